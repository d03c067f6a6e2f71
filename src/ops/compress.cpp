// src/ops/compress.cpp — validation, planning and backend dispatch of the compressor operations
// (compress, rollback, fork_prefix). Everything is checked on the host before any byte changes.
#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dsv4/compressor.hpp"
#include "dsv4/error.hpp"
#include "ops/compress_args.hpp"
#include "ops/compress_rollback.hpp"
#include "ref/compressor_ref.hpp"
#include "runtime/compressor_state_access.hpp"

#if defined(DSV4_WITH_CUDA)
#include "cuda/compressor/launch.hpp"
#endif

namespace dsv4 {

// ---- views ---------------------------------------------------------------------------------------

MatrixF32View MatrixF32View::of(const TensorView& tensor, const std::string& name) {
  require(tensor.dtype == DType::F32, name, "expected dtype F32, got " + std::string(dtype_name(tensor.dtype)));
  require(tensor.shape.size() == 2, name, "expected a 2-D tensor [rows, cols], got shape " + shape_string(tensor.shape));
  require(tensor.data != nullptr || tensor.numel() == 0, name, "null data pointer");
  return MatrixF32View{static_cast<const float*>(tensor.data), tensor.shape[0], tensor.shape[1], tensor.shape[1],
                       tensor.device};
}

MatrixF32View MatrixF32View::columns(std::int64_t begin, std::int64_t count) const {
  // count ≤ cols − begin: begin + count could overflow.
  require(begin >= 0 && count >= 0 && begin <= cols && count <= cols - begin, "columns",
          std::to_string(count) + " columns from column " + std::to_string(begin) + " are outside the " +
              std::to_string(cols) + " columns");
  return MatrixF32View{data ? data + begin : nullptr, rows, count, row_stride, device};
}

namespace {

[[noreturn, maybe_unused]] void cuda_backend_missing(const std::string& operation) {
  throw Error("device", "the CUDA backend of " + operation + " is not built yet (CPU only for now)");
}

void check_rows(const MatrixF32View& view, const std::string& name, std::int64_t rows, std::int64_t cols,
                Device device) {
  require(view.device == device, name,
          std::string("expected rows on ") + device_name(device) + ", got " + device_name(view.device));
  require(view.rows == rows && view.cols == cols, name,
          "expected shape [" + std::to_string(rows) + ", " + std::to_string(cols) + "], got [" +
              std::to_string(view.rows) + ", " + std::to_string(view.cols) + "]");
  require(view.row_stride >= view.cols, name, "row stride " + std::to_string(view.row_stride) + " is below the width");
  // The rows' span in bytes, (rows − 1)·stride + cols floats, must be countable (addresses are computed from it).
  constexpr std::int64_t kMaxFloats = std::numeric_limits<std::int64_t>::max() / 4;
  require(rows <= 1 || view.row_stride <= (kMaxFloats - view.cols) / (rows - 1), name,
          "row stride " + std::to_string(view.row_stride) + " makes the rows' span overflow");
  require(view.data != nullptr || rows == 0, name, "null data pointer");
}

// Pool and cache must have been made for a compressor with this state and entry layout.
void check_pool_and_cache(const CompressorSpec& spec, const CompressorStatePool& pool, const PagedCache& cache) {
  const CompressorSpec& made = pool.spec();
  require(made.ratio == spec.ratio && made.width == spec.width && made.overlap == spec.overlap &&
              made.online == spec.online && made.max_rollback == spec.max_rollback,
          "pool", "was made for another compressor (ratio, width, overlap, online or max_rollback differ)");
  require(cache.layout().kind == spec.output && cache.layout().dim == spec.width, "cache",
          std::string("holds ") + entry_kind_name(cache.layout().kind) + " entries of width " +
              std::to_string(cache.layout().dim) + ", the compressor writes " + entry_kind_name(spec.output) +
              " entries of width " + std::to_string(spec.width));
  require(cache.device() == pool.device(), "cache",
          std::string("is on ") + device_name(cache.device()) + " but the state pool is on " + device_name(pool.device()));
}

// The block/entry range [first, end) a request of `tokens` tokens after `prefix` completes.
std::pair<std::int64_t, std::int64_t> completed_entries(const CompressorSpec& spec, std::int64_t prefix,
                                                        std::int64_t new_tokens) {
  return {prefix / spec.ratio, (prefix + new_tokens) / spec.ratio};
}

}  // namespace

// ---- compress ------------------------------------------------------------------------------------

std::int64_t count_compress_events(const CompressorSpec& spec, const CompressBatch& batch) {
  std::int64_t events = 0;
  for (const CompressRequest& r : batch) {
    const auto [first, end] = completed_entries(spec, r.prefix_len, r.new_tokens);
    events += end - first;
  }
  return events;
}

CompressPlan plan_compress(const CompressorSpec& spec, const CompressorWeights& weights, const CompressBatch& batch,
                           const MatrixF32View& kv, const MatrixF32View& score, const CompressorStatePool& pool,
                           const PagedCache& cache, const CompressOutputs& outputs) {
  validate_compressor_spec(spec);
  check_pool_and_cache(spec, pool, cache);
  const Device device = pool.device();
  check_tensor(weights.ape, "ape", DType::F32, {spec.ratio, spec.row_width()}, device);
  check_tensor(weights.norm, "norm", DType::F32, {spec.width}, device);

  CompressPlan plan;
  std::vector<bool> slot_seen(static_cast<std::size_t>(pool.num_slots()), false);
  std::map<std::int32_t, std::pair<std::size_t, std::int64_t>> page_writer;  // physical → (request, logical page)
  const int per_page = cache.entries_per_page();
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const CompressRequest& r = batch[i];
    const std::string name = "batch[" + std::to_string(i) + "]";
    require(r.new_tokens >= 0, name + ".new_tokens", "must be non-negative, got " + std::to_string(r.new_tokens));
    if (r.slot == 0) {
      require(r.new_tokens == 0 && r.prefix_len == 0, name + ".slot",
              "slot 0 is the null slot: only a padding request with no tokens may name it");
    } else {
      pool.check_allocated(r.slot, name + ".slot");
      require(!slot_seen[static_cast<std::size_t>(r.slot)], name + ".slot",
              "state slot " + std::to_string(r.slot) + " appears twice in one step");
      slot_seen[static_cast<std::size_t>(r.slot)] = true;
      require(r.prefix_len == pool.tokens(r.slot), name + ".prefix_len",
              "is " + std::to_string(r.prefix_len) + " but state slot " + std::to_string(r.slot) + " has seen " +
                  std::to_string(pool.tokens(r.slot)) + " tokens (chunks out of order?)");
    }
    require(r.new_tokens <= spec.max_positions - r.prefix_len, name + ".new_tokens",
            "the last position " + std::to_string(r.prefix_len + r.new_tokens - 1) + " is at or past max_positions " +
                std::to_string(spec.max_positions));

    const auto [first, end] = completed_entries(spec, r.prefix_len, r.new_tokens);
    PlannedRequest planned{r.slot, r.prefix_len, r.new_tokens, plan.total_rows,
                           static_cast<std::int64_t>(plan.events.size()), end - first,
                           r.slot != 0 && CompressorStateAccess::chains_complete(pool, r.slot)};
    for (std::int64_t n = first; n < end; ++n) {
      const std::int64_t logical = n / per_page;
      const std::int32_t physical = checked_physical_page(cache, r.page_table, logical, name + ".page_table");
      const auto [it, inserted] = page_writer.try_emplace(physical, i, logical);
      require(inserted || it->second == std::make_pair(i, logical), name + ".page_table",
              "physical page " + std::to_string(physical) + " is written twice in one step (by batch[" +
                  std::to_string(it->second.first) + "] logical page " + std::to_string(it->second.second) + ")");
      plan.events.push_back(PlannedEvent{static_cast<int>(plan.requests.size()), n,
                                         physical * per_page + static_cast<std::int32_t>(n % per_page)});
    }
    plan.requests.push_back(planned);
    plan.total_rows += r.new_tokens;
  }

