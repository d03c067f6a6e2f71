// src/cuda/common/runtime.hpp — CUDA runtime helpers shared by every kernel family's launcher.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "dsv4/error.hpp"

namespace dsv4::cuda {

// Throws Error("device", "<what>: <CUDA message>") unless `status` is cudaSuccess.
inline void check_cuda(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) throw Error("device", what + ": " + cudaGetErrorString(status));
}

// Multiprocessors of the current device (at least 1).
inline int multiprocessor_count() {
  int device = 0, count = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
  return count > 0 ? count : 1;
}

}  // namespace dsv4::cuda
