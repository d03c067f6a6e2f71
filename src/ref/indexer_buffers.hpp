// src/ref/indexer_buffers.hpp — the memory the indexer's query preparation and score steps read and
// write, as raw pointers on the backend's device. The CPU calls (indexer_ref.hpp) and the CUDA
// kernels' parameters (cuda/indexer/params.hpp) derive from these, so src/ops fills each once.
#pragma once

#include <cstdint>

namespace dsv4::ref {

struct IndexerQueryBuffers {
  const float* q_rows = nullptr;        // [num_rows, heads·d_I]
  const float* head_logits = nullptr;   // [num_rows, heads]
  const float* rope_cos = nullptr;      // [num_rows, rope_pairs]
  const float* rope_sin = nullptr;      // [num_rows, rope_pairs]
  std::uint8_t* codes = nullptr;        // [num_rows, heads, data_bytes]
  void* scales = nullptr;               // FP8: float [num_rows, heads]; FP4: u8 [num_rows, heads, d_I/32]
  float* weights = nullptr;             // [num_rows, heads]
  std::int64_t num_rows = 0;
  std::int32_t heads = 0;               // H_I
  std::int32_t rope_pairs = 0;          // r/2
};

struct IndexerScoreBuffers {
  const std::uint8_t* q_codes = nullptr;  // [num_rows, heads, data_bytes] (CUDA: 16-byte aligned)
  const void* q_scales = nullptr;         // FP8: float [num_rows, heads]; FP4: u8 [num_rows, heads, d_I/32]
  const float* weights = nullptr;         // [num_rows, heads]
  const std::uint8_t* pages = nullptr;    // key pages [num_pages, page_bytes] (CUDA: 16-byte aligned)
  std::int64_t page_bytes = 0;
  std::int32_t entries_per_page = 0;
  std::int32_t heads = 0;                 // H_I
  float* scores = nullptr;                // [num_rows, num_cols]
  std::int64_t num_rows = 0;
};

}  // namespace dsv4::ref