  check_rows(kv, "kv", plan.total_rows, spec.row_width(), device);
  check_rows(score, "score", plan.total_rows, spec.row_width(), device);
  const auto events = static_cast<std::int64_t>(plan.events.size());
  if (outputs.compressed.given()) check_tensor(outputs.compressed, "outputs.compressed", DType::F32, {events, spec.width}, device);
  if (outputs.entry_ids.given()) check_tensor(outputs.entry_ids, "outputs.entry_ids", DType::I32, {events}, device);
  if (outputs.positions.given()) check_tensor(outputs.positions, "outputs.positions", DType::I32, {events}, device);
  if (outputs.cache_slots.given()) check_tensor(outputs.cache_slots, "outputs.cache_slots", DType::I32, {events}, device);
  // The outputs share no byte with what the step reads or writes besides them, nor with each other.
  const auto bytes_of_rows = [](const MatrixF32View& m) {  // the strided view's whole span
    return TensorView{const_cast<float*>(m.data), DType::F32, {m.rows > 0 ? (m.rows - 1) * m.row_stride + m.cols : 0}, m.device};
  };
  const TensorView kv_bytes = bytes_of_rows(kv), score_bytes = bytes_of_rows(score);
  check_disjoint({{outputs.compressed, "outputs.compressed"},
                  {outputs.entry_ids, "outputs.entry_ids"},
                  {outputs.positions, "outputs.positions"},
                  {outputs.cache_slots, "outputs.cache_slots"}},
                 {{kv_bytes, "kv"},
                  {score_bytes, "score"},
                  {weights.ape, "ape"},
                  {weights.norm, "norm"},
                  {pool.storage().view(), "pool"},
                  {cache.storage().view(), "cache"}});
  return plan;
}

