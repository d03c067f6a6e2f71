// src/cuda/sparse_attention/kernel.cuh — the sparse attention kernel for head tiles of 16 and 32
// (sm_90a, mma.sync bf16), and the pieces it shares with the 64-head wgmma kernel (wgmma_kernel.cuh):
// merge arithmetic, slot resolution, chunk planning, arrival counting and the chunk merge.
//
// Grid: one thread block per (query row, head tile, chunk of split_candidates candidates), in
// groups of p.order_group (row, head tile) pairs, chunk-major inside a group (launch.cu picks the
// group; 1 = a row's chunks adjacent). The order changes no bit.
// Load warps only gather and dequantize (config.cuh: Traits::kWarps).
// Per 64-candidate block of the chunk:
//   gather   16-byte cp.async of the 64 entries' 576 data bytes + 8 scale bytes (double-buffered,
//            one block ahead; −1 / out-of-pool slots zero-fill and are masked)
//   dequant  e4m3 · ue8m0 → bf16 by field shift (dequant.cuh), into one K(=V) tile
//   S = Q·Kᵀ mma.sync m16n8k16, scores in base 2, invalid candidates −inf
//   softmax  running max / sum per head, exchanged between the 4 column warps through shared memory
//   O += P·V mma.sync with P from shared memory and V = the K tile read transposed
// A row of one chunk normalizes in registers; a row of several chunks writes its unnormalized O
// and (max, sum) per chunk, and the last chunk to arrive merges them in chunk order. Both paths go
// through the same merge arithmetic (merge_weights / accumulate_chunk / finish_pair), so a row's
// bytes depend only on its own inputs and on split_candidates: no atomics touch the sums.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/common/ptx_sm90.cuh"
#include "cuda/common/spans.cuh"  // a probe build's kernel spans
#include "cuda/sparse_attention/config.cuh"
#include "cuda/sparse_attention/dequant.cuh"
#include "cuda/sparse_attention/ptx.cuh"

namespace dsv4::cuda::sparse_attention {

// ---- merge arithmetic shared by the one-chunk and the several-chunk paths ------------------------
// Every step is an explicitly rounded operation, so the compiler cannot contract the two paths
// differently.

struct RowNormalizer {
  float max_safe;   // max(chunk maxima, sink) in base 2, or 0 when that is −inf
  float inv_denom;  // 1 / (Σ_c l_c·2^(m_c − max) + 2^(sink − max)), 0 for an empty row
  float lse;        // natural-log log-sum-exp, sink included (−inf for an empty row)
};

__device__ __forceinline__ float chunk_weight(float chunk_max, float max_safe) {
  return chunk_max == -INFINITY ? 0.0f : ptx::exp2_approx(__fsub_rn(chunk_max, max_safe));
}

// The normalizer of a row from its maximum (base 2, over the chunks and the sink) and Σ_c l_c·w_c.
__device__ __forceinline__ RowNormalizer finish_normalizer(float max, float chunk_denominator, float sink2) {
  RowNormalizer r;
  r.max_safe = max == -INFINITY ? 0.0f : max;
  const float denom = __fadd_rn(chunk_denominator, ptx::exp2_approx(__fsub_rn(sink2, r.max_safe)));
  r.inv_denom = denom > 0.0f ? __frcp_rn(denom) : 0.0f;
  r.lse = denom > 0.0f ? __fmul_rn(__fadd_rn(r.max_safe, log2f(denom)), kLn2) : -INFINITY;
  return r;
}

// `stats(c)` returns chunk c's (max in base 2, Σp) as a float2; `sink2` is the sink in base 2.
template <class ChunkStats>
__device__ __forceinline__ RowNormalizer merge_weights(int num_chunks, ChunkStats stats, float sink2) {
  float m = sink2;
  for (int c = 0; c < num_chunks; ++c) m = fmaxf(m, stats(c).x);
  const float max_safe = m == -INFINITY ? 0.0f : m;
  float denom = 0.0f;
  for (int c = 0; c < num_chunks; ++c) {
    const float2 s = stats(c);
    const float w = chunk_weight(s.x, max_safe);
    if (w != 0.0f) denom = __fmaf_rn(s.y, w, denom);
  }
  return finish_normalizer(m, denom, sink2);
}

// merge_weights with one row's chunks spread over the 16 lanes of a half-warp (every lane of the warp
// calls it): lane c of the half holds chunk c's (max, sum) in `mine` (`chunk` = c; lanes c ≥
// num_chunks ≤ 16 hold anything). Every lane gets the normalizer, and `weight` its chunk's weight (0
// past num_chunks). The same operations in the same order: the maximum is exact in any order, the
// denominator is summed in chunk order by every lane from the shuffled values.
__device__ __forceinline__ RowNormalizer merge_weights_half_warp(int num_chunks, float2 mine, int chunk, float sink2,
                                                                 float& weight) {
  const bool live = chunk < num_chunks;
  float m = live ? fmaxf(sink2, mine.x) : sink2;
#pragma unroll
  for (int offset = 8; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset, 16));
  const float max_safe = m == -INFINITY ? 0.0f : m;
  weight = live ? chunk_weight(mine.x, max_safe) : 0.0f;
  float denom = 0.0f;
#pragma unroll
  for (int c = 0; c < 16; ++c) {
    const float w = __shfl_sync(0xffffffffu, weight, c, 16), l = __shfl_sync(0xffffffffu, mine.y, c, 16);
    if (c < num_chunks && w != 0.0f) denom = __fmaf_rn(l, w, denom);
  }
  return finish_normalizer(m, denom, sink2);
}

