// src/cuda/sparse_attention/launch_tile.cuh — launches the kernel for one head tile.
//
// Included by one small .cu per head tile (instantiate_h*.cu), so the three instantiations compile
// in parallel and a change to one does not rebuild the others.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cuda/sparse_attention/kernel.cuh"
#include "cuda/common/runtime.hpp"
#include "dsv4/error.hpp"

namespace dsv4::cuda::sparse_attention {

template <int kHeadTile>
void launch_tile(const SparseAttentionParams& params, cudaStream_t stream) {
  using T = Traits<kHeadTile>;
  // The opt-in shared memory size is a per-function attribute: set once per process.
  static const cudaError_t configured = cudaFuncSetAttribute(
      sparse_attention_kernel<kHeadTile>, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
  check_cuda(configured, "cannot reserve shared memory for sparse attention");
  const long long head_tiles = (params.num_heads + kHeadTile - 1) / kHeadTile;
  const long long blocks = static_cast<long long>(params.num_rows) * head_tiles * params.num_splits;
  if (blocks > 0x7fffffffLL) throw Error("q", "too many rows × heads × chunks for one launch");
  sparse_attention_kernel<kHeadTile>
      <<<static_cast<unsigned>(blocks), T::kThreads, T::kSmemBytes, stream>>>(params);
  check_cuda(cudaGetLastError(), "sparse attention launch failed");
}

// One explicit instantiation per head tile lives in instantiate_h{16,32,64}.cu.
extern template void launch_tile<16>(const SparseAttentionParams&, cudaStream_t);
extern template void launch_tile<32>(const SparseAttentionParams&, cudaStream_t);
extern template void launch_tile<64>(const SparseAttentionParams&, cudaStream_t);

}  // namespace dsv4::cuda::sparse_attention
