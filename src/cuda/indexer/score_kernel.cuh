// src/cuda/indexer/score_kernel.cuh — I[t, s] = Σ_h w[t,h]·ReLU(q[t,h]·k_s) over paged FP8/FP4 keys.
//
// Tensor cores through wgmma m64n64k32 e4m3 with f32 accumulation: A = 64 keys from registers,
// B = one query row's 64 heads from shared memory (K-major, 128-byte swizzle). The K dimension
// (d_I = 128) is visited in a lane-friendly order: lane (g, q) of warp w supplies bytes
// [16q, 16q+16) and [64+16q, 64+16q+16) of key rows 16w+g and 16w+g+8, and the queries are staged in
// the matching order, which is one bijection of the 128 dims applied to both operands: the dot
// products are unchanged and every key arrives with two 16-byte loads, no shared-memory staging.
//
// Scales stay out of the MMA: a positive per-key scale commutes with ReLU and multiplies the head
// sum; the per-(row, head) query scale is folded into the head weight. FP4 keys and queries are
// widened to e4m3 codes relative to their largest block scale (exact while a block is within 2^8
// of it; further below, values are rounded to e4m3 — see docs/notes-indexer.md). FP4 keys use their
// own K bijection: a lane loads one whole 32-value scale block of each of its keys with one 16-byte
// load (see load_fp4_row), and two 64-key steps of loads are in flight instead of one.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/common/ptx_sm90.cuh"  // allow_dependent_launch, wait_for_prerequisite_grids
#include "cuda/common/spans.cuh"  // a probe build's kernel spans
#include "cuda/indexer/params.hpp"
#include "cuda/indexer/ptx_sm90.cuh"
#include "cuda/indexer/score_config.hpp"
#include "dsv4/formats.hpp"
#include "dsv4/indexer.hpp"  // request_of_row

