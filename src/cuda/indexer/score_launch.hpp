// src/cuda/indexer/score_launch.hpp — the score kernel's launch, one explicit instantiation per key
// format (score_fp8.cu, score_fp4.cu), so each kernel compiles in its own translation unit.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/runtime.hpp"
#include "cuda/indexer/params.hpp"
#include "cuda/indexer/score_config.hpp"

namespace dsv4::cuda::indexer_score {

// grid (row tiles, key chunks) as `shape` says, dynamic shared memory `shared`; an early launch
// (runtime.hpp: the kernel waits for the kernel before it before reading anything).
template <IndexerKeyFormat kFormat>
void launch(const IndexerScoreParams& p, dim3 grid, const ScoreShape& shape, std::size_t shared, cudaStream_t stream);

// The body, for the two instantiating translation units (they include score_kernel.cuh first).
#define DSV4_INSTANTIATE_SCORE_LAUNCH(FORMAT)                                                                 \
  template <>                                                                                               \
  void launch<FORMAT>(const IndexerScoreParams& p, dim3 grid, const ScoreShape& shape, std::size_t shared,  \
                      cudaStream_t stream) {                                                                \
    auto* kernel = score_kernel<FORMAT>;                                                                    \
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)), \
               "indexer score kernel shared memory");                                                       \
    check_cuda(launch_early(kernel, grid, dim3(kThreads), shared, stream, p, shape),                        \
               "indexer score kernel launch");                                                              \
  }

}  // namespace dsv4::cuda::indexer_score
