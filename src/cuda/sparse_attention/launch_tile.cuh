// src/cuda/sparse_attention/launch_tile.cuh — launches the kernel for one head tile.
//
// Included by one small .cu per head tile (instantiate_h*.cu), so the three instantiations compile
// in parallel and a change to one does not rebuild the others.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <type_traits>

#include "cuda/sparse_attention/kernel.cuh"
#include "cuda/sparse_attention/wgmma_kernel.cuh"
#include "cuda/common/runtime.hpp"
#include "dsv4/error.hpp"

namespace dsv4::cuda::sparse_attention {

template <int kHeadTile>
void launch_tile(const SparseAttentionParams& params, cudaStream_t stream) {
  // The 64-head tile runs on warpgroup MMA (wgmma_kernel.cuh), 16 and 32 on mma.sync (kernel.cuh).
  using Plan = std::conditional_t<kHeadTile == WgmmaPlan::kHeads, WgmmaPlan, Traits<kHeadTile>>;
  const auto kernel = [] {
    if constexpr (kHeadTile == WgmmaPlan::kHeads) return sparse_attention_wgmma_kernel<kHeadTile>;
    else return sparse_attention_kernel<kHeadTile>;
  }();
  constexpr int kThreads = Plan::kThreads, kSmemBytes = Plan::kSmemBytes;
  // The opt-in shared memory size is a per-function attribute: set once per process.
  static const cudaError_t configured =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  check_cuda(configured, "cannot reserve shared memory for sparse attention");
  const long long head_tiles = (params.num_heads + kHeadTile - 1) / kHeadTile;
  const long long blocks = static_cast<long long>(params.num_rows) * head_tiles * params.num_splits;
  if (blocks > 0x7fffffffLL) throw Error("q", "too many rows × heads × chunks for one launch");
  kernel<<<static_cast<unsigned>(blocks), kThreads, kSmemBytes, stream>>>(params);
  check_cuda(cudaGetLastError(), "sparse attention launch failed");
}

// One explicit instantiation per head tile lives in instantiate_h{16,32,64}.cu.
extern template void launch_tile<16>(const SparseAttentionParams&, cudaStream_t);
extern template void launch_tile<32>(const SparseAttentionParams&, cudaStream_t);
extern template void launch_tile<64>(const SparseAttentionParams&, cudaStream_t);

}  // namespace dsv4::cuda::sparse_attention