namespace dsv4::cuda::indexer_score {

// Shared-memory position of chunk c of head h: flipping bit 2 of the chunk on odd heads puts the
// two heads a quarter-warp reads in different banks.
__device__ __forceinline__ int swizzled_chunk(int chunk, int head) { return chunk ^ ((head & 1) << 2); }

// ---- FP4 widening: one table per key block, values in order ----

// The e4m3 code (round to nearest even, as e4m3_from) of e2m1 magnitude code j times 2^-d, in integer
// arithmetic: the tables are built at every CTA start, and this is a few integer operations where
// e4m3_from(ldexp(...)) is a float frexp/ldexp/rint chain.
__host__ __device__ constexpr std::uint32_t e4m3_of_scaled_e2m1(int j, int d) {
  constexpr int kHalves[8] = {0, 1, 2, 3, 4, 6, 8, 12};  // magnitude in units of 0.5
  constexpr int kLog2Halves[8] = {0, 0, 1, 1, 2, 2, 3, 3};
  const int halves = kHalves[j];
  if (halves == 0) return 0;
  if (d <= 8) {  // exact: halves·2^(8−d) units of 2^-9 (the e4m3 subnormal step), at most two significant bits
    const int units = halves << (8 - d);
    const int log2 = kLog2Halves[j] + 8 - d;
    if (log2 < 4) return static_cast<std::uint32_t>(units);  // subnormals and the first binade: code = units
    return static_cast<std::uint32_t>(((log2 - 3) << 3) + (units >> (log2 - 3)));
  }
  const int shift = d - 8;  // halves / 2^shift units: below 8, a subnormal rounded to nearest even
  if (shift > 4) return 0;  // below half a unit
  const int q = halves >> shift, rest = halves & ((1 << shift) - 1), half = 1 << (shift - 1);
  return static_cast<std::uint32_t>(q + ((rest > half || (rest == half && (q & 1) != 0)) ? 1 : 0));
}

// Widening table d: byte j = e4m3 code of −(e2m1 magnitude j times 2^-d), i.e. with the sign bit set
// (widen_e2m1x8 clears it for positive values).
__device__ __forceinline__ uint2 e2m1_widening_table(int d) {
  std::uint32_t word[2] = {0x80808080u, 0x80808080u};
#pragma unroll
  for (int j = 0; j < 8; ++j) word[j / 4] |= e4m3_of_scaled_e2m1(j, d) << (8 * (j % 4));
  return make_uint2(word[0], word[1]);
}

// Eight e2m1 codes (value j in nibble j of `packed`) → e4m3 codes through `table`, in value order: values
// 0–3, then 4–7. A selector nibble's sign bit would switch prmt to msb replication, so the (negated)
// codes are looked up with it cleared. A second prmt keeps it and points every nibble at bytes 4–7,
// all 0x01 (an immediate operand; bytes 0–3 are zero): 1 for a positive value, 0 for a negative one,
// and code − 128·that clears the sign of the positive ones (10 instructions per 8 values).
__device__ __forceinline__ uint2 widen_e2m1x8(std::uint32_t packed, uint2 table) {
  constexpr std::uint32_t kOnes = 0x01010101u;
  const std::uint32_t magnitudes = packed & 0x77777777u;
  const std::uint32_t lo = ptx::prmt(table.x, table.y, magnitudes);
  const std::uint32_t hi = ptx::prmt(table.x, table.y, magnitudes >> 16);
  const std::uint32_t sign_selectors = packed | 0x44444444u;
  const std::uint32_t lo_positive = ptx::prmt(0u, kOnes, sign_selectors);
  const std::uint32_t hi_positive = ptx::prmt(0u, kOnes, sign_selectors >> 16);
  return make_uint2(lo - 128u * lo_positive, hi - 128u * hi_positive);
}

// One 32-value block (16 bytes) → 32 e4m3 codes in value order (words 0..7 = values 4i..4i+3).
__device__ __forceinline__ void widen_e2m1_block(const uint4& packed, uint2 table, uint4& lo, uint4& hi) {
  const uint2 a = widen_e2m1x8(packed.x, table), b = widen_e2m1x8(packed.y, table);
  const uint2 c = widen_e2m1x8(packed.z, table), d = widen_e2m1x8(packed.w, table);
  lo = make_uint4(a.x, a.y, b.x, b.y);
  hi = make_uint4(c.x, c.y, d.x, d.y);
}

// Largest of the four ue8m0 bytes of `scales` (two 16-bit lanes, then one compare).
__device__ __forceinline__ int largest_scale_byte(std::uint32_t scales) {
  const std::uint32_t m = __vmaxu2(scales & 0x00ff00ffu, (scales >> 8) & 0x00ff00ffu);
  return static_cast<int>(max(m & 0xffffu, m >> 16));
}

// A lane's share of two key rows (16w+g and 16w+g+8 of the warpgroup's 64): chunks q and q+4 of each.
struct KeyRows {
  uint4 lo_g, hi_g, lo_g8, hi_g8;
};

// The pages of a CTA's key chunk, looked up once per request segment (a key load then waits on one
// memory round trip, not two): pages[i] is the pool page of the request's page first_page + i, or
// −1 when the table points outside the pool.
struct ChunkPages {
  const std::int32_t* pages;  // shared memory
  int first_page;