__device__ __forceinline__ float accumulate_chunk(float acc, float chunk_out, float weight) {
  return weight != 0.0f ? __fmaf_rn(chunk_out, weight, acc) : acc;
}

// Output dims (d, d+1), d even: normalize and round to bf16; when `rotate` (a RoPE pair, d ≥ 448,
// with tables) apply the inverse rotation (a, b) → (a·cos + b·sin, b·cos − a·sin) and round again.
// Returns bf16x2.
__device__ __forceinline__ std::uint32_t finish_pair(float acc0, float acc1, float inv_denom, bool rotate, float cos_v,
                                                     float sin_v) {
  float a = __bfloat162float(__float2bfloat16_rn(__fmul_rn(acc0, inv_denom)));
  float b = __bfloat162float(__float2bfloat16_rn(__fmul_rn(acc1, inv_denom)));
  if (rotate) {
    const float ra = __fmaf_rn(a, cos_v, __fmul_rn(b, sin_v));
    const float rb = __fmaf_rn(b, cos_v, -__fmul_rn(a, sin_v));
    a = ra;
    b = rb;
  }
  return ptx::pack_bf16x2(a, b);
}

// RoPE pair of output dim d (even, ≥ 448).
__device__ __forceinline__ int rope_pair(int d) { return (d - Entry::kNopeDim) / 2; }

// ---- pieces of the main loop ----------------------------------------------------------------

// Slot of candidate `c` (0 ≤ c < W + K) of `row`, or −1 when none / outside its pool.
__device__ __forceinline__ int resolve_slot(const SparseAttentionParams& p, std::int64_t row, int c) {
  std::int32_t slot;
  std::int64_t pool_slots;
  if (c < p.window_width) {
    slot = p.window_slots[row * p.window_width + c];
    pool_slots = p.window.num_slots;
  } else {
    slot = p.compressed_slots[row * p.compressed_width + (c - p.window_width)];
    pool_slots = p.compressed.num_slots;
  }
  return (slot >= 0 && slot < pool_slots) ? slot : -1;
}

// Addresses of candidate `c` of the chunk (slot ≥ 0): its 576 data bytes and its 8-byte scale record.
struct EntryAddress {
  const std::uint8_t* data;
  const std::uint8_t* scales;
};
__device__ __forceinline__ EntryAddress entry_address(const SparseAttentionParams& p, int chunk_begin, int c, int slot) {
  const bool in_window = chunk_begin + c < p.window_width;
  const std::uint8_t* pages = in_window ? p.window.pages : p.compressed.pages;
  const std::int64_t page_bytes = in_window ? p.window.page_bytes : p.compressed.page_bytes;
  const int per_page = in_window ? p.window.entries_per_page : p.compressed.entries_per_page;
  // slot / per_page by the launch's multiplier (exact for every slot < 2^31): no divide on the gather path.
  const int page = static_cast<int>(
      fast_divide(static_cast<std::uint32_t>(slot), in_window ? p.window.page_divisor : p.compressed.page_divisor));
  const int index = slot - page * per_page;
  const std::uint8_t* page_base = pages + static_cast<std::int64_t>(page) * page_bytes;
  return {page_base + Entry::data_offset(index), page_base + Entry::scale_offset(index, per_page)};
}

// Asks L2 for the lines of block `block` (one thread per candidate), two steps before its cp.async.
__device__ __forceinline__ void prefetch_block(const SparseAttentionParams& p, const int* s_slots, int chunk_begin,
                                               int block, int tid) {
  if (tid >= kBlock) return;
  const int c = block * kBlock + tid;
  const int slot = s_slots[c];
  if (slot < 0) return;
  const EntryAddress a = entry_address(p, chunk_begin, c, slot);
#pragma unroll
  for (int line = 0; line < Entry::kDataBytes / 128; ++line) ptx::prefetch_l2(a.data + line * 128);
  ptx::prefetch_l2(a.data + Entry::kDataBytes - 1);
  ptx::prefetch_l2(a.scales);
}

// Issues the cp.async copies of block `block` (64 candidates) of the chunk into `stage`
// ([64 × 576 data][64 × 8 scales]). Four threads per candidate, nine 16-byte pieces each.
template <int kThreads>
__device__ __forceinline__ void gather_block(const SparseAttentionParams& p, const int* s_slots /*[kMaxSplitCandidates]*/,
                                             int chunk_begin, int block, std::uint8_t* stage, int tid) {
  constexpr int kThreadsPerEntry = 4;
  constexpr int kPieces = Entry::kDataBytes / 16;  // 36
  const int sub = tid % kThreadsPerEntry;
  for (int e = tid / kThreadsPerEntry; e < kBlock; e += kThreads / kThreadsPerEntry) {
    const int c = block * kBlock + e;
    const int slot = s_slots[c];
    const bool valid = slot >= 0;
    // Masked entries read nothing; the source address only has to be a legal pointer (q).
    const std::uint8_t* fallback = reinterpret_cast<const std::uint8_t*>(p.q);
    const EntryAddress a = valid ? entry_address(p, chunk_begin, c, slot) : EntryAddress{fallback, fallback};
    const std::uint8_t* data = a.data;
    const std::uint8_t* scales = a.scales;
    std::uint8_t* dst = stage + e * Entry::kDataBytes;
#pragma unroll
    for (int k = sub; k < kPieces; k += kThreadsPerEntry) ptx::cp_async_16(dst + k * 16, data + k * 16, valid);
    if (sub == 0) ptx::cp_async_8(stage + kRawDataBytes + e * Entry::kScaleBytes, scales, valid);
  }
}

