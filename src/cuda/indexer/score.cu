// src/cuda/indexer/score.cu — tile, chunk and key-ring choice of the score kernel.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "cuda/indexer/params.hpp"
#include "cuda/indexer/score_config.hpp"
#include "cuda/indexer/score_launch.hpp"
#include "cuda/common/runtime.hpp"
#include "dsv4/error.hpp"

namespace dsv4::cuda {
namespace {

using namespace indexer_score;

// Shared memory a CTA may take beyond the dynamic part (the kernel's static arrays, about 2.4 KB)
// and what the driver reserves per CTA.
constexpr std::size_t kStaticSharedAllowance = 4096;
constexpr std::size_t kReservedPerCta = 1024;

// Key-ring depth in steps: as deep as fits next to the tile's queries while two CTAs still share
// an SM (or one, when the queries alone take more than half of it), at most kMaxRingSteps.
// DSV4_INDEXER_SCORE_RING_STEPS=n caps it at n (tests use 1, so every small case wraps the ring;
// 0 selects the register kernel, kept for comparison).
int ring_steps_for(int heads, int tile_rows, IndexerKeyFormat format) {
  int device = 0, per_sm = 0, per_block = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
  cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  const std::size_t fixed = shared_bytes(heads, tile_rows, format, 0);
  const std::size_t step = static_cast<std::size_t>(ring_step_bytes(format));
  const std::size_t half_sm = static_cast<std::size_t>(per_sm) / 2 - kReservedPerCta - kStaticSharedAllowance;
  const std::size_t whole = static_cast<std::size_t>(per_block) - kStaticSharedAllowance;
  const std::size_t budget = fixed + 2 * step <= half_sm ? half_sm : whole;
  int steps = budget > fixed ? static_cast<int>(std::min<std::size_t>(kMaxRingSteps, (budget - fixed) / step)) : 0;
  if (const char* cap = std::getenv("DSV4_INDEXER_SCORE_RING_STEPS")) steps = std::min(steps, std::atoi(cap));
  return std::max(steps, 0);
}

}  // namespace

void indexer_scores(const IndexerScoreParams& p, void* stream) {
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
  shape.ring_steps = ring_steps_for(p.heads, shape.tile_rows, p.format);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks));
  const std::size_t shared = shared_bytes(p.heads, shape.tile_rows, p.format, shape.ring_steps);
  auto* s = static_cast<cudaStream_t>(stream);
  if (p.format == IndexerKeyFormat::FP8) launch_fp8(p, grid, shape, shared, s);
  else launch_fp4(p, grid, shape, shared, s);
  const cudaError_t status = cudaGetLastError();
  check_cuda(status, "indexer score kernel launch");
}

}  // namespace dsv4::cuda
