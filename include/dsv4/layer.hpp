// dsv4/layer.hpp — one DeepSeek-V4 attention layer with its per-request streaming state (SPEC §8).
//
// An AttentionLayer holds one layer's weights and, for up to `max_requests` requests, everything
// streaming needs: the window cache (the last tokens' kv in the 584-byte format of §5.1, a ring per
// request), the compressor and indexer states (§6) and their paged caches (§5). `forward` runs one
// ragged step — any number of new tokens for any subset of the open requests — and is chunk- and
// batch-invariant: a request's outputs and cache bytes never depend on how its tokens were split
// into steps or which requests shared a step.
//
//   AttentionLayer layer(model, load_layer_weights(path, model, 2), {});
//   int r = layer.open_request();
//   layer.forward(r, x_prompt, {y_prompt});        // prefill [T, D]
//   layer.forward(r, x_next, {y_next});            // decode  [1, D]
//
// The projections run on the CPU with double accumulation (the reference); docs/layer.md describes
// the step and the state.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "dsv4/cache_format.hpp"
#include "dsv4/config.hpp"
#include "dsv4/tensor.hpp"
#include "dsv4/weights.hpp"

namespace dsv4 {

namespace detail {
struct AttentionLayerImpl;  // src/runtime/layer_state_impl.hpp
}

struct LayerOptions {
  int max_requests = 1;               // requests whose state the layer holds at once
  std::int64_t max_tokens = 1 << 16;  // tokens one request may reach (sizes the paged caches)
  int max_rollback = 8;               // tokens a request may drop again (speculative decoding)
  // Queries attended per window sub-step (0: the window W): the window ring holds
  // W − 1 + max(window_step, max_rollback) tokens per request, however long a prefill chunk is.
  int window_step = 0;
  IndexerKeyFormat indexer_format = IndexerKeyFormat::FP8;  // CSA key cache (132 or 68 bytes)
  bool online_compressor = false;     // running (M, S, V) state for non-overlapping compressors
  int threads = 1;                    // CPU threads for the projections and the indexer; results do not depend on it
};

// One request's part of a step; its rows follow the previous request's in `x`.
struct LayerStepRequest {
  int request = 0;              // from open_request()
  std::int64_t new_tokens = 0;  // ≥ 0; positions tokens(request) .. tokens(request) + new_tokens − 1
};

// Outputs of a step, host F32/I32 views over T = Σ new_tokens rows. `y` is required; leave `attn`
// or `topk` default (null data, empty shape) to skip them.
struct LayerOutputs {
  TensorView y;     // [T, D] F32: the layer output
  TensorView attn;  // [T, H, d] F32: attention output after inverse RoPE, before the output projection
  TensorView topk;  // [T, K] I32: CSA layers only — selected entry numbers, ascending, −1 padded

  LayerOutputs() = default;
  LayerOutputs(TensorView y_, TensorView attn_ = {}, TensorView topk_ = {})
      : y(std::move(y_)), attn(std::move(attn_)), topk(std::move(topk_)) {}
};

// What one request holds, for inspection and accounting (bytes of the layer's pools it owns).
struct LayerRequestUsage {
  std::int64_t tokens = 0;              // tokens processed (the next token's position)
  std::int64_t window_bytes = 0;        // its window ring (fixed size)
  std::int64_t compressed_entries = 0;  // attention entries written (tokens / m)
  std::int64_t compressed_bytes = 0;    // those entries, 584 B each
  std::int64_t indexer_entries = 0;     // indexer keys written (CSA)
  std::int64_t indexer_bytes = 0;       // those keys, 132 or 68 B each
  std::int64_t state_bytes = 0;         // compressor (and indexer compressor) streaming state
};

class AttentionLayer {
 public:
  // Takes the weights of layer weights.layer.index of `model`. Throws Error(key) for an invalid
  // `model` (validate_model_config), Error("weights") when they do not belong to that layer,
  // Error(option name) for invalid options.
  AttentionLayer(const ModelConfig& model, LayerWeights weights, const LayerOptions& options = {});
  ~AttentionLayer();
  AttentionLayer(AttentionLayer&&) noexcept;
  AttentionLayer& operator=(AttentionLayer&&) noexcept;

  const ModelConfig& model() const;
  const LayerConfig& layer() const;
  const LayerWeights& weights() const;
  const LayerOptions& options() const;

  // A new request with no tokens. Throws Error("max_requests") when every request slot is open.
  int open_request();
  // Frees a request's state and cache pages. Error("request") unless it is open.
  void close_request(int request);
  std::int64_t tokens(int request) const;
  LayerRequestUsage usage(int request) const;

  // One ragged step. `x` [T, D] (F32 or BF16, host) holds the new tokens of batch[0], then
  // batch[1], ... (the layer's normalized input). Every argument is validated first — requests
  // open and distinct, positions below max_tokens and max_positions, shapes and dtypes of x and the
  // outputs — and an Error naming it leaves every state and cache untouched.
  void forward(std::span<const LayerStepRequest> batch, const TensorView& x, const LayerOutputs& outputs);
  // The same for a single request: x [T, D] are its next T tokens.
  void forward(int request, const TensorView& x, const LayerOutputs& outputs);

  // Drops the last `n` tokens of `request` (speculative decoding): afterwards it continues exactly
  // as if they never arrived. Error("n") when n < 0 or more than max_rollback below the most
  // tokens it reached.
  void rollback(int request, std::int64_t n);

 private:
  std::unique_ptr<detail::AttentionLayerImpl> impl_;
};

}  // namespace dsv4