// Raw stage → bf16 K tile [64][kRowPitch]. Each job converts 16 e4m3 codes (one scale) into two
// 16-byte stores, or copies 8 RoPE bf16. Jobs go in groups whose loads are all issued before any
// conversion, so the shared-memory latency is paid once per group (smaller groups at 512 threads,
// where registers are tighter). Zero-filled (masked) entries decode to zeros.
template <int kThreads>
__device__ __forceinline__ void dequantize_block(const std::uint8_t* stage, std::uint16_t* s_k, int tid) {
  constexpr int kCodeUnits = Entry::kNopeDim / 16;                 // 28 per candidate
  constexpr int kRopeUnits = Entry::kRopeDim * 2 / 16;             // 8 per candidate
  constexpr int kCodeJobs = kBlock * kCodeUnits, kRopeJobs = kBlock * kRopeUnits;
  constexpr int kCodeIters = (kCodeJobs + kThreads - 1) / kThreads;
  constexpr int kGroup = 7;  // jobs whose loads are issued together
#pragma unroll
  for (int g = 0; g < kCodeIters; g += kGroup) {
    uint4 codes[kGroup];
    std::uint32_t scales[kGroup];
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      const int job = tid + (g + i) * kThreads;
      if (g + i < kCodeIters && (kCodeJobs % kThreads == 0 || job < kCodeJobs)) {
        const int e = job / kCodeUnits, u = job % kCodeUnits;
        codes[i] = *reinterpret_cast<const uint4*>(stage + e * Entry::kDataBytes + u * 16);
        scales[i] = stage[kRawDataBytes + e * Entry::kScaleBytes + u / (Entry::kQuantBlock / 16)];
      }
    }
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      const int job = tid + (g + i) * kThreads;
      if (g + i < kCodeIters && (kCodeJobs % kThreads == 0 || job < kCodeJobs)) {
        const int e = job / kCodeUnits, u = job % kCodeUnits;
        uint4 lo, hi;
        dequantize_e4m3x16(codes[i], scales[i], lo, hi);
        uint4* dst = reinterpret_cast<uint4*>(s_k + e * kRowPitch + u * 16);
        dst[0] = lo;
        dst[1] = hi;
      }
    }
  }
  for (int job = tid; job < kRopeJobs; job += kThreads) {
    const int e = job / kRopeUnits, u = job % kRopeUnits;
    *reinterpret_cast<uint4*>(s_k + e * kRowPitch + Entry::kNopeDim + u * 8) =
        *reinterpret_cast<const uint4*>(stage + e * Entry::kDataBytes + Entry::kNopeDim + u * 16);
  }
}

