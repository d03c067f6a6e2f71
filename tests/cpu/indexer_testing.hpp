// tests/cpu/indexer_testing.hpp — random indexer batches (queries, paged keys, rows) for the CPU and
// GPU suites of the indexer and its top-k.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "dsv4/entry_codec.hpp"
#include "dsv4/indexer.hpp"
#include "dsv4/tensor.hpp"
#include "testing/testing.hpp"

namespace dsv4::testing {

template <class T>
TensorView host_view(std::vector<T>& data, DType dtype, Shape shape) {
  return TensorView{data.data(), dtype, std::move(shape), Device::CPU};
}

// bf16-rounded normal values whose magnitude varies per 32-value block, so FP4 blocks of one
// vector get different scales and FP8 vectors different amax.
inline std::vector<float> spread_values(std::mt19937_64& rng, int n) {
  std::vector<float> v = random_normal(rng, static_cast<std::size_t>(n), 1.0f);
  std::uniform_int_distribution<int> binade(-3, 2);
  for (int b = 0; b < n; b += 32) {
    const float scale = std::ldexp(1.0f, binade(rng));
    for (int i = b; i < std::min(n, b + 32); ++i) v[i] = round_to_bf16(v[i] * scale);
  }
  return v;
}

// Quantizes one query head like a key (entry_codec.hpp) into its codes and scale storage.
inline void quantize_head(const IndexerEntryFormat& fmt, const float* values, std::uint8_t* codes, void* scales,
                          std::int64_t head_index) {
  if (fmt.format == IndexerKeyFormat::FP8) {
    float amax = 0.0f;
    for (int k = 0; k < fmt.dim; ++k) amax = std::fmax(amax, std::fabs(values[k]));
    const float scale = indexer_fp8_scale(amax);
    for (int k = 0; k < fmt.dim; ++k) codes[k] = e4m3_from(values[k] / scale);
    static_cast<float*>(scales)[head_index] = scale;
    return;
  }
  auto* bytes = static_cast<std::uint8_t*>(scales) + head_index * (fmt.dim / 32);
  for (int b = 0; b < fmt.dim / 32; ++b) bytes[b] = encode_e2m1_block(values + b * 32, 32, codes + b * 16);
}

// One batch on the host: rows of B requests, each request's keys in scattered pages of a pool that
// also holds pages of random bytes nobody owns.
struct IndexerBatch {
  IndexerEntryFormat format;
  int heads = 0;
  int entries_per_page = 0;
  std::int64_t num_rows = 0, num_cols = 0;
  std::vector<std::int32_t> query_start, visible, page_table;
  int max_pages = 0;
  std::vector<std::uint8_t> pages;  // [num_pages, page_bytes]
  std::int64_t num_pages = 0;
  std::vector<std::uint8_t> q_codes;
  std::vector<float> q_scales_f32;        // FP8
  std::vector<std::uint8_t> q_scales_u8;  // FP4
  std::vector<float> weights;

  std::int64_t page_bytes() const { return format.page_bytes(entries_per_page); }
  int num_requests() const { return static_cast<int>(query_start.size()) - 1; }

