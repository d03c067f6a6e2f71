// src/cuda/common/fast_divisor.hpp — division by a divisor fixed for a launch, without a divide.
//
// Plain C++ (the host computes the multiplier when it fills a kernel's parameters); the device form,
// fast_divide, is defined for CUDA translation units only.
#pragma once

#include <cstdint>

#include "dsv4/cache_format.hpp"  // DSV4_HDC

namespace dsv4::cuda {

// Division of n < 2^32 by a divisor d fixed for the launch (1 ≤ d < 2^31), as one multiply-high,
// an add and two shifts (Granlund & Montgomery 1994, "Division by invariant integers using
// multiplication", Fig. 4.1): with l = ceil(log2 d) and m = floor(2^32·(2^l − d)/d) + 1,
// t = ⌊m·n / 2^32⌋ and n / d = (t + ((n − t) >> min(l, 1))) >> max(l − 1, 0), exact for every n < 2^32.
struct FastDivisor {
  std::uint32_t divisor = 1;
  std::uint32_t multiplier = 1;
  std::uint32_t shift1 = 0;  // min(l, 1)
  std::uint32_t shift2 = 0;  // max(l − 1, 0)
};

// The FastDivisor of d (1 ≤ d < 2^31; the caller checks).
constexpr FastDivisor make_fast_divisor(std::uint32_t d) {
  std::uint32_t l = 0;
  while ((std::uint64_t{1} << l) < d) ++l;
  FastDivisor f;
  f.divisor = d;
  f.multiplier = static_cast<std::uint32_t>((std::uint64_t{1} << 32) * ((std::uint64_t{1} << l) - d) / d + 1);
  f.shift1 = l < 1 ? l : 1;
  f.shift2 = l > 1 ? l - 1 : 0;
  return f;
}

// n / f.divisor with the multiply-high (host and device share it; __umulhi on the device).
DSV4_HDC std::uint32_t fast_divide_with(std::uint32_t n, const FastDivisor& f, std::uint32_t multiply_high) {
  return (multiply_high + ((n - multiply_high) >> f.shift1)) >> f.shift2;
}
constexpr std::uint32_t fast_divide_host(std::uint32_t n, const FastDivisor& f) {
  return fast_divide_with(n, f, static_cast<std::uint32_t>((std::uint64_t{f.multiplier} * n) >> 32));
}

#if defined(__CUDACC__)
// n / d.divisor for n < 2^32 on the device: ~4 instructions instead of a division.
__device__ __forceinline__ std::uint32_t fast_divide(std::uint32_t n, const FastDivisor& d) {
  return fast_divide_with(n, d, __umulhi(n, d.multiplier));
}
#endif

}  // namespace dsv4::cuda