// The last chunk of a row to arrive merges every chunk's (O, max, sum) in chunk order and writes the
// row's output and lse. Kept out of line: it runs once per row and tile, after the O fragments are
// dead, and its registers should not weigh on the main loop's allocation.
// `s_weights` has room for [kHeadTile][num_splits] floats, `s_inv` for [kHeadTile] (shared memory no
// longer in use); threads 0 .. kThreads−1 take part and `sync` is their barrier. Only output dims
// [dim_begin, dim_begin + dims) are merged (a multiple of 4; a dim-split block merges its own slice);
// `write_lse` for the one block per (row, head tile) that writes lse.
template <int kHeadTile, int kThreads, class Sync>
__device__ __noinline__ void merge_chunks(const SparseAttentionParams& p, std::int64_t row, int head0,
                                          float* s_weights, float* s_inv, Sync sync, int dim_begin = 0,
                                          int dims = kDim, bool write_lse = true) {
  const int tid = threadIdx.x;
  const std::int64_t chunk_base = row * p.num_splits;  // [row][chunk][head]
  const std::int64_t out_row = row * p.num_heads;
  const float* rope_cos = p.rope_cos != nullptr ? p.rope_cos + row * (Entry::kRopeDim / 2) : nullptr;
  const float* rope_sin = p.rope_sin != nullptr ? p.rope_sin + row * (Entry::kRopeDim / 2) : nullptr;
  // Per head: the merge weights of every chunk into shared memory. One thread per head reads the
  // chunks' statistics in turn; with more chunks than the rounds of half-warps it takes, one half-warp
  // per head, lane c reading chunk c's (the reads of a round in flight at once; the same operations as
  // merge_weights, as in the cluster merge). Measured (H200, 64 heads: 4 rounds): 10 chunks 22.8 →
  // 21.4 µs, 2 chunks +0.6..1 µs with half-warps; not measured on the 16- and 32-head tiles (1 and 2
  // rounds), which take it from 2 and 3 chunks.
  const int tile_heads = min(kHeadTile, p.num_heads - head0);
  const int num_chunks = p.num_splits;
  constexpr int kLanes = 16;
  static_assert(kThreads % 32 == 0, "whole warps take part in the half-warp rounds");
  const int rounds = (tile_heads * kLanes + kThreads - 1) / kThreads;
  if (num_chunks <= kLanes && rounds < num_chunks) {
    for (int base = 0; base < tile_heads * kLanes; base += kThreads) {  // uniform: every lane takes part
      const int i = (base + tid) / kLanes, c = (base + tid) % kLanes;
      const int local = min(i, tile_heads - 1), h = head0 + local;
      const float2 mine =
          c < num_chunks
              ? __ldcg(reinterpret_cast<const float2*>(p.partial_stats + ((chunk_base + c) * p.num_heads + h) * 2))
              : make_float2(0.0f, 0.0f);
      float weight;
      const RowNormalizer n = merge_weights_half_warp(num_chunks, mine, c, __fmul_rn(p.attn_sink[h], kLog2e), weight);
      if (i < tile_heads) {
        if (c < num_chunks) s_weights[i * num_chunks + c] = weight;
        if (c == 0) {
          s_inv[i] = n.inv_denom;
          if (write_lse) p.lse[out_row + h] = n.lse;
        }
      }
    }
  } else if (tid < tile_heads) {
    const int h = head0 + tid;
    const float* stats = p.partial_stats + (chunk_base * p.num_heads + h) * 2;  // chunk c at + c·num_heads·2
    const auto chunk_stats = [&](int c) {
      return __ldcg(reinterpret_cast<const float2*>(stats + static_cast<std::int64_t>(c) * p.num_heads * 2));
    };
    const RowNormalizer n = merge_weights(num_chunks, chunk_stats, __fmul_rn(p.attn_sink[h], kLog2e));
    for (int c = 0; c < num_chunks; ++c) s_weights[tid * num_chunks + c] = chunk_weight(chunk_stats(c).x, n.max_safe);
    s_inv[tid] = n.inv_denom;
    if (write_lse) p.lse[out_row + h] = n.lse;
  }
  sync();

  // Every output element: Σ_c weight_c · O_c in chunk order. kBatch float4 per thread at a time; the
  // loads of chunk c + 1 are issued before chunk c is accumulated, so the chunks' memory round trips
  // overlap (a row alone waits on this merge).
  constexpr int kBatch = 8;
  const int quads = dims / 4;  // float4 per head row in the merged slice
  const int total_quads = tile_heads * quads;
  const std::int64_t chunk_stride = static_cast<std::int64_t>(p.num_heads) * kDim;  // floats from chunk c to c + 1
  for (int first = tid; first < total_quads; first += kThreads * kBatch) {
    const float* src[kBatch];  // element b of chunk 0: float4 at src[b] + c · chunk_stride for chunk c
    int weight_row[kBatch];    // s_weights index of element b's head, chunk 0
    float4 acc[kBatch], o[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = min(first + b * kThreads, total_quads - 1);  // past the end: a valid, unused address
      const int h = i / quads, d = dim_begin + (i % quads) * 4;
      src[b] = p.partial_out + (chunk_base * p.num_heads + head0 + h) * kDim + d;
      weight_row[b] = h * num_chunks;
      acc[b] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      o[b] = __ldcg(reinterpret_cast<const float4*>(src[b]));
    }
    for (int c = 0; c < num_chunks; ++c) {
      float4 next[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        next[b] = c + 1 < num_chunks ? __ldcg(reinterpret_cast<const float4*>(src[b] + (c + 1) * chunk_stride)) : o[b];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const float w = s_weights[weight_row[b] + c];
        acc[b].x = accumulate_chunk(acc[b].x, o[b].x, w);
        acc[b].y = accumulate_chunk(acc[b].y, o[b].y, w);
        acc[b].z = accumulate_chunk(acc[b].z, o[b].z, w);
        acc[b].w = accumulate_chunk(acc[b].w, o[b].w, w);
        o[b] = next[b];
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = first + b * kThreads;
      if (i >= total_quads) continue;
      const int h = i / quads, d = dim_begin + (i % quads) * 4;
      std::uint16_t* out = p.out + (out_row + head0 + h) * kDim + d;
      const bool rotate = rope_cos != nullptr && d >= Entry::kNopeDim;
      const int pair = rotate ? rope_pair(d) : 0;
      *reinterpret_cast<uint2*>(out) = make_uint2(
          finish_pair(acc[b].x, acc[b].y, s_inv[h], rotate, rotate ? rope_cos[pair] : 1.0f, rotate ? rope_sin[pair] : 0.0f),
          finish_pair(acc[b].z, acc[b].w, s_inv[h], rotate, rotate ? rope_cos[pair + 1] : 1.0f,
                      rotate ? rope_sin[pair + 1] : 0.0f));
    }
  }
}

// ---- the work of one thread block, shared by the mma.sync and the wgmma kernels ---------------------

struct ChunkWork {
  std::int64_t row;  // query row
  int head0;         // first head of the tile
  int chunk;         // chunk of split_candidates candidates
  int chunk_begin;   // its first candidate (0 ≤ c < W + K)
  int chunk_count;   // its candidates (≤ split_candidates; 0 for a chunk past the row's end)
  int num_blocks;    // its 64-candidate blocks
};

// Block `block` → (chunk, row · head_tiles + head tile): chunk-major inside groups of order_group
// pairs (`block` is blockIdx.x, or blockIdx.x / dim_split in a dim-split launch).
__device__ __forceinline__ ChunkWork chunk_of_block(const SparseAttentionParams& p, int head_tile,
                                                    unsigned block = blockIdx.x) {
  const int head_tiles = (p.num_heads + head_tile - 1) / head_tile;
  const unsigned tile_rows = static_cast<unsigned>(p.num_rows) * static_cast<unsigned>(head_tiles);
  const unsigned splits = static_cast<unsigned>(p.num_splits), order_group = static_cast<unsigned>(p.order_group);
  const unsigned group_first = block / (order_group * splits) * order_group;
  const unsigned group_size = min(order_group, tile_rows - group_first);
  const unsigned in_group = block - group_first * splits;
  const int tile_row = static_cast<int>(group_first + in_group % group_size);
  ChunkWork w;
  w.chunk = static_cast<int>(in_group / group_size);
  w.head0 = (tile_row % head_tiles) * head_tile;
  w.row = tile_row / head_tiles;
  const int total = p.window_width + p.compressed_width;
  w.chunk_begin = w.chunk * p.split_candidates;
  w.chunk_count = max(0, min(p.split_candidates, total - w.chunk_begin));
  w.num_blocks = (w.chunk_count + kBlock - 1) / kBlock;
  return w;
}

// The chunk's slot table (s_slots [kMaxSplitCandidates]: slot or −1), the valid-candidate bits of each
// block (s_valid [kMaxBlocksPerSplit][2]) and the blocks with any valid candidate (s_live, their count
// in s_live[kMaxBlocksPerSplit]).
// Blocks without a valid candidate are skipped: they would change nothing. Returns the live count.
// Every thread issues all its slot loads before it stores any (one memory round trip, not one per
// kThreads candidates), then calls `after_loads_issued` (the caller's Q copy: queued behind the small
// slot loads instead of in front of them). One pass covers the table because src/ops keeps
// split_candidates a multiple of 64 and ≤ kMaxSplitCandidates (so num_blocks · 64 ≤ kPerThread · kThreads).
template <int kThreads, class AfterLoadsIssued>
__device__ __forceinline__ int plan_chunk(const SparseAttentionParams& p, const ChunkWork& w, int* s_slots,
                                          std::uint32_t* s_valid, int* s_live, AfterLoadsIssued after_loads_issued) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  constexpr int kPerThread = (kMaxSplitCandidates + kThreads - 1) / kThreads;
  const int table_size = w.num_blocks * kBlock;
  int slot[kPerThread];
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int i = tid + k * kThreads;
    slot[k] = i < w.chunk_count ? resolve_slot(p, w.row, w.chunk_begin + i) : -1;
  }
  after_loads_issued();