  __device__ int of(const IndexerScoreParams& p, int s) const {
    return pages[(s >> p.entries_per_page_log2) - first_page];
  }
};

// The first byte of pool page `page` (≥ 0): one 32 × 32 → 64-bit multiply (the host checks that a
// page has fewer than 2^31 bytes); offsets inside the page stay 32-bit.
__device__ __forceinline__ const std::uint8_t* page_base(const IndexerScoreParams& p, int page) {
  return p.pages + static_cast<std::uint64_t>(static_cast<std::uint32_t>(page)) * static_cast<std::uint32_t>(p.page_bytes);
}

// ---- FP8 keys: loaded straight into the wgmma A-fragment registers ----

// Loads a lane's share of FP8 key row s, chunks q and q + 4, and returns the key's float32 scale.
// Past the visible range the row reads as zeros with scale 0; on a page outside the pool as zeros
// with scale NaN (the score then shows the broken page table). One page lookup serves both.
__device__ __forceinline__ float load_fp8_row(const IndexerScoreParams& p, const ChunkPages& pages, int s,
                                              int visible_end, int quad, uint4& lo, uint4& hi) {
  lo = hi = make_uint4(0, 0, 0, 0);
  if (s >= visible_end) return 0.0f;
  const int page = pages.of(p, s);
  if (page < 0) return __int_as_float(0x7fc00000);
  const std::uint8_t* base = page_base(p, page);
  const int entry = s & (p.entries_per_page - 1);
  const std::uint8_t* data = base + entry * kDim + quad * kChunkBytes;
  lo = ptx::load_stream_v4(data);
  hi = ptx::load_stream_v4(data + kDim / 2);
  return __uint_as_float(ptx::load_stream_u32(base + p.entries_per_page * kDim + entry * 4));
}

// ---- FP4 keys: lane (g, q) loads scale block q (bytes [16q, 16q+16)) of its rows ----
// The lane's 32 values are words 0..7 of its KeyRows (k-step j takes words 2j and 2j+1: values
// 32q + 8j + 0..3 and + 4..7), so logical K index 32j + 16h + 4q + t is dimension 32q + 8j + 4h + t;
// stage_queries applies the same bijection to the queries. One 16-byte load per key row and one
// widening table per row (a block's own), where 8-byte loads of two blocks needed two.

// A lane's share of one FP4 key row as loaded. A row that was not loaded (past the visible range, or on
// a page outside the pool) has scale bytes kUnloadedScales, which give a NaN key scale (past the visible
// range the score is never written), and unspecified codes.
struct PackedRow {
  uint4 codes;
  std::uint32_t scales;
};
inline constexpr std::uint32_t kUnloadedScales = 0xffffffffu;

// Issues the loads of block `quad` of FP4 key row s and of its scales (no use of the data).
__device__ __forceinline__ PackedRow load_fp4_row(const IndexerScoreParams& p, const ChunkPages& pages, int s,
                                                  int visible_end, int quad) {
  constexpr std::uint32_t kRowBytes = kDim / 2;
  const int page = s < visible_end ? pages.of(p, s) : -1;
  const bool loaded = page >= 0;
  // Unsigned in-page offsets: added to the 64-bit page base without sign extension.
  const std::uint32_t entry = static_cast<std::uint32_t>(s & (p.entries_per_page - 1));
  const std::uint8_t* base = page_base(p, max(page, 0));  // never read unless loaded
  PackedRow row;
  row.codes = ptx::load_stream_v4_if(loaded, base + (entry * kRowBytes + static_cast<std::uint32_t>(quad) * kChunkBytes));
  row.scales = ptx::load_stream_u32_or(
      loaded, base + (static_cast<std::uint32_t>(p.entries_per_page) * kRowBytes + entry * 4), kUnloadedScales);
  return row;
}

// The e4m3 words of a loaded row's block (relative to the row's largest block scale) and the key's scale:
// that block scale, NaN for a row that was not loaded (a scale byte of 0xff, NaN in e8m0, reads the same).
__device__ __forceinline__ float widen_fp4_row(const PackedRow& row, const uint2* tables, int quad, uint4& lo,
                                               uint4& hi) {
  const int largest = largest_scale_byte(row.scales);
  const int block = static_cast<int>((row.scales >> (8 * quad)) & 0xffu);
  widen_e2m1_block(row.codes, tables[min(largest - block, kExponentTables - 1)], lo, hi);
  // 2^(largest − 127) (as float_from_ue8m0: 0x00400000 for byte 0), NaN for byte 0xff.
  const bool special = largest == 0 || largest == 0xff;
  return __uint_as_float((static_cast<std::uint32_t>(largest) << 23) | (special ? 0x00400000u : 0u));
}

// ---- a lane's two key rows of a 64-key step (16w+g and 16w+g+8), as loaded ----

template <IndexerKeyFormat kFormat>
struct LoadedStep;

template <>
struct LoadedStep<IndexerKeyFormat::FP8> {  // ready for the MMA as loaded
  KeyRows keys;
  float scale_lo, scale_hi;
};

template <>
struct LoadedStep<IndexerKeyFormat::FP4> {
  PackedRow g, g8;
};

template <IndexerKeyFormat kFormat>
__device__ __forceinline__ void load_step(const IndexerScoreParams& p, const ChunkPages& pages, int k0,
                                          int visible_end, int g, int quad, LoadedStep<kFormat>& step) {
  const int s = k0 + g;
  if constexpr (kFormat == IndexerKeyFormat::FP8) {
    step.scale_lo = load_fp8_row(p, pages, s, visible_end, quad, step.keys.lo_g, step.keys.hi_g);
    step.scale_hi = load_fp8_row(p, pages, s + 8, visible_end, quad, step.keys.lo_g8, step.keys.hi_g8);
  } else {
    step.g = load_fp4_row(p, pages, s, visible_end, quad);
    step.g8 = load_fp4_row(p, pages, s + 8, visible_end, quad);
  }
}

// The step's wgmma A fragments and its two keys' scales.
template <IndexerKeyFormat kFormat>
__device__ __forceinline__ void ready_step(const LoadedStep<kFormat>& step, const uint2* tables, int quad,
                                           KeyRows& keys, float& scale_lo, float& scale_hi) {
  if constexpr (kFormat == IndexerKeyFormat::FP8) {
    keys = step.keys;
    scale_lo = step.scale_lo;
    scale_hi = step.scale_hi;
  } else {
    scale_lo = widen_fp4_row(step.g, tables, quad, keys.lo_g, keys.hi_g);
    scale_hi = widen_fp4_row(step.g8, tables, quad, keys.lo_g8, keys.hi_g8);
  }
}

__device__ __forceinline__ std::uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Copies the tile's queries into shared memory as e4m3 codes in the wgmma B layout and folds each
// (row, head) query scale into its weight. Row r, head h: 128 bytes at (r·heads + h)·128, holding
// logical chunk L (the k32 step L/2, its half L%2) at 16-byte slot L ^ (h mod 8).
// FP8: logical chunk L gathers word 2·(j%2) + L%2 of physical chunks 4·(j/2) + q, q = 0..3, j = L/2 —
// the bytes lane q supplies to the A fragment of that k-step (see row_scores).
// FP4: word q of logical chunk L is dimensions 32q + 4L .. 32q + 4L + 3 (see load_fp4_row).
template <IndexerKeyFormat kFormat>
__device__ __forceinline__ void stage_queries(const IndexerScoreParams& p, std::int64_t row0, int rows,
                                              std::uint8_t* s_q, float* s_w, const uint2* tables) {
  const int heads = p.heads;
  if constexpr (kFormat == IndexerKeyFormat::FP4) {
    // One thread per (row, head, block b): the block's widened words L = 0..7 (dimensions 32b + 4L..4L+3)
    // go to word b of logical chunk L.
    for (int item = threadIdx.x; item < rows * heads * 4; item += kThreads) {
      const int rh = item / 4, block = item % 4, h = rh % heads;  // rh = r·heads + h
      const std::int64_t head = row0 * heads + rh;
      const std::uint32_t scales = static_cast<const std::uint32_t*>(p.q_scales)[head];
      const uint4 packed = *reinterpret_cast<const uint4*>(p.q_codes + head * (kDim / 2) + block * kChunkBytes);
      const int largest = largest_scale_byte(scales);
      const int block_scale = static_cast<int>((scales >> (8 * block)) & 0xffu);
      uint4 lo, hi;
      widen_e2m1_block(packed, tables[min(largest - block_scale, kExponentTables - 1)], lo, hi);
      std::uint8_t* out = s_q + rh * kDim + 4 * block;
#pragma unroll
      for (int chunk = 0; chunk < kChunksPerHead; ++chunk)
        *reinterpret_cast<std::uint32_t*>(out + (chunk ^ (h & 7)) * kChunkBytes) =
            word_of(chunk < 4 ? lo : hi, chunk % 4);
      if (block == 0) s_w[rh] = p.weights[head] * float_from_ue8m0(static_cast<std::uint8_t>(largest));
    }
  } else {
    for (int rh = threadIdx.x; rh < rows * heads; rh += kThreads) {  // rh = r·heads + h
      const int h = rh % heads;
      const std::int64_t head = row0 * heads + rh;
      uint4 physical[kChunksPerHead];
#pragma unroll
      for (int c = 0; c < kChunksPerHead; ++c)
        physical[c] = *reinterpret_cast<const uint4*>(p.q_codes + head * kDim + c * kChunkBytes);
      const float scale = static_cast<const float*>(p.q_scales)[head];
      std::uint8_t* out = s_q + rh * kDim;
#pragma unroll
      for (int logical = 0; logical < kChunksPerHead; ++logical) {
        const int j = logical / 2, half = j / 2, word = 2 * (j % 2) + logical % 2;
        const uint4 v = make_uint4(word_of(physical[4 * half], word), word_of(physical[4 * half + 1], word),
                                   word_of(physical[4 * half + 2], word), word_of(physical[4 * half + 3], word));
        *reinterpret_cast<uint4*>(out + ((logical ^ (h & 7)) * kChunkBytes)) = v;
      }
      s_w[rh] = p.weights[head] * scale;
    }
  }
  // The tensor cores read these bytes through the async proxy.
  ptx::fence_proxy_async_shared();
}

// Σ_h w_h·ReLU(q_h·k) for one query row against the warpgroup's 64 keys: lane (g, q) of warp w gets
// the sum of key 16w+g (q even) or 16w+g+8 (q odd), reduced over the quad. `b_descriptor`: the
// wgmma descriptor of the row's queries in shared memory (head group 0, k-step 0).
__device__ __forceinline__ float row_scores(KeyRows& keys, std::uint64_t b_descriptor, const float* s_w_row, int heads,
                                            int quad) {
  float sum_lo = 0.0f, sum_hi = 0.0f;  // this lane's share of keys 16w+g and 16w+g+8
  for (int group = 0; group < heads / kHeadGroup; ++group) {
    float d[32] = {};  // never read: the first k-step does not accumulate (the compiler drops the zeros)
    ptx::wgmma_fence();
#pragma unroll
    for (int j = 0; j < kKSteps; ++j) {
      const uint4& g_chunk = j < 2 ? keys.lo_g : keys.hi_g;
      const uint4& g8_chunk = j < 2 ? keys.lo_g8 : keys.hi_g8;
      const int w0 = 2 * (j % 2);
      ptx::wgmma_m64n64k32_e4m3_rs(
          d, word_of(g_chunk, w0), word_of(g8_chunk, w0), word_of(g_chunk, w0 + 1), word_of(g8_chunk, w0 + 1),
          ptx::advance_descriptor(b_descriptor, group * kHeadGroup * kDim + 32 * j), j > 0);
    }
    ptx::wgmma_commit();
    ptx::wgmma_wait_all();
#pragma unroll
    for (int i = 0; i < 32; ++i) ptx::fence_operand(d[i]);
    // ReLU · w with two partial sums per key: dependent FMA chains of 8, no separate products.
    const float* w = s_w_row + group * kHeadGroup + 2 * quad;
    float lo_even = 0.0f, lo_odd = 0.0f, hi_even = 0.0f, hi_odd = 0.0f;
#pragma unroll
    for (int n = 0; n < kHeadGroup / 8; ++n) {
      const float2 wn = *reinterpret_cast<const float2*>(w + 8 * n);
      lo_even = fmaf(fmaxf(d[4 * n], 0.0f), wn.x, lo_even);
      lo_odd = fmaf(fmaxf(d[4 * n + 1], 0.0f), wn.y, lo_odd);
      hi_even = fmaf(fmaxf(d[4 * n + 2], 0.0f), wn.x, hi_even);
      hi_odd = fmaf(fmaxf(d[4 * n + 3], 0.0f), wn.y, hi_odd);
    }
    sum_lo += lo_even + lo_odd;
    sum_hi += hi_even + hi_odd;
  }
  // Two shuffles reduce both keys over the quad: after the first, even lanes hold key g's pair sum
  // and odd lanes key g+8's; the second adds the other pair.
  const bool odd = (quad & 1) != 0;
  float mine = odd ? sum_hi : sum_lo;
  mine += __shfl_xor_sync(0xffffffffu, odd ? sum_lo : sum_hi, 1);
  mine += __shfl_xor_sync(0xffffffffu, mine, 2);
  return mine;
}

// scores [num_rows, num_cols]; grid (ceil(num_rows / shape.tile_rows), ceil(num_cols / shape.key_chunk)).
template <IndexerKeyFormat kFormat>
__global__ void __launch_bounds__(kThreads, 2) score_kernel(const IndexerScoreParams p, const ScoreShape shape) {
  cuda::ptx::allow_dependent_launch();  // the top-k behind it may take free SMs now (it waits for this grid)
  extern __shared__ __align__(16) std::uint8_t smem[];
  const std::uint32_t misalignment = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem)) % kSwizzleAtom;
  std::uint8_t* s_q = smem + (kSwizzleAtom - misalignment) % kSwizzleAtom;  // [tile_rows][heads][128], swizzled
  float* s_w = reinterpret_cast<float*>(s_q + query_bytes(p.heads, shape.tile_rows));     // [tile_rows][heads]
  uint2* s_tables = reinterpret_cast<uint2*>(s_q + tables_offset(p.heads, shape.tile_rows));  // [kExponentTables]
  __shared__ int s_visible[kRowsPerTile];
  __shared__ int s_request_part[kWarps][kRowsPerTile];  // the request of row r is Σ_w s_request_part[w][r]
  __shared__ std::int32_t s_pages[kMaxKeyChunk / kMinEntriesPerPage + 1];  // the chunk's pages, per segment

  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.x) * shape.tile_rows;
  const int rows = static_cast<int>(min(static_cast<std::int64_t>(shape.tile_rows), p.num_rows - row0));
  const int col0 = static_cast<int>(blockIdx.y) * shape.key_chunk;
  const int col_end = min(col0 + shape.key_chunk, p.num_cols);
  const int warpgroup = threadIdx.x / 128;
  const int cta_warp = threadIdx.x / 32, warp = cta_warp % 4, lane = threadIdx.x % 32;
  const int g = lane / 4, quad = lane % 4;
  const int log2_epp = p.entries_per_page_log2;
  // Launched early (score_launch.hpp): every tensor is read or written after this wait.
  cuda::ptx::wait_for_prerequisite_grids();
  spans::stamp(spans::kScores);

  // The tile's bookkeeping and queries take one memory round trip: every load below is issued before
  // any result is used (each thread keeps its values in registers until after the query staging).
  // V_t of the tile's rows, by threads away from the first ones (those stage queries).
  const int row_thread = static_cast<int>(threadIdx.x) - kThreads / 2;
  const bool loads_visible = row_thread >= 0 && row_thread < rows;
  const int visible_value = loads_visible ? p.visible[row0 + row_thread] : 0;
  // Row t belongs to request #{j in 1..B−1 : query_start[j] ≤ t} (query_start is non-decreasing):
  // counted over the whole CTA, or binary-searched when there are too many requests.
  const bool count_starts = p.num_requests <= kMaxCountedRequests;
  int starts[kStartsPerThread];
