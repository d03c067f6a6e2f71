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

using KernelFn = void (*)(TopkParams);

// The kernel taking `vectors` 16-byte loads (4·vectors entries) a thread: 1, 2, 4 or 8.
KernelFn kernel_for(int vectors) {
  switch (vectors) {
    case 1: return topk::topk_kernel<1>;
    case 2: return topk::topk_kernel<2>;
    case 4: return topk::topk_kernel<4>;
    default: return topk::topk_kernel<8>;
  }
}

// Sets every kernel's dynamic shared memory once, and says whether the device schedules 16-CTA
// clusters (a non-portable size) of the widest kernel a 16-CTA cluster uses (a 262144-entry row:
// 16384 entries a CTA, 4 loads a thread). Asked once per process (the library uses one device
// per process).
bool sixteen_cta_clusters() {
  static const bool supported = [] {
    using namespace topk;
    bool non_portable = true;
    for (int vectors : {1, 2, 4, 8}) {
      const KernelFn kernel = kernel_for(vectors);
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(key_bytes(vectors)));
      if (vectors <= 4 && cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess)
        non_portable = false;
    }
    cudaGetLastError();  // clear a refusal: 8-CTA clusters remain
    if (!non_portable) return false;
    cudaLaunchAttribute attribute = cluster_attribute(kMaxCluster);
    const cudaLaunchConfig_t config =
        launch_config(dim3(kMaxCluster), dim3(kThreads), key_bytes(4), nullptr, &attribute, 1);
    int clusters = 0;
    const bool fits =
        cudaOccupancyMaxActiveClusters(&clusters, kernel_for(4), &config) == cudaSuccess && clusters > 0;
    cudaGetLastError();
    return fits;
  }();
  return supported;
}

void launch(const TopkParams& p, int cluster_size, int vectors, cudaStream_t stream) {
  // An early launch behind the score kernel, which allows it.
  cudaLaunchAttribute attributes[2] = {cluster_attribute(cluster_size), early_launch_attribute()};
  const cudaLaunchConfig_t config = launch_config(dim3(static_cast<unsigned>(p.num_rows * cluster_size)),
                                                  dim3(topk::kThreads), topk::key_bytes(vectors), stream, attributes, 2);
  check_cuda(consumed_launch_status(cudaLaunchKernelEx(&config, kernel_for(vectors), p)), "top-k kernel launch");
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
  const bool sixteen = sixteen_cta_clusters();  // also sets the kernels' shared-memory sizes
  const int widest = p.num_rows * kMaxCluster <= sms && sixteen ? kMaxCluster : kMaxPortableCluster;
  while (cs < widest && 2 * p.num_rows * cs <= sms && p.num_cols >= 2 * cs * 2048) cs *= 2;
  const std::int64_t per_cta = (p.num_cols + cs - 1) / cs;
  const std::int64_t per_thread = (per_cta + kThreads - 1) / kThreads;
  int vectors = 1;  // 16-byte loads a thread: a power of two ≥ per_thread / 4
  while (4 * vectors < per_thread) vectors *= 2;
  require(p.num_rows * cs <= 0x7fffffff, "scores", "too many rows for one launch");
  launch(p, cs, vectors, static_cast<cudaStream_t>(stream));  // (checks its launch)
}

}  // namespace dsv4::cuda
