// src/ref/layer_projections.cpp — input and output projections of the reference layer.
#include "ref/layer_projections.hpp"

#include "dsv4/formats.hpp"
#include "dsv4/norms.hpp"
#include "ref/layer_linear.hpp"

namespace dsv4::ref {

namespace {

// Activations between stages are bf16, as the model runs (the known-answer vectors round at
// exactly these points): a matrix product's output, a norm's output, a RoPE's output.
enum class Rounding { Float32, Bf16 };

void round_rows(std::vector<float>& v, Rounding rounding) {
  if (rounding == Rounding::Bf16)
    for (auto& e : v) e = round_to_bf16(e);
}

std::vector<float> project(const Tensor& weight, const float* x, std::int64_t rows, std::int64_t x_stride,
                           Rounding rounding, int threads) {
  std::vector<float> y(static_cast<std::size_t>(rows * weight.shape()[0]));
  linear(x, rows, x_stride, weight, y.data(), threads);
  round_rows(y, rounding);
  return y;
}

// In place on each of the `count` rows of `width` in `rows`: RMSNorm (weight may be null), bf16,
// then, when `rope` is given, RoPE at the row's position on the last r dims, bf16.
void norm_rope_rows(std::vector<float>& rows, std::int64_t count, int width, const float* weight, double eps,
                    const RopeTable* rope, const std::int64_t* positions, std::int64_t rows_per_position) {
  for (std::int64_t i = 0; i < count; ++i) {
    float* row = rows.data() + i * width;
    rms_norm(row, weight, width, eps, row);
    for (int k = 0; k < width; ++k) row[k] = round_to_bf16(row[k]);
    if (!rope) continue;
    apply_rope_to_tail(*rope, row, width, positions[i / rows_per_position]);
    for (int k = width - rope->rope_dim(); k < width; ++k) row[k] = round_to_bf16(row[k]);
  }
}

}  // namespace

LayerProjections project_inputs(const ModelConfig& model, const LayerWeights& weights, const RopeTable& rope,
                                const float* x, const std::int64_t* positions, std::int64_t rows, int threads) {
  const std::int64_t D = model.hidden_size, H = model.num_heads;
  const int d = model.head_dim, q_lora_rank = model.q_lora_rank;
  const double eps = model.rms_eps;
  LayerProjections p;
  p.rows = rows;

  // 1. q_lora = RMSNorm_q(W_qa x); q = W_qb q_lora as [H, d]; per-head norm without weight; RoPE.
  p.q_lora = project(weights.wq_a, x, rows, D, Rounding::Bf16, threads);
  norm_rope_rows(p.q_lora, rows, q_lora_rank, weights.q_norm.data_as<float>(), eps, nullptr, positions, 1);
  p.q = project(weights.wq_b, p.q_lora.data(), rows, q_lora_rank, Rounding::Bf16, threads);
  norm_rope_rows(p.q, rows * H, d, nullptr, eps, &rope, positions, H);

  // 2. kv = RMSNorm_kv(W_kv x); RoPE.
  p.kv = project(weights.wkv, x, rows, D, Rounding::Bf16, threads);
  norm_rope_rows(p.kv, rows, d, weights.kv_norm.data_as<float>(), eps, &rope, positions, 1);

  // Compressor rows: float32 (SPEC §4), score without ape (the compressor adds ape[p mod m]).
  if (weights.compressor) {
    p.compressor_kv = project(weights.compressor->wkv, x, rows, D, Rounding::Float32, threads);
    p.compressor_score = project(weights.compressor->wgate, x, rows, D, Rounding::Float32, threads);
  }
  // Indexer (SPEC §7): its compressor's rows (float32), q_I = W_qb^I q_lora (bf16), head logits
  // W_w x (float32: prepare_indexer_queries scales them into the head weights).
  if (weights.indexer) {
    const auto& idx = *weights.indexer;
    p.indexer_kv = project(idx.compressor.wkv, x, rows, D, Rounding::Float32, threads);
    p.indexer_score = project(idx.compressor.wgate, x, rows, D, Rounding::Float32, threads);
    p.indexer_q = project(idx.wq_b, p.q_lora.data(), rows, q_lora_rank, Rounding::Bf16, threads);
    p.indexer_logits = project(idx.weights_proj, x, rows, D, Rounding::Float32, threads);
  }
  return p;
}

void project_output(const ModelConfig& model, const LayerWeights& weights, const float* o, std::int64_t rows,
                    float* y, int threads) {
  const std::int64_t H = model.num_heads, d = model.head_dim, G = model.o_groups, o_lora = model.o_lora_rank;
  const std::int64_t group_width = H / G * d;  // (H/G)·d inputs per group
  // u [T, G·o_lora]: group g's rows of W_oa [o_lora, (H/G)·d] applied to o_g, the g-th slice of o.
  std::vector<float> u(static_cast<std::size_t>(rows * G * o_lora));
  for (std::int64_t g = 0; g < G; ++g) {
    const float* w_g = weights.wo_a.data_as<float>() + g * o_lora * group_width;  // [o_lora, (H/G)·d]
    std::vector<float> u_g(static_cast<std::size_t>(rows * o_lora));
    linear(o + g * group_width, rows, H * d, w_g, o_lora, group_width, u_g.data(), threads);
    for (std::int64_t t = 0; t < rows; ++t)
      for (std::int64_t k = 0; k < o_lora; ++k) u[(t * G + g) * o_lora + k] = round_to_bf16(u_g[t * o_lora + k]);
  }
  linear(u.data(), rows, G * o_lora, weights.wo_b, y, threads);
}

}  // namespace dsv4::ref
