// src/ref/indexer.cpp — CPU reference of the indexer's query preparation and scores (SPEC §7).
//
// Plain loops in the SPEC's order of operations; dot products and head sums accumulate in double.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "dsv4/entry_codec.hpp"
#include "dsv4/formats.hpp"
#include "dsv4/norms.hpp"
#include "ref/indexer_ref.hpp"

namespace dsv4::ref {

void prepare_indexer_queries(const IndexerQueryPrepCall& call) {
  const int dim = call.format.dim;
  const int data_bytes = call.format.data_bytes();
  const int rope_dim = 2 * call.rope_pairs;
  const double weight_scale = 1.0 / std::sqrt(static_cast<double>(dim) * call.heads);
  std::vector<float> x(static_cast<std::size_t>(dim));
  for (std::int64_t t = 0; t < call.num_rows; ++t) {
    const float* cos_t = call.rope_cos + t * call.rope_pairs;
    const float* sin_t = call.rope_sin + t * call.rope_pairs;
    for (int h = 0; h < call.heads; ++h) {
      const std::int64_t head = t * call.heads + h;
      std::memcpy(x.data(), call.q_rows + head * dim, sizeof(float) * static_cast<std::size_t>(dim));
      float* tail = x.data() + dim - rope_dim;
      for (int i = 0; i < call.rope_pairs; ++i) {
        const double a = tail[2 * i], b = tail[2 * i + 1], c = cos_t[i], s = sin_t[i];
        tail[2 * i] = static_cast<float>(a * c - b * s);
        tail[2 * i + 1] = static_cast<float>(a * s + b * c);
      }
      // Rounded to bf16 after RoPE and after the transform, exactly as the keys are (SPEC §4
      // post-processing); the known-answer layer vectors select the same top-k only this way.
      for (auto& v : x) v = round_to_bf16(v);
      walsh_hadamard(x.data(), dim);
      for (auto& v : x) v = round_to_bf16(v);
      std::uint8_t* codes = call.codes + head * data_bytes;
      if (call.format.format == IndexerKeyFormat::FP8) {
        float amax = 0.0f;
        for (float v : x) amax = std::fmax(amax, std::fabs(v));
        const float scale = indexer_fp8_scale(amax);
        for (int k = 0; k < dim; ++k) codes[k] = e4m3_from(x[static_cast<std::size_t>(k)] / scale);
        static_cast<float*>(call.scales)[head] = scale;
      } else {
        constexpr int kBlock = IndexerEntryFormat::kFp4Block;
        auto* scale_bytes = static_cast<std::uint8_t*>(call.scales) + head * (dim / kBlock);
        for (int b = 0; b < dim / kBlock; ++b)
          scale_bytes[b] = encode_e2m1_block(x.data() + b * kBlock, kBlock, codes + b * kBlock / 2);
      }
      call.weights[head] = static_cast<float>(call.head_logits[head] * weight_scale);
    }
  }
}

void dequantize_query(const IndexerEntryFormat& format, int heads, const std::uint8_t* codes, const void* scales,
                      std::int64_t row, int head, float* out) {
  const std::int64_t index = row * heads + head;
  const std::uint8_t* data = codes + index * format.data_bytes();
  if (format.format == IndexerKeyFormat::FP8) {
    const float scale = static_cast<const float*>(scales)[index];
    for (int k = 0; k < format.dim; ++k) out[k] = float_from_e4m3(data[k]) * scale;
    return;
  }
  constexpr int kBlock = IndexerEntryFormat::kFp4Block;
  const auto* scale_bytes = static_cast<const std::uint8_t*>(scales) + index * (format.dim / kBlock);
  for (int k = 0; k < format.dim; ++k) {
    const std::uint8_t code = (k % 2 == 0) ? (data[k / 2] & 0xf) : (data[k / 2] >> 4);
    out[k] = float_from_e2m1(code) * float_from_ue8m0(scale_bytes[k / kBlock]);
  }
}

void indexer_scores(const IndexerScoresCall& call) {
  const int dim = call.format.dim;
  const int epp = call.entries_per_page;
  std::vector<float> q(static_cast<std::size_t>(call.heads) * dim);
  std::vector<float> k(static_cast<std::size_t>(dim));
  for (std::int64_t t = 0; t < call.num_rows; ++t) {
    const int b = request_of_row(call.rows.query_start, call.rows.num_requests, t);
    const std::int32_t* page_row = call.rows.page_table + static_cast<std::int64_t>(b) * call.rows.max_pages;
    const std::int64_t visible = call.rows.visible[t];
    for (int h = 0; h < call.heads; ++h)
      dequantize_query(call.format, call.heads, call.q_codes, call.q_scales, t, h, q.data() + h * dim);
    const float* w = call.weights + t * call.heads;
    float* out = call.scores + t * call.num_cols;
    for (std::int64_t s = 0; s < call.num_cols; ++s) {
      if (s >= visible) {
        out[s] = -std::numeric_limits<float>::infinity();
        continue;
      }
      const std::uint8_t* page = call.pages + static_cast<std::int64_t>(page_row[s / epp]) * call.page_bytes;
      decode_indexer_entry(call.format, page, static_cast<int>(s % epp), epp, k.data());
      double score = 0.0;
      for (int h = 0; h < call.heads; ++h) {
        double dot = 0.0;
        for (int i = 0; i < dim; ++i) dot += static_cast<double>(q[static_cast<std::size_t>(h) * dim + i]) * k[i];
        score += static_cast<double>(w[h]) * std::fmax(dot, 0.0);
      }
      out[s] = static_cast<float>(score);
    }
  }
}

}  // namespace dsv4::ref
