// src/ref/layer_linear.hpp — the reference layer's matrix products (internal).
//
// Every output element is one dot product accumulated in double in a fixed order that does not
// depend on how many rows are processed together or on the thread count, and rounded once to
// float32. That is what makes the layer bit-identical for any chunking of a sequence.
#pragma once

#include <cstdint>
#include <functional>

#include "dsv4/tensor.hpp"

namespace dsv4::ref {

// Σ_k a[k]·b[k] in double, eight interleaved partial sums combined pairwise (fixed order).
double dot_double(const float* a /*[n]*/, const float* b /*[n]*/, std::int64_t n);

// y[i, o] = Σ_k x[i, k] · weight[o, k] for i < rows.
// x [rows, in] f32 (row stride `x_stride` elements), weight [out, in] f32 row-major, y [rows, out] f32.
// `threads` ≥ 1 splits the output columns; results do not depend on it.
void linear(const float* x, std::int64_t rows, std::int64_t x_stride, const float* weight, std::int64_t out,
            std::int64_t in, float* y, int threads);
// The same with a 2-D F32 host tensor [out, in] as the weight.
void linear(const float* x, std::int64_t rows, std::int64_t x_stride, const Tensor& weight, float* y, int threads);

// Runs body(begin, end) over [0, n) split into at most `threads` contiguous ranges, on threads when
// the work (n · cost_per_item) is large enough to pay for starting them.
void parallel_ranges(std::int64_t n, int threads, double cost_per_item,
                     const std::function<void(std::int64_t, std::int64_t)>& body);

}  // namespace dsv4::ref
