// src/runtime/layer_state_step.cpp — one ragged step of an attention layer (SPEC §8):
// projections → compressors (entries stored before attention) → per request and window sub-step:
// window writes, candidate lists (window + CSA selection or all visible HCA entries), sparse
// attention with sink and inverse RoPE → grouped output projection.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "dsv4/entry_codec.hpp"
#include "dsv4/error.hpp"
#include "dsv4/formats.hpp"
#include "dsv4/sparse_attention.hpp"
#include "ref/layer_projections.hpp"
#include "runtime/layer_state_impl.hpp"
#include "runtime/layer_state_select.hpp"

namespace dsv4 {

namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// x [T, D] as float32 (a bf16 input is widened exactly).
std::vector<float> input_as_float(const TensorView& x) {
  std::vector<float> out(static_cast<std::size_t>(x.numel()));
  if (x.dtype == DType::F32) {
    std::memcpy(out.data(), x.data, out.size() * sizeof(float));
  } else {
    const auto* bits = x.as<const std::uint16_t>();  // [T, D] bf16
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = float_from_bf16_bits(bits[i]);
  }
  return out;
}

MatrixF32View rows_view(const std::vector<float>& rows, std::int64_t count, std::int64_t width) {
  return MatrixF32View{rows.data(), count, width, width, Device::CPU};
}


// Window candidates of n queries at `positions`: tokens t − W + 1 .. t, oldest first, as slots of the
// request's ring (page `page` of `ring` entries); −1 before the sequence start. I32 [n, W].
Tensor window_slots(const std::int64_t* positions, std::int64_t n, int W, int page, int ring) {
  Tensor slots = Tensor::empty(DType::I32, {n, W});
  for (std::int64_t r = 0; r < n; ++r) {
    for (int j = 0; j < W; ++j) {
      const std::int64_t u = positions[r] - W + 1 + j;
      slots.data_as<std::int32_t>()[r * W + j] = u < 0 ? -1 : static_cast<std::int32_t>(page * ring + u % ring);
    }
  }
  return slots;
}

// HCA candidates: every visible entry 0 .. V_t − 1 of each query, −1 padded to the widest row
// (the last query's, V_t grows with t). Entry numbers [n, width].
std::vector<std::int32_t> all_visible_entries(const std::int64_t* positions, std::int64_t n, int ratio,
                                              std::int64_t& width) {
  width = n > 0 ? (positions[n - 1] + 1) / ratio : 0;
  std::vector<std::int32_t> entries(static_cast<std::size_t>(n * width), -1);
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t e = 0; e < (positions[r] + 1) / ratio; ++e) entries[r * width + e] = static_cast<std::int32_t>(e);
  return entries;
}

// Entry numbers [n, width] (−1: none) → physical slots of the compressed cache. I32 [n, width].
Tensor physical_slots(const std::vector<std::int32_t>& entries, std::int64_t n, std::int64_t width,
                      const std::vector<std::int32_t>& page_table, int entries_per_page) {
  Tensor slots = Tensor::empty(DType::I32, {n, width});
  for (std::size_t k = 0; k < entries.size(); ++k) {
    slots.data_as<std::int32_t>()[k] =
        entries[k] < 0 ? -1 : static_cast<std::int32_t>(physical_slot(page_table.data(), entries[k], entries_per_page));
  }
  return slots;
}

}  // namespace

