// src/cuda/compressor/postprocess.cuh — the fused post-processing of one compressed row (SPEC §4):
// bf16 → RMSNorm → bf16 → RoPE at the entry position → bf16 → (indexer: Walsh–Hadamard → bf16) →
// encoding (SPEC §5) straight into the paged cache, plus the optional outputs.
//
// The arithmetic is the reference's, parallelized over lanes (lane l holds channels 4l..4l+3):
//  - the sum of squares of bf16 values and the Walsh–Hadamard butterflies of bf16 values are exact
//    in double, so their order across lanes cannot change a bit;
//  - the RoPE products of a bf16 value and a float32 cos/sin are exact in double (8 + 24 bits), so
//    a fused multiply-add gives the reference's rounding;
//  - scales and codes come from the shared encoders of formats.hpp / entry_codec.hpp.
// Every thread of the unit calls finish_event (it contains unit barriers); only `active` threads
// (the first group) hold the row and store.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/fast_float.cuh"
#include "cuda/compressor/device_common.cuh"
#include "cuda/compressor/rope.cuh"
#include "dsv4/cache_format.hpp"
#include "dsv4/entry_codec.hpp"
#include "dsv4/formats.hpp"

namespace dsv4::cuda::compressor {

// 584-byte attention entry (AttentionEntryFormat): lanes 0..111 hold the 448 nope dims (16 lanes per
// 64-value scale block), lanes 112..127 the 64 RoPE dims stored as bf16.
__device__ __forceinline__ void store_attention_entry(const float (&y)[4], int lane, bool active, const EntryTarget& t,
                                                      int entries_per_page) {
  using F = AttentionEntryFormat;
  constexpr int kNopeLanes = F::kNopeDim / 4;
  constexpr int kLanesPerScale = F::kQuantBlock / 4;
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; ++k) amax = fmaxf(amax, fabsf(y[k]));
  amax = lanes_max<kLanesPerScale>(amax);  // every lane of a 16-lane group gets its block's maximum
  if (!active) return;
  if (lane < kNopeLanes) {
    const std::uint8_t e = ue8m0_scale_byte(amax, kE4m3Max, kUe8m0FloorE4m3);
    const float inv_scale = float_from_ue8m0(static_cast<std::uint8_t>(254 - e));  // 2^(127−e), exact
    const std::uint32_t codes = e4m3_codes(y[0] * inv_scale, y[1] * inv_scale, y[2] * inv_scale, y[3] * inv_scale);
    *reinterpret_cast<std::uint32_t*>(t.page + F::data_offset(t.index_in_page) + 4 * lane) = codes;
    if (lane % kLanesPerScale == 0) t.page[F::scale_offset(t.index_in_page, entries_per_page) + lane / kLanesPerScale] = e;
  } else {
    const int rope_lane = lane - kNopeLanes;
    uint2 bits;
    bits.x = static_cast<std::uint32_t>(bf16_bits_from_float(y[0])) | (static_cast<std::uint32_t>(bf16_bits_from_float(y[1])) << 16);
    bits.y = static_cast<std::uint32_t>(bf16_bits_from_float(y[2])) | (static_cast<std::uint32_t>(bf16_bits_from_float(y[3])) << 16);
    *reinterpret_cast<uint2*>(t.page + F::rope_offset(t.index_in_page) + 8 * rope_lane) = bits;
    if (rope_lane == 0) t.page[F::scale_offset(t.index_in_page, entries_per_page) + F::kNumScales] = 0;  // pad byte
  }
}

