// src/runtime/layer_state.cpp — an attention layer's pools and per-request states: construction,
// opening and closing requests, validation of a step, rollback and accounting.
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "dsv4/error.hpp"
#include "ops/compress_rollback.hpp"
#include "runtime/layer_state_impl.hpp"
#include "runtime/ring_limits.hpp"

namespace dsv4 {

namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

void validate_options(const ModelConfig& model, const LayerOptions& o) {
  require(o.max_requests >= 1, "max_requests", "must be at least 1, got " + std::to_string(o.max_requests));
  validate_indexer_key_format(o.indexer_format, "indexer_format");
  require(o.max_tokens >= 1 && o.max_tokens <= model.max_positions, "max_tokens",
          "must be in [1, max_position_embeddings = " + std::to_string(model.max_positions) + "], got " +
              std::to_string(o.max_tokens));
  // Upper bounds keep the int ring and pool sizes (max_requests + 1, W − 1 + max(window_step,
  // max_rollback), the compressor rings) from overflowing.
  require(o.max_requests < std::numeric_limits<int>::max(), "max_requests", "is too large");
  require(model.window <= kMaxRingExtent, "sliding_window",
          "must be at most " + std::to_string(kMaxRingExtent) + " for the window ring, got " + std::to_string(model.window));
  require(o.max_rollback >= 0 && o.max_rollback <= kMaxRingExtent, "max_rollback",
          "must be in [0, " + std::to_string(kMaxRingExtent) + "], got " + std::to_string(o.max_rollback));
  require(o.window_step >= 0 && o.window_step <= kMaxRingExtent, "window_step",
          "must be in [0, " + std::to_string(kMaxRingExtent) + "], got " + std::to_string(o.window_step));
  require(o.threads >= 1, "threads", "must be at least 1, got " + std::to_string(o.threads));
}

// The weights must be what layer_weight_specs lists for this layer (F32 on the host, those shapes,
// the compressor exactly when ratio > 0, the indexer exactly on CSA layers): the step reads them
// unchecked. A sink that sparse_attention refuses (NaN, +inf) is refused here, before any request
// exists, instead of in the middle of a step after the compressors have run.
void validate_weights(const ModelConfig& model, const LayerWeights& w) {
  const int layer = w.layer.index;
  require(w.compressor.has_value() == (w.layer.ratio > 0), "weights",
          "layer " + std::to_string(layer) + " of ratio " + std::to_string(w.layer.ratio) +
              (w.layer.ratio > 0 ? " needs its compressor weights" : " has no compressor, yet compressor weights are given"));
  require(w.indexer.has_value() == layer_has_indexer(w.layer), "weights",
          "layer " + std::to_string(layer) +
              (layer_has_indexer(w.layer) ? " is a CSA layer and needs its indexer weights" : " has no indexer, yet indexer weights are given"));
  const std::vector<const Tensor*> tensors = layer_weight_tensors(w);
  const std::vector<WeightSpec> specs = layer_weight_specs(model, layer);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    check_tensor(tensors[i]->view(), checkpoint_weight_name(layer, specs[i]), DType::F32, specs[i].shape, Device::CPU);
  }
  const float* sink = w.attn_sink.data_as<const float>();  // [H], specs[7]
  for (std::int64_t h = 0; h < w.attn_sink.numel(); ++h) {
    if (std::isnan(sink[h]) || sink[h] == std::numeric_limits<float>::infinity())
      throw Error(checkpoint_weight_name(layer, specs[7]), "head " + std::to_string(h) + " holds NaN or +inf");
  }
}

std::int64_t bytes_of(const CompressorStatePool& pool) {
  return static_cast<std::int64_t>(pool.records_per_slot()) * pool.record_floats() * 4;
}

}  // namespace

