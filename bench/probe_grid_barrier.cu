// bench/probe_grid_barrier.cu — what a barrier across a grid costs, against a cluster's hardware barrier.
// A probe, not a bench (scripts/gpu-check runs bench_* only): it bounds a grid-wide top-k for one row
// (128 CTAs exchanging their histograms through global memory instead of a 16-CTA cluster through
// distributed shared memory; PERFORMANCE.md, "For the next device session").
//
// One kernel per line: G CTAs (one a SM, all resident) of T threads pass R barriers in a row; CTA 0's
// thread 0 reads %globaltimer before the first and after the last, so a barrier costs (t1 − t0) / R.
// The grid barrier: a CTA barrier, then thread 0 adds 1 to a counter with release semantics and polls it
// with acquire loads until every CTA of this round has arrived (the counter only grows: a round's target
// is the next multiple of G above the value it found; 0 at each launch), then a CTA barrier. "publish + read" adds what a
// level of the top-k's bin search does between two barriers: each CTA writes 64 counters (256 bytes),
// and after the barrier every CTA reads all G CTAs' counters (warp w reads CTAs w, w + 32, …) and sums
// them into shared memory. The cluster lines do the same with cluster.sync() and distributed shared
// memory (16 CTAs, a non-portable size).
// Usage: probe_grid_barrier (no arguments; prints a table).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

#include "bench_common.hpp"
#include "cuda/common/runtime.hpp"  // cluster_attribute, launch_config

namespace {

namespace cg = cooperative_groups;
using dsv4::bench::check_cuda;

constexpr int kRounds = 200;
constexpr int kCounters = 64;

__device__ __forceinline__ std::uint64_t global_timer() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void grid_barrier(unsigned* counter) {
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned old;
    asm volatile("atom.add.release.gpu.u32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
    const unsigned target = (old / gridDim.x + 1) * gridDim.x;
    unsigned now;
    do {
      asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(now) : "l"(counter) : "memory");
    } while (static_cast<int>(now - target) < 0);
  }
  __syncthreads();
}