#pragma unroll
  for (int i = 0; i < kStartsPerThread; ++i) {
    const int j = 1 + static_cast<int>(threadIdx.x) + i * kThreads;
    starts[i] = count_starts && j < p.num_requests ? p.query_start[j] : 0x7fffffff;
  }
  // With a single request every row's request is known, so the chunk's page-table slice is fetched
  // now, whole (V_t is not known yet; entries past it are bounded and never read from, though their
  // first lines are prefetched like the others' where they lie in the pool: stage_page).
  const bool single_request = p.num_requests == 1;
  const ChunkPages pages{s_pages, col0 >> log2_epp};
  constexpr int kEarlyPages = (kMaxKeyChunk / kMinEntriesPerPage + 1 + kThreads - 1) / kThreads;
  const int last_chunk_page = (col_end - 1) >> log2_epp;
  std::int32_t early_pages[kEarlyPages];
#pragma unroll
  for (int i = 0; i < kEarlyPages; ++i) {  // from the last thread down: the first ones stage queries
    const int page = pages.first_page + (kThreads - 1 - static_cast<int>(threadIdx.x)) + i * kThreads;
    early_pages[i] = single_request && page <= last_chunk_page && page < p.max_pages ? p.page_table[page] : -1;
  }
  if constexpr (kFormat == IndexerKeyFormat::FP4) {
    // Built while the loads above are in flight (integer arithmetic, a few hundred cycles).
    if (threadIdx.x < kExponentTables) s_tables[threadIdx.x] = e2m1_widening_table(threadIdx.x);
    __syncthreads();
  }
  stage_queries<kFormat>(p, row0, rows, s_q, s_w, s_tables);
