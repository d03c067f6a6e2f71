// src/cuda/compressor/e4m3_bits.hpp — e4m3_from (formats.hpp) for float inputs in integer
// operations on the bits, for the kernels' encoders (plain C++: host and device, so the CPU suite
// checks it against e4m3_from).
//
// e4m3_from reaches a normal code through frexp, a float subtraction and a rint (~50 instructions
// on the GPU); for |x| in [2^-6, 448) the code is the float's (biased exponent, top 3 mantissa
// bits) rounded to nearest even on the 20 dropped bits, with the exponent rebiased from 127 to 7.
// NaN, saturation and the e4m3 subnormal range take e4m3_from's own branches. Equal to
// e4m3_from<float> for all 2^32 inputs (checked exhaustively on the host when it was written;
// the CPU suite checks every input of the normal range and the boundaries of the others).
#pragma once

#include <cstdint>

#include "dsv4/formats.hpp"

namespace dsv4::cuda::compressor {

DSV4_HD std::uint8_t e4m3_from_bits(float x) {
  const std::uint32_t u = detail::float_bits(x);
  const std::uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude < 0x3c800000u || magnitude >= 0x43e00000u) return e4m3_from(x);  // |x| < 2^-6, ≥ 448, inf, NaN
  const std::uint32_t sign = (u >> 24) & 0x80u;
  // (biased exponent, 3 mantissa bits), rounded to nearest even on the 20 bits below (a carry
  // moves into the exponent); below 448 it stays ≤ 448's code 0x7e.
  const std::uint32_t rounded = (magnitude + 0x7ffffu + ((magnitude >> 20) & 1u)) >> 20;
  return static_cast<std::uint8_t>(sign | (rounded - ((127u - 7u) << 3)));
}

}  // namespace dsv4::cuda::compressor
