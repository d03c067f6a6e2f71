// src/cuda/compressor/rope.cuh — cos and sin of a float32 RoPE angle, rounded to float32, as the
// reference computes them (RopeTable::cos_sin: the double cos/sin of the float32 angle, rounded).
//
// CUDA's double sin/cos carry a Payne–Hanek slow path that needs local memory; angles here are
// float32 values below 2^31 (positions < 2^31, frequencies ≤ 1), so a Cody–Waite reduction with a
// double-double π/2 is accurate to ~1e-23 absolute, and Taylor polynomials on [−π/4, π/4] (last
// term < 1e-25) give cos/sin within a few double ulps. Rounding that to float32 matches the
// correctly rounded value unless the exact value lies within ~2^-50 of a float32 rounding
// midpoint (a chance of about 2^-27 per value).
#pragma once

#include <cuda_runtime.h>

namespace dsv4::cuda::compressor {

__device__ __forceinline__ void rope_cos_sin(float angle, float& cos_out, float& sin_out) {
  constexpr double kTwoOverPi = 0.63661977236758134308;
  constexpr double kHalfPiHi = 1.5707963267948966192;     // double(π/2)
  constexpr double kHalfPiLo = 6.123233995736766036e-17;  // π/2 − kHalfPiHi
  // rint by the 1.5·2^52 shifter (exact for 0 ≤ x < 2^51, ties to even as rint), whose low mantissa
  // bits are then the quadrant: no conversion to a 64-bit integer, no branch on the quadrant (lanes
  // of a warp evaluate different pairs, so a switch on it diverged).
  constexpr double kShifter = 6755399441055744.0;  // 1.5·2^52
  const double theta = angle;
  const double shifted = __dadd_rn(__dmul_rn(theta, kTwoOverPi), kShifter);
  const double k = __dsub_rn(shifted, kShifter);
  const int quadrant = static_cast<int>(__double_as_longlong(shifted) & 3);
  // theta − k·hi exactly: k·hi = product + error (fma), theta − product is exact (Sterbenz).
  const double product = k * kHalfPiHi;
  const double product_error = fma(k, kHalfPiHi, -product);
  const double r = ((theta - product) - product_error) - k * kHalfPiLo;  // |r| ≤ π/4 (+tiny)
  const double r2 = r * r;
  // sin r = r·(1 − r²/3! + r⁴/5! − ... − r²⁰/21!), cos r = 1 − r²/2! + ... + r²⁰/20!
  double s = -1.0 / 51090942171709440000.0;  // −1/21!
  s = fma(s, r2, 1.0 / 121645100408832000.0);
  s = fma(s, r2, -1.0 / 355687428096000.0);
  s = fma(s, r2, 1.0 / 1307674368000.0);
  s = fma(s, r2, -1.0 / 6227020800.0);
  s = fma(s, r2, 1.0 / 39916800.0);
  s = fma(s, r2, -1.0 / 362880.0);
  s = fma(s, r2, 1.0 / 5040.0);
  s = fma(s, r2, -1.0 / 120.0);
  s = fma(s, r2, 1.0 / 6.0);
  const double sin_r = fma(-r * r2, s, r);
  double c = 1.0 / 2432902008176640000.0;  // 1/20!
  c = fma(c, r2, -1.0 / 6402373705728000.0);
  c = fma(c, r2, 1.0 / 20922789888000.0);
  c = fma(c, r2, -1.0 / 87178291200.0);
  c = fma(c, r2, 1.0 / 479001600.0);
  c = fma(c, r2, -1.0 / 3628800.0);
  c = fma(c, r2, 1.0 / 40320.0);
  c = fma(c, r2, -1.0 / 720.0);
  c = fma(c, r2, 1.0 / 24.0);
  c = fma(c, r2, -0.5);
  const double cos_r = fma(c, r2, 1.0);
  // Quadrant q: (cos, sin) = (cos_r, sin_r), (−sin_r, cos_r), (−cos_r, −sin_r), (sin_r, −cos_r).
  const bool swap = (quadrant & 1) != 0;
  const double cos_value = swap ? sin_r : cos_r, sin_value = swap ? cos_r : sin_r;
  cos_out = static_cast<float>(quadrant == 1 || quadrant == 2 ? -cos_value : cos_value);
  sin_out = static_cast<float>(quadrant >= 2 ? -sin_value : sin_value);
}

}  // namespace dsv4::cuda::compressor
