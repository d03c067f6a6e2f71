// src/runtime/layer_state_select.cpp — CSA selection through the lightning indexer (SPEC §7):
// query preparation (RoPE, Walsh–Hadamard, quantization), scores against the request's key cache,
// exact top-k.
#include "runtime/layer_state_select.hpp"

#include <algorithm>

#include "dsv4/indexer.hpp"
#include "dsv4/topk.hpp"
#include "ref/layer_linear.hpp"

namespace dsv4 {

namespace {

// Rows [begin, begin + count) of a row-major host vector as a 2-D F32 view [count, width].
TensorView f32_rows(const std::vector<float>& v, std::int64_t begin, std::int64_t count, std::int64_t width) {
  return TensorView{const_cast<float*>(v.data()) + begin * width, DType::F32, {count, width}, Device::CPU};
}

}  // namespace

void select_csa_entries(const detail::AttentionLayerImpl& layer, const LayerState& s, const ref::LayerProjections& p,
                        std::int64_t row_begin, std::int64_t rows, const std::int64_t* positions,
                        std::int32_t* entries) {
  const ModelConfig& model = layer.model;
  const int heads = model.index_heads, dim = model.index_head_dim, K = model.index_topk;
  const int ratio = layer.weights.layer.ratio, pairs = model.rope_dim / 2;
  const IndexerKeyFormat format = layer.options.indexer_format;
  const IndexerKeyCacheView keys{layer.indexer_keys.storage().view(), IndexerEntryFormat{format, dim},
                                 layer.indexer_keys.entries_per_page()};
  Tensor page_table = Tensor::from_host(DType::I32, {1, static_cast<std::int64_t>(s.page_table.size())},
                                        s.page_table.data());

  // Rows are independent: each thread prepares, scores and selects its own range.
  const std::int64_t widest = (positions[rows - 1] + 1) / ratio;  // V_t of the last (largest) query
  ref::parallel_ranges(rows, layer.options.threads, static_cast<double>(widest * heads * dim),
                       [&](std::int64_t r0, std::int64_t r1) {
    const std::int64_t n = r1 - r0;
    if (n == 0) return;
    Tensor cos = Tensor::empty(DType::F32, {n, pairs}), sin = Tensor::empty(DType::F32, {n, pairs});
    Tensor query_start = Tensor::empty(DType::I32, {2}), visible = Tensor::empty(DType::I32, {n});
    query_start.data_as<std::int32_t>()[0] = 0;
    query_start.data_as<std::int32_t>()[1] = static_cast<std::int32_t>(n);
    for (std::int64_t r = 0; r < n; ++r) {
      const std::int64_t t = positions[r0 + r];
      visible.data_as<std::int32_t>()[r] = static_cast<std::int32_t>((t + 1) / ratio);
      for (int i = 0; i < pairs; ++i)
        layer.rope.cos_sin(t, i, cos.data_as<float>()[r * pairs + i], sin.data_as<float>()[r * pairs + i]);
    }
    const IndexerQuery q = IndexerQuery::empty(format, n, heads, dim);
    prepare_indexer_queries(f32_rows(p.indexer_q, row_begin + r0, n, static_cast<std::int64_t>(heads) * dim),
                            f32_rows(p.indexer_logits, row_begin + r0, n, heads), cos.view(), sin.view(), format,
                            q.view());
    const IndexerRowsView rows_view{query_start.view(), visible.view(), page_table.view()};
    const std::int64_t width = std::max<std::int64_t>((positions[r1 - 1] + 1) / ratio, 1);
    Tensor scores = Tensor::empty(DType::F32, {n, width});
    indexer_scores(q.view(), keys, rows_view, scores.view());
    const TensorView selected{entries + r0 * K, DType::I32, {n, K}, Device::CPU};
    indexer_topk(scores.view(), rows_view, keys.entries_per_page, selected, TensorView{});
  });
}

}  // namespace dsv4