#pragma unroll
  for (int k = 0; k < kPerThread; ++k)
    if (tid + k * kThreads < table_size) s_slots[tid + k * kThreads] = slot[k];
  __syncthreads();
  for (int b = warp; b < w.num_blocks; b += kThreads / 32) {  // one warp per block: its valid-candidate bits
    const std::uint32_t lo = __ballot_sync(0xffffffffu, s_slots[b * kBlock + lane] >= 0);
    const std::uint32_t hi = __ballot_sync(0xffffffffu, s_slots[b * kBlock + 32 + lane] >= 0);
    if (lane == 0) s_valid[2 * b] = lo, s_valid[2 * b + 1] = hi;
  }
  __syncthreads();
  if (tid == 0) {
    int live = 0;
    for (int b = 0; b < w.num_blocks; ++b)
      if ((s_valid[2 * b] | s_valid[2 * b + 1]) != 0) s_live[live++] = b;
    s_live[kMaxBlocksPerSplit] = live;
  }
  __syncthreads();
  return s_live[kMaxBlocksPerSplit];
}

// Barriers of the threads that finish a chunk: the whole block, or (warp-specialized kernel) the
// kThreads threads 0 .. kThreads−1 through named barrier kId.
struct BlockSync {
  __device__ void operator()() const { __syncthreads(); }
};
template <int kThreads, int kId>
struct GroupSync {
  __device__ void operator()() const { ptx::barrier_sync(kId, kThreads); }
};

// Called by every finishing thread (thread 0 among them) after they wrote the chunk's partials: true
// (in each of them) for the block that arrives last for its (row, head tile), which then merges.
// `s_flag` is shared scratch. `part` (< 4, a dim-split block's slice) picks one of the tile's counters.
template <class Sync>
__device__ __forceinline__ bool last_to_arrive(const SparseAttentionParams& p, std::int64_t row, int head0,
                                               int& s_flag, Sync sync, int part = 0) {
  __threadfence();
  sync();
  int* arrivals = p.arrivals + row * ((p.num_heads + 15) / 16) + head0 / 16 + part;
  if (threadIdx.x == 0) {
    __threadfence();
    s_flag = atomicAdd(arrivals, 1) == p.num_splits - 1;
  }
  sync();
  const bool last = s_flag != 0;
  if (last) __threadfence();
  return last;
}

