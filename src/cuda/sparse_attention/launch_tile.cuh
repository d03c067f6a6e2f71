// src/cuda/sparse_attention/launch_tile.cuh — launches the kernel for one head tile.
//
// Included by one small .cu per head tile (instantiate_h*.cu), so the three instantiations compile
// in parallel and a change to one does not rebuild the others.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cuda/sparse_attention/kernel.cuh"
#include "cuda/sparse_attention/wgmma_kernel.cuh"
#include "cuda/common/runtime.hpp"
#include "dsv4/error.hpp"

namespace dsv4::cuda::sparse_attention {

// Launches `kernel` (one instantiation, shared memory configured once per process) over `blocks`.
template <class Kernel>
void launch_blocks(Kernel kernel, int threads, int smem_bytes, long long blocks, const SparseAttentionParams& params,
                   cudaStream_t stream) {
  if (blocks > 0x7fffffffLL) throw Error("q", "too many rows × heads × chunks for one launch");
  kernel<<<static_cast<unsigned>(blocks), threads, smem_bytes, stream>>>(params);
  check_cuda(cudaGetLastError(), "sparse attention launch failed");
}

// The opt-in shared memory size is a per-function attribute: set once per instantiation.
template <class Kernel>
void reserve_shared_memory(Kernel kernel, int smem_bytes) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes),
             "cannot reserve shared memory for sparse attention");
}

// The 64-head tile on warpgroup MMA (wgmma_kernel.cuh), each (row, head tile, chunk) in kDimSplit
// output-dim parts.
template <int kDimSplit>
void launch_wgmma(const SparseAttentionParams& params, long long blocks, cudaStream_t stream) {
  const auto kernel = sparse_attention_wgmma_kernel<WgmmaPlan::kHeads, kDimSplit>;
  static const bool reserved = (reserve_shared_memory(kernel, WgmmaPlan::kSmemBytes), true);
  (void)reserved;
  // setmaxnreg only redistributes the block's own registers: if the compiler allocated fewer than the
  // plan assumes, the consumers' increase would wait forever. Refuse instead of hanging.
  static const int launch_registers = [&] {
    cudaFuncAttributes attributes{};
    check_cuda(cudaFuncGetAttributes(&attributes, kernel), "sparse attention kernel attributes");
    return attributes.numRegs;
  }();
  if (launch_registers < WgmmaPlan::kLaunchRegisters)
    throw Error("device", "the wgmma attention kernel was built with " + std::to_string(launch_registers) +
                              " registers per thread, its register split needs at least " +
                              std::to_string(WgmmaPlan::kLaunchRegisters));
  launch_blocks(kernel, WgmmaPlan::kThreads, WgmmaPlan::kSmemBytes, blocks * kDimSplit, params, stream);
}

template <int kHeadTile>
void launch_tile(const SparseAttentionParams& params, cudaStream_t stream) {
  const long long head_tiles = (params.num_heads + kHeadTile - 1) / kHeadTile;
  const long long blocks = static_cast<long long>(params.num_rows) * head_tiles * params.num_splits;
  if constexpr (kHeadTile == WgmmaPlan::kHeads) {
    switch (params.dim_split) {
      case 4: launch_wgmma<4>(params, blocks, stream); break;
      case 2: launch_wgmma<2>(params, blocks, stream); break;
      default: launch_wgmma<1>(params, blocks, stream); break;
    }
  } else {  // 16 and 32 on mma.sync (kernel.cuh)
    using T = Traits<kHeadTile>;
    static const bool reserved = (reserve_shared_memory(sparse_attention_kernel<kHeadTile>, T::kSmemBytes), true);
    (void)reserved;
    launch_blocks(sparse_attention_kernel<kHeadTile>, T::kThreads, T::kSmemBytes, blocks, params, stream);
  }
}

// One explicit instantiation per head tile lives in instantiate_h{16,32,64}.cu.
extern template void launch_tile<16>(const SparseAttentionParams&, cudaStream_t);
extern template void launch_tile<32>(const SparseAttentionParams&, cudaStream_t);
extern template void launch_tile<64>(const SparseAttentionParams&, cudaStream_t);

}  // namespace dsv4::cuda::sparse_attention
