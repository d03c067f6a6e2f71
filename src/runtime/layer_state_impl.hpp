// src/runtime/layer_state_impl.hpp — what an AttentionLayer holds (internal to src/runtime/layer_state*.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "dsv4/compressor.hpp"
#include "dsv4/layer.hpp"
#include "dsv4/paged_cache.hpp"
#include "dsv4/rope.hpp"

namespace dsv4 {

// One request's streaming state in the layer's pools.
struct LayerState {
  bool open = false;
  std::int64_t tokens = 0;         // tokens processed: the next token's position
  std::int64_t rollback_floor = 0; // the lowest token count rollback() may return to
  int window_page = 0;             // its page of the window pool: a ring of window_ring tokens
  int compressor_slot = 0;         // slot in compressor_pool (ratio > 0), else 0
  int indexer_slot = 0;            // slot in indexer_pool (CSA), else 0
  std::vector<std::int32_t> page_table;  // logical → physical page of both compressed caches
};

namespace detail {
struct AttentionLayerImpl {
  ModelConfig model;
  LayerWeights weights;
  LayerOptions options;  // window_step resolved (never 0)
  RopeTable rope;  // the layer's table (q, kv, inverse RoPE of the output)

  // Window cache: one page per request (page 0 is the null page), token t of a request in slot
  // window_page · window_ring + t mod window_ring. A query sees W tokens back, and a sub-step of
  // window_step queries (or a rollback of max_rollback tokens) must not overwrite them, hence
  // window_ring = W − 1 + max(window_step, max_rollback).
  int window_ring = 0;
  PagedCache window;

  // Compressors (ratio > 0) and the indexer's own compressor (CSA), their states and caches; both
  // caches use the request's page table (page p of raw tokens ↔ page p of each compressed cache).
  std::optional<CompressorSpec> compressor_spec;
  std::optional<CompressorSpec> indexer_spec;
  CompressorStatePool compressor_pool;
  CompressorStatePool indexer_pool;
  PagedCache compressed;
  PagedCache indexer_keys;
  std::vector<std::int32_t> free_pages;  // physical pages of the compressed caches not in use

  std::vector<LayerState> requests;  // [max_requests]

  AttentionLayerImpl(const ModelConfig& model, LayerWeights weights, const LayerOptions& options);

  bool is_csa() const { return indexer_spec.has_value(); }
  LayerState& request(int id, const char* argument = "request");
  const LayerState& request(int id, const char* argument = "request") const;

  // One ragged step; arguments already validated by AttentionLayer::forward except as noted there.
  void step(std::span<const LayerStepRequest> batch, const TensorView& x, const LayerOutputs& outputs);
};
}  // namespace detail

}  // namespace dsv4
