// src/cuda/indexer/score_fp4.cu — the score kernel for FP4 (68-byte) keys.
#include "cuda/indexer/score_kernel.cuh"
#include "cuda/indexer/score_launch.hpp"

namespace dsv4::cuda::indexer_score {

template <>
ScoreKernel score_kernel_for<IndexerKeyFormat::FP4>(const Fp4Variant& fp4) {
  if (fp4.path == Fp4Path::kChunks) return score_kernel<IndexerKeyFormat::FP4, Fp4Path::kChunks, 1>;
  if (fp4.ahead == 1) return score_kernel<IndexerKeyFormat::FP4, Fp4Path::kBlocks, 1>;
  return score_kernel<IndexerKeyFormat::FP4, Fp4Path::kBlocks, 2>;
}

DSV4_INSTANTIATE_SCORE_LAUNCH(IndexerKeyFormat::FP4)

}  // namespace dsv4::cuda::indexer_score
