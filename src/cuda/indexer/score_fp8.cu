// src/cuda/indexer/score_fp8.cu — the score kernel for FP8 (132-byte) keys.
#include "cuda/indexer/score_kernel.cuh"
#include "cuda/indexer/score_launch.hpp"

namespace dsv4::cuda::indexer_score {

DSV4_INSTANTIATE_SCORE_LAUNCH(IndexerKeyFormat::FP8)

}  // namespace dsv4::cuda::indexer_score
