// src/cuda/topk/topk.cu — cluster size and per-thread width of the top-k kernel, and its launch.
#include <cuda_runtime.h>

#include <string>

#include "cuda/topk/params.hpp"
#include "cuda/topk/topk_kernel.cuh"
#include "dsv4/error.hpp"

namespace dsv4::cuda {

namespace {

int multiprocessors() {
  int device = 0, count = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
  return count > 0 ? count : 1;
}

template <int kPerThread>
void launch(const TopkParams& p, int cluster_size, cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(p.num_rows * cluster_size));
  config.blockDim = dim3(topk::kThreads);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = static_cast<unsigned>(cluster_size);
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  cudaLaunchKernelEx(&config, topk::topk_kernel<kPerThread>, p);
}

}  // namespace

void indexer_topk(const TopkParams& p, void* stream) {
  using namespace topk;
  constexpr int kWidest = 64;  // entries per thread at most: 64 registers of keys
  // Smallest cluster that holds the row; then more CTAs per row while the rows alone leave SMs
  // idle and each CTA keeps at least 2048 entries.
  int cs = 1;
  while (static_cast<std::int64_t>(cs) * kThreads * kWidest < p.num_cols) cs *= 2;
  require(cs <= kMaxCluster, "scores", "rows are too wide for one cluster");
  const std::int64_t sms = multiprocessors();
  while (cs < kMaxCluster && p.num_rows * cs < sms && p.num_cols >= 2 * cs * 2048) cs *= 2;
  const std::int64_t per_cta = (p.num_cols + cs - 1) / cs;
  int per_thread = 4;
  while (static_cast<std::int64_t>(per_thread) * kThreads < per_cta) per_thread *= 2;
  require(p.num_rows * cs <= 0x7fffffff, "scores", "too many rows for one launch");
  auto* s = static_cast<cudaStream_t>(stream);
  switch (per_thread) {
    case 4: launch<4>(p, cs, s); break;
    case 8: launch<8>(p, cs, s); break;
    case 16: launch<16>(p, cs, s); break;
    case 32: launch<32>(p, cs, s); break;
    default: launch<64>(p, cs, s); break;
  }
  const cudaError_t status = cudaGetLastError();
  require(status == cudaSuccess, "device", std::string("top-k kernel launch: ") + cudaGetErrorString(status));
}

}  // namespace dsv4::cuda
