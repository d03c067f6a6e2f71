// dsv4/indexer.hpp — the CSA lightning indexer (SPEC §7): query preparation and scores.
//
//   prepare_indexer_queries   q_I rows → RoPE, Walsh–Hadamard, quantization; head weights
//   indexer_scores            I[t, s] = Σ_h w_t[h] · ReLU(q_t,h · k_s) over a request's paged key cache
//   indexer_topk (topk.hpp)   the K largest scores of each row, as entry numbers and physical slots
//
// Decode (B requests × next_n rows) and prefill (a ragged batch) are the same call: a query row
// belongs to one request (query_start), sees the first V_t entries of that request (visible) and
// finds them through the request's page table row.
//
// Backends: the tensors' device picks the CPU reference (plain loops, double accumulation) or the
// CUDA kernels (sm_90a). Every argument is validated on the host first; a violation throws
// dsv4::Error naming the argument and leaves every output untouched.
#pragma once

#include <cstdint>

#include "dsv4/cache_format.hpp"
#include "dsv4/formats.hpp"  // DSV4_HD
#include "dsv4/tensor.hpp"

namespace dsv4 {

// Quantized indexer queries of N_q rows, in the number format of the keys (SPEC §7):
//   FP8: codes  U8  [N_q, H_I, d_I]      e4m3, value = code · scale
//        scales F32 [N_q, H_I]           max(amax, 1e-4) / 448 per (row, head)
//   FP4: codes  U8  [N_q, H_I, d_I/2]    e2m1 pairs, lower-indexed value in the low nibble
//        scales U8  [N_q, H_I, d_I/32]   ue8m0 per 32 values (F = 6, floor 6·2^-126)
// weights F32 [N_q, H_I]: w_t[h] = (W_w x_t)[h] · d_I^-1/2 · H_I^-1/2 (not multiplied by any scale).
struct IndexerQueryView {
  TensorView codes;
  TensorView scales;
  TensorView weights;
};

// Owning storage for prepared queries.
struct IndexerQuery {
  Tensor codes, scales, weights;

  // Uninitialized storage for `rows` rows of `heads` heads of width `dim` in `format`.
  static IndexerQuery empty(IndexerKeyFormat format, std::int64_t rows, int heads, int dim,
                            Device device = Device::CPU);
  IndexerQueryView view() const { return {codes.view(), scales.view(), weights.view()}; }
};

// A paged pool of indexer key entries (SPEC §5.2): `pages` is U8 [num_pages, page_bytes] with
// page_bytes = format.page_bytes(entries_per_page); entry s of a request lives in page
// page_table[b][s / entries_per_page] at index s mod entries_per_page.
struct IndexerKeyCacheView {
  TensorView pages;
  IndexerEntryFormat format;
  int entries_per_page = 64;  // P / m
};

// The request of query `row` in a ragged batch: the last b with query_start[b] ≤ row (binary search
// over query_start [num_requests + 1]). Host and device (the reference and the kernels share it).
DSV4_HD int request_of_row(const std::int32_t* query_start, int num_requests, std::int64_t row) {
  int lo = 0, hi = num_requests - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (query_start[mid] <= row) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// Which request each query row belongs to and what it sees.
struct IndexerRowsView {
  TensorView query_start;  // I32 [B + 1]: rows of request b are [query_start[b], query_start[b+1]);
                           //   query_start[0] = 0, non-decreasing, query_start[B] = N_q
  TensorView visible;      // I32 [N_q]: V_t; row t sees entries 0..V_t−1 of its request
                           //   (V_t = floor((t+1)/m) for the token at position t)
  TensorView page_table;   // I32 [B, max_pages]: pool page of each of the request's pages
};

struct IndexerOptions {
  // Check the values of query_start, visible and page_table (ordering, ranges, pages inside the
  // pool). Always done for CPU tensors; for CUDA tensors it copies them to the host and
  // synchronizes, so a serving loop with trusted plans may turn it off. Without it, the CUDA
  // kernels still never read outside the pool: a page outside it yields NaN scores.
  bool check_contents = true;
  // CUDA only: the cudaStream_t to run on (nullptr: the default stream).
  // The query preparation, the score kernel and the top-k launch early (programmatic dependent launch):
  // their blocks may take free SMs while the kernel before them in the stream finishes, if that kernel
  // allows it, and wait for it before reading or writing any tensor (with check_contents, the call's
  // host copy and synchronization come first, so there is nothing to overlap). Each allows it too — the
  // score kernel and the top-k at their start, the query preparation once its own wait is over (a score
  // kernel placed while the kernel before the query preparation still runs was found slower): a kernel
  // launched after them with programmatic stream serialization must execute griddepcontrol.wait before
  // it reads their outputs or writes any of their inputs (launches without that attribute wait as usual).
  void* stream = nullptr;
};

// Query preparation (SPEC §7), one fused kernel on the GPU. Per row t and head h:
// RoPE on the last r dims of q_rows[t, h·d_I : (h+1)·d_I] with the row's cos/sin (interleaved pairs),
// then y = H_{d_I} x / sqrt(d_I) (Walsh–Hadamard), then quantization as described at
// IndexerQueryView; weights[t, h] = head_logits[t, h] · d_I^-1/2 · H_I^-1/2.
//   q_rows       F32 [N_q, H_I·d_I]  (W_qb^I · q_lora; the GEMM belongs to the layer)
//   head_logits  F32 [N_q, H_I]      (W_w · x)
//   rope_cos     F32 [N_q, r/2]      cos θ(t, i) at the row's position (RopeTable::cos_sin), r ≤ d_I
//   rope_sin     F32 [N_q, r/2]
//   out          prepared queries of `format`, shapes as in IndexerQueryView, every element written
//                (its three tensors share no byte with the inputs or with each other)
// d_I must be a power of two (Walsh–Hadamard), a multiple of 32 for FP4; on CUDA d_I = 128.
void prepare_indexer_queries(const TensorView& q_rows, const TensorView& head_logits, const TensorView& rope_cos,
                             const TensorView& rope_sin, IndexerKeyFormat format, const IndexerQueryView& out,
                             const IndexerOptions& options = {});

// Scores of every query row against the visible entries of its request:
//   scores[t, s] = Σ_h weights[t, h] · ReLU(q[t, h] · k_s)     for s < V_t (both sides dequantized)
//   scores[t, s] = −inf                                         for V_t ≤ s < S
//   q       prepared queries (format = keys.format.format, d_I = keys.format.dim)
//   keys    the indexer key cache
//   rows    query_start / visible / page_table; V_t ≤ S, and every page holding a visible entry
//           must be inside the pool
//   scores  F32 [N_q, S], written entirely (sharing no byte with the other arguments)
// On CUDA: d_I = 128, H_I = 64 or 128, entries_per_page a power of two ≥ 4 (P and m
// are powers of two in every published model), tensors 16-byte aligned. The result of a row never depends on the other rows (no cross-row reduction).
void indexer_scores(const IndexerQueryView& q, const IndexerKeyCacheView& keys, const IndexerRowsView& rows,
                    const TensorView& scores, const IndexerOptions& options = {});

}  // namespace dsv4
