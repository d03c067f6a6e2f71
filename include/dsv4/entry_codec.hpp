// dsv4/entry_codec.hpp — encoding and decoding of one cache entry (SPEC §5), host and device.
//
// Inputs are the post-processed values, already rounded to bf16 (held in float). The encoders write
// through the layout traits of cache_format.hpp into a page; decoders read them back to float.
// Kernels may parallelize the same arithmetic across threads but must produce identical bytes.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "dsv4/cache_format.hpp"
#include "dsv4/formats.hpp"

namespace dsv4 {

// ---- FP8 attention entry (584 B) ----------------------------------------------------------------

// Scale byte and codes of one 64-value nope block: e = ue8m0(amax / 448), code = e4m3(v / 2^(e−127)).
// Dividing by a power of two is exact, so the code depends only on the bf16 value and the scale.
DSV4_HD std::uint8_t encode_e4m3_block(const float* values /*[n]*/, int n, std::uint8_t* codes /*[n]*/) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(values[i]));
  const std::uint8_t e = ue8m0_scale_byte(amax, kE4m3Max, kUe8m0FloorE4m3);
  const float inv_scale = float_from_ue8m0(static_cast<std::uint8_t>(254 - e));  // 2^(127−e), exact
  for (int i = 0; i < n; ++i) codes[i] = e4m3_from(values[i] * inv_scale);
  return e;
}

// Writes entry `i` of a page of `entries_per_page` entries from `values` [512] (bf16-rounded).
DSV4_HD void encode_attention_entry(const float* values, std::uint8_t* page, int i, int entries_per_page) {
  using F = AttentionEntryFormat;
  std::uint8_t* codes = page + F::data_offset(i);
  std::uint8_t* scales = page + F::scale_offset(i, entries_per_page);
  for (int b = 0; b < F::kNumScales; ++b)
    scales[b] = encode_e4m3_block(values + b * F::kQuantBlock, F::kQuantBlock, codes + b * F::kQuantBlock);
  for (int b = F::kNumScales; b < F::kScaleBytes; ++b) scales[b] = 0;
  std::uint8_t* rope = page + F::rope_offset(i);
  for (int k = 0; k < F::kRopeDim; ++k) {
    const std::uint16_t bits = bf16_bits_from_float(values[F::kNopeDim + k]);
    rope[2 * k] = static_cast<std::uint8_t>(bits & 0xff);  // little-endian bf16
    rope[2 * k + 1] = static_cast<std::uint8_t>(bits >> 8);
  }
}

// Reads entry `i` back to float `out` [512].
DSV4_HD void decode_attention_entry(const std::uint8_t* page, int i, int entries_per_page, float* out) {
  using F = AttentionEntryFormat;
  const std::uint8_t* codes = page + F::data_offset(i);
  const std::uint8_t* scales = page + F::scale_offset(i, entries_per_page);
  for (int k = 0; k < F::kNopeDim; ++k) out[k] = float_from_e4m3(codes[k]) * float_from_ue8m0(scales[k / F::kQuantBlock]);
  const std::uint8_t* rope = page + F::rope_offset(i);
  for (int k = 0; k < F::kRopeDim; ++k)
    out[F::kNopeDim + k] = float_from_bf16_bits(static_cast<std::uint16_t>(rope[2 * k] | (rope[2 * k + 1] << 8)));
}

// ---- indexer entry (FP8 132 B / FP4 68 B at d_I = 128) --------------------------------------------

// FP8: scale = max(amax, 1e-4) / 448 as a float32 division; code = e4m3(v / scale) in float32.
DSV4_HD float indexer_fp8_scale(float amax) { return std::fmax(amax, kUe8m0FloorE4m3) / kE4m3Max; }

// FP4: per 32 values, e = ue8m0(amax / 6, floor 6·2^-126), code = e2m1(v / 2^(e−127)), two codes per
// byte with the lower-indexed value in the low nibble.
DSV4_HD std::uint8_t encode_e2m1_block(const float* values /*[n]*/, int n, std::uint8_t* packed /*[n/2]*/) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(values[i]));
  const std::uint8_t e = ue8m0_scale_byte(amax, kE2m1Max, kUe8m0FloorE2m1);
  const float scale = float_from_ue8m0(e);
  for (int i = 0; i < n; i += 2) {
    const std::uint8_t lo = e2m1_from(values[i] / scale);
    const std::uint8_t hi = e2m1_from(values[i + 1] / scale);
    packed[i / 2] = static_cast<std::uint8_t>(lo | (hi << 4));
  }
  return e;
}

// Writes entry `i` of an indexer page from `values` [fmt.dim] (bf16-rounded, after Walsh–Hadamard).
DSV4_HD void encode_indexer_entry(const IndexerEntryFormat& fmt, const float* values, std::uint8_t* page, int i,
                                  int entries_per_page) {
  std::uint8_t* data = page + fmt.data_offset(i);
  std::uint8_t* scale_bytes = page + fmt.scale_offset(i, entries_per_page);
  if (fmt.format == IndexerKeyFormat::FP8) {
    float amax = 0.0f;
    for (int k = 0; k < fmt.dim; ++k) amax = std::fmax(amax, std::fabs(values[k]));
    const float scale = indexer_fp8_scale(amax);
    for (int k = 0; k < fmt.dim; ++k) data[k] = e4m3_from(values[k] / scale);
    std::memcpy(scale_bytes, &scale, sizeof scale);  // little-endian float32
    return;
  }
  for (int b = 0; b < fmt.dim / IndexerEntryFormat::kFp4Block; ++b)
    scale_bytes[b] = encode_e2m1_block(values + b * IndexerEntryFormat::kFp4Block, IndexerEntryFormat::kFp4Block,
                                       data + b * IndexerEntryFormat::kFp4Block / 2);
}

// Reads indexer entry `i` back to float `out` [fmt.dim].
DSV4_HD void decode_indexer_entry(const IndexerEntryFormat& fmt, const std::uint8_t* page, int i, int entries_per_page,
                                  float* out) {
  const std::uint8_t* data = page + fmt.data_offset(i);
  const std::uint8_t* scale_bytes = page + fmt.scale_offset(i, entries_per_page);
  if (fmt.format == IndexerKeyFormat::FP8) {
    float scale;
    std::memcpy(&scale, scale_bytes, sizeof scale);
    for (int k = 0; k < fmt.dim; ++k) out[k] = float_from_e4m3(data[k]) * scale;
    return;
  }
  for (int k = 0; k < fmt.dim; ++k) {
    const std::uint8_t byte = data[k / 2];
    const std::uint8_t code = (k % 2 == 0) ? (byte & 0xf) : (byte >> 4);
    out[k] = float_from_e2m1(code) * float_from_ue8m0(scale_bytes[k / IndexerEntryFormat::kFp4Block]);
  }
}

}  // namespace dsv4
