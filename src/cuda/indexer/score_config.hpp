// src/cuda/indexer/score_config.hpp — tile shapes and the shared-memory plan of the score kernel.
//
// A CTA owns a tile of 1 to 8 consecutive query rows and a chunk of key columns. Its 2 warpgroups
// take 64-key steps of the chunk in turn: each lane loads its share of the 64 keys straight into
// registers in the wgmma A-fragment order (16-byte loads, prefetched one step ahead), then every
// row of the tile reuses them against its 64 heads (wgmma B) in shared memory.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dsv4::cuda::indexer_score {

inline constexpr int kDim = 128;               // d_I the kernels support
inline constexpr int kWarpgroups = 2;
inline constexpr int kThreads = 128 * kWarpgroups;
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kRowsPerTile = 8;         // most rows sharing every key load of a CTA
inline constexpr int kKeysPerStep = 64;        // wgmma M: 16 keys per warp of a warpgroup
inline constexpr int kKeysPerCtaStep = kWarpgroups * kKeysPerStep;
inline constexpr int kHeadGroup = 64;          // wgmma N: heads per instruction
inline constexpr int kMaxHeads = 128;
inline constexpr int kKSteps = kDim / 32;      // wgmma k32 steps per dot product
inline constexpr int kChunkBytes = 16;         // one 16-byte chunk = 16 e4m3 values
inline constexpr int kChunksPerHead = kDim / kChunkBytes;
inline constexpr int kSwizzleAtom = 1024;      // 8 rows × 128 bytes: the 128-byte swizzle pattern
// FP4 values are widened to e4m3 relative to the entry's largest block scale; a block 2^d below it
// uses table d. From d = 17 on every magnitude (≤ 6·2^-17) rounds to zero in e4m3.
inline constexpr int kExponentTables = 32;

// Key columns per CTA: 2 to 16 CTA steps (a long prefill still balances; a short one fills the GPU).
inline constexpr int kMinKeyChunk = 2 * kKeysPerCtaStep;
inline constexpr int kMaxKeyChunk = 16 * kKeysPerCtaStep;
inline constexpr int kMinEntriesPerPage = 4;   // the kernels need a power of two ≥ 4 (16-byte aligned entries)
// Request starts a CTA counts in parallel (one round trip) to find its rows' requests; beyond this
// many requests it binary-searches (a round trip per halving).
inline constexpr int kStartsPerThread = 4;
inline constexpr int kMaxCountedRequests = kStartsPerThread * kThreads;

static_assert(kDim == kChunkBytes * kChunksPerHead && kChunksPerHead == 8, "a head row is one 128-byte swizzle row");
static_assert(kKeysPerStep == 64, "wgmma M is 64");

// Dynamic shared memory: queries [tile_rows][heads][128] e4m3 (128-byte swizzle, 1024-aligned: one
// extra atom of slack) | weights [tile_rows][heads] f32 (query scale folded in) | FP4 widening
// tables [kExponentTables] × 8 bytes.
constexpr std::size_t query_bytes(int heads, int tile_rows) { return static_cast<std::size_t>(tile_rows) * heads * kDim; }
constexpr std::size_t weight_bytes(int heads, int tile_rows) {
  return static_cast<std::size_t>(tile_rows) * heads * sizeof(float);
}
constexpr std::size_t tables_offset(int heads, int tile_rows) {
  return query_bytes(heads, tile_rows) + weight_bytes(heads, tile_rows);  // from the aligned query base
}
constexpr std::size_t shared_bytes(int heads, int tile_rows) {
  return kSwizzleAtom + tables_offset(heads, tile_rows) + kExponentTables * 8;
}

// How a launch is shaped (score.cu picks it, the kernel follows it).
struct ScoreShape {
  int key_chunk = 0;  // key columns per CTA, a multiple of kKeysPerCtaStep
  int tile_rows = 0;  // query rows per CTA, 1..kRowsPerTile
};

}  // namespace dsv4::cuda::indexer_score
