// src/cuda/compressor/config.hpp — thread layouts of the compressor kernels (compile-time traits).
//
// A "unit" computes one work item (params.hpp). Lane l of a unit owns channels [4l, 4l + 4) of the
// c-wide entry, so every global access is one 16-byte vector and every reduction of the
// post-processing (RMSNorm sum, scale-block maxima, Walsh–Hadamard) runs across lanes.
// A two-pass unit may split the candidate rows of an event into kGroups groups of kLanes threads
// (C128: 128 rows per branch are too many for one thread's loads in flight); their partial
// softmax statistics are merged in shared memory in group order, so the result never depends on
// scheduling. Units smaller than 128 threads (c = 128: one warp) are packed 128 / unit per block.
#pragma once

namespace dsv4::cuda::compressor {

template <int kWidth_, int kGroups_>
struct UnitConfig {
  static constexpr int kWidth = kWidth_;                 // c: values per entry
  static constexpr int kGroups = kGroups_;               // candidate-row groups per unit
  static constexpr int kLanes = kWidth / 4;              // one float4 of channels per lane
  static constexpr int kWarpsPerGroup = kLanes / 32;
  static constexpr int kUnitThreads = kLanes * kGroups;
  static constexpr int kUnitsPerBlock = kUnitThreads >= 128 ? 1 : 128 / kUnitThreads;
  static constexpr int kBlockThreads = kUnitThreads * kUnitsPerBlock;
  // A unit of one warp synchronizes with __syncwarp; a larger unit is the whole block.
  static constexpr bool kWarpUnit = kUnitThreads == 32;

  static_assert(kWidth % 128 == 0, "a group is whole warps: c must be a multiple of 128");
  static_assert(kWarpUnit || kUnitsPerBlock == 1, "multi-warp units own their block");
};

// Two-pass (softmax over the stored rows of the window).
//   kLongWindow: more than kSingleGroupMaxCandidates candidates per event (C128): the rows are
//   split over groups so that a unit is 256 (c = 512) or 128 (c = 128) threads.
//   kBatch: candidate rows whose kv, score and ape vectors a thread loads before any math (12
//   registers each, plus addresses): 8 rows × 32 B × 384 threads = 96 KB in flight per SM, or
//   4 rows × 32 B × 512 threads = 64 KB for long windows.
//   kMinBlocksPerSM: 3 blocks of 128 threads (≤ 168 registers: a batch of 8 does not spill), or
//   512 threads of long-window units (≤ 128 registers).
constexpr int two_pass_groups(int width, bool long_window) { return !long_window ? 1 : width >= 512 ? 2 : 4; }

template <int kWidth, bool kLongWindow>
struct TwoPassConfig : UnitConfig<kWidth, two_pass_groups(kWidth, kLongWindow)> {
  static constexpr int kBatch = kLongWindow ? 4 : 8;
  static constexpr int kMinBlocksPerSM =
      kLongWindow ? 512 / UnitConfig<kWidth, two_pass_groups(kWidth, kLongWindow)>::kBlockThreads : 3;
};

// Online (running max / sum / mean per channel, one row after another).
template <int kWidth>
struct OnlineConfig : UnitConfig<kWidth, 1> {
  static constexpr int kBatch = 4;  // rows loaded ahead of the sequential recurrence
  static constexpr int kMinBlocksPerSM = 4;
};

// Candidates per event above which the two-pass kernel splits an event's rows over groups.
inline constexpr int kSingleGroupMaxCandidates = 16;

}  // namespace dsv4::cuda::compressor
