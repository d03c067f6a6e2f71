// src/ops/indexer_rows.hpp — validation of IndexerRowsView shared by indexer_scores and indexer_topk.
#pragma once

#include <cstdint>
#include <vector>

#include "dsv4/indexer.hpp"
#include "ref/indexer_ref.hpp"

namespace dsv4::detail {

// Host copies of the three row arrays (the views themselves when already on the host).
struct HostIndexerRows {
  std::vector<std::int32_t> query_start, visible, page_table;
  int num_requests = 0;
  int max_pages = 0;
  ref::IndexerRows view() const {
    return {query_start.data(), visible.data(), page_table.data(), num_requests, max_pages};
  }
};

// Checks dtypes, devices and shapes of `rows` for `num_rows` query rows on `device`; returns B.
int check_indexer_row_shapes(const IndexerRowsView& rows, std::int64_t num_rows, Device device);

// Checks the values: query_start ordering, 0 ≤ V_t ≤ num_cols, and for every request the pages
// holding its visible entries: present in the table, ≥ 0, below `num_pages` (when ≥ 0) and with
// every slot representable as int32 (skipped when entries_per_page is 0: the table is not read).
// Copies CUDA tensors to the host.
HostIndexerRows check_indexer_row_contents(const IndexerRowsView& rows, std::int64_t num_rows, std::int64_t num_cols,
                                           int entries_per_page, std::int64_t num_pages);

// Throws Error(name) unless the data pointer is a multiple of `alignment` bytes.
void require_aligned(const TensorView& view, const std::string& name, std::size_t alignment);

}  // namespace dsv4::detail
