// src/cuda/indexer/score_fp4.cu — the score kernel for FP4 (68-byte) keys.
#include "cuda/indexer/score_kernel.cuh"
#include "cuda/indexer/score_launch.hpp"

namespace dsv4::cuda::indexer_score {

void launch_fp4(const IndexerScoreParams& p, dim3 grid, const ScoreShape& shape, std::size_t shared,
                cudaStream_t stream) {
  auto* kernel = score_kernel<IndexerKeyFormat::FP4>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
  kernel<<<grid, kThreads, shared, stream>>>(p, shape);
}

}  // namespace dsv4::cuda::indexer_score
