// src/cuda/indexer/score_fp4.cu — the score kernel for FP4 (68-byte) keys.
#include "cuda/indexer/score_kernel.cuh"
#include "cuda/indexer/score_launch.hpp"

namespace dsv4::cuda::indexer_score {

DSV4_INSTANTIATE_SCORE_LAUNCH(IndexerKeyFormat::FP4)

}  // namespace dsv4::cuda::indexer_score
