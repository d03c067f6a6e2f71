// src/cuda/indexer/query.cu — launcher of the fused query preparation.
#include <cuda_runtime.h>

#include <string>

#include "cuda/indexer/params.hpp"
#include "cuda/indexer/query_kernel.cuh"
#include "cuda/common/runtime.hpp"
#include "dsv4/error.hpp"

namespace dsv4::cuda {

void prepare_indexer_queries(const IndexerQueryPrepParams& p, void* stream) {
  using namespace indexer_query;
  const std::int64_t blocks = (p.num_rows * p.heads + kWarps - 1) / kWarps;
  require(blocks <= 0x7fffffff, "q_rows", "too many query heads for one launch");
  auto* s = static_cast<cudaStream_t>(stream);
  // An early launch (runtime.hpp): the kernel waits for the kernel before it before reading anything.
  auto* kernel =
      p.format == IndexerKeyFormat::FP8 ? query_kernel<IndexerKeyFormat::FP8> : query_kernel<IndexerKeyFormat::FP4>;
  check_cuda(launch_early(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, s, p),
             "indexer query kernel launch");
}

}  // namespace dsv4::cuda