detail::AttentionLayerImpl::AttentionLayerImpl(const ModelConfig& model_, LayerWeights weights_, const LayerOptions& options_)
    : model(model_), weights(std::move(weights_)), options(options_), rope(weights.layer.rope) {
  // The sizes below divide by page_size, o_groups, ...: a config nobody validated is refused first.
  validate_model_config(model);
  validate_options(model, options);
  if (options.window_step == 0) options.window_step = model.window;
  const int index = weights.layer.index;
  require(weights.layer == layer_config(model, index), "weights",
          "were loaded for another configuration of layer " + std::to_string(index));
  validate_weights(model, weights);
  const int max_requests = options.max_requests;

  window_ring = model.window - 1 + std::max(options.window_step, options.max_rollback);
  window = PagedCache(EntryLayout{EntryKind::Attention, model.head_dim}, window_ring, max_requests + 1);

  if (weights.layer.ratio > 0) {
    const int ratio = weights.layer.ratio;
    require(model.page_size % ratio == 0, "page_size", "must be a multiple of the ratio " + std::to_string(ratio));
    const std::int64_t pages_per_request = ceil_div(options.max_tokens, model.page_size);
    const std::int64_t num_pages = pages_per_request * max_requests + 1;  // + the null page 0
    require(num_pages * (model.page_size / ratio) <= std::numeric_limits<std::int32_t>::max(), "max_tokens",
            "max_tokens · max_requests needs more cache slots than int32 slot numbers allow");
    const auto make = [&](bool indexer) {
      CompressorSpec spec = CompressorSpec::for_layer(model, index, indexer, options.indexer_format,
                                                      options.online_compressor && !weights.layer.overlap);
      spec.max_rollback = options.max_rollback;
      return spec;
    };
    compressor_spec = make(false);
    compressor_pool = CompressorStatePool(*compressor_spec, max_requests + 1);
    compressed = make_compressed_cache(*compressor_spec, model.page_size, static_cast<int>(num_pages));
    if (weights.indexer) {
      indexer_spec = make(true);
      indexer_pool = CompressorStatePool(*indexer_spec, max_requests + 1);
      indexer_keys = make_compressed_cache(*indexer_spec, model.page_size, static_cast<int>(num_pages));
    }
    for (std::int64_t p = num_pages - 1; p >= 1; --p) free_pages.push_back(static_cast<std::int32_t>(p));
  }
  requests.resize(static_cast<std::size_t>(max_requests));
}

LayerState& detail::AttentionLayerImpl::request(int id, const char* argument) {
  return const_cast<LayerState&>(static_cast<const detail::AttentionLayerImpl&>(*this).request(id, argument));
}

const LayerState& detail::AttentionLayerImpl::request(int id, const char* argument) const {
  require(id >= 0 && id < static_cast<int>(requests.size()) && requests[static_cast<std::size_t>(id)].open, argument,
          "request " + std::to_string(id) + " is not open");
  return requests[static_cast<std::size_t>(id)];
}

AttentionLayer::AttentionLayer(const ModelConfig& model, LayerWeights weights, const LayerOptions& options)
    : impl_(std::make_unique<detail::AttentionLayerImpl>(model, std::move(weights), options)) {}
AttentionLayer::~AttentionLayer() = default;
AttentionLayer::AttentionLayer(AttentionLayer&&) noexcept = default;
AttentionLayer& AttentionLayer::operator=(AttentionLayer&&) noexcept = default;

const ModelConfig& AttentionLayer::model() const { return impl_->model; }
const LayerConfig& AttentionLayer::layer() const { return impl_->weights.layer; }
const LayerWeights& AttentionLayer::weights() const { return impl_->weights; }
const LayerOptions& AttentionLayer::options() const { return impl_->options; }

int AttentionLayer::open_request() {
  detail::AttentionLayerImpl& m = *impl_;
  const auto free = std::find_if(m.requests.begin(), m.requests.end(), [](const LayerState& s) { return !s.open; });
  require(free != m.requests.end(), "max_requests",
          "all " + std::to_string(m.requests.size()) + " request slots of the layer are open");
  LayerState s;
  s.open = true;
  s.window_page = static_cast<int>(free - m.requests.begin()) + 1;
  if (m.compressor_spec) s.compressor_slot = m.compressor_pool.allocate();
  if (m.indexer_spec) s.indexer_slot = m.indexer_pool.allocate();
  *free = std::move(s);
  return static_cast<int>(free - m.requests.begin());
}

void AttentionLayer::close_request(int request) {
  detail::AttentionLayerImpl& m = *impl_;
  LayerState& s = m.request(request);
  if (s.compressor_slot) m.compressor_pool.release(s.compressor_slot);
  if (s.indexer_slot) m.indexer_pool.release(s.indexer_slot);
  // Freed pages keep their bytes; a later owner overwrites every entry before any query can see it.
  for (auto page : s.page_table) m.free_pages.push_back(page);
  s = LayerState{};
}

std::int64_t AttentionLayer::tokens(int request) const { return impl_->request(request).tokens; }