// The merging block leaves the counter clean for the next call (every chunk has arrived).
__device__ __forceinline__ void reset_arrivals(const SparseAttentionParams& p, std::int64_t row, int head0,
                                               int part = 0) {
  if (threadIdx.x == 0) p.arrivals[row * ((p.num_heads + 15) / 16) + head0 / 16 + part] = 0;
}

// ---- the kernel -------------------------------------------------------------------------------

template <int kHeadTile>
__global__ void __launch_bounds__(Traits<kHeadTile>::kThreads, 1)
    sparse_attention_kernel(const __grid_constant__ SparseAttentionParams p) {
  using T = Traits<kHeadTile>;
  constexpr int kMT = T::kMTiles;
  constexpr int kThreads = T::kThreads;
  ptx::allow_dependent_launch();  // the next kernel may take free SMs now (it waits for this one's end)
  extern __shared__ __align__(128) std::uint8_t smem[];
  auto* s_q = reinterpret_cast<std::uint16_t*>(smem + T::kQ);         // [kHeadTile][kRowPitch] bf16
  auto* s_k = reinterpret_cast<std::uint16_t*>(smem + T::kK);         // [64][kRowPitch] bf16
  std::uint8_t* s_raw = smem + T::kRaw;                               // [2][kRawStageBytes]
  auto* s_prob = reinterpret_cast<std::uint16_t*>(smem + T::kProb);   // [kHeadTile][kProbPitch] bf16
  auto* s_row_max = reinterpret_cast<float*>(smem + T::kRowMax);      // [4][kHeadTile]
  auto* s_row_sum = reinterpret_cast<float*>(smem + T::kRowSum);      // [4][kHeadTile]
  auto* s_slots = reinterpret_cast<int*>(smem + T::kSlots);           // [kMaxSplitCandidates]
  auto* s_valid = reinterpret_cast<std::uint32_t*>(smem + T::kValid); // [kMaxBlocksPerSplit][2] valid bits of each block
  auto* s_live = reinterpret_cast<int*>(smem + T::kLive);             // [kMaxBlocksPerSplit] live block numbers
  int& s_is_last = s_live[kMaxBlocksPerSplit + 1];

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int row_warp = warp / kColumnWarps, col_warp = warp % kColumnWarps;
  // Warp-uniform: load warps join the gather, the dequantization and the barriers only.
  const bool math_warp = warp < T::kMathWarps;
  const int group = lane / 4, quad = lane % 4;  // mma fragment coordinates

  const ChunkWork work = chunk_of_block(p, kHeadTile);
  const int head0 = work.head0, chunk = work.chunk, chunk_begin = work.chunk_begin;
  const std::int64_t row = work.row;
  // Launched early (programmatic dependent launch, launch_tile.cuh): every input is read after this.
  ptx::wait_for_prerequisite_grids();
  spans::stamp(spans::kAttention);

  // The chunk's plan, and the Q tile (heads past num_heads zero-filled) once the slot loads are out.
  const int num_live = plan_chunk<kThreads>(p, work, s_slots, s_valid, s_live, [&] {
    for (int i = tid; i < kHeadTile * (kDim / 8); i += kThreads) {
      const int h = i / (kDim / 8), k = i % (kDim / 8);
      const bool valid = head0 + h < p.num_heads;
      const std::uint16_t* src = valid ? p.q + ((row * p.num_heads + head0 + h) * kDim + k * 8) : p.q;
      ptx::cp_async_16(s_q + h * kRowPitch + k * 8, src, valid);
    }
  });
  if (num_live > 0) gather_block<kThreads>(p, s_slots, chunk_begin, s_live[0], s_raw, tid);
  ptx::cp_async_commit();
  if (num_live > 1) prefetch_block(p, s_slots, chunk_begin, s_live[1], tid);

  // Per thread: rows (head within tile) of its fragments and the running softmax state.
  int frag_row[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) frag_row[mt][half] = (row_warp * kMT + mt) * 16 + half * 8 + group;
  float run_max[kMT][2], run_sum[kMT][2];
  float acc_o[kMT][kDimsPerWarp / 8][4];  // O fragments: 16 n-tiles of 8 output dims
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) run_max[mt][half] = -INFINITY, run_sum[mt][half] = 0.0f;
#pragma unroll
    for (int nt = 0; nt < kDimsPerWarp / 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc_o[mt][nt][i] = 0.0f;
  }

  for (int it = 0; it < num_live; ++it) {
    const int block = s_live[it];
    std::uint8_t* stage = s_raw + (it % 2) * kRawStageBytes;
    ptx::cp_async_wait_all();
    __syncthreads();  // block `it` landed everywhere; the K and P tiles of the last block are free
    if (it + 1 < num_live)
      gather_block<kThreads>(p, s_slots, chunk_begin, s_live[it + 1], s_raw + ((it + 1) % 2) * kRawStageBytes, tid);
    ptx::cp_async_commit();
    if (it + 2 < num_live) prefetch_block(p, s_slots, chunk_begin, s_live[it + 2], tid);
    dequantize_block<kThreads>(stage, s_k, tid);
    __syncthreads();

    // S = Q·Kᵀ for this warp's heads × its 16 candidates, over all 512 dims.
    float acc_s[kMT][2][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc_s[mt][nt][i] = 0.0f;
    if (math_warp) {
      // Per-lane ldmatrix row addresses (32-bit shared); the loops only add immediates.
      const std::uint32_t k_rows =
          ptx::smem_address(s_k + (col_warp * kCandidatesPerWarp + lane % 8 + (lane / 16) * 8) * kRowPitch + ((lane / 8) % 2) * 8);
      const std::uint32_t q_rows = ptx::smem_address(s_q + (row_warp * kMT * 16 + lane % 16) * kRowPitch + (lane / 16) * 8);
#pragma unroll 4
      for (int kk = 0; kk < kDim / 16; ++kk) {
        std::uint32_t b[4];
        ptx::ldmatrix_x4(b, k_rows + kk * 32);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          std::uint32_t a[4];
          ptx::ldmatrix_x4(a, q_rows + mt * 16 * kRowPitch * 2 + kk * 32);
          ptx::mma_bf16_16816(acc_s[mt][0], a, b[0], b[1]);
          ptx::mma_bf16_16816(acc_s[mt][1], a, b[2], b[3]);
        }
      }

      // Scores in base 2, masked; the block maximum of each head across the 4 column warps.
      // This warp's 16 candidates lie in one half of the block's 64 valid bits.
      const std::uint32_t valid_bits =
          s_valid[2 * block + col_warp * kCandidatesPerWarp / 32] >> (col_warp * kCandidatesPerWarp % 32);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float m = -INFINITY;
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const int cand = nt * 8 + quad * 2 + j;  // within the warp's 16
              float& s = acc_s[mt][nt][half * 2 + j];
              s = (valid_bits >> cand) & 1u ? __fmul_rn(s, p.score_scale_log2) : -INFINITY;
              m = fmaxf(m, s);
            }
          }
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
          if (quad == 0) s_row_max[col_warp * kHeadTile + frag_row[mt][half]] = m;
        }
      }
    }  // math_warp
    __syncthreads();

    // Probabilities (bf16, to shared memory for P·V) and their per-warp sums.
    float rescale[kMT][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) rescale[mt][0] = rescale[mt][1] = 1.0f;
    if (math_warp) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = frag_row[mt][half];
          float block_max = s_row_max[r];
