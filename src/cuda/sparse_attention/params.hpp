// src/cuda/sparse_attention/params.hpp — what the host hands the sparse attention kernels.
//
// Plain C++ (no CUDA types), so the dispatcher in src/ops can fill it; everything is validated there.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/common/fast_divisor.hpp"
#include "dsv4/sparse_attention.hpp"

namespace dsv4::cuda {

// One paged pool of 584-byte entries (cache_format.hpp: AttentionEntryFormat).
struct AttentionPool {
  const std::uint8_t* pages = nullptr;  // [num_pages, page_bytes], 16-byte aligned
  std::int64_t page_bytes = 0;          // AttentionEntryFormat::page_bytes(entries_per_page)
  std::int32_t entries_per_page = 0;
  std::int64_t num_slots = 0;           // num_pages · entries_per_page; slots outside [0, num_slots) are masked
  FastDivisor page_divisor;             // of entries_per_page: a slot's page without a divide
};

struct SparseAttentionParams {
  const std::uint16_t* q = nullptr;            // bf16 [num_rows, num_heads, 512], 16-byte aligned
  AttentionPool window;                        // the raw-token (SWA) pool
  AttentionPool compressed;                    // the compressed pool
  const std::int32_t* window_slots = nullptr;  // [num_rows, window_width], −1 = none (may be null if width 0)
  const std::int32_t* compressed_slots = nullptr;  // [num_rows, compressed_width] (may be null if width 0)
  const float* attn_sink = nullptr;            // [num_heads]
  const float* rope_cos = nullptr;             // [num_rows, 32] or null (no inverse RoPE)
  const float* rope_sin = nullptr;             // [num_rows, 32] or null (null exactly when rope_cos is: src/ops checks)
  std::uint16_t* out = nullptr;                // bf16 [num_rows, num_heads, 512]
  float* lse = nullptr;                        // [num_rows, num_heads]
  std::int32_t num_rows = 0;
  std::int32_t num_heads = 0;
  std::int32_t window_width = 0;               // W: window slots per row
  std::int32_t compressed_width = 0;           // K: compressed slots per row
  float score_scale_log2 = 0;                  // softmax_scale · log2(e): scores are kept in base 2
  std::int32_t split_candidates = 0;           // candidates per chunk (multiple of 64, ≤ kMaxSplitCandidates)
  std::int32_t num_splits = 0;                 // ceil((W + K) / split_candidates), ≥ 1
  // Scratch for rows of more than one chunk (null when num_splits == 1), see workspace_layout():
  float* partial_out = nullptr;                // [num_rows, num_splits, num_heads, 512] unnormalized O
  float* partial_stats = nullptr;              // [num_rows, num_splits, num_heads, 2] (max in base 2, Σp)
  std::int32_t* arrivals = nullptr;            // [num_rows, ceil(num_heads / 16)] chunk counters, zero between calls
  // Grid order, set by launch_sparse_attention (changes no bit): blocks run chunk-major inside groups
  // of order_group (row, head tile) pairs; 1 = a row's chunks adjacent.
  std::int32_t order_group = 1;
  // Output-dim split of the 64-head tile (1, 2 or 4; 0 on entry = launch_sparse_attention picks it for
  // small grids; changes no bit): dim_split blocks share a (row, head tile, chunk), each computes the same scores
  // and probabilities and the P·V of 512 / dim_split output dims; they count their chunks apart
  // (arrival counters head0 / 16 + part, so it needs num_heads % 64 == 0).
  std::int32_t dim_split = 0;
  // Set by launch_sparse_attention (changes no bit): 1 = rows of 2..16 chunks on the 64-head tile merge
  // inside a thread-block cluster (set_cluster_merge), the workspace then unused; 2 = as 1, forced
  // (ClusterMerge::forced: also where the clusters need more waves than the plain grid).
  std::int32_t cluster_merge = 0;
  // Set by launch_sparse_attention (changes no bit): 1 = the 64-head tile's asymmetric consumers
  // (wgmma_kernel.cuh, kAsymmetric; switch DSV4_ATTENTION_ASYMMETRIC=1 or set_asymmetric_consumers).
  std::int32_t asymmetric = 0;
  // Set by launch_sparse_attention (changes no bit): 1 = the two 64-head tiles of a row (64 < H ≤ 128)
  // run as a 2-CTA cluster that shares the decode of every K block (wgmma_kernel.cuh, kPairDecode;
  // switch DSV4_ATTENTION_PAIR_DECODE or set_pair_decode).
  std::int32_t pair_decode = 0;
};

// Largest split_candidates the kernels' shared slot table holds (the public limit).
inline constexpr int kMaxSplitCandidates = dsv4::kMaxSplitCandidates;
inline constexpr int kCandidateBlock = 64;  // candidates per pipeline step; split_candidates is a multiple
// Most chunks one row may have: the merge keeps [64 heads][chunks] weights in shared memory.
inline constexpr int kMaxChunksPerRow = 552;

// Byte offsets of the three scratch arrays inside one workspace buffer.
struct WorkspaceLayout {
  std::size_t partial_out = 0, partial_stats = 0, arrivals = 0, total = 0;
};
inline WorkspaceLayout workspace_layout(std::int64_t num_rows, std::int64_t num_heads, std::int64_t num_splits) {
  WorkspaceLayout w;
  if (num_splits <= 1 || num_rows == 0) return w;
  const auto align = [](std::size_t x) { return (x + 255) / 256 * 256; };
  const std::size_t n = static_cast<std::size_t>(num_rows);
  w.partial_out = 0;
  w.partial_stats = align(n * num_splits * num_heads * 512 * sizeof(float));
  w.arrivals = w.partial_stats + align(n * num_splits * num_heads * 2 * sizeof(float));
  w.total = w.arrivals + align(n * ((num_heads + 15) / 16) * sizeof(std::int32_t));
  return w;
}

// Runs the kernels on `stream` (a cudaStream_t). Throws Error("device", ...) on a CUDA failure.
void launch_sparse_attention(const SparseAttentionParams& params, void* stream);

// The cluster merge: a row of 2..16 chunks on the 64-head tile is launched as thread-block clusters
// whose blocks merge their chunks through distributed shared memory, instead of float32 partials
// through the workspace and an arrival counter; the same arithmetic in the same order, so the same
// bytes. `automatic` (the default) takes it where clusters_keep_waves holds; `forced` takes it
// whenever the device can schedule the cluster size (tests); `off` never.
// DSV4_ATTENTION_CLUSTER_MERGE=0 / 1 (read once) selects off / forced (another value throws Error
// naming the variable); set_cluster_merge overrides it and returns the mode before the call.
enum class ClusterMerge { off, automatic, forced };
ClusterMerge set_cluster_merge(ClusterMerge mode);
ClusterMerge cluster_merge();
// How many clusters of `size` (2..16) chunk blocks of the 64-head tile in `output_parts` (1, 2 or 4)
// this device runs at once (cudaOccupancyMaxActiveClusters of that instantiation: the 4-part one has
// 512 threads, the others 384); 0 when it cannot schedule that size.
int attention_clusters_at_once(int size, int output_parts = 1);
// The automatic mode's rule: a grid of `grid_blocks` thread blocks (one per SM) launched as `clusters`
// clusters, at most `at_once` resident, must not take more rounds than the plain grid takes waves —
// a cluster's SMs sit in one GPC, so large clusters can leave SMs idle (B = 1, H = 128 at 10 chunks:
// 8 clusters of 10 ran in two rounds, 23.5 → 30.7 µs).
inline bool clusters_keep_waves(long long grid_blocks, long long clusters, int at_once, int sms) {
  if (at_once <= 0 || sms <= 0) return false;
  return (clusters + at_once - 1) / at_once <= (grid_blocks + sms - 1) / sms;
}
// The A/B switch of the asymmetric consumers (wgmma_kernel.cuh: the scorer computes S of all 64
// candidates and hands P to the follower; the same bytes, 2–6% faster on H200): on unless
// DSV4_ATTENTION_ASYMMETRIC=0 (read once; another value than 0 or 1 throws Error naming it) or turned
// off here (tests, benches).
// Returns the setting before the call.
bool set_asymmetric_consumers(bool on);
bool asymmetric_consumers();
// Whether the last launch_sparse_attention of this process ran the asymmetric kernel (tests: the
// switch must reach the launch).
bool last_launch_asymmetric();
void note_asymmetric_launch(bool asymmetric);  // the launcher's record of it
// The A/B switch of the pair decode (params.pair_decode; the same bytes; 7–10% faster at B = 128,
// H = 128 on H200): on unless DSV4_ATTENTION_PAIR_DECODE=0 (read once; another value than 0 or 1
// throws Error naming it) or turned off here. Returns the setting before the call.
// last_launch_pair_decode: whether the last launch ran it.
bool set_pair_decode(bool on);
bool pair_decode();
bool last_launch_pair_decode();
void note_pair_decode_launch(bool paired);  // the launcher's record of it
// The early launch (programmatic dependent launch, launch_tile.cuh: launch_blocks): the attention's
// blocks may start while the kernel before them finishes, and wait for it before reading any input;
// the same bytes. On unless DSV4_ATTENTION_EARLY_LAUNCH=0 (read once; another value than 0 or 1
// throws Error naming it) or turned off here. Returns the setting before the call.
// last_launch_early: whether the last launch of an attention kernel asked for it.
bool set_early_launch(bool on);
bool early_launch();
bool last_launch_early();
void note_early_launch(bool early);  // the launcher's record of it
// Whether the last launch_sparse_attention of this process merged in clusters (false when the mode
// was off, no row had 2..16 chunks, the device could not schedule the cluster size, or `automatic`
// kept the grid plain by clusters_keep_waves: the same bytes through the workspace). For tests: a
// fallback must not pass for the cluster path.
bool last_launch_merged_in_cluster();
void note_cluster_merge_launch(bool merged_in_cluster);  // the launcher's record of it

}  // namespace dsv4::cuda
