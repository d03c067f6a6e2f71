// dsv4/projection.hpp — the compressor's input projection on a GPU: the kv and score rows
// [W_kv; W_gate]·x (SPEC §4), bf16 inputs, float32 products, through cuBLAS.
//
//   Tensor rows = Tensor::empty(DType::F32, {T, 2 * spec.row_width()}, Device::CUDA);
//   project_rows(x, w_kv_gate, rows.view());
//   auto all = MatrixF32View::of(rows.view(), "rows");
//   compress(spec, weights, batch, all.columns(0, spec.row_width()),
//            all.columns(spec.row_width(), spec.row_width()), pool, cache);
#pragma once

#include "dsv4/tensor.hpp"

namespace dsv4 {

#if defined(DSV4_WITH_CUDA)
// rows = x · weightᵀ with float32 accumulation (cuBLAS, bf16 × bf16 → f32):
//   x      [T, D] BF16, contiguous, on CUDA;
//   weight [N, D] BF16 on CUDA: for a compressor W_kv [coff·c, D] stacked above W_gate [coff·c, D];
//   rows   [T, N] F32 on CUDA: columns [0, coff·c) are kv, [coff·c, 2·coff·c) the score (no ape).
// `stream` is a cudaStream_t (null: the default stream). T = 0 does nothing.
// Errors: Error("x"), Error("weight"), Error("rows") for a dtype, shape or device mismatch;
// Error("device") when cuBLAS fails.
void project_rows(const TensorView& x, const TensorView& weight, const TensorView& rows, void* stream = nullptr);
#endif

}  // namespace dsv4
