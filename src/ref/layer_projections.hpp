// src/ref/layer_projections.hpp — the dense parts of the reference layer (SPEC §7, §8), internal.
//
// Row-wise: every output row depends only on its own input row and position, so a step's rows can
// be projected together whatever requests and chunks they come from.
#pragma once

#include <cstdint>
#include <vector>

#include "dsv4/config.hpp"
#include "dsv4/rope.hpp"
#include "dsv4/weights.hpp"

namespace dsv4::ref {

// Everything a step derives from its input rows x [T, D] before any cache is touched.
struct LayerProjections {
  std::int64_t rows = 0;                 // T
  // bf16-valued (activations between stages are bf16: after each product, norm and RoPE):
  std::vector<float> q_lora;             // [T, q_lora]: RMSNorm_q(W_qa x)
  std::vector<float> q;                  // [T, H, d]: W_qb q_lora, per-head RMS norm, RoPE at t
  std::vector<float> kv;                 // [T, d]: RMSNorm_kv(W_kv x), RoPE at t
  // float32:
  std::vector<float> compressor_kv;      // [T, coff·d]: compressor W_kv x (ratio > 0)
  std::vector<float> compressor_score;   // [T, coff·d]: compressor W_gate x, without ape
  std::vector<float> indexer_kv;         // [T, coff·d_I]: indexer compressor rows (CSA)
  std::vector<float> indexer_score;      // [T, coff·d_I]
  std::vector<float> indexer_q;          // [T, H_I, d_I]: W_qb^I q_lora (bf16; before RoPE and Hadamard)
  std::vector<float> indexer_logits;     // [T, H_I]: W_w x (prepare_indexer_queries scales them)
};

// Projects x [T, D] (float32, row-major) at `positions` [T] through `weights` (SPEC §8 steps 1–2
// and the row projections of the compressors and the indexer). `rope` is the layer's table.
LayerProjections project_inputs(const ModelConfig& model, const LayerWeights& weights, const RopeTable& rope,
                                const float* x, const std::int64_t* positions, std::int64_t rows, int threads);

// The grouped output projection (SPEC §8 step 6): o [T, H, d] viewed as G groups of (H/G)·d,
// u_g = bf16(W_oa[g] · o_g), y = W_ob · concat_g(u_g). y [T, D] float32.
void project_output(const ModelConfig& model, const LayerWeights& weights, const float* o, std::int64_t rows,
                    float* y, int threads);

}  // namespace dsv4::ref