ref::CompressArgs detail::compress_args(const CompressorSpec& spec, const CompressPlan& plan,
                                        const CompressorWeights& weights, const MatrixF32View& kv,
                                        const MatrixF32View& score, CompressorStatePool& pool, PagedCache& cache,
                                        const CompressOutputs& outputs) {
  ref::CompressArgs args;
  args.spec = &spec;
  args.plan = &plan;
  args.kv = kv.data;
  args.kv_stride = kv.row_stride;
  args.score = score.data;
  args.score_stride = score.row_stride;
  args.ape = weights.ape.as<const float>();
  args.norm = weights.norm.as<const float>();
  args.state = pool.storage().data_as<float>();
  args.chains = CompressorStateAccess::chains(pool);
  args.records_per_slot = pool.records_per_slot();
  args.record_floats = pool.record_floats();
  args.cache = cache.storage().data_as<std::uint8_t>();
  args.page_bytes = cache.page_bytes();
  args.entries_per_page = cache.entries_per_page();
  args.out_compressed = outputs.compressed.as<float>();
  args.out_entry_ids = outputs.entry_ids.as<std::int32_t>();
  args.out_positions = outputs.positions.as<std::int32_t>();
  args.out_cache_slots = outputs.cache_slots.as<std::int32_t>();
  return args;
}

void compress(const CompressorSpec& spec, const CompressorWeights& weights, const CompressBatch& batch,
              const MatrixF32View& kv, const MatrixF32View& score, CompressorStatePool& pool, PagedCache& cache,
              const CompressOutputs& outputs, [[maybe_unused]] void* stream) {
  const CompressPlan plan = plan_compress(spec, weights, batch, kv, score, pool, cache, outputs);
  const ref::CompressArgs args = detail::compress_args(spec, plan, weights, kv, score, pool, cache, outputs);
  std::vector<bool> chains_kept(plan.requests.size(), false);  // per planned request (CUDA slice chains)
  switch (pool.device()) {
    case Device::CPU: ref::compress(args); break;
    case Device::CUDA:
#if defined(DSV4_WITH_CUDA)
      chains_kept = cuda::run_compress(args, stream);
      break;
#else
      cuda_backend_missing("compress");
#endif
  }
  for (std::size_t i = 0; i < plan.requests.size(); ++i) {
    const PlannedRequest& r = plan.requests[i];
    if (r.slot != 0) CompressorStateAccess::advance(pool, r.slot, r.prefix_len + r.new_tokens, chains_kept[i]);
  }
}

// ---- rollback and fork -----------------------------------------------------------------------------

std::vector<std::int64_t> detail::checked_rollback(const CompressorStatePool& pool, int slot, std::int64_t n,
                                                   const PagedCache& cache, std::span<const std::int32_t> page_table) {
  const CompressorSpec& spec = pool.spec();
  check_pool_and_cache(spec, pool, cache);
  pool.check_allocated(slot, "slot");
  const std::int64_t tokens = pool.tokens(slot);
  require(n >= 0 && n <= tokens, "n", std::to_string(n) + " is outside [0, " + std::to_string(tokens) + "]");
  require(tokens - n >= pool.rollback_floor(slot), "n",
          "rolling back " + std::to_string(n) + " of " + std::to_string(tokens) + " tokens goes below " +
              std::to_string(pool.rollback_floor(slot)) + ", the oldest state slot " + std::to_string(slot) +
              " still holds (at most " + std::to_string(spec.max_rollback) +
              " tokens below its highest count, never before a fork point)");
  // The cache slots of the entries completed by the dropped tokens, every page validated.
  const auto [first, end] = completed_entries(spec, tokens - n, n);
  const int per_page = cache.entries_per_page();
  std::vector<std::int64_t> slots;
  for (std::int64_t e = first; e < end; ++e) {
    const std::int32_t physical = checked_physical_page(cache, page_table, e / per_page, "page_table");
    slots.push_back(static_cast<std::int64_t>(physical) * per_page + e % per_page);
  }
  return slots;
}