// Indexer key (IndexerEntryFormat) of width 128: one warp, lane l holds values 4l..4l+3.
__device__ __forceinline__ void store_indexer_entry(const float (&y)[4], int lane, bool active, OutputKind output,
                                                    const EntryTarget& t, int entries_per_page) {
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; ++k) amax = fmaxf(amax, fabsf(y[k]));
  if (output == OutputKind::IndexerFP8) {
    const IndexerEntryFormat fmt{IndexerKeyFormat::FP8, 128};
    amax = lanes_max<32>(amax);
    if (!active) return;
    const float scale = indexer_fp8_scale(amax);
    float scaled[4] = {y[0], y[1], y[2], y[3]};
    divide4_rn(scaled, scale);  // y / scale, four IEEE divisions with one reciprocal
    const std::uint32_t codes = e4m3_codes(scaled[0], scaled[1], scaled[2], scaled[3]);
    *reinterpret_cast<std::uint32_t*>(t.page + fmt.data_offset(t.index_in_page) + 4 * lane) = codes;
    if (lane == 0) *reinterpret_cast<float*>(t.page + fmt.scale_offset(t.index_in_page, entries_per_page)) = scale;
    return;
  }
  const IndexerEntryFormat fmt{IndexerKeyFormat::FP4, 128};
  constexpr int kLanesPerScale = IndexerEntryFormat::kFp4Block / 4;
  amax = lanes_max<kLanesPerScale>(amax);
  if (!active) return;
  const std::uint8_t e = ue8m0_scale_byte(amax, kE2m1Max, kUe8m0FloorE2m1);
  const float scale = float_from_ue8m0(e);
  const auto pair = [&](int k) {
    return static_cast<std::uint32_t>(e2m1_from(y[k] / scale) | (e2m1_from(y[k + 1] / scale) << 4));
  };
  *reinterpret_cast<std::uint16_t*>(t.page + fmt.data_offset(t.index_in_page) + 2 * lane) =
      static_cast<std::uint16_t>(pair(0) | (pair(2) << 8));
  if (lane % kLanesPerScale == 0) t.page[fmt.scale_offset(t.index_in_page, entries_per_page) + lane / kLanesPerScale] = e;
}

// This lane's 4 RMSNorm weights, loaded once per item (early, off the event's critical path).
template <class Config>
__device__ __forceinline__ void load_norm(const KernelParams& p, int lane, float (&norm)[4]) {
  to_array(load_shared_input(p.norm + 4 * (lane % Config::kLanes)), norm);
}