// kPublish: between barriers, each CTA writes its counters and reads every CTA's (global memory).
template <bool kPublish>
__global__ void grid_rounds(unsigned* counter, int* exchange, std::uint64_t* elapsed, int* sink) {
  __shared__ int totals[kCounters];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  grid_barrier(counter);  // everyone resident before the clock starts
  const std::uint64_t t0 = global_timer();
  for (int r = 0; r < kRounds; ++r) {
    if (kPublish) {
      if (threadIdx.x < kCounters) {
        exchange[blockIdx.x * kCounters + threadIdx.x] = r + static_cast<int>(threadIdx.x);
        totals[threadIdx.x] = 0;
      }
    }
    grid_barrier(counter);
    if (kPublish) {
      for (int cta = warp; cta < static_cast<int>(gridDim.x); cta += warps) {
        const int2 v = __ldcg(reinterpret_cast<const int2*>(exchange + cta * kCounters) + lane);
        atomicAdd(&totals[2 * lane], v.x);
        atomicAdd(&totals[2 * lane + 1], v.y);
      }
      __syncthreads();
      if (threadIdx.x == 0) sink[blockIdx.x] += totals[r % kCounters];
      grid_barrier(counter);  // nobody rewrites its counters before all have read them
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) *elapsed = global_timer() - t0;
}

template <bool kPublish>
__global__ void cluster_rounds(std::uint64_t* elapsed, int* sink) {
  __shared__ int counters[kCounters];
  __shared__ int totals[kCounters];
  cg::cluster_group cluster = cg::this_cluster();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int ranks = static_cast<int>(cluster.num_blocks());
  cluster.sync();
  const std::uint64_t t0 = global_timer();
  for (int r = 0; r < kRounds; ++r) {
    if (kPublish && threadIdx.x < kCounters) {
      counters[threadIdx.x] = r + static_cast<int>(threadIdx.x);
      totals[threadIdx.x] = 0;
    }
    cluster.sync();
    if (kPublish) {
      for (int cta = warp; cta < ranks; cta += warps) {
        const int2 v = reinterpret_cast<const int2*>(cluster.map_shared_rank(counters, cta))[lane];
        atomicAdd(&totals[2 * lane], v.x);
        atomicAdd(&totals[2 * lane + 1], v.y);
      }
      __syncthreads();
      if (threadIdx.x == 0) sink[blockIdx.x] += totals[r % kCounters];
      cluster.sync();
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) *elapsed = global_timer() - t0;
}

double per_round_us(const std::uint64_t* d_elapsed) {
  std::uint64_t ns = 0;
  check_cuda(cudaMemcpy(&ns, d_elapsed, sizeof ns, cudaMemcpyDeviceToHost), "elapsed");
  return ns / 1e3 / kRounds;
}

}  // namespace

int main() {
  int sms = 0;
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SM count");
  unsigned* counter = nullptr;
  int *exchange = nullptr, *sink = nullptr;
  std::uint64_t* elapsed = nullptr;
  check_cuda(cudaMalloc(&counter, sizeof(unsigned)), "counter");
  check_cuda(cudaMemset(counter, 0, sizeof(unsigned)), "counter");
  check_cuda(cudaMalloc(&exchange, sizeof(int) * kCounters * 1024), "exchange");
  check_cuda(cudaMalloc(&sink, sizeof(int) * 1024), "sink");
  check_cuda(cudaMemset(sink, 0, sizeof(int) * 1024), "sink");
  check_cuda(cudaMalloc(&elapsed, sizeof(std::uint64_t)), "elapsed");
  std::printf("%d SMs; µs a round (median of 5 launches of %d rounds; a round with publish + read is two barriers)\n",
              sms, kRounds);
  std::printf("%-34s %8s %8s\n", "barrier", "256 thr", "1024 thr");
  const auto median5 = [](auto&& one) {
    std::vector<double> v;
    for (int i = 0; i < 5; ++i) v.push_back(one());
    return dsv4::bench::median(std::move(v));
  };
  for (bool publish : {false, true}) {
    for (int ctas : {16, 32, 64, 128, sms}) {
      if (ctas > sms) continue;
      double us[2];
      for (int t = 0; t < 2; ++t) {
        const int threads = t == 0 ? 256 : 1024;
        us[t] = median5([&] {
          // Each launch starts at 0: a count left by a launch of another size would shift its rounds.
          check_cuda(cudaMemset(counter, 0, sizeof(unsigned)), "counter");
          if (publish) grid_rounds<true><<<ctas, threads>>>(counter, exchange, elapsed, sink);
          else grid_rounds<false><<<ctas, threads>>>(counter, exchange, elapsed, sink);
          check_cuda(cudaDeviceSynchronize(), "grid rounds");
          return per_round_us(elapsed);
        });
      }
      std::printf("grid %3d CTAs%-21s %8.3f %8.3f\n", ctas, publish ? ", publish + read" : "", us[0], us[1]);
    }
    for (int ranks : {8, 16}) {
      double us[2];
      for (int t = 0; t < 2; ++t) {
        const int threads = t == 0 ? 256 : 1024;
        auto kernel = publish ? cluster_rounds<true> : cluster_rounds<false>;
        check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1), "non-portable");
        cudaLaunchAttribute attribute = dsv4::cuda::cluster_attribute(ranks);
        const cudaLaunchConfig_t config =
            dsv4::cuda::launch_config(dim3(ranks), dim3(threads), 0, nullptr, &attribute, 1);
        us[t] = median5([&] {
          check_cuda(cudaLaunchKernelEx(&config, kernel, elapsed, sink), "cluster rounds");
          check_cuda(cudaDeviceSynchronize(), "cluster rounds");
          return per_round_us(elapsed);
        });
      }
      std::printf("cluster %2d CTAs%-19s %8.3f %8.3f\n", ranks, publish ? ", publish + read" : "", us[0], us[1]);
    }
  }
  cudaFree(counter);
  cudaFree(exchange);
  cudaFree(sink);
  cudaFree(elapsed);
  return 0;
}