  IndexerQueryView query_view() {
    void* scales = format.format == IndexerKeyFormat::FP8 ? static_cast<void*>(q_scales_f32.data())
                                                          : static_cast<void*>(q_scales_u8.data());
    const Shape scale_shape = format.format == IndexerKeyFormat::FP8 ? Shape{num_rows, heads}
                                                                     : Shape{num_rows, heads, format.dim / 32};
    return {host_view(q_codes, DType::U8, {num_rows, heads, format.data_bytes()}),
            TensorView{scales, format.format == IndexerKeyFormat::FP8 ? DType::F32 : DType::U8, scale_shape,
                       Device::CPU},
            host_view(weights, DType::F32, {num_rows, heads})};
  }
  IndexerKeyCacheView key_view() {
    return {host_view(pages, DType::U8, {num_pages, page_bytes()}), format, entries_per_page};
  }
  IndexerRowsView rows_view() {
    return {host_view(query_start, DType::I32, {static_cast<std::int64_t>(query_start.size())}),
            host_view(visible, DType::I32, {num_rows}),
            host_view(page_table, DType::I32, {static_cast<std::int64_t>(num_requests()), max_pages})};
  }
};

// `visible_per_request[b]` lists V_t of request b's rows; the score rows are `num_cols` wide
// (≥ every V_t). Pages are drawn from a shuffled pool with `spare_pages` unowned pages.
inline IndexerBatch make_indexer_batch(std::mt19937_64& rng, IndexerKeyFormat key_format, int heads,
                                       int entries_per_page, const std::vector<std::vector<int>>& visible_per_request,
                                       std::int64_t num_cols, int spare_pages = 3) {
  IndexerBatch batch;
  batch.format = IndexerEntryFormat{key_format, 128};
  batch.heads = heads;
  batch.entries_per_page = entries_per_page;
  batch.num_cols = num_cols;
  batch.query_start.push_back(0);
  std::vector<int> entries;  // per request
  for (const auto& rows : visible_per_request) {
    batch.query_start.push_back(batch.query_start.back() + static_cast<int>(rows.size()));
    int most = 0;
    for (int v : rows) {
      batch.visible.push_back(v);
      most = std::max(most, v);
    }
    entries.push_back(most);
  }
  batch.num_rows = batch.query_start.back();
  const int requests = static_cast<int>(visible_per_request.size());
  std::vector<int> pages_of(static_cast<std::size_t>(requests));
  int total_pages = spare_pages;
  for (int b = 0; b < requests; ++b) {
    pages_of[b] = (entries[b] + entries_per_page - 1) / entries_per_page;
    total_pages += pages_of[b];
    batch.max_pages = std::max(batch.max_pages, pages_of[b] + 1);  // one unused column past the end
  }
  batch.num_pages = total_pages;
  std::vector<std::int32_t> pool(static_cast<std::size_t>(total_pages));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  batch.pages.resize(static_cast<std::size_t>(total_pages * batch.page_bytes()));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& x : batch.pages) x = static_cast<std::uint8_t>(byte(rng));  // unowned pages stay random
  // Columns past a request's pages hold a wild value: kernels must never read them.
  batch.page_table.assign(static_cast<std::size_t>(requests) * batch.max_pages, -7);
  std::size_t next = 0;
  for (int b = 0; b < requests; ++b) {
    for (int p = 0; p < pages_of[b]; ++p) batch.page_table[b * batch.max_pages + p] = pool[next++];
    for (int s = 0; s < entries[b]; ++s) {
      const auto values = spread_values(rng, 128);
      std::uint8_t* page = batch.pages.data() + batch.page_table[b * batch.max_pages + s / entries_per_page] *
                                                    batch.page_bytes();
      encode_indexer_entry(batch.format, values.data(), page, s % entries_per_page, entries_per_page);
    }
  }
  batch.q_codes.resize(static_cast<std::size_t>(batch.num_rows * heads * batch.format.data_bytes()));
  batch.q_scales_f32.resize(static_cast<std::size_t>(batch.num_rows * heads));
  batch.q_scales_u8.resize(static_cast<std::size_t>(batch.num_rows * heads * 4));
  void* scales = key_format == IndexerKeyFormat::FP8 ? static_cast<void*>(batch.q_scales_f32.data())
                                                     : static_cast<void*>(batch.q_scales_u8.data());
  for (std::int64_t i = 0; i < batch.num_rows * heads; ++i) {
    const auto values = spread_values(rng, 128);
    quantize_head(batch.format, values.data(), batch.q_codes.data() + i * batch.format.data_bytes(), scales, i);
  }
  // Mixed-sign weights, as (W_w x) gives: scores take both signs and ReLU matters.
  batch.weights = random_normal(rng, static_cast<std::size_t>(batch.num_rows * heads), 0.125f);
  return batch;
}

// V_t for `rows` consecutive tokens starting at position `first` with ratio m (SPEC §7).
inline std::vector<int> causal_visible(std::int64_t first, int rows, int ratio) {
  std::vector<int> v;
  for (int i = 0; i < rows; ++i) v.push_back(static_cast<int>((first + i + 1) / ratio));
  return v;
}

}  // namespace dsv4::testing
