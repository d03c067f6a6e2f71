// src/cuda/indexer/score.cu — tile and chunk choice of the score kernel.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda/indexer/params.hpp"
#include "cuda/indexer/score_config.hpp"
#include "cuda/indexer/score_launch.hpp"
#include "cuda/common/runtime.hpp"
#include "dsv4/error.hpp"

namespace dsv4::cuda {
namespace {

constexpr const char* kFp4PathVariable = "DSV4_INDEXER_FP4_PATH";

// The FP4 kernel variant: kBlocks with 2 steps in flight unless the environment asks for another.
indexer_score::Fp4Variant fp4_variant_from_environment() {
  using indexer_score::Fp4Path;
  const char* value = std::getenv(kFp4PathVariable);
  if (value == nullptr || std::strcmp(value, "blocks2") == 0) return {Fp4Path::kBlocks, 2};
  if (std::strcmp(value, "blocks1") == 0) return {Fp4Path::kBlocks, 1};
  if (std::strcmp(value, "chunks") == 0) return {Fp4Path::kChunks, 1};
  throw Error(kFp4PathVariable, std::string("must be chunks, blocks1 or blocks2, got \"") + value + "\"");
}

}  // namespace

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
  static const Fp4Variant fp4 = fp4_variant_from_environment();
  if (p.format == IndexerKeyFormat::FP8) launch<IndexerKeyFormat::FP8>(p, grid, shape, shared, fp4, s);
  else launch<IndexerKeyFormat::FP4>(p, grid, shape, shared, fp4, s);
  const cudaError_t status = cudaGetLastError();
  check_cuda(status, "indexer score kernel launch");
}

}  // namespace dsv4::cuda
