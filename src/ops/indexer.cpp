// src/ops/indexer.cpp — validation and backend dispatch of the indexer's query preparation and scores.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "dsv4/error.hpp"
#include "dsv4/indexer.hpp"
#include "dsv4/paged_cache.hpp"
#include "ops/indexer_rows.hpp"
#include "ref/indexer_ref.hpp"
#if defined(DSV4_WITH_CUDA)
#include "cuda/indexer/params.hpp"
#endif

namespace dsv4 {

namespace detail {

int check_indexer_row_shapes(const IndexerRowsView& rows, std::int64_t num_rows, Device device) {
  check_tensor(rows.query_start, "query_start", DType::I32, {-1}, device);
  require(rows.query_start.dim(0) >= 1, "query_start", "needs B + 1 ≥ 1 entries");
  const std::int64_t requests = rows.query_start.dim(0) - 1;
  require(requests <= std::numeric_limits<std::int32_t>::max(), "query_start", "too many requests");
  check_tensor(rows.visible, "visible", DType::I32, {num_rows}, device);
  check_tensor(rows.page_table, "page_table", DType::I32, {requests, -1}, device);
  require(rows.page_table.dim(1) <= std::numeric_limits<std::int32_t>::max(), "page_table", "too many pages per request");
  require(requests >= 1 || num_rows == 0, "query_start", "has no request but there are query rows");
  return static_cast<int>(requests);
}

namespace {
std::vector<std::int32_t> host_copy(const TensorView& view) {
  std::vector<std::int32_t> out(static_cast<std::size_t>(view.numel()));
  if (out.empty()) return out;
  if (view.device == Device::CPU) {
    const auto* data = view.as<const std::int32_t>();
    std::copy(data, data + out.size(), out.begin());
  } else {
    Tensor host = Tensor::empty(DType::I32, view.shape, Device::CPU);
    host.copy_from(view);
    const auto* data = host.data_as<const std::int32_t>();
    std::copy(data, data + out.size(), out.begin());
  }
  return out;
}
}  // namespace

HostIndexerRows check_indexer_row_contents(const IndexerRowsView& rows, std::int64_t num_rows, std::int64_t num_cols,
                                           int entries_per_page, std::int64_t num_pages) {
  HostIndexerRows host;
  host.num_requests = static_cast<int>(rows.query_start.dim(0) - 1);
  host.max_pages = static_cast<int>(rows.page_table.dim(1));
  host.query_start = host_copy(rows.query_start);
  host.visible = host_copy(rows.visible);
  host.page_table = host_copy(rows.page_table);
  const auto& qs = host.query_start;
  require(qs[0] == 0, "query_start", "must start at 0, got " + std::to_string(qs[0]));
  for (int b = 0; b < host.num_requests; ++b)
    require(qs[b] <= qs[b + 1], "query_start",
            "must be non-decreasing, but entry " + std::to_string(b + 1) + " is below entry " + std::to_string(b));
  require(qs[host.num_requests] == num_rows, "query_start",
          "must end at the number of query rows " + std::to_string(num_rows) + ", got " +
              std::to_string(qs[host.num_requests]));
  for (std::int64_t t = 0; t < num_rows; ++t) {
    const std::int32_t v = host.visible[static_cast<std::size_t>(t)];
    require(v >= 0 && v <= num_cols, "visible",
            "row " + std::to_string(t) + " sees " + std::to_string(v) + " entries, outside [0, " +
                std::to_string(num_cols) + "] (the score row width)");
  }
  const std::int64_t max_slot = std::numeric_limits<std::int32_t>::max();
  for (int b = 0; entries_per_page > 0 && b < host.num_requests; ++b) {
    std::int64_t most = 0;
    for (std::int32_t t = qs[b]; t < qs[b + 1]; ++t) most = std::max<std::int64_t>(most, host.visible[t]);
    const std::int64_t needed = (most + entries_per_page - 1) / entries_per_page;
    require(needed <= host.max_pages, "page_table",
            "request " + std::to_string(b) + " sees " + std::to_string(most) + " entries in " + std::to_string(needed) +
                " pages, but its row has " + std::to_string(host.max_pages));
    for (std::int64_t p = 0; p < needed; ++p) {
      const std::int64_t page = host.page_table[static_cast<std::size_t>(b * static_cast<std::int64_t>(host.max_pages) + p)];
      require(page >= 0 && (num_pages < 0 || page < num_pages), "page_table",
              "request " + std::to_string(b) + " page " + std::to_string(p) + " is " + std::to_string(page) +
                  (num_pages < 0 ? ", negative" : ", outside the pool of " + std::to_string(num_pages) + " pages"));
      require(page * entries_per_page + entries_per_page - 1 <= max_slot, "page_table",
              "request " + std::to_string(b) + " page " + std::to_string(page) + " has slots beyond int32");
    }
  }
  return host;
}

void require_aligned(const TensorView& view, const std::string& name, std::size_t alignment) {
  require(reinterpret_cast<std::uintptr_t>(view.data) % alignment == 0, name,
          "must be " + std::to_string(alignment) + "-byte aligned on CUDA");
}

}  // namespace detail

namespace {

using detail::require_aligned;

Shape code_shape(IndexerKeyFormat format, std::int64_t rows, std::int64_t heads, int dim) {
  return {rows, heads, format == IndexerKeyFormat::FP8 ? dim : dim / 2};
}
Shape scale_shape(IndexerKeyFormat format, std::int64_t rows, std::int64_t heads, int dim) {
  if (format == IndexerKeyFormat::FP8) return {rows, heads};
  return {rows, heads, dim / IndexerEntryFormat::kFp4Block};
}
DType scale_dtype(IndexerKeyFormat format) { return format == IndexerKeyFormat::FP8 ? DType::F32 : DType::U8; }

void check_query_tensors(const IndexerQueryView& q, IndexerKeyFormat format, std::int64_t rows, std::int64_t heads,
                         int dim, Device device, const std::string& prefix) {
  check_tensor(q.codes, prefix + "codes", DType::U8, code_shape(format, rows, heads, dim), device);
  check_tensor(q.scales, prefix + "scales", scale_dtype(format), scale_shape(format, rows, heads, dim), device);
  check_tensor(q.weights, prefix + "weights", DType::F32, {rows, heads}, device);
}

void check_dim(IndexerKeyFormat format, int dim, const std::string& name) {
  require(dim >= 1, name, "d_I must be positive, got " + std::to_string(dim));
  if (format == IndexerKeyFormat::FP4)
    require(dim % IndexerEntryFormat::kFp4Block == 0, name,
            "FP4 needs d_I to be a multiple of 32, got " + std::to_string(dim));
}

[[maybe_unused]] [[noreturn]] void no_cuda_backend() {
  throw Error("device", "this build of dsv4 has no CUDA backend");
}

}  // namespace

IndexerQuery IndexerQuery::empty(IndexerKeyFormat format, std::int64_t rows, int heads, int dim, Device device) {
  validate_indexer_key_format(format, "format");
  check_dim(format, dim, "dim");
  require(heads >= 1, "heads", "must be positive");
  require(rows >= 0, "rows", "must be non-negative, got " + std::to_string(rows));
  IndexerQuery q;
  q.codes = Tensor::empty(DType::U8, code_shape(format, rows, heads, dim), device);
  q.scales = Tensor::empty(scale_dtype(format), scale_shape(format, rows, heads, dim), device);
  q.weights = Tensor::empty(DType::F32, {rows, heads}, device);
  return q;
}

void prepare_indexer_queries(const TensorView& q_rows, const TensorView& head_logits, const TensorView& rope_cos,
                             const TensorView& rope_sin, IndexerKeyFormat format, const IndexerQueryView& out,
                             const IndexerOptions& options) {
  const Device device = q_rows.device;
  validate_indexer_key_format(format, "format");
  check_tensor(q_rows, "q_rows", DType::F32, {-1, -1}, device);
  const std::int64_t rows = q_rows.dim(0);
  check_tensor(head_logits, "head_logits", DType::F32, {rows, -1}, device);
  const std::int64_t heads = head_logits.dim(1);
  require(heads >= 1 && heads <= 4096, "head_logits", "needs between 1 and 4096 heads, got " + std::to_string(heads));
  require(q_rows.dim(1) % heads == 0, "q_rows",
          "width " + std::to_string(q_rows.dim(1)) + " is not a multiple of H_I = " + std::to_string(heads));
  const std::int64_t dim64 = q_rows.dim(1) / heads;
  require(dim64 >= 1 && dim64 <= 65536 && (dim64 & (dim64 - 1)) == 0, "q_rows",
          "d_I = " + std::to_string(dim64) + " must be a power of two (Walsh–Hadamard)");
  const int dim = static_cast<int>(dim64);
  check_dim(format, dim, "q_rows");
  check_tensor(rope_cos, "rope_cos", DType::F32, {rows, -1}, device);
  const std::int64_t pairs = rope_cos.dim(1);
  require(2 * pairs <= dim, "rope_cos", "r = " + std::to_string(2 * pairs) + " exceeds d_I = " + std::to_string(dim));
  check_tensor(rope_sin, "rope_sin", DType::F32, {rows, pairs}, device);
  check_query_tensors(out, format, rows, heads, dim, device, "out.");
  check_disjoint({{out.codes, "out.codes"}, {out.scales, "out.scales"}, {out.weights, "out.weights"}},
                 {{q_rows, "q_rows"}, {head_logits, "head_logits"}, {rope_cos, "rope_cos"}, {rope_sin, "rope_sin"}});
  ref::IndexerQueryBuffers buffers;
  buffers.q_rows = q_rows.as<const float>();
  buffers.head_logits = head_logits.as<const float>();
  buffers.rope_cos = rope_cos.as<const float>();
  buffers.rope_sin = rope_sin.as<const float>();
  buffers.codes = out.codes.as<std::uint8_t>();
  buffers.scales = out.scales.data;
  buffers.weights = out.weights.as<float>();
  buffers.num_rows = rows;
  buffers.heads = static_cast<std::int32_t>(heads);
  buffers.rope_pairs = static_cast<std::int32_t>(pairs);
  if (device == Device::CPU) {
    ref::IndexerQueryPrepCall call;
    static_cast<ref::IndexerQueryBuffers&>(call) = buffers;
    call.format = IndexerEntryFormat{format, dim};
    ref::prepare_indexer_queries(call);
    return;
  }
#if defined(DSV4_WITH_CUDA)
  require(dim == 128, "q_rows", "the CUDA kernel needs d_I = 128, got " + std::to_string(dim));
  for (const auto& [view, name] : {std::pair{q_rows, "q_rows"}, {out.codes, "out.codes"}})
    require_aligned(view, name, 16);
  if (rows == 0) return;
  cuda::IndexerQueryPrepParams p;
  static_cast<ref::IndexerQueryBuffers&>(p) = buffers;
  p.format = format;
  p.weight_scale = 1.0 / std::sqrt(static_cast<double>(dim) * static_cast<double>(heads));
  cuda::prepare_indexer_queries(p, options.stream);
#else
  (void)options;
  no_cuda_backend();
#endif
}

void indexer_scores(const IndexerQueryView& q, const IndexerKeyCacheView& keys, const IndexerRowsView& rows,
                    const TensorView& scores, const IndexerOptions& options) {
  const Device device = q.codes.device;
  const IndexerEntryFormat format = keys.format;
  validate_indexer_key_format(format.format, "keys.format");
  check_dim(format.format, format.dim, "keys.format");
  require(keys.entries_per_page >= 1, "keys.entries_per_page",
          "must be positive, got " + std::to_string(keys.entries_per_page));
  check_tensor(q.codes, "q.codes", DType::U8, {-1, -1, format.data_bytes()}, device);
  const std::int64_t num_rows = q.codes.dim(0);
  const std::int64_t heads = q.codes.dim(1);
  require(heads >= 1, "q.codes", "needs at least one head");
  check_query_tensors(q, format.format, num_rows, heads, format.dim, device, "q.");
  check_tensor(keys.pages, "keys.pages", DType::U8, {-1, format.page_bytes(keys.entries_per_page)}, device);
  const std::int64_t num_pages = keys.pages.dim(0);
  check_tensor(scores, "scores", DType::F32, {num_rows, -1}, device);
  const std::int64_t num_cols = scores.dim(1);
  require(num_cols <= std::numeric_limits<std::int32_t>::max(), "scores", "too many columns");
  detail::check_indexer_row_shapes(rows, num_rows, device);
  check_disjoint({{scores, "scores"}}, {{q.codes, "q.codes"},
                                      {q.scales, "q.scales"},
                                      {q.weights, "q.weights"},
                                      {keys.pages, "keys.pages"},
                                      {rows.query_start, "query_start"},
                                      {rows.visible, "visible"},
                                      {rows.page_table, "page_table"}});

  ref::IndexerScoreBuffers buffers;
  buffers.q_codes = q.codes.as<const std::uint8_t>();
  buffers.q_scales = q.scales.data;
  buffers.weights = q.weights.as<const float>();
  buffers.pages = keys.pages.as<const std::uint8_t>();
  buffers.page_bytes = format.page_bytes(keys.entries_per_page);
  buffers.entries_per_page = keys.entries_per_page;
  buffers.heads = static_cast<std::int32_t>(heads);
  buffers.scores = scores.as<float>();
  buffers.num_rows = num_rows;
  if (device == Device::CPU) {
    const detail::HostIndexerRows host =
        detail::check_indexer_row_contents(rows, num_rows, num_cols, keys.entries_per_page, num_pages);
    ref::IndexerScoresCall call;
    static_cast<ref::IndexerScoreBuffers&>(call) = buffers;
    call.format = format;
    call.rows = host.view();
    call.num_cols = num_cols;
    ref::indexer_scores(call);
    return;
  }
#if defined(DSV4_WITH_CUDA)
  require(format.dim == 128, "keys.format", "the CUDA kernels need d_I = 128, got " + std::to_string(format.dim));
  require(heads % 64 == 0 && heads <= 128, "q.codes",
          "the CUDA kernels need H_I = 64 or 128 (wgmma N = 64 heads), got " + std::to_string(heads));
  const int epp = keys.entries_per_page;
  require(epp >= 4 && (epp & (epp - 1)) == 0, "keys.entries_per_page",
          "the CUDA kernels need a power of two ≥ 4 (16-byte aligned entries), got " + std::to_string(epp));
  require_aligned(q.codes, "q.codes", 16);
  require_aligned(keys.pages, "keys.pages", 16);
  require_aligned(q.scales, "q.scales", 4);
  require(num_rows <= std::numeric_limits<std::int32_t>::max() / 2, "q.codes", "too many query rows");
  if (options.check_contents)
    detail::check_indexer_row_contents(rows, num_rows, num_cols, keys.entries_per_page, num_pages);
  if (num_rows == 0 || num_cols == 0) return;
  cuda::IndexerScoreParams p;
  static_cast<ref::IndexerScoreBuffers&>(p) = buffers;
  p.format = format.format;
  p.num_pages = num_pages;
  while ((1 << p.entries_per_page_log2) < epp) ++p.entries_per_page_log2;
  p.query_start = rows.query_start.as<const std::int32_t>();
  p.visible = rows.visible.as<const std::int32_t>();
  p.page_table = rows.page_table.as<const std::int32_t>();
  p.num_requests = static_cast<std::int32_t>(rows.query_start.dim(0) - 1);
  p.max_pages = static_cast<std::int32_t>(rows.page_table.dim(1));
  p.num_cols = static_cast<std::int32_t>(num_cols);
  cuda::indexer_scores(p, options.stream);
#else
  (void)options;
  no_cuda_backend();
#endif
}

}  // namespace dsv4
