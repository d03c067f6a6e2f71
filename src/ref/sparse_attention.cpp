// src/ref/sparse_attention.cpp — CPU reference of the sparse attention with sink (SPEC §8 steps 4–6).
//
// Plain and readable on purpose: each row decodes its candidates to float once, then every head
// evaluates the formula in double. Rows are independent, so they are spread over a few threads.
#include "ref/sparse_attention_ref.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "dsv4/cache_format.hpp"
#include "dsv4/entry_codec.hpp"
#include "dsv4/formats.hpp"

namespace dsv4::ref {
namespace {

using F = AttentionEntryFormat;
constexpr int kDim = F::kDim;
constexpr int kRopePairs = F::kRopeDim / 2;

// The decoded candidates of one row, window slots first: [count, 512].
std::vector<float> decode_candidates(const SparseAttentionCall& call, std::int64_t row, int& count) {
  std::vector<float> entries;
  count = 0;
  const auto add = [&](const HostAttentionPool& pool, const std::int32_t* slots, int width) {
    for (int j = 0; j < width; ++j) {
      const std::int32_t slot = slots[row * width + j];
      if (slot < 0) continue;  // −1: no candidate
      const std::uint8_t* page = pool.pages + static_cast<std::int64_t>(slot / pool.entries_per_page) * pool.page_bytes;
      entries.resize(static_cast<std::size_t>(count + 1) * kDim);
      decode_attention_entry(page, slot % pool.entries_per_page, pool.entries_per_page,
                             entries.data() + static_cast<std::size_t>(count) * kDim);
      ++count;
    }
  };
  add(call.window, call.window_slots, call.window_width);
  add(call.compressed, call.compressed_slots, call.compressed_width);
  return entries;
}

void attend_row(const SparseAttentionCall& call, std::int64_t row) {
  int count = 0;
  const std::vector<float> entries = decode_candidates(call, row, count);
  std::vector<double> z(static_cast<std::size_t>(count));
  std::vector<double> o(kDim);
  for (int h = 0; h < call.num_heads; ++h) {
    const std::int64_t head = row * call.num_heads + h;
    const std::uint16_t* q = call.q + head * kDim;
    const double sink = call.attn_sink[h];
    double max_z = sink;
    for (int i = 0; i < count; ++i) {
      double dot = 0;
      for (int k = 0; k < kDim; ++k) dot += static_cast<double>(float_from_bf16_bits(q[k])) * entries[i * kDim + k];
      z[i] = dot * call.softmax_scale;
      max_z = std::max(max_z, z[i]);
    }
    std::uint16_t* out = call.out + head * kDim;
    if (max_z == -std::numeric_limits<double>::infinity()) {  // no candidate and no sink
      std::fill(out, out + kDim, std::uint16_t{0});
      call.lse[head] = -std::numeric_limits<float>::infinity();
      continue;
    }
    double denominator = std::exp(sink - max_z);
    std::fill(o.begin(), o.end(), 0.0);
    for (int i = 0; i < count; ++i) {
      const double p = std::exp(z[i] - max_z);
      denominator += p;
      for (int k = 0; k < kDim; ++k) o[k] += p * entries[i * kDim + k];
    }
    for (int k = 0; k < kDim; ++k) out[k] = bf16_bits_from_float(static_cast<float>(o[k] / denominator));
    if (call.rope_cos != nullptr) {  // inverse rotation (by −θ) of the bf16 output's RoPE pairs
      for (int i = 0; i < kRopePairs; ++i) {
        const double c = call.rope_cos[row * kRopePairs + i], s = call.rope_sin[row * kRopePairs + i];
        std::uint16_t* pair = out + F::kNopeDim + 2 * i;
        const double a = float_from_bf16_bits(pair[0]), b = float_from_bf16_bits(pair[1]);
        pair[0] = bf16_bits_from_float(static_cast<float>(a * c + b * s));
        pair[1] = bf16_bits_from_float(static_cast<float>(b * c - a * s));
      }
    }
    call.lse[head] = static_cast<float>(max_z + std::log(denominator));
  }
}

}  // namespace

void sparse_attention(const SparseAttentionCall& call) {
  const std::int64_t hardware = std::max(1u, std::thread::hardware_concurrency());
  const std::int64_t workers = std::min<std::int64_t>(hardware, call.num_rows);
  std::vector<std::thread> threads;
  for (std::int64_t w = 0; w < workers; ++w) {
    threads.emplace_back([&call, w, workers] {
      for (std::int64_t row = w; row < call.num_rows; row += workers) attend_row(call, row);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace dsv4::ref
