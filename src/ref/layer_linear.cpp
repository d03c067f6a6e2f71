// src/ref/layer_linear.cpp — double-accumulated matrix products of the reference layer.
#include "ref/layer_linear.hpp"

#include <algorithm>
#include <thread>
#include <vector>

namespace dsv4::ref {

namespace {
constexpr int kLanes = 8;                 // partial sums per dot product (lets the compiler vectorize)
constexpr double kMinParallelWork = 2e5;  // multiply-adds below which a thread costs more than it saves
constexpr std::int64_t kTokenBlock = 32;  // input rows per pass over the weights (32 × 2048 floats = 256 KiB)
}  // namespace

double dot_double(const float* a, const float* b, std::int64_t n) {
  double lane[kLanes] = {};
  std::int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes)
    for (int j = 0; j < kLanes; ++j) lane[j] += static_cast<double>(a[k + j]) * static_cast<double>(b[k + j]);
  for (int j = 0; k < n; ++k, ++j) lane[j] += static_cast<double>(a[k]) * static_cast<double>(b[k]);
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

void parallel_ranges(std::int64_t n, int threads, double cost_per_item,
                     const std::function<void(std::int64_t, std::int64_t)>& body) {
  const auto by_work = static_cast<std::int64_t>(static_cast<double>(n) * cost_per_item / kMinParallelWork);
  const std::int64_t parts = std::clamp<std::int64_t>(std::min<std::int64_t>(threads, by_work), 1, std::max<std::int64_t>(n, 1));
  if (parts <= 1) {
    body(0, n);
    return;
  }
  std::vector<std::thread> workers;
  workers.reserve(static_cast<std::size_t>(parts - 1));
  for (std::int64_t p = 1; p < parts; ++p)
    workers.emplace_back(body, n * p / parts, n * (p + 1) / parts);
  body(0, n / parts);
  for (auto& w : workers) w.join();
}

void linear(const float* x, std::int64_t rows, std::int64_t x_stride, const Tensor& weight, float* y, int threads) {
  linear(x, rows, x_stride, weight.data_as<float>(), weight.shape()[0], weight.shape()[1], y, threads);
}

void linear(const float* x, std::int64_t rows, std::int64_t x_stride, const float* w, std::int64_t out,
            std::int64_t in, float* y, int threads) {
  parallel_ranges(out, threads, static_cast<double>(rows * in), [&](std::int64_t begin, std::int64_t end) {
    // Blocks of tokens small enough to stay in cache while every weight row of the range passes.
    for (std::int64_t i0 = 0; i0 < rows; i0 += kTokenBlock) {
      const std::int64_t i1 = std::min(rows, i0 + kTokenBlock);
      for (std::int64_t o = begin; o < end; ++o)
        for (std::int64_t i = i0; i < i1; ++i)
          y[i * out + o] = static_cast<float>(dot_double(w + o * in, x + i * x_stride, in));
    }
  });
}

}  // namespace dsv4::ref
