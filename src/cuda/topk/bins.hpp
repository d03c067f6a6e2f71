// src/cuda/topk/bins.hpp — the coarse histogram bins of the CUDA top-k (plain C++, host and device).
//
// A bin is a monotone function of the order key (dsv4/topk.hpp): 64 bins per octave of |score| over
// 2^-16 ≤ |score| < 2^16 on each side of zero (sign, 8 exponent bits and the top 6 mantissa bits of
// the float), smaller magnitudes in the two bins beside zero, larger ones (±inf too) in the two end
// bins, NaN (key 0) in bin 0. Because it is monotone, the keys of one bin form one interval, whose
// ends `first_key_of_bin` gives exactly: a walk compares keys against two bounds instead of binning
// every key again. The CPU test checks both functions against each other at every bin edge.
#pragma once

#include <cstdint>

#include "dsv4/formats.hpp"  // DSV4_HD

namespace dsv4::cuda::topk {

inline constexpr int kCoarseBins = 4096;
inline constexpr int kHalfBins = kCoarseBins / 2;              // bins of each sign
inline constexpr std::uint32_t kBinFloorCode = (127u - 16u) << 6;  // exponent of 2^-16, then 6 mantissa bits

// Bin (0..4095) of an order key. With u = key >> 17 (the sign-ordered exponent and top 6 mantissa
// bits), the bins of each sign are one clamped line in u — scores ≥ +0 (key's top bit set):
// 2048 + clamp(u − 0x4000 − kBinFloorCode, 0, 2047); negative ones (u = 0x3fff − their magnitude
// code): 2047 − clamp(0x3fff − u − kBinFloorCode, 0, 2047) = clamp(u − (0x3fff − kBinFloorCode −
// 2047), 0, 2047) — so a bin is a subtraction, a max and a min (the counting pass bins every key).
// Checked equal, over all 2^32 keys, to the form by magnitude (sign, ~key for negatives, clamp).
DSV4_HD int coarse_bin(std::uint32_t key) {
  constexpr int kPositiveOffset = 0x4000 + static_cast<int>(kBinFloorCode) - kHalfBins;
  constexpr int kNegativeOffset = 0x3fff - static_cast<int>(kBinFloorCode) - (kHalfBins - 1);
  const bool non_negative = (key >> 31) != 0;  // order keys of scores ≥ +0 have the top bit set
  const int low = non_negative ? kHalfBins : 0;
  const int bin = static_cast<int>(key >> 17) - (non_negative ? kPositiveOffset : kNegativeOffset);
  return bin < low ? low : bin > low + kHalfBins - 1 ? low + kHalfBins - 1 : bin;
}

// The smallest order key whose bin is ≥ `bin` (0..4096); 2^32 when there is none (bin 4096).
DSV4_HD std::uint64_t first_key_of_bin(int bin) {
  if (bin <= 0) return 0;
  if (bin < kHalfBins)  // negative scores: the largest magnitude code the bin holds, inverted
    return static_cast<std::uint32_t>(
        ~(((0x4000u + kBinFloorCode + static_cast<std::uint32_t>(kHalfBins - bin)) << 17) - 1u));
  if (bin == kHalfBins) return 0x80000000u;  // +0 and everything above
  if (bin < kCoarseBins) return (0x4000u + kBinFloorCode + static_cast<std::uint32_t>(bin - kHalfBins)) << 17;
  return std::uint64_t{1} << 32;
}

}  // namespace dsv4::cuda::topk
