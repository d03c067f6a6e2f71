// src/cuda/common/runtime.hpp — CUDA runtime helpers shared by every kernel family's launcher.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>

#include "dsv4/error.hpp"

namespace dsv4::cuda {

// Throws Error("device", "<what>: <CUDA message>") unless `status` is cudaSuccess.
inline void check_cuda(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) throw Error("device", what + ": " + cudaGetErrorString(status));
}

// The launch attribute of an early launch (programmatic dependent launch): the kernel may start while
// the kernel before it in the stream finishes, once that one allows it (ptx::allow_dependent_launch);
// it must execute ptx::wait_for_prerequisite_grids before it reads or writes any tensor.
inline cudaLaunchAttribute early_launch_attribute() {
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  return attribute;
}

// The launch attribute of clusters of `size` consecutive blocks (along x).
inline cudaLaunchAttribute cluster_attribute(int size) {
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = static_cast<unsigned>(size);
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  return attribute;
}

// The status of a cudaLaunchKernelEx call with the runtime's last error consumed, as a launch followed
// by cudaGetLastError() reports it: a failed launch sets the last error too, and left there it would
// surface at the next call that reads it.
inline cudaError_t consumed_launch_status(cudaError_t launch) {
  const cudaError_t last = cudaGetLastError();
  return launch != cudaSuccess ? launch : last;
}

// The configuration of a launch of `grid` blocks of `block` threads with `shared` bytes of dynamic shared
// memory on `stream`, carrying the `count` attributes at `attributes` (which must outlive its use).
inline cudaLaunchConfig_t launch_config(dim3 grid, dim3 block, std::size_t shared, cudaStream_t stream,
                                        cudaLaunchAttribute* attributes, unsigned count) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = count;
  return config;
}

// kernel<<<grid, block, shared, stream>>>(args...) as an early launch (early_launch_attribute).
template <class... Params, class... Args>
cudaError_t launch_early(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared, cudaStream_t stream,
                         Args&&... args) {
  cudaLaunchAttribute early = early_launch_attribute();
  const cudaLaunchConfig_t config = launch_config(grid, block, shared, stream, &early, 1);
  return consumed_launch_status(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// Multiprocessors of the current device (at least 1).
inline int multiprocessor_count() {
  int device = 0, count = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
  return count > 0 ? count : 1;
}

}  // namespace dsv4::cuda
