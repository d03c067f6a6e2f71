// src/cuda/indexer/score.cu — tile and chunk choice of the score kernel.
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
  // The kernels address inside a page with 32-bit offsets (a page of 2^31 bytes would hold 16M entries).
  require(p.page_bytes < (std::int64_t{1} << 31), "keys.pages", "pages of 2 GiB or more are not supported on CUDA");
  // Rows per CTA: a request's rows share every key load, so a tile covers about one request's rows
  // (decode: next_n, prefill: 8); rows of other requests in the same tile only add query staging.
  const std::int64_t rows_per_request = (p.num_rows + p.num_requests - 1) / std::max(p.num_requests, 1);
  ScoreShape shape;
  shape.tile_rows = static_cast<int>(std::clamp<std::int64_t>(rows_per_request, 1, kRowsPerTile));
  const std::int64_t tiles = (p.num_rows + shape.tile_rows - 1) / shape.tile_rows;
  require(tiles <= 0x7fffffff, "q.codes", "too many query rows for one launch");
  // Aim at one wave of two CTAs per SM over the tile × column work; each CTA takes 2 to 16 full
  // steps of 128 keys (fewer, larger chunks waste less on tiles whose rows see little).
  const std::int64_t slots = 2 * static_cast<std::int64_t>(multiprocessor_count());
  const std::int64_t cols = p.num_cols;
  std::int64_t chunk = (cols * tiles + slots - 1) / slots;
  chunk = (chunk + kKeysPerCtaStep - 1) / kKeysPerCtaStep * kKeysPerCtaStep;
  chunk = std::clamp<std::int64_t>(chunk, kMinKeyChunk, kMaxKeyChunk);
  const std::int64_t chunks = (cols + chunk - 1) / chunk;
  require(chunks <= 65535, "scores", "too many columns for one launch");
  shape.key_chunk = static_cast<int>(chunk);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks));
  const std::size_t shared = shared_bytes(p.heads, shape.tile_rows);
  auto* s = static_cast<cudaStream_t>(stream);
  // (score_launch.hpp checks the launch)
  if (p.format == IndexerKeyFormat::FP8) launch<IndexerKeyFormat::FP8>(p, grid, shape, shared, s);
  else launch<IndexerKeyFormat::FP4>(p, grid, shape, shared, s);
}

}  // namespace dsv4::cuda
