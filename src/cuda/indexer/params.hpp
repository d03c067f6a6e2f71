// src/cuda/indexer/params.hpp — what the host hands the indexer kernels.
//
// Plain C++ (no CUDA types), so the dispatcher in src/ops can fill it; everything is validated there.
#pragma once

#include <cstdint>

#include "dsv4/cache_format.hpp"

namespace dsv4::cuda {

// Query preparation: one warp per (row, head).
struct IndexerQueryPrepParams {
  IndexerKeyFormat format = IndexerKeyFormat::FP8;
  const float* q_rows = nullptr;       // [num_rows, heads, 128]
  const float* head_logits = nullptr;  // [num_rows, heads]
  const float* rope_cos = nullptr;     // [num_rows, rope_pairs]
  const float* rope_sin = nullptr;     // [num_rows, rope_pairs]
  std::uint8_t* codes = nullptr;       // [num_rows, heads, 128 (FP8) or 64 (FP4)]
  void* scales = nullptr;              // FP8: float [num_rows, heads]; FP4: u8 [num_rows, heads, 4]
  float* weights = nullptr;            // [num_rows, heads]
  std::int64_t num_rows = 0;
  std::int32_t heads = 0;
  std::int32_t rope_pairs = 0;         // r/2 ≤ 64
  double weight_scale = 0;             // d_I^-1/2 · H_I^-1/2 (applied in double, as the reference)
};

void prepare_indexer_queries(const IndexerQueryPrepParams& params, void* stream);

// Scores of query rows against their request's paged keys (d_I = 128).
struct IndexerScoreParams {
  IndexerKeyFormat format = IndexerKeyFormat::FP8;
  const std::uint8_t* q_codes = nullptr;   // [num_rows, heads, 128 (FP8) or 64 (FP4)], 16-byte aligned
  const void* q_scales = nullptr;          // FP8: float [num_rows, heads]; FP4: u8 [num_rows, heads, 4]
  const float* weights = nullptr;          // [num_rows, heads]
  const std::uint8_t* pages = nullptr;     // [num_pages, page_bytes], 16-byte aligned
  std::int64_t page_bytes = 0;
  std::int64_t num_pages = 0;              // pages outside [0, num_pages) are never read (NaN scores)
  std::int32_t entries_per_page = 0;       // a power of two ≥ 4 (16-byte aligned entries, shift for the page)
  std::int32_t entries_per_page_log2 = 0;
  const std::int32_t* query_start = nullptr;  // [num_requests + 1]
  const std::int32_t* visible = nullptr;      // [num_rows]
  const std::int32_t* page_table = nullptr;   // [num_requests, max_pages]
  std::int32_t num_requests = 0;
  std::int32_t max_pages = 0;
  float* scores = nullptr;                 // [num_rows, num_cols]
  std::int64_t num_rows = 0;
  std::int32_t num_cols = 0;
  std::int32_t heads = 0;                  // 64 or 128
};

void indexer_scores(const IndexerScoreParams& params, void* stream);

}  // namespace dsv4::cuda
