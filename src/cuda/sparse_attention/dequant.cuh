// src/cuda/sparse_attention/dequant.cuh — e4m3 codes with a ue8m0 block scale → exact bf16 (SPEC §5.1).
//
// Field shift instead of a cvt chain (KERNELS.md §4): an e4m3 byte s.eeee.mmm moved to bits 15 | 10..4
// of a 16-bit lane is the bf16 s.0000eeee.mmm0000, i.e. the code's value times 2^-120 — subnormal
// codes (eeee = 0) included, they land on bf16 subnormals. One multiply by the power of two
// 2^120 · 2^(e−127) = 2^(e−7) restores the value; a bf16 product by a power of two is exact unless
// it leaves the range, so the result equals float_from_e4m3(code) · float_from_ue8m0(e) rounded to
// bf16, which is that value itself (4 significant bits). NaN codes (0x7f/0xff, never written by the
// encoder) decode to a finite ±480 · scale instead of NaN.
#pragma once

#include <cstdint>

#include "cuda/common/ptx_sm90.cuh"
#include "cuda/sparse_attention/ptx.cuh"

namespace dsv4::cuda::sparse_attention {

// Two codes (bytes picked by `selector` from `four`) → bf16x2 of their values times 2^-120.
// selector 0x9180 takes bytes 0 and 1, 0xB3A2 bytes 2 and 3: each code goes to the low byte of its
// 16-bit lane and its sign, replicated by prmt (selector nibble bit 3), to the high byte; shifted left
// by 4, the lane is s.ssss.eeee.mmm0000 (the low lane's replicated sign spills into the high lane's
// bits 16–19), and the mask keeps the sign bit and the seven code bits: s.0000eeee.mmm0000.
__device__ __forceinline__ std::uint32_t e4m3x2_to_bf16x2_times_2pow_m120(std::uint32_t four, std::uint32_t selector) {
  return (ptx::prmt(four, 0u, selector) << 4) & 0x87f087f0u;
}
inline constexpr std::uint32_t kCodes01 = 0x9180, kCodes23 = 0xB3A2;

// bf16x2 with both halves 2^(field − 127) (1 ≤ field ≤ 254).
__device__ __forceinline__ std::uint32_t bf16x2_power_of_two(std::uint32_t field) { return field * 0x00800080u; }

// Largest scale byte for which 2^(e−7) is a normal bf16, so one multiply does.
inline constexpr std::uint32_t kSingleMultiplyMaxScale = 134;

// The two factors whose product is 2^(e−7): (2^(e−7), 1) while that is a normal bf16, else
// (2^120, 2^(e−127)). In the general path both multiplies always run — the second by exactly 1
// changes no bit — so the decode is straight-line code: a branch per scale kept the compiler from
// interleaving independent codes, and the decode ran at about one instruction per seven cycles
// (Nsight Compute, H200). Callers that know all their scale bytes are ≤ kSingleMultiplyMaxScale
// take the kOneFactor path below (one branch per entry, not per scale).
struct ScaleFactors {
  std::uint32_t first, second;  // bf16x2
};
__device__ __forceinline__ ScaleFactors scale_factors(std::uint32_t e) {
  const bool single = e <= kSingleMultiplyMaxScale;
  return {bf16x2_power_of_two(single ? e + 120 : 247), bf16x2_power_of_two(single ? 127u : e)};
}

// Eight codes (`codes`.x bytes 0..3 then .y bytes 0..3) with scale factors `f` → eight bf16, in order.
// kOneFactor: only f.first is applied — exact where the scale byte is ≤ kSingleMultiplyMaxScale (then
// f.second is 1); callers that know every scale byte of their codes is in that range save a multiply
// a pair.
template <bool kOneFactor = false>
__device__ __forceinline__ uint4 dequantize_e4m3x8(uint2 codes, ScaleFactors f) {
  std::uint32_t v[4] = {e4m3x2_to_bf16x2_times_2pow_m120(codes.x, kCodes01), e4m3x2_to_bf16x2_times_2pow_m120(codes.x, kCodes23),
                        e4m3x2_to_bf16x2_times_2pow_m120(codes.y, kCodes01), e4m3x2_to_bf16x2_times_2pow_m120(codes.y, kCodes23)};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[i] = ptx::mul_bf16x2(v[i], f.first);
    if constexpr (!kOneFactor) v[i] = ptx::mul_bf16x2(v[i], f.second);
  }
  return make_uint4(v[0], v[1], v[2], v[3]);
}
// The same with scale byte `e` (kOneFactor: e ≤ kSingleMultiplyMaxScale).
template <bool kOneFactor = false>
__device__ __forceinline__ uint4 dequantize_e4m3x8(uint2 codes, std::uint32_t e) {
  return dequantize_e4m3x8<kOneFactor>(codes, scale_factors(e));
}

// Sixteen codes sharing scale byte `e` → sixteen bf16 (`lo` the first eight, `hi` the last eight).
template <bool kOneFactor = false>
__device__ __forceinline__ void dequantize_e4m3x16(uint4 codes, std::uint32_t e, uint4& lo, uint4& hi) {
  const ScaleFactors f = scale_factors(e);
  lo = dequantize_e4m3x8<kOneFactor>(make_uint2(codes.x, codes.y), f);
  hi = dequantize_e4m3x8<kOneFactor>(make_uint2(codes.z, codes.w), f);
}

// Scale byte i (0..7) of an entry's 8-byte scale record, as loaded (.x bytes 0..3, then .y).
__device__ __forceinline__ std::uint32_t scale_byte(uint2 record, int i) {
  return ((i < 4 ? record.x : record.y) >> (8 * (i % 4))) & 0xffu;
}

// Whether every one of the `bytes` low scale bytes of a record is ≤ kSingleMultiplyMaxScale.
__device__ __forceinline__ bool scales_take_one_factor(uint2 record, int bytes) {
  bool one = true;
#pragma unroll
  for (int i = 0; i < 8; ++i)
    if (i < bytes) one = one && scale_byte(record, i) <= kSingleMultiplyMaxScale;
  return one;
}

}  // namespace dsv4::cuda::sparse_attention
