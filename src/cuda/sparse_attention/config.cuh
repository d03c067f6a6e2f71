// src/cuda/sparse_attention/config.cuh — tile shapes and the shared-memory plan of the mma.sync kernel.
//
// One thread block = one query row × a tile of 16 or 32 heads × one chunk of ≤ kMaxSplitCandidates
// (2560) candidates,
// walked in blocks of 64 candidates (the 64-head tile is the wgmma kernel, wgmma_kernel.cuh, with
// its own plan). Warps form a grid: kRowWarps along heads × 4 along the candidates (for Q·Kᵀ: 16
// candidates each) and, reusing the same warps, along the 512 output dims (for P·V: 128 dims each).
// The 4-wide column split is the same for both head tiles, which is what makes a row's bytes
// independent of which of the two the dispatcher picks.
#pragma once

#include <cstdint>

#include "cuda/sparse_attention/params.hpp"
#include "dsv4/cache_format.hpp"

namespace dsv4::cuda::sparse_attention {

using Entry = AttentionEntryFormat;
inline constexpr int kDim = Entry::kDim;                                   // 512
inline constexpr int kBlock = kCandidateBlock;                             // 64 candidates per step
inline constexpr int kColumnWarps = 4;
inline constexpr int kCandidatesPerWarp = kBlock / kColumnWarps;           // 16: two n-tiles of 8
inline constexpr int kDimsPerWarp = kDim / kColumnWarps;                   // 128: sixteen n-tiles of 8
inline constexpr int kMaxBlocksPerSplit = kMaxSplitCandidates / kBlock;    // 40
// Warps of the 16- and 32-head kernels: 4 MMA warps plus load warps (Traits::kWarps).
inline constexpr int kLoadingWarps = 8;
// Row pitch (bf16) of the Q and K tiles: 1040 B ≡ 16 mod 128, so the 8 row addresses of an
// ldmatrix phase hit 8 different 16-byte bank groups.
inline constexpr int kRowPitch = kDim + 8;
// Row pitch (bf16) of the probability tile: 144 B ≡ 16 mod 128, same reason.
inline constexpr int kProbPitch = kBlock + 8;
// One gathered block as it arrives: 64 × 576 data bytes, then 64 × 8-byte scale records.
inline constexpr int kRawDataBytes = kBlock * Entry::kDataBytes;                  // 36,864
inline constexpr int kRawStageBytes = kRawDataBytes + kBlock * Entry::kScaleBytes;  // 37,376
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

template <int kHeadTile_>
struct Traits {
  static constexpr int kHeadTile = kHeadTile_;
  static_assert(kHeadTile == 16 || kHeadTile == 32, "mma.sync head tiles of 16 or 32");
  static constexpr int kMTiles = kHeadTile >= 32 ? 2 : 1;  // 16-head MMA row tiles per warp
  static constexpr int kRowWarps = kHeadTile / (16 * kMTiles);
  // Warps that run the MMAs and the softmax: kRowWarps × 4 column warps (warps 0 .. kMathWarps−1).
  static constexpr int kMathWarps = kRowWarps * kColumnWarps;
  // Load warps that only gather and dequantize join them (exact work whose split over threads
  // changes no bit): a small batch is bound by one block's serial chain per 64 candidates, most of
  // it the dequantization, which these warps shorten.
  static constexpr int kWarps = kLoadingWarps;
  static constexpr int kThreads = 32 * kWarps;

  // Shared memory plan, bytes:
  static constexpr int kQ = 0;                                            // bf16 [kHeadTile][kRowPitch]
  static constexpr int kK = kQ + kHeadTile * kRowPitch * 2;               // bf16 [64][kRowPitch], K = V
  static constexpr int kRaw = kK + kBlock * kRowPitch * 2;                // 2 stages × kRawStageBytes
  static constexpr int kProb = kRaw + 2 * kRawStageBytes;                 // bf16 [kHeadTile][kProbPitch]
  static constexpr int kRowMax = kProb + kHeadTile * kProbPitch * 2;      // f32 [4][kHeadTile]
  static constexpr int kRowSum = kRowMax + kColumnWarps * kHeadTile * 4;  // f32 [4][kHeadTile]
  static constexpr int kSlots = kRowSum + kColumnWarps * kHeadTile * 4;   // i32 [kMaxSplitCandidates]: slot or −1
  static constexpr int kValid = kSlots + kMaxSplitCandidates * 4;         // u32 [kMaxBlocksPerSplit][2]: valid bits per block
  static constexpr int kLive = kValid + kMaxBlocksPerSplit * 2 * 4;       // i32 [kMaxBlocksPerSplit] live blocks, count, flag
  static constexpr int kSmemBytes = kLive + (kMaxBlocksPerSplit + 4) * 4;

  // The merge of a row's chunks keeps its weights [kHeadTile][chunks] in the K tile and raw stages.
  static constexpr int kMaxChunks = (kProb - kK) / (kHeadTile * 4);
  static_assert(kMaxChunks >= kMaxChunksPerRow, "the merge weights fit for every tile");
  static_assert(kK % 16 == 0 && kRaw % 16 == 0 && kProb % 16 == 0 && kRowMax % 16 == 0 && kSlots % 16 == 0 &&
                    kValid % 16 == 0 && kLive % 16 == 0,
                "16-byte aligned regions (cp.async, ldmatrix)");
  static_assert(kSmemBytes <= 227 * 1024, "fits the opt-in shared memory of one Hopper block");
};

}  // namespace dsv4::cuda::sparse_attention
