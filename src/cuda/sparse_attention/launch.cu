// src/cuda/sparse_attention/launch.cu — picks the head tile and launches (params.hpp).
//
// The tile only changes how many heads share one gathered/dequantized block, never the arithmetic
// of a head (the column split of the warps is the same for every tile), so choosing it from the
// batch size keeps batch invariance: large batches take 64-head tiles (one dequantization serves
// 64 heads), small ones smaller tiles to put more thread blocks on the 132 SMs.
#include <cuda_runtime.h>

#include "cuda/sparse_attention/launch_tile.cuh"
#include "cuda/sparse_attention/params.hpp"

namespace dsv4::cuda {

namespace {
int multiprocessor_count() {
  int device = 0, count = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || count <= 0)
    return 132;
  return count;
}
}  // namespace

void launch_sparse_attention(const SparseAttentionParams& params, void* stream_handle) {
  auto stream = static_cast<cudaStream_t>(stream_handle);
  static const int sms = multiprocessor_count();
  const auto blocks_with = [&](int tile) {
    return static_cast<long long>(params.num_rows) * ((params.num_heads + tile - 1) / tile) * params.num_splits;
  };
  // Largest tile that divides the heads (no padded heads) and still fills the SMs; else 16.
  int tile = 16;
  for (int candidate : {64, 32}) {
    if (params.num_heads % candidate == 0 && blocks_with(candidate) >= sms) {
      tile = candidate;
      break;
    }
  }
  switch (tile) {
    case 64: sparse_attention::launch_tile<64>(params, stream); break;
    case 32: sparse_attention::launch_tile<32>(params, stream); break;
    default: sparse_attention::launch_tile<16>(params, stream); break;
  }
}

}  // namespace dsv4::cuda
