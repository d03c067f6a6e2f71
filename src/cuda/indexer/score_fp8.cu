// src/cuda/indexer/score_fp8.cu — the score kernels for FP8 (132-byte) keys.
#include "cuda/indexer/score_kernel.cuh"
#include "cuda/indexer/score_launch.hpp"

namespace dsv4::cuda::indexer_score {

void launch_fp8(const IndexerScoreParams& p, dim3 grid, const ScoreShape& shape, std::size_t shared,
                cudaStream_t stream) {
  auto* kernel = shape.ring_steps > 0 ? score_kernel<IndexerKeyFormat::FP8, true> : score_kernel<IndexerKeyFormat::FP8, false>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
  kernel<<<grid, kThreads, shared, stream>>>(p, shape);
}

}  // namespace dsv4::cuda::indexer_score
