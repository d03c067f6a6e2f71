// dsv4/formats.hpp — the number formats of SPEC §3: bf16, e4m3 ("fn"), ue8m0 scales, e2m1 (FP4).
//
// Header-only and usable from host and device code, so the CPU reference, the CUDA kernels and
// the tests share one definition of every rounding rule. All conversions round to nearest, ties to
// even; e4m3 and e2m1 saturate to their largest finite magnitude (448, 6).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DSV4_HD __host__ __device__ __forceinline__
#else
#define DSV4_HD inline
#endif

namespace dsv4 {

namespace detail {
DSV4_HD std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
DSV4_HD float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}
}  // namespace detail

// ---- bf16 -------------------------------------------------------------------------------------
DSV4_HD std::uint16_t bf16_bits_from_float(float f) {
  std::uint32_t u = detail::float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<std::uint16_t>(u >> 16);
}
DSV4_HD float float_from_bf16_bits(std::uint16_t b) {
  return detail::bits_float(static_cast<std::uint32_t>(b) << 16);
}
// float32 → bf16 → float32: the "round to bf16" step of the SPEC.
DSV4_HD float round_to_bf16(float f) { return float_from_bf16_bits(bf16_bits_from_float(f)); }

// ---- e4m3 (fn: bias 7, max 448, code 0x7f/0xff is NaN, no infinities) --------------------------
inline constexpr float kE4m3Max = 448.0f;

// Encodes x (float or double) exactly: every step below is exact in the input's precision.
template <class Real>
DSV4_HD std::uint8_t e4m3_from(Real x) {
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return static_cast<std::uint8_t>(sign | 0x7f);
  Real a = std::fabs(x);
  if (a >= Real(448)) return static_cast<std::uint8_t>(sign | 0x7e);  // saturate (inf too)
  if (a < Real(0.015625)) {                                            // below 2^-6: subnormal
    // Multiples of 2^-9; q == 8 rolls over into the smallest normal (code 0x08) naturally.
    int q = static_cast<int>(std::nearbyint(a * Real(512)));
    return static_cast<std::uint8_t>(sign | q);
  }
  int e;
  Real m = std::frexp(a, &e);  // a = m·2^e, m in [0.5, 1)
  int exponent = e - 1;        // a = (2m)·2^exponent, 2m in [1, 2)
  int q = static_cast<int>(std::nearbyint((m * Real(2) - Real(1)) * Real(8)));
  if (q == 8) { q = 0; ++exponent; }
  int code = ((exponent + 7) << 3) | q;
  if (code > 0x7e) code = 0x7e;  // 448 < a < 464 rounds to 448 anyway; guard the rollover
  return static_cast<std::uint8_t>(sign | code);
}

DSV4_HD float float_from_e4m3(std::uint8_t code) {
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  const int exponent = (code >> 3) & 0xf;
  const int mantissa = code & 0x7;
  if ((code & 0x7f) == 0x7f) return NAN;
  if (exponent == 0) return sign * static_cast<float>(mantissa) * 0.001953125f;  // ·2^-9
  return sign * std::ldexp(1.0f + static_cast<float>(mantissa) * 0.125f, exponent - 7);
}

// ---- ue8m0 power-of-two scales -----------------------------------------------------------------
// Floors of the block maximum before the division (SPEC §3).
inline constexpr float kUe8m0FloorE4m3 = 1e-4f;
inline constexpr float kUe8m0FloorE2m1 = 6.0f * 1.1754943508222875e-38f;  // 6·2^-126

// The scale byte e (scale = 2^(e−127)) for a block with absolute maximum `amax` in a format whose
// largest value is `format_max`: 2^ceil(log2(max(amax, floor) / format_max)), the quotient a
// float32 division and the ceiling read off its bits (exponent, plus one if any mantissa bit).
DSV4_HD std::uint8_t ue8m0_scale_byte(float amax, float format_max, float floor_value) {
  const float q = (amax > floor_value ? amax : floor_value) / format_max;
  const std::uint32_t u = detail::float_bits(q);
  int biased = static_cast<int>((u >> 23) & 0xffu);
  const std::uint32_t mantissa = u & 0x7fffffu;
  if (biased == 0) {  // subnormal quotient: ceil(log2(m·2^-149)) = -149 + ceil(log2 m)
    int ceil_log2 = 0;
    while ((1u << ceil_log2) < mantissa) ++ceil_log2;
    biased = 127 - 149 + ceil_log2;
    return static_cast<std::uint8_t>(biased < 0 ? 0 : biased);
  }
  if (mantissa != 0) ++biased;
  return static_cast<std::uint8_t>(biased > 254 ? 254 : biased);
}
DSV4_HD float float_from_ue8m0(std::uint8_t e) {
  if (e == 0) return detail::bits_float(0x00400000u);  // 2^-127 is subnormal in float32
  return detail::bits_float(static_cast<std::uint32_t>(e) << 23);
}

// ---- e2m1 (FP4: grid 0, 0.5, 1, 1.5, 2, 3, 4, 6; sign in bit 3) ----------------------------------
inline constexpr float kE2m1Max = 6.0f;

template <class Real>
DSV4_HD std::uint8_t e2m1_from(Real x) {
  const std::uint8_t sign = std::signbit(x) ? 0x8 : 0x0;
  const Real a = std::fabs(x);
  // Midpoints between grid neighbours; at a tie the even code (mantissa bit 0) wins, hence the
  // alternation of <= and <.
  std::uint8_t code;
  if (a <= Real(0.25)) code = 0;
  else if (a < Real(0.75)) code = 1;
  else if (a <= Real(1.25)) code = 2;
  else if (a < Real(1.75)) code = 3;
  else if (a <= Real(2.5)) code = 4;
  else if (a < Real(3.5)) code = 5;
  else if (a <= Real(5.0)) code = 6;
  else code = 7;  // saturates (NaN input is not meaningful here and also lands on 6)
  // A value that rounds to zero is stored as +0 (code 0), as the published reference does
  // (shared/vectors: e2m1_in −0.25 → 0x0); e4m3 keeps the sign of zero.
  return static_cast<std::uint8_t>(code == 0 ? 0 : (sign | code));
}

DSV4_HD float float_from_e2m1(std::uint8_t code) {
  const float magnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = magnitude[code & 0x7];
  return (code & 0x8) ? -v : v;
}

}  // namespace dsv4
