// src/cuda/topk/params.hpp — what the host hands the top-k kernels (plain C++, validated in src/ops).
#pragma once

#include <cstdint>

namespace dsv4::cuda {

struct TopkParams {
  const float* scores = nullptr;              // [num_rows, num_cols]
  const std::int32_t* visible = nullptr;      // [num_rows], each ≤ num_cols
  const std::int32_t* query_start = nullptr;  // [num_requests + 1]
  const std::int32_t* page_table = nullptr;   // [num_requests, max_pages]; read only when slots is set
  std::int32_t num_requests = 0;
  std::int32_t max_pages = 0;
  std::int32_t entries_per_page = 0;
  std::int32_t* indices = nullptr;            // [num_rows, k]
  std::int32_t* slots = nullptr;              // [num_rows, k] or null
  std::int64_t num_rows = 0;
  std::int32_t num_cols = 0;                  // ≤ kTopkMaxCandidates
  std::int32_t k = 0;
};

void indexer_topk(const TopkParams& params, void* stream);

}  // namespace dsv4::cuda
