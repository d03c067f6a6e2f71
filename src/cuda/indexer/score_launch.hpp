// src/cuda/indexer/score_launch.hpp — one launch function per key format (score_fp8.cu, score_fp4.cu),
// so each instantiation of the score kernel compiles in its own translation unit.
#pragma once

#include <cuda_runtime.h>

#include "cuda/indexer/params.hpp"
#include "cuda/indexer/score_config.hpp"

namespace dsv4::cuda::indexer_score {

// grid (row tiles, key chunks) as `shape` says, dynamic shared memory `shared`.
void launch_fp8(const IndexerScoreParams& p, dim3 grid, const ScoreShape& shape, std::size_t shared,
                cudaStream_t stream);
void launch_fp4(const IndexerScoreParams& p, dim3 grid, const ScoreShape& shape, std::size_t shared,
                cudaStream_t stream);

}  // namespace dsv4::cuda::indexer_score
