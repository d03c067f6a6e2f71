// src/cuda/indexer/score.cu — grid and chunk choice of the score kernel.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "cuda/indexer/params.hpp"
#include "cuda/indexer/score_config.hpp"
#include "cuda/indexer/score_launch.hpp"
#include "cuda/common/runtime.hpp"
#include "dsv4/error.hpp"

namespace dsv4::cuda {

void indexer_scores(const IndexerScoreParams& p, void* stream) {
  using namespace indexer_score;
  const std::int64_t tiles = (p.num_rows + kRowsPerTile - 1) / kRowsPerTile;
  require(tiles <= 0x7fffffff, "q.codes", "too many query rows for one launch");
  // Aim at one wave of two CTAs per SM over the tile × column work; each CTA takes 1 to 4 full
  // steps of 512 keys (fewer, larger chunks waste less on tiles whose rows see little).
  const std::int64_t slots = 2 * static_cast<std::int64_t>(multiprocessor_count());
  const std::int64_t cols = p.num_cols;
  std::int64_t chunk = (cols * tiles + slots - 1) / slots;
  chunk = (chunk + kKeysPerCtaStep - 1) / kKeysPerCtaStep * kKeysPerCtaStep;
  chunk = std::clamp<std::int64_t>(chunk, kMinKeyChunk, kMaxKeyChunk);
  const std::int64_t chunks = (cols + chunk - 1) / chunk;
  require(chunks <= 65535, "scores", "too many columns for one launch");
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks));
  const std::size_t shared = shared_bytes(p.heads);
  auto* s = static_cast<cudaStream_t>(stream);
  if (p.format == IndexerKeyFormat::FP8) launch_fp8(p, grid, static_cast<int>(chunk), shared, s);
  else launch_fp4(p, grid, static_cast<int>(chunk), shared, s);
  const cudaError_t status = cudaGetLastError();
  check_cuda(status, "indexer score kernel launch");
}

}  // namespace dsv4::cuda