#pragma unroll
          for (int w = 1; w < kColumnWarps; ++w) block_max = fmaxf(block_max, s_row_max[w * kHeadTile + r]);
          const float new_max = fmaxf(run_max[mt][half], block_max);
          const float max_safe = new_max == -INFINITY ? 0.0f : new_max;
          rescale[mt][half] = ptx::exp2_approx(__fsub_rn(run_max[mt][half], max_safe));
          run_max[mt][half] = new_max;
          float sum = 0.0f;
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            const std::uint32_t pr = ptx::pack_bf16x2(ptx::exp2_approx(__fsub_rn(acc_s[mt][nt][half * 2], max_safe)),
                                                      ptx::exp2_approx(__fsub_rn(acc_s[mt][nt][half * 2 + 1], max_safe)));
            const int cand = col_warp * kCandidatesPerWarp + nt * 8 + quad * 2;
            *reinterpret_cast<std::uint32_t*>(s_prob + r * kProbPitch + cand) = pr;
            // Sum what P·V will use: the bf16-rounded probabilities.
            sum = __fadd_rn(sum, __uint_as_float(pr << 16));
            sum = __fadd_rn(sum, __uint_as_float(pr & 0xffff0000u));
          }
          sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 1));
          sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 2));
          if (quad == 0) s_row_sum[col_warp * kHeadTile + r] = sum;
        }
      }
    }  // math_warp
    __syncthreads();
    if (!math_warp) continue;

    bool any_rescale = false;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = frag_row[mt][half];
        float block_sum = 0.0f;
#pragma unroll
        for (int w = 0; w < kColumnWarps; ++w) block_sum = __fadd_rn(block_sum, s_row_sum[w * kHeadTile + r]);
        run_sum[mt][half] = __fmaf_rn(run_sum[mt][half], rescale[mt][half], block_sum);
        any_rescale |= rescale[mt][half] != 1.0f;
      }
    }
    if (__any_sync(0xffffffffu, any_rescale)) {  // x·1 = x exactly: skipping changes no bit
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
#pragma unroll
          for (int nt = 0; nt < kDimsPerWarp / 8; ++nt) {
            acc_o[mt][nt][half * 2] = __fmul_rn(acc_o[mt][nt][half * 2], rescale[mt][half]);
            acc_o[mt][nt][half * 2 + 1] = __fmul_rn(acc_o[mt][nt][half * 2 + 1], rescale[mt][half]);
          }
        }
      }
    }

    // O += P·V for this warp's heads × its 128 output dims; V is the K tile read transposed.
    const std::uint32_t v_rows = ptx::smem_address(
        s_k + (lane % 8 + ((lane / 8) % 2) * 8) * kRowPitch + col_warp * kDimsPerWarp + (lane / 16) * 8);
    const std::uint32_t p_rows = ptx::smem_address(s_prob + (row_warp * kMT * 16 + lane % 16) * kProbPitch + (lane / 16) * 8);
