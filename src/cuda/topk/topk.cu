// src/cuda/topk/topk.cu — cluster size and per-thread width of the top-k kernel, and its launch.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "cuda/topk/params.hpp"
#include "cuda/topk/topk_kernel.cuh"
#include "cuda/common/runtime.hpp"
#include "dsv4/error.hpp"

namespace dsv4::cuda {

namespace {

void set_cluster(cudaLaunchConfig_t& config, cudaLaunchAttribute& attribute, int cluster_size) {
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = static_cast<unsigned>(cluster_size);
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
}

// Whether the device schedules 16-CTA clusters (a non-portable size) of the kernel with the shared
// memory such a cluster needs (a 262144-entry row: kMaxPerThread / 2 entries a thread). Asked once
// per process (the library uses one device per process).
bool sixteen_cta_clusters() {
  static const bool supported = [] {
    using namespace topk;
    const std::size_t shared = key_bytes(kMaxPerThread / 2);
    if (cudaFuncSetAttribute(topk_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess ||
        cudaFuncSetAttribute(topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)) !=
            cudaSuccess) {
      cudaGetLastError();  // clear the refusal: 8-CTA clusters remain
      return false;
    }
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(kMaxCluster);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = shared;
    cudaLaunchAttribute attribute;
    set_cluster(config, attribute, kMaxCluster);
    int clusters = 0;
    const bool fits = cudaOccupancyMaxActiveClusters(&clusters, topk_kernel, &config) == cudaSuccess && clusters > 0;
    cudaGetLastError();
    return fits;
  }();
  return supported;
}

void launch(const TopkParams& p, int cluster_size, int per_thread, cudaStream_t stream) {
  const std::size_t shared = topk::key_bytes(per_thread);
  cudaFuncSetAttribute(topk::topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(p.num_rows * cluster_size));
  config.blockDim = dim3(topk::kThreads);
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  cudaLaunchAttribute attribute;
  set_cluster(config, attribute, cluster_size);
  cudaLaunchKernelEx(&config, topk::topk_kernel, p, per_thread);
}

}  // namespace

void indexer_topk(const TopkParams& p, void* stream) {
  using namespace topk;
  // Smallest cluster that holds the row; then more CTAs per row while the rows alone leave over half
  // the SMs idle and each CTA keeps at least 2048 entries (16 where the device schedules them).
  int cs = 1;
  while (static_cast<std::int64_t>(cs) * kThreads * kMaxPerThread < p.num_cols) cs *= 2;
  require(cs <= kMaxPortableCluster, "scores", "rows are too wide for one cluster");
  const std::int64_t sms = multiprocessor_count();
  const int widest = p.num_rows * kMaxCluster <= sms && sixteen_cta_clusters() ? kMaxCluster : kMaxPortableCluster;
  while (cs < widest && 2 * p.num_rows * cs <= sms && p.num_cols >= 2 * cs * 2048) cs *= 2;
  const std::int64_t per_cta = (p.num_cols + cs - 1) / cs;
  const int per_thread = static_cast<int>(std::max<std::int64_t>(1, (per_cta + kThreads - 1) / kThreads));
  require(p.num_rows * cs <= 0x7fffffff, "scores", "too many rows for one launch");
  launch(p, cs, per_thread, static_cast<cudaStream_t>(stream));
  const cudaError_t status = cudaGetLastError();
  check_cuda(status, "top-k kernel launch");
}

}  // namespace dsv4::cuda