LayerRequestUsage AttentionLayer::usage(int request) const {
  const detail::AttentionLayerImpl& m = *impl_;
  const LayerState& s = m.request(request);
  LayerRequestUsage u;
  u.tokens = s.tokens;
  u.window_bytes = m.window.page_bytes();
  if (m.compressor_spec) {
    u.compressed_entries = s.tokens / m.compressor_spec->ratio;
    u.compressed_bytes = u.compressed_entries * m.compressed.layout().entry_bytes();
    u.state_bytes += bytes_of(m.compressor_pool);
  }
  if (m.indexer_spec) {
    u.indexer_entries = s.tokens / m.indexer_spec->ratio;
    u.indexer_bytes = u.indexer_entries * m.indexer_keys.layout().entry_bytes();
    u.state_bytes += bytes_of(m.indexer_pool);
  }
  return u;
}

void AttentionLayer::forward(std::span<const LayerStepRequest> batch, const TensorView& x,
                             const LayerOutputs& outputs) {
  const detail::AttentionLayerImpl& m = *impl_;
  const ModelConfig& c = m.model;
  std::int64_t total = 0;
  std::set<int> seen;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const std::string arg = "batch[" + std::to_string(i) + "]";
    const LayerState& s = m.request(batch[i].request, arg.c_str());
    require(seen.insert(batch[i].request).second, arg, "request " + std::to_string(batch[i].request) +
                                                          " appears twice in one step");
    const std::int64_t n = batch[i].new_tokens;
    require(n >= 0, arg, "new_tokens must be non-negative, got " + std::to_string(n));
    require(n <= m.options.max_tokens - s.tokens, arg,
            std::to_string(n) + " new tokens after " + std::to_string(s.tokens) + " exceed max_tokens = " +
                std::to_string(m.options.max_tokens));
    total += n;
  }
  require(x.dtype == DType::F32 || x.dtype == DType::BF16, "x",
          "expected dtype F32 or BF16, got " + std::string(dtype_name(x.dtype)));
  check_tensor(x, "x", x.dtype, {total, c.hidden_size}, Device::CPU);
  check_tensor(outputs.y, "y", DType::F32, {total, c.hidden_size}, Device::CPU);
  if (outputs.attn.given())
    check_tensor(outputs.attn, "attn", DType::F32, {total, c.num_heads, c.head_dim}, Device::CPU);
  if (outputs.topk.given()) {
    require(m.is_csa(), "topk", "only CSA layers (with an indexer) select compressed entries");
    check_tensor(outputs.topk, "topk", DType::I32, {total, c.index_topk}, Device::CPU);
  }
  impl_->step(batch, x, outputs);
}

void AttentionLayer::forward(int request, const TensorView& x, const LayerOutputs& outputs) {
  require(x.shape.size() == 2, "x", "expected shape [T, D], got " + shape_string(x.shape));
  const LayerStepRequest one{request, x.dim(0)};
  forward(std::span<const LayerStepRequest>(&one, 1), x, outputs);
}

void AttentionLayer::rollback(int request, std::int64_t n) {
  detail::AttentionLayerImpl& m = *impl_;
  LayerState& s = m.request(request);
  require(n >= 0 && n <= s.tokens - s.rollback_floor, "n",
          "can roll back between 0 and " + std::to_string(s.tokens - s.rollback_floor) + " tokens, got " +
              std::to_string(n));
  if (n == 0) return;
  // The window ring keeps max_rollback tokens beyond the window, so nothing of it needs undoing:
  // the dropped tokens' slots are rewritten before any later query can reach them. Both compressors'
  // rollbacks are checked before either changes anything.
  std::vector<std::int64_t> compressor_entries, indexer_entries;
  if (m.compressor_spec)
    compressor_entries = detail::checked_rollback(m.compressor_pool, s.compressor_slot, n, m.compressed, s.page_table);
  if (m.indexer_spec)
    indexer_entries = detail::checked_rollback(m.indexer_pool, s.indexer_slot, n, m.indexer_keys, s.page_table);
  if (m.compressor_spec) detail::apply_rollback(m.compressor_pool, s.compressor_slot, n, m.compressed, compressor_entries);
  if (m.indexer_spec) detail::apply_rollback(m.indexer_pool, s.indexer_slot, n, m.indexer_keys, indexer_entries);
  s.tokens -= n;
}

}  // namespace dsv4