void detail::AttentionLayerImpl::step(std::span<const LayerStepRequest> batch, const TensorView& x,
                                const LayerOutputs& outputs) {
  const std::int64_t T = x.dim(0), H = model.num_heads, d = model.head_dim;
  const int W = model.window, K = model.index_topk, threads = options.threads;
  const int ratio = weights.layer.ratio;

  // Rows of each request and their positions.
  std::vector<std::int64_t> row_begin(batch.size() + 1, 0), positions(static_cast<std::size_t>(T));
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const LayerState& s = request(batch[i].request);
    row_begin[i + 1] = row_begin[i] + batch[i].new_tokens;
    for (std::int64_t r = 0; r < batch[i].new_tokens; ++r) positions[row_begin[i] + r] = s.tokens + r;
  }

  // Page tables grown to cover every new token (tentatively: committed after validation).
  std::vector<std::vector<std::int32_t>> tables(batch.size());
  std::vector<std::int32_t> free_after = free_pages;
  for (std::size_t i = 0; i < batch.size() && ratio > 0; ++i) {
    const LayerState& s = request(batch[i].request);
    tables[i] = s.page_table;
    const std::int64_t pages = ceil_div(s.tokens + batch[i].new_tokens, model.page_size);
    while (static_cast<std::int64_t>(tables[i].size()) < pages) {
      require(!free_after.empty(), "max_tokens", "the layer's compressed caches are full");
      tables[i].push_back(free_after.back());
      free_after.pop_back();
    }
  }

  const std::vector<float> xf = input_as_float(x);
  const ref::LayerProjections p = ref::project_inputs(model, weights, rope, xf.data(), positions.data(), T, threads);

  // Compressors: validate both steps, then run them (entries are stored before any attention).
  if (compressor_spec) {
    const auto make_batch = [&](bool indexer) {
      CompressBatch cb;
      for (std::size_t i = 0; i < batch.size(); ++i) {
        const LayerState& s = request(batch[i].request);
        cb.push_back({indexer ? s.indexer_slot : s.compressor_slot, s.tokens, batch[i].new_tokens, tables[i]});
      }
      return cb;
    };
    const CompressorWeights cw{weights.compressor->ape.view(), weights.compressor->norm.view()};
    const std::int64_t width = compressor_spec->row_width();
    const CompressBatch cb = make_batch(false);
    plan_compress(*compressor_spec, cw, cb, rows_view(p.compressor_kv, T, width),
                  rows_view(p.compressor_score, T, width), compressor_pool, compressed);
    if (indexer_spec) {
      const CompressorWeights iw{weights.indexer->compressor.ape.view(), weights.indexer->compressor.norm.view()};
      const std::int64_t iwidth = indexer_spec->row_width();
      const CompressBatch ib = make_batch(true);
      plan_compress(*indexer_spec, iw, ib, rows_view(p.indexer_kv, T, iwidth), rows_view(p.indexer_score, T, iwidth),
                    indexer_pool, indexer_keys);
      compress(*indexer_spec, iw, ib, rows_view(p.indexer_kv, T, iwidth), rows_view(p.indexer_score, T, iwidth),
               indexer_pool, indexer_keys);
    }
    compress(*compressor_spec, cw, cb, rows_view(p.compressor_kv, T, width), rows_view(p.compressor_score, T, width),
             compressor_pool, compressed);
    for (std::size_t i = 0; i < batch.size(); ++i) request(batch[i].request).page_table = tables[i];
    free_pages = std::move(free_after);
  }

  // Attention, request by request, in sub-steps of at most window_step queries: the sub-step's
  // tokens enter the window ring first, so every query finds its whole window there.
  std::vector<float> o(static_cast<std::size_t>(T * H * d));           // [T, H, d]
  std::vector<std::int32_t> selected(is_csa() ? static_cast<std::size_t>(T * K) : 0);  // [T, K] entry numbers
  const AttentionPoolView window_view{window.storage().view(), window_ring};
  const AttentionPoolView compressed_view =
      compressor_spec ? AttentionPoolView{compressed.storage().view(), compressed.entries_per_page()} : window_view;
  const Tensor sink = weights.attn_sink;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const LayerState& s = request(batch[i].request);
    for (std::int64_t a = row_begin[i]; a < row_begin[i + 1]; a += options.window_step) {
      const std::int64_t b = std::min(row_begin[i + 1], a + options.window_step), n = b - a;
      std::uint8_t* ring = window.page_data(s.window_page);
      for (std::int64_t r = a; r < b; ++r)
        encode_attention_entry(p.kv.data() + r * d, ring, static_cast<int>(positions[r] % window_ring), window_ring);

      // Compressed candidates as entry numbers (ascending, −1 padded): the CSA selection or all
      // visible HCA entries.
      std::vector<std::int32_t> entries;  // [n, width]
      std::int64_t width = 0;
      if (is_csa()) {
        width = K;
        entries.assign(static_cast<std::size_t>(n * K), -1);
        select_csa_entries(*this, s, p, a, n, positions.data() + a, entries.data());
        std::copy(entries.begin(), entries.end(), selected.begin() + a * K);
      } else if (ratio > 0) {
        entries = all_visible_entries(positions.data() + a, n, ratio, width);
      }
      const Tensor slots_w = window_slots(positions.data() + a, n, W, s.window_page, window_ring);
      const Tensor slots_c = physical_slots(entries, n, width, s.page_table, compressed.entries_per_page());

      // q as bf16 bits; cos/sin of every RoPE pair at each query's position for the inverse RoPE.
      const int pairs = model.rope_dim / 2;
      Tensor q = Tensor::empty(DType::BF16, {n, H, d});
      for (std::int64_t k = 0; k < n * H * d; ++k) q.data_as<std::uint16_t>()[k] = bf16_bits_from_float(p.q[a * H * d + k]);
      Tensor cos = Tensor::empty(DType::F32, {n, pairs}), sin = Tensor::empty(DType::F32, {n, pairs});
      for (std::int64_t r = 0; r < n; ++r)
        for (int k = 0; k < pairs; ++k)
          rope.cos_sin(positions[a + r], k, cos.data_as<float>()[r * pairs + k], sin.data_as<float>()[r * pairs + k]);

      Tensor out = Tensor::empty(DType::BF16, {n, H, d}), lse = Tensor::empty(DType::F32, {n, H});
      SparseAttentionOptions ao;
      ao.softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
      ao.rope_cos = cos.view();
      ao.rope_sin = sin.view();
      sparse_attention(q.view(), window_view, compressed_view, slots_w.view(), slots_c.view(), sink.view(),
                       out.view(), lse.view(), ao);
      for (std::int64_t k = 0; k < n * H * d; ++k) o[a * H * d + k] = float_from_bf16_bits(out.data_as<std::uint16_t>()[k]);
    }
  }

  ref::project_output(model, weights, o.data(), T, outputs.y.as<float>(), threads);
  if (outputs.attn.data) std::memcpy(outputs.attn.data, o.data(), o.size() * sizeof(float));
  if (outputs.topk.data) std::memcpy(outputs.topk.data, selected.data(), selected.size() * sizeof(std::int32_t));

  for (std::size_t i = 0; i < batch.size(); ++i) {
    LayerState& s = request(batch[i].request);
    s.tokens += batch[i].new_tokens;
    s.rollback_floor = std::max(s.rollback_floor, s.tokens - options.max_rollback);
  }
}

}  // namespace dsv4
