// src/cuda/common/fast_float.cuh — float operations in fewer instructions, each with the bits it keeps
// (tests/gpu/test_compressor_gpu.cu checks each against its reference on every float).
//
// round_pair_to_bf16: round_to_bf16 (dsv4/formats.hpp) of two floats by one conversion instruction.
// cvt.rn.bf16x2.f32 rounds to nearest even, subnormals and overflow included, as the reference's
// integer rounding does; only a NaN differs (the hardware gives the canonical NaN, the reference
// keeps its sign and upper payload, quieted), so a NaN takes the reference's bits. The integer
// rounding took ≈ 8 instructions a value (Nsight Compute, C4-128 prefill: 131 of an event's 1654).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "dsv4/formats.hpp"

namespace dsv4::cuda {

__device__ __forceinline__ void round_pair_to_bf16(float& a, float& b) {
  std::uint32_t packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(b), "f"(a));  // b to the upper half, a the lower
  // The reference's NaN: its own sign and upper payload bits, quieted (selects, not a branch: a branch
  // held registers that spilled in the 96-register kernels).
  const auto nan_kept = [](float x) { return __uint_as_float((__float_as_uint(x) & 0xffff0000u) | 0x00400000u); };
  a = a != a ? nan_kept(a) : __uint_as_float(packed << 16);
  b = b != b ? nan_kept(b) : __uint_as_float(packed & 0xffff0000u);
}

__device__ __forceinline__ void round4_to_bf16(float (&v)[4]) {
  round_pair_to_bf16(v[0], v[1]);
  round_pair_to_bf16(v[2], v[3]);
}

// exp_flushed: __expf(x) (ex2.approx.f32 of x·log2 e) with subnormal results flushed to zero.
// Without flush-to-zero the compiler wraps each MUFU.EX2 in a fix-up for them (t < −126: halve t,
// square the result), three more instructions per exponential (120 of a C4-128 compress event's
// 1654, Nsight Compute). Wherever __expf's result is not subnormal the bits are its bits.
inline constexpr float kLog2E = 1.4426950216293334961f;  // the constant of __expf's FMUL (0x3fb8aa3b)
__device__ __forceinline__ float exp_flushed(float x) {
  float result;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(result) : "f"(__fmul_rn(x, kLog2E)));
  return result;
}

// divide_normal: __fdividef(x, y) for a divisor of normal magnitude, |y| in [2^-126, 2^126]: x times
// rcp.approx.ftz(y). __fdividef guards both ends of that range (a compare and two predicated scalings
// before the reciprocal), dependent instructions on the online recurrence's chain (a row of it took
// ≈ 375 cycles on the H200); inside the range its bits are these.
__device__ __forceinline__ float divide_normal(float x, float y) {
  float reciprocal;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(reciprocal) : "f"(y));
  return __fmul_rn(x, reciprocal);
}

// divide4_rn: x[k] / y for four x and one divisor, each bit for bit __fdiv_rn(x[k], y). __fdiv_rn
// is, per division, a reciprocal (MUFU.RCP), one Newton step, the quotient and one correction by
// FMAs, behind a guard (FCHK) that sends operands near the ends of the range to a slow path — about
// ten instructions a division. Here the reciprocal and its Newton step are shared, and the guard is
// a range test: with |y| and every |x| in [2^-60, 2^60] no intermediate underflows or overflows and
// the same FMAs give the same bits; anything else (a zero, a subnormal, an infinity, a NaN, a far
// exponent) takes __fdiv_rn itself. Checked on the GPU against __fdiv_rn for every float x over a
// spread of divisors (test_compressor_gpu, CompressorGpuFastFloat).
__device__ __forceinline__ void divide4_rn(float (&x)[4], float y) {
  constexpr float kLow = 0x1p-60f, kHigh = 0x1p60f;
  bool in_range = fabsf(y) >= kLow && fabsf(y) <= kHigh;
#pragma unroll
  for (int k = 0; k < 4; ++k) in_range = in_range && fabsf(x[k]) >= kLow && fabsf(x[k]) <= kHigh;
  if (in_range) {
    float reciprocal;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(reciprocal) : "f"(y));
    reciprocal = __fmaf_rn(reciprocal, __fmaf_rn(reciprocal, -y, 1.0f), reciprocal);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float quotient = __fmul_rn(reciprocal, x[k]);
      x[k] = __fmaf_rn(reciprocal, __fmaf_rn(quotient, -y, x[k]), quotient);
    }
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) x[k] = __fdiv_rn(x[k], y);
  }
}

// e4m3_codes: e4m3_from (dsv4/formats.hpp) of four floats, packed with a in the low byte, by two
// cvt.rn.satfinite.e4m3x2.f32 — round to nearest even, e4m3 subnormals, values ≥ 448 and infinities
// saturated to ±448, as e4m3_from does — instead of ≈ 10 integer instructions a value on the
// float's bits. A NaN takes e4m3_from's code (its sign | 0x7f) by a select,
// whatever the hardware gives for it.
__device__ __forceinline__ std::uint32_t e4m3_codes(float a, float b, float c, float d) {
  std::uint16_t low, high;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(low) : "f"(b), "f"(a));  // b to the upper byte
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(high) : "f"(d), "f"(c));
  std::uint32_t codes = static_cast<std::uint32_t>(low) | (static_cast<std::uint32_t>(high) << 16);
  const auto keep_nan = [&codes](float x, int shift) {
    const std::uint32_t nan_code = ((__float_as_uint(x) >> 24) & 0x80u) | 0x7fu;
    codes = x != x ? (codes & ~(0xffu << shift)) | (nan_code << shift) : codes;
  };
  keep_nan(a, 0);
  keep_nan(b, 8);
  keep_nan(c, 16);
  keep_nan(d, 24);
  return codes;
}

}  // namespace dsv4::cuda
