// src/cuda/compressor/projection.cpp — project_rows (dsv4/projection.hpp) through cuBLAS.
#include "dsv4/projection.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <limits>
#include <string>

#include "dsv4/error.hpp"

namespace dsv4 {

namespace {

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw Error("device", std::string(what) + " failed: " + cublasGetStatusString(status));
  }
}

// One handle per host thread (cuBLAS handles must not be used by two threads at once). Never
// destroyed: at process exit the CUDA runtime may already be gone.
cublasHandle_t thread_handle() {
  thread_local cublasHandle_t handle = [] {
    cublasHandle_t created = nullptr;
    check_cublas(cublasCreate(&created), "cublasCreate");
    return created;
  }();
  return handle;
}

}  // namespace

void project_rows(const TensorView& x, const TensorView& weight, const TensorView& rows, void* stream) {
  check_tensor(x, "x", DType::BF16, {-1, -1}, Device::CUDA);
  const std::int64_t tokens = x.dim(0), hidden = x.dim(1);
  check_tensor(weight, "weight", DType::BF16, {-1, hidden}, Device::CUDA);
  const std::int64_t outputs = weight.dim(0);
  check_tensor(rows, "rows", DType::F32, {tokens, outputs}, Device::CUDA);
  constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();
  require(tokens <= kIntMax && hidden <= kIntMax && outputs <= kIntMax, "x", "dimensions exceed cuBLAS int sizes");
  if (tokens == 0 || outputs == 0) return;
  cublasHandle_t handle = thread_handle();
  check_cublas(cublasSetStream(handle, static_cast<cudaStream_t>(stream)), "cublasSetStream");
  // Row-major rows [T, N] is column-major [N, T] = weight (column-major [D, N])ᵀ · x (column-major [D, T]).
  const float alpha = 1.0f, beta = 0.0f;
  check_cublas(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(outputs), static_cast<int>(tokens),
                            static_cast<int>(hidden), &alpha, weight.data, CUDA_R_16BF, static_cast<int>(hidden), x.data,
                            CUDA_R_16BF, static_cast<int>(hidden), &beta, rows.data, CUDA_R_32F,
                            static_cast<int>(outputs), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

}  // namespace dsv4
