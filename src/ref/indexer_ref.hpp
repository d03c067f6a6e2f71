// src/ref/indexer_ref.hpp — the CPU reference of the indexer (the oracle of SPEC §9).
//
// Host pointers of calls that dsv4::prepare_indexer_queries / indexer_scores / indexer_topk have
// already validated (shapes, dtypes, contents); shapes as in dsv4/indexer.hpp and dsv4/topk.hpp.
#pragma once

#include <cstdint>

#include "dsv4/cache_format.hpp"
#include "dsv4/indexer.hpp"  // request_of_row
#include "ref/indexer_buffers.hpp"

namespace dsv4::ref {

struct IndexerQueryPrepCall : IndexerQueryBuffers {
  IndexerEntryFormat format;  // key format and d_I
};

// RoPE (double from the float32 cos/sin, rounded to float32), Walsh–Hadamard (norms.hpp), and the
// key encoders of entry_codec.hpp applied to each (row, head).
void prepare_indexer_queries(const IndexerQueryPrepCall& call);

// The rows of a batch and their paged keys.
struct IndexerRows {
  const std::int32_t* query_start = nullptr;  // [num_requests + 1]
  const std::int32_t* visible = nullptr;      // [num_rows]
  const std::int32_t* page_table = nullptr;   // [num_requests, max_pages]
  int num_requests = 0;
  int max_pages = 0;
};

struct IndexerScoresCall : IndexerScoreBuffers {
  IndexerEntryFormat format;
  IndexerRows rows;
  std::int64_t num_cols = 0;
};

// Dequantizes both sides with the entry_codec decoders and sums Σ_h w·max(q·k, 0) in double.
void indexer_scores(const IndexerScoresCall& call);

// Dequantized query head (row, head) of prepared queries into `out` [d_I].
void dequantize_query(const IndexerEntryFormat& format, int heads, const std::uint8_t* codes, const void* scales,
                      std::int64_t row, int head, float* out);

struct IndexerTopkCall {
  const float* scores = nullptr;  // [num_rows, num_cols]
  IndexerRows rows;
  int entries_per_page = 0;
  std::int32_t* indices = nullptr;  // [num_rows, k]
  std::int32_t* slots = nullptr;    // [num_rows, k] or null
  std::int64_t num_rows = 0, num_cols = 0;
  int k = 0;
};

// Ranks by (topk_order_key desc, entry asc), keeps the first K, writes them in ascending order.
void indexer_topk(const IndexerTopkCall& call);

}  // namespace dsv4::ref
