// src/cuda/indexer/params.hpp — what the host hands the indexer kernels.
//
// Plain C++ (no CUDA types), so the dispatcher in src/ops can fill it; everything is validated there.
#pragma once

#include <cstdint>

#include "dsv4/cache_format.hpp"
#include "ref/indexer_buffers.hpp"

namespace dsv4::cuda {

// Query preparation: one warp per (row, head).
struct IndexerQueryPrepParams : ref::IndexerQueryBuffers {  // d_I = 128 (codes 128 B FP8, 64 B FP4)
  IndexerKeyFormat format = IndexerKeyFormat::FP8;
  double weight_scale = 0;  // d_I^-1/2 · H_I^-1/2 (applied in double, as the reference)
};

void prepare_indexer_queries(const IndexerQueryPrepParams& params, void* stream);

// Scores of query rows against their request's paged keys (d_I = 128).
struct IndexerScoreParams : ref::IndexerScoreBuffers {  // heads 64 or 128; entries_per_page a power of two ≥ 4
  IndexerKeyFormat format = IndexerKeyFormat::FP8;
  std::int64_t num_pages = 0;              // pages outside [0, num_pages) are never read (NaN scores)
  std::int32_t entries_per_page_log2 = 0;  // (16-byte aligned entries, shift for the page)
  const std::int32_t* query_start = nullptr;  // [num_requests + 1]
  const std::int32_t* visible = nullptr;      // [num_rows]
  const std::int32_t* page_table = nullptr;   // [num_requests, max_pages]
  std::int32_t num_requests = 0;
  std::int32_t max_pages = 0;
  std::int32_t num_cols = 0;
};

void indexer_scores(const IndexerScoreParams& params, void* stream);

}  // namespace dsv4::cuda