void detail::apply_rollback(CompressorStatePool& pool, int slot, std::int64_t n, PagedCache& cache,
                            const std::vector<std::int64_t>& slots, [[maybe_unused]] void* stream) {
  const int per_page = cache.entries_per_page();
  if (!slots.empty() && cache.device() == Device::CUDA) {
#if defined(DSV4_WITH_CUDA)
    cuda::clear_entries(cache.layout(), cache.storage().data_as<std::uint8_t>(), cache.page_bytes(), per_page, slots,
                        stream);
#else
    cuda_backend_missing("rollback");
#endif
  } else {
    for (const std::int64_t s : slots) {
      cache.layout().clear(cache.page_data(static_cast<int>(s / per_page)), static_cast<int>(s % per_page), per_page);
    }
  }
  CompressorStateAccess::rewind(pool, slot, pool.tokens(slot) - n);
}

void rollback(CompressorStatePool& pool, int slot, std::int64_t n, PagedCache& cache,
              std::span<const std::int32_t> page_table, void* stream) {
  detail::apply_rollback(pool, slot, n, cache, detail::checked_rollback(pool, slot, n, cache, page_table), stream);
}

void fork_prefix(CompressorStatePool& pool, int src_slot, int dst_slot, std::int64_t prefix_tokens,
                 const PagedCache& cache, [[maybe_unused]] void* stream) {
  const CompressorSpec& spec = pool.spec();
  check_pool_and_cache(spec, pool, cache);
  pool.check_allocated(src_slot, "src_slot");
  pool.check_allocated(dst_slot, "dst_slot");
  require(src_slot != dst_slot, "dst_slot", "must differ from src_slot");
  require(pool.tokens(dst_slot) == 0, "dst_slot",
          "state slot " + std::to_string(dst_slot) + " already has " + std::to_string(pool.tokens(dst_slot)) +
              " tokens; fork into a freshly allocated slot");
  const std::int64_t page_tokens = static_cast<std::int64_t>(spec.ratio) * cache.entries_per_page();
  require(prefix_tokens >= 0 && prefix_tokens % spec.ratio == 0, "prefix_tokens",
          std::to_string(prefix_tokens) + " is inside a block of " + std::to_string(spec.ratio) +
              " tokens: a fork mid-block is refused (the open block's rows belong to the source request)");
  require(prefix_tokens % page_tokens == 0, "prefix_tokens",
          std::to_string(prefix_tokens) + " is not at a page boundary (a multiple of " + std::to_string(page_tokens) +
              " tokens), so the two requests would write into one cache page");
  require(prefix_tokens <= pool.tokens(src_slot) && prefix_tokens >= pool.rollback_floor(src_slot), "prefix_tokens",
          std::to_string(prefix_tokens) + " is outside [" + std::to_string(pool.rollback_floor(src_slot)) + ", " +
              std::to_string(pool.tokens(src_slot)) + "], the token counts whose state slot " +
              std::to_string(src_slot) + " still holds");
  // The whole slot is copied: it holds the rows (or snapshot) of the fork point among others.
  const std::size_t floats = static_cast<std::size_t>(pool.records_per_slot()) * pool.record_floats();
  const float* src = CompressorStateAccess::slot_records(pool, src_slot);
  float* dst = CompressorStateAccess::slot_records(pool, dst_slot);
  if (pool.device() == Device::CUDA) {
#if defined(DSV4_WITH_CUDA)
    cuda::copy_state(dst, src, floats, stream);
#else
    cuda_backend_missing("fork_prefix");
#endif
  } else {
    std::copy(src, src + floats, dst);
  }
  CompressorStateAccess::start_at(pool, dst_slot, prefix_tokens);
}

}  // namespace dsv4
