// src/ops/topk.cpp — validation and backend dispatch of the indexer's top-k selection.
#include <cstdint>
#include <limits>
#include <string>

#include "dsv4/error.hpp"
#include "dsv4/topk.hpp"
#include "ops/indexer_rows.hpp"
#include "ref/indexer_ref.hpp"
#if defined(DSV4_WITH_CUDA)
#include "cuda/topk/params.hpp"
#endif

namespace dsv4 {

void indexer_topk(const TensorView& scores, const IndexerRowsView& rows, int entries_per_page,
                  const TensorView& indices, const TensorView& slots, const IndexerOptions& options) {
  const Device device = scores.device;
  check_tensor(scores, "scores", DType::F32, {-1, -1}, device);
  const std::int64_t num_rows = scores.dim(0);
  const std::int64_t num_cols = scores.dim(1);
  require(num_cols <= std::numeric_limits<std::int32_t>::max(), "scores", "too many columns");
  require(entries_per_page >= 1, "entries_per_page", "must be positive, got " + std::to_string(entries_per_page));
  check_tensor(indices, "indices", DType::I32, {num_rows, -1}, device);
  const std::int64_t k = indices.dim(1);
  require(k >= 1 && k <= std::numeric_limits<std::int32_t>::max() / 2, "indices",
          "K (its width) must be at least 1, got " + std::to_string(k));
  const bool with_slots = slots.given();
  if (with_slots) check_tensor(slots, "slots", DType::I32, {num_rows, k}, device);
  detail::check_indexer_row_shapes(rows, num_rows, device);
  check_disjoint({{indices, "indices"}, {slots, "slots"}},
                 {{scores, "scores"}, {rows.query_start, "query_start"}, {rows.visible, "visible"},
                  {rows.page_table, "page_table"}});

  if (device == Device::CPU) {
    // Without slots the page table is not read, so its contents need not be valid.
    const detail::HostIndexerRows host =
        detail::check_indexer_row_contents(rows, num_rows, num_cols, with_slots ? entries_per_page : 0, -1);
    ref::IndexerTopkCall call;
    call.scores = scores.as<const float>();
    call.rows = host.view();
    call.entries_per_page = entries_per_page;
    call.indices = indices.as<std::int32_t>();
    call.slots = with_slots ? slots.as<std::int32_t>() : nullptr;
    call.num_rows = num_rows;
    call.num_cols = num_cols;
    call.k = static_cast<int>(k);
    ref::indexer_topk(call);
    return;
  }
#if defined(DSV4_WITH_CUDA)
  require(num_cols <= kTopkMaxCandidates, "scores",
          "the CUDA top-k takes rows of at most " + std::to_string(kTopkMaxCandidates) + " candidates, got " +
              std::to_string(num_cols));
  if (options.check_contents)
    detail::check_indexer_row_contents(rows, num_rows, num_cols, with_slots ? entries_per_page : 0, -1);
  if (num_rows == 0) return;
  cuda::TopkParams p;
  p.scores = scores.as<const float>();
  p.visible = rows.visible.as<const std::int32_t>();
  p.query_start = rows.query_start.as<const std::int32_t>();
  p.page_table = rows.page_table.as<const std::int32_t>();
  p.num_requests = static_cast<std::int32_t>(rows.query_start.dim(0) - 1);
  p.max_pages = static_cast<std::int32_t>(rows.page_table.dim(1));
  p.entries_per_page = entries_per_page;
  p.indices = indices.as<std::int32_t>();
  p.slots = with_slots ? slots.as<std::int32_t>() : nullptr;
  p.num_rows = num_rows;
  p.num_cols = static_cast<std::int32_t>(num_cols);
  p.k = static_cast<std::int32_t>(k);
  cuda::indexer_topk(p, options.stream);
#else
  (void)options;
  throw Error("device", "this build of dsv4 has no CUDA backend");
#endif
}

}  // namespace dsv4