#pragma unroll 1  // unrolling this too would hoist 32 transposed loads and spill
    for (int kk = 0; kk < kBlock / 16; ++kk) {
      std::uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) ptx::ldmatrix_x4(a[mt], p_rows + mt * 16 * kProbPitch * 2 + kk * 32);
#pragma unroll
      for (int np = 0; np < kDimsPerWarp / 16; ++np) {
        std::uint32_t b[4];
        ptx::ldmatrix_x4_trans(b, v_rows + kk * 16 * kRowPitch * 2 + np * 32);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          ptx::mma_bf16_16816(acc_o[mt][2 * np], a[mt], b[0], b[1]);
          ptx::mma_bf16_16816(acc_o[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }
  }
  ptx::cp_async_wait_all();  // the Q copies when no block was live

  const std::int64_t out_row = row * p.num_heads;
  const float* rope_cos = p.rope_cos != nullptr ? p.rope_cos + row * (Entry::kRopeDim / 2) : nullptr;
  const float* rope_sin = p.rope_sin != nullptr ? p.rope_sin + row * (Entry::kRopeDim / 2) : nullptr;

  if (p.num_splits == 1) {  // the whole row in this block: normalize from registers
    if (!math_warp) return;
    float weight[kMT][2], inv_denom[kMT][2];  // the row normalizers first, then the stores
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int h = head0 + frag_row[mt][half];
        weight[mt][half] = 0.0f, inv_denom[mt][half] = 0.0f;
        if (h >= p.num_heads) continue;
        const float m = run_max[mt][half], l = run_sum[mt][half];
        const RowNormalizer n =
            merge_weights(1, [&](int) { return make_float2(m, l); }, __fmul_rn(p.attn_sink[h], kLog2e));
        weight[mt][half] = chunk_weight(m, n.max_safe);
        inv_denom[mt][half] = n.inv_denom;
        if (col_warp == 0 && quad == 0) p.lse[out_row + h] = n.lse;
      }
    }
    // The RoPE dims 448..511 are the last warp column's n-tiles 8..15: this thread's 8 pairs.
    constexpr int kRopeTiles = Entry::kRopeDim / 8;
    constexpr int kFirstRopeTile = kDimsPerWarp / 8 - kRopeTiles;
    const bool rotate = rope_cos != nullptr && col_warp == kColumnWarps - 1;
    float cos_v[kRopeTiles], sin_v[kRopeTiles];
#pragma unroll
    for (int t = 0; t < kRopeTiles; ++t) {
      const int pair = rope_pair((kColumnWarps - 1) * kDimsPerWarp + (kFirstRopeTile + t) * 8 + quad * 2);
      cos_v[t] = rotate ? rope_cos[pair] : 1.0f;
      sin_v[t] = rotate ? rope_sin[pair] : 0.0f;
    }
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int h = head0 + frag_row[mt][half];
        if (h >= p.num_heads) continue;
        std::uint16_t* out = p.out + (out_row + h) * kDim;
#pragma unroll
        for (int nt = 0; nt < kDimsPerWarp / 8; ++nt) {
          const int d = col_warp * kDimsPerWarp + nt * 8 + quad * 2;
          const int t = nt >= kFirstRopeTile ? nt - kFirstRopeTile : 0;
          *reinterpret_cast<std::uint32_t*>(out + d) =
              finish_pair(accumulate_chunk(0.0f, acc_o[mt][nt][half * 2], weight[mt][half]),
                          accumulate_chunk(0.0f, acc_o[mt][nt][half * 2 + 1], weight[mt][half]), inv_denom[mt][half],
                          rotate && nt >= kFirstRopeTile, cos_v[t], sin_v[t]);
        }
      }
    }
    return;
  }

  // Several chunks: publish this one, then the last to arrive merges all of them in order.
  const std::int64_t chunk_base = row * p.num_splits;  // [row][chunk][head]
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int h = head0 + frag_row[mt][half];
      if (!math_warp || h >= p.num_heads) continue;
      const std::int64_t slot = (chunk_base + chunk) * p.num_heads + h;
      float* out = p.partial_out + slot * kDim;
#pragma unroll
      for (int nt = 0; nt < kDimsPerWarp / 8; ++nt) {
        const int d = col_warp * kDimsPerWarp + nt * 8 + quad * 2;
        *reinterpret_cast<float2*>(out + d) = make_float2(acc_o[mt][nt][half * 2], acc_o[mt][nt][half * 2 + 1]);
      }
      if (col_warp == 0 && quad == 0)
        *reinterpret_cast<float2*>(p.partial_stats + slot * 2) = make_float2(run_max[mt][half], run_sum[mt][half]);
    }
  }
  if (!last_to_arrive(p, row, head0, s_is_last, BlockSync{})) return;
  merge_chunks<kHeadTile, kThreads>(p, row, head0, reinterpret_cast<float*>(smem + T::kK),
                                    reinterpret_cast<float*>(smem + T::kRowMax), BlockSync{});
  reset_arrivals(p, row, head0);
}

}  // namespace dsv4::cuda::sparse_attention