// Post-processes the compressed row `compressed` (this lane's 4 channels) of event target `t`,
// stores the entry and the optional outputs. `norm`: this lane's RMSNorm weights (load_norm).
// `s_sum` [Config::kWarpsPerGroup] is scratch shared by the unit (unused for single-warp groups).
template <class Config>
__device__ __forceinline__ void finish_event(const KernelParams& p, const float (&compressed)[4], int lane, bool active,
                                             const EntryTarget& t, const float (&norm)[4], double* s_sum) {
  constexpr int kWidth = Config::kWidth;
  constexpr int kLastWarpLane = Config::kLanes - 32;
  // This lane's RoPE frequency (r ≤ 64: pair lane − kLastWarpLane, step 2), read first where a group
  // is one warp (c = 128; at c = 512 the five-block kernel spills the register): a lane-indexed read
  // of the parameters is a serialized constant-bank load, and read inside the RoPE branches (a load
  // is not hoisted out of a branch) it stalled the event's chain right before its multiply (4% of the
  // C4-128 256K prefill's stall samples, Nsight Compute). Read first, the RMSNorm hides it.
  constexpr bool kFrequencyFirst = Config::kWarpsPerGroup == 1;
  const float first_frequency = kFrequencyFirst ? p.rope_frequencies[max(lane - kLastWarpLane, 0)] : 0.0f;
  if (active) {
    if (p.out_compressed) {
      store4(p.out_compressed + t.event_row * kWidth + 4 * lane,
             make_float4(compressed[0], compressed[1], compressed[2], compressed[3]));
    }
    if (lane == 0) {
      if (p.out_entry_ids) p.out_entry_ids[t.event_row] = static_cast<std::int32_t>(t.entry);
      if (p.out_positions) p.out_positions[t.event_row] = static_cast<std::int32_t>(t.entry * p.ratio);
      if (p.out_cache_slots) p.out_cache_slots[t.event_row] = t.cache_slot;
    }
  }

  // 1. bf16, RMSNorm with double statistics, bf16.
  float x[4] = {compressed[0], compressed[1], compressed[2], compressed[3]};
  round4_to_bf16(x);
  double sum_squares = 0.0;
#pragma unroll
  for (int k = 0; k < 4; ++k) sum_squares += static_cast<double>(x[k]) * x[k];
  sum_squares = lanes_sum<32>(sum_squares);
  if constexpr (Config::kWarpsPerGroup > 1) {
    if (active && lane % 32 == 0) s_sum[lane / 32] = sum_squares;
    unit_sync<Config>();
    sum_squares = 0.0;
#pragma unroll
    for (int w = 0; w < Config::kWarpsPerGroup; ++w) sum_squares += s_sum[w];
    unit_sync<Config>();  // s_sum may be reused by the next event
  }
  const double inv_rms = 1.0 / sqrt(sum_squares / kWidth + p.eps);
  float y[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) y[k] = static_cast<float>(static_cast<double>(norm[k]) * (static_cast<double>(x[k]) * inv_rms));
  round4_to_bf16(y);

  // 2. RoPE on the last r dims at the entry's position (its block's first token), bf16. The r/4 RoPE
  // lanes are the last lanes of the group's last warp (r ≤ 128); each rotates pairs 2k and 2k + 1
  // (k: its index among them). For r ≤ 64 the cos/sin of pair i are computed once, by lane i of that
  // warp, and fetched by shuffles: one double-precision evaluation per lane instead of two
  // per RoPE lane while the other lanes idle. (r > 64: each RoPE lane evaluates its own two.)
  const int first_rope_lane = (kWidth - p.rope_dim) / 4;
  const float position = static_cast<float>(t.entry * p.ratio);
  const auto rotate = [&](int q, float cos_theta, float sin_theta) {
    const double c = cos_theta, s = sin_theta;
    const double a = y[2 * q], b = y[2 * q + 1];
    y[2 * q] = static_cast<float>(a * c - b * s);
    y[2 * q + 1] = static_cast<float>(a * s + b * c);
    round_pair_to_bf16(y[2 * q], y[2 * q + 1]);
  };
  if (p.rope_dim <= 64) {
    if (lane >= kLastWarpLane) {  // the group's last warp, whole
      const int j = lane - kLastWarpLane;
      float own_cos = 1.0f, own_sin = 0.0f;
      if (2 * j < p.rope_dim) {
        const float frequency = kFrequencyFirst ? first_frequency : p.rope_frequencies[j];
        rope_cos_sin(__fmul_rn(position, frequency), own_cos, own_sin);
      }
      const int k = max(lane - first_rope_lane, 0);  // (lanes before the RoPE lanes fetch and discard pair 0)
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const float cos_theta = __shfl_sync(0xffffffffu, own_cos, 2 * k + q);
        const float sin_theta = __shfl_sync(0xffffffffu, own_sin, 2 * k + q);
        if (lane >= first_rope_lane) rotate(q, cos_theta, sin_theta);
      }
    }
  } else if (lane >= first_rope_lane) {
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      float cos_theta, sin_theta;
      rope_cos_sin(__fmul_rn(position, p.rope_frequencies[2 * (lane - first_rope_lane) + q]), cos_theta, sin_theta);
      rotate(q, cos_theta, sin_theta);
    }
  }

  // 3. Encode and store.
  if constexpr (kWidth == AttentionEntryFormat::kDim) {
    store_attention_entry(y, lane, active, t, p.entries_per_page);
  } else {
    static_assert(kWidth == 128, "indexer keys are one warp wide");
    // Walsh–Hadamard (Sylvester order) over the 128 values: strides 1 and 2 inside the lane,
    // strides 4..64 across lanes xor 1..16. The lower index of a pair takes a + b, the upper a − b.
    double v[4] = {y[0], y[1], y[2], y[3]};
    const double s01 = v[0] + v[1], d01 = v[0] - v[1], s23 = v[2] + v[3], d23 = v[2] - v[3];
    v[0] = s01 + s23;
    v[1] = d01 + d23;
    v[2] = s01 - s23;
    v[3] = d01 - d23;
    // Across lanes the upper lane's other − v is other + (−v), the negation a flip of v's sign bit
    // (exact), so both lanes take one add, rounded as the sums are: a LOP3 and a DADD a value instead
    // of a negation, a 64-bit select and an add. (A NaN's sign may come out flipped where the
    // subtraction kept it; nothing reads it: both key encodings divide by the scale first, which
    // gives the canonical NaN.)
#pragma unroll
    for (int h = 1; h < 32; h *= 2) {
      const int sign_flip = (lane & h) != 0 ? static_cast<int>(0x80000000u) : 0;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const double other = __shfl_xor_sync(0xffffffffu, v[k], h);
        v[k] = other + __hiloint2double(__double2hiint(v[k]) ^ sign_flip, __double2loint(v[k]));
      }
    }
    const double scale = 1.0 / sqrt(static_cast<double>(kWidth));
#pragma unroll
    for (int k = 0; k < 4; ++k) y[k] = static_cast<float>(v[k] * scale);
    round4_to_bf16(y);
    store_indexer_entry(y, lane, active, p.output, t, p.entries_per_page);
  }
}

}  // namespace dsv4::cuda::compressor