#pragma unroll
  for (int r = 0; r < kRowsPerTile; ++r) {
    int count = 0;
#pragma unroll
    for (int i = 0; i < kStartsPerThread; ++i) count += starts[i] <= row0 + r ? 1 : 0;
    count = __reduce_add_sync(0xffffffffu, count);
    if (lane == 0) s_request_part[cta_warp][r] = count;
  }
  if (!count_starts && cta_warp == 0) {  // warp 0's parts are 0 then; its lane r holds row r's request
    __syncwarp();
    if (lane < rows) s_request_part[0][lane] = request_of_row(p.query_start, p.num_requests, row0 + lane);
  }
  if (loads_visible) s_visible[row_thread] = min(max(visible_value, 0), p.num_cols);
  // Page i of the chunk as staged (−1 outside the pool), its first line prefetched to L2: the page's
  // address translation (a pool's pages lie anywhere in it) is then made here, for all the chunk's
  // pages at once, not by the key step that first reads the page.
  const auto stage_page = [&](int i, std::int64_t page) {
    const bool in_pool = page >= 0 && page < p.num_pages;
    s_pages[i] = in_pool ? static_cast<std::int32_t>(page) : -1;
    if (in_pool) ptx::prefetch_l2(page_base(p, static_cast<int>(page)));
  };
