// src/cuda/indexer/score_config.hpp — tile shapes and the shared-memory plan of the score kernel.
//
// A CTA owns a tile of 1 to 8 consecutive query rows and a chunk of key columns. Its 2 warpgroups
// take 64-key steps of the chunk in turn: each lane fetches its share of the 64 keys in the wgmma
// A-fragment order, either into a shared-memory ring of 1 to 8 steps (cp.async; the lane reads its
// own bytes back) or straight into registers one step ahead; then every row of the tile reuses them
// against its 64 heads (wgmma B) in shared memory.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dsv4/cache_format.hpp"

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
inline constexpr int kMaxRingSteps = 8;        // cp.async.wait_group takes the depth as an immediate (0..7 pending)

static_assert(kDim == kChunkBytes * kChunksPerHead && kChunksPerHead == 8, "a head row is one 128-byte swizzle row");
static_assert(kKeysPerStep == 64, "wgmma M is 64");

// The key ring: one slot per warp and step, holding what the warp's lanes fetched for their two key
// rows (16w+g and 16w+g+8): chunk c of lane l at c·32·chunk + l·chunk (c = lo_g, hi_g, lo_g8, hi_g8;
// 16 bytes FP8, 8 bytes FP4 — consecutive lanes, consecutive addresses: no bank conflicts), then
// the two rows' 4-byte scale words at 4·32·chunk + row·128 + l·4.
constexpr int ring_chunk_bytes(IndexerKeyFormat format) { return format == IndexerKeyFormat::FP8 ? 16 : 8; }
constexpr int ring_scale_offset(IndexerKeyFormat format) { return 4 * 32 * ring_chunk_bytes(format); }
constexpr int ring_slot_bytes(IndexerKeyFormat format) { return ring_scale_offset(format) + 2 * 32 * 4; }
constexpr int ring_step_bytes(IndexerKeyFormat format) { return kWarps * ring_slot_bytes(format); }

// Dynamic shared memory: queries [tile_rows][heads][128] e4m3 (128-byte swizzle, 1024-aligned: one
// extra atom of slack) | weights [tile_rows][heads] f32 (query scale folded in) | FP4 widening
// tables [kExponentTables] × 8 bytes | key ring [ring_steps][kWarps] slots (16-byte aligned: every
// part before it is a multiple of 16 bytes).
constexpr std::size_t query_bytes(int heads, int tile_rows) { return static_cast<std::size_t>(tile_rows) * heads * kDim; }
constexpr std::size_t weight_bytes(int heads, int tile_rows) {
  return static_cast<std::size_t>(tile_rows) * heads * sizeof(float);
}
constexpr std::size_t tables_offset(int heads, int tile_rows) {
  return query_bytes(heads, tile_rows) + weight_bytes(heads, tile_rows);  // from the aligned query base
}
constexpr std::size_t ring_offset(int heads, int tile_rows) { return tables_offset(heads, tile_rows) + kExponentTables * 8; }
constexpr std::size_t shared_bytes(int heads, int tile_rows, IndexerKeyFormat format, int ring_steps) {
  return kSwizzleAtom + ring_offset(heads, tile_rows) + static_cast<std::size_t>(ring_steps) * ring_step_bytes(format);
}
static_assert(ring_slot_bytes(IndexerKeyFormat::FP8) % 16 == 0 && ring_slot_bytes(IndexerKeyFormat::FP4) % 16 == 0,
              "ring slots keep 16-byte alignment");

// How a launch is shaped (score.cu picks it, the kernel follows it).
struct ScoreShape {
  int key_chunk = 0;   // key columns per CTA, a multiple of kKeysPerCtaStep
  int tile_rows = 0;   // query rows per CTA, 1..kRowsPerTile
  int ring_steps = 0;  // key-ring depth in steps, 1..kMaxRingSteps; 0: registers, one step ahead
};

}  // namespace dsv4::cuda::indexer_score