#pragma unroll
  for (int i = 0; i < kEarlyPages; ++i) {
    const int page = pages.first_page + (kThreads - 1 - static_cast<int>(threadIdx.x)) + i * kThreads;
    if (single_request && page <= last_chunk_page) stage_page(page - pages.first_page, early_pages[i]);
  }
  __syncthreads();

  const auto request_of_tile_row = [&](int r) {
    int request = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) request += s_request_part[w][r];
    return request;
  };
  const float neg_inf = -INFINITY;
  const std::uint64_t q_descriptor = ptx::sw128_descriptor(s_q);  // row r: + r·heads·128 bytes
  const int lane_key = 16 * warp + g;
  // Rows of one request share their keys; a tile spanning requests handles them one after another.
  for (int r_begin = 0; r_begin < rows;) {
    const int request = request_of_tile_row(r_begin);
    int r_end = r_begin + 1, visible_end = s_visible[r_begin];
    while (r_end < rows && request_of_tile_row(r_end) == request) visible_end = max(visible_end, s_visible[r_end++]);
    const int key_end = min(visible_end, col_end);  // keys this CTA loads for the segment
    if (!single_request) {
      const std::int32_t* page_row = p.page_table + static_cast<std::int64_t>(request) * p.max_pages;
      __syncthreads();  // the previous segment is done with s_pages
      if (key_end > col0) {
        const int last_page = (key_end - 1) >> log2_epp;
        for (int i = pages.first_page + threadIdx.x; i <= last_page; i += kThreads)
          stage_page(i - pages.first_page, i < p.max_pages ? page_row[i] : -1);
      }
      __syncthreads();
    }

    // Steps at or past visible_end: nothing is visible to any row (the same for the whole warpgroup).
    const auto write_past_visible = [&](int k0) {
      for (int r = r_begin; r < r_end; ++r) {
        float* out = p.scores + (row0 + r) * p.num_cols;
        for (int j = threadIdx.x % 128; j < kKeysPerStep; j += 128)
          if (k0 + j < col_end) out[k0 + j] = neg_inf;
      }
    };
    // The scores of a step's 64 keys for every row of the segment.
    const auto score_step = [&](int k0, KeyRows& keys, float scale_lo, float scale_hi) {
      for (int r = r_begin; r < r_end; ++r) {
        const float sum = row_scores(keys, ptx::advance_descriptor(q_descriptor, r * p.heads * kDim),
                                     s_w + r * p.heads, p.heads, quad);
        // Quad lanes 0 and 1 write keys 16w + g and 16w + g + 8.
        const int s = k0 + lane_key + 8 * quad;
        if (quad < 2 && s < col_end) {
          const float value = sum * (quad == 0 ? scale_lo : scale_hi);
          p.scores[(row0 + r) * p.num_cols + s] = s < s_visible[r] ? value : neg_inf;
        }
      }
    };
    // This lane's keys: rows 16·warp + g and + 8 of each 64-key step of its warpgroup.
    const int first = col0 + warpgroup * kKeysPerStep;
    if constexpr (kFormat == IndexerKeyFormat::FP4) {
      // Two steps of loads in flight, in two buffers that take turns: a buffer is reloaded (for the
      // step after next) as soon as it is widened, before its step's MMA, so steps need no register moves.
      LoadedStep<kFormat> even, odd;
      load_step<kFormat>(p, pages, first + 16 * warp, key_end, g, quad, even);
      load_step<kFormat>(p, pages, first + kKeysPerCtaStep + 16 * warp, key_end, g, quad, odd);
      const auto run_step = [&](int k0, LoadedStep<kFormat>& buffer) {
        if (k0 >= visible_end) {
          write_past_visible(k0);
          return;
        }
        KeyRows keys;
        float scale_lo, scale_hi;
        ready_step<kFormat>(buffer, s_tables, quad, keys, scale_lo, scale_hi);
        load_step<kFormat>(p, pages, k0 + 2 * kKeysPerCtaStep + 16 * warp, key_end, g, quad, buffer);
        score_step(k0, keys, scale_lo, scale_hi);
      };
      for (int k0 = first; k0 < col_end; k0 += 2 * kKeysPerCtaStep) {
        run_step(k0, even);
        if (k0 + kKeysPerCtaStep < col_end) run_step(k0 + kKeysPerCtaStep, odd);
      }
    } else {
      // One step ahead: its loads are issued before the current step is computed and stay in flight
      // meanwhile (issuing them after this step's MMA issue shortened the prefetch distance; measured:
      // B=128 N=65536 382 → 403 µs).
      LoadedStep<kFormat> loaded;
      load_step<kFormat>(p, pages, first + 16 * warp, key_end, g, quad, loaded);
      for (int k0 = first; k0 < col_end; k0 += kKeysPerCtaStep) {
        if (k0 >= visible_end) {
          write_past_visible(k0);
          continue;
        }
        LoadedStep<kFormat> next;
        load_step<kFormat>(p, pages, k0 + kKeysPerCtaStep + 16 * warp, key_end, g, quad, next);
        KeyRows keys;
        float scale_lo, scale_hi;
        ready_step<kFormat>(loaded, s_tables, quad, keys, scale_lo, scale_hi);
        score_step(k0, keys, scale_lo, scale_hi);
        loaded = next;
      }
    }
    r_begin = r_end;
  }
}

}  // namespace dsv4::cuda::indexer_score
