// bench/probe_cluster_exchange.cu — what the attention's cluster merge pays to move its partials. A probe,
// not a bench (scripts/gpu-check runs bench_* only): it bounds the one-row decode at the latency split,
// whose merge moves ≈ 32 KB of float32 partials into each merging block in ≈ 2 µs (notes-sparse-attention
// §25: the same whether pulled through distributed shared memory, pushed, or through L2).
//
// `clusters` clusters of C CTAs (C = 10: one row of 640 candidates at split 64 has 4 such clusters, one
// an output part), 256 threads each. Every CTA fills `bytes` of its shared memory (its chunk's partials
// of all the part's heads), then after a cluster barrier reads its share — 1/C of the heads — from every
// CTA of the cluster (itself too) and sums it in chunk order, the merge's reduce-scatter. clock64 around
// the read phase only (from the barrier to the sum's last add), per CTA; the table gives the median and
// the largest over the CTAs, in cycles and bytes a cycle into the CTA, for reads of 4 and 16 bytes a
// lane and for the same exchange through global memory (each CTA's partials stored, then read back by
// the others after a cluster barrier with release / acquire semantics, as the L2 variant did).
// Usage: probe_cluster_exchange (no arguments; prints a table).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "bench_common.hpp"
#include "cuda/common/runtime.hpp"  // cluster_attribute, launch_config

namespace {

namespace cg = cooperative_groups;
using dsv4::bench::check_cuda;

constexpr int kThreads = 256;

// kVector: 1 (float) or 4 (float4) a lane; kGlobal: through `scratch` instead of distributed shared memory.
template <int kVector, bool kGlobal>
__global__ void __launch_bounds__(kThreads) exchange(int bytes, float* scratch, long long* cycles, float* sink) {
  extern __shared__ float4 smem[];
  const cg::cluster_group cluster = cg::this_cluster();
  const int ranks = static_cast<int>(cluster.num_blocks()), rank = static_cast<int>(cluster.block_rank());
  const int floats = bytes / 4;
  float* mine = reinterpret_cast<float*>(smem);
  for (int i = threadIdx.x; i < floats; i += kThreads) mine[i] = static_cast<float>(rank * 131 + i % 97) * 0.25f;
  float* my_global = scratch + static_cast<std::int64_t>(blockIdx.x) * floats;
  if (kGlobal)
    for (int i = threadIdx.x; i < floats; i += kThreads) my_global[i] = mine[i];
  __syncthreads();
  cluster.sync();  // (release / acquire: the global stores are visible to the cluster after it)
  const long long start = clock64();
  // This CTA's share: floats [rank·F/C, (rank+1)·F/C) of every CTA's buffer, kVector floats a lane.
  const int share_begin = rank * floats / ranks / kVector, share_end = (rank + 1) * floats / ranks / kVector;
  const int cluster_first_block = static_cast<int>(blockIdx.x) - rank;
  float total = 0.0f;
  for (int v = share_begin + static_cast<int>(threadIdx.x); v < share_end; v += kThreads) {
    float sum = 0.0f;
    if constexpr (kVector == 4) {
      float4 parts[16];
#pragma unroll
      for (int r = 0; r < 16; ++r) {  // every CTA's value at once
        if (r < ranks) {
          const float4* from = kGlobal ? reinterpret_cast<const float4*>(scratch + static_cast<std::int64_t>(cluster_first_block + r) * floats)
                                       : reinterpret_cast<const float4*>(cluster.map_shared_rank(mine, r));
          parts[r] = kGlobal ? __ldcg(from + v) : from[v];
        }
      }
#pragma unroll
      for (int r = 0; r < 16; ++r)
        if (r < ranks) sum += parts[r].x + parts[r].y + parts[r].z + parts[r].w;
    } else {
      float parts[16];
#pragma unroll
      for (int r = 0; r < 16; ++r) {
        if (r < ranks) {
          const float* from = kGlobal ? scratch + static_cast<std::int64_t>(cluster_first_block + r) * floats
                                      : cluster.map_shared_rank(mine, r);
          parts[r] = kGlobal ? __ldcg(from + v) : from[v];
        }
      }
#pragma unroll
      for (int r = 0; r < 16; ++r)
        if (r < ranks) sum += parts[r];
    }
    total += sum;
  }
  __syncthreads();
  const long long elapsed = clock64() - start;
  if (threadIdx.x == 0) cycles[blockIdx.x] = elapsed;
  if (total == 1234.5f) sink[0] = total;  // keeps the reads
  cluster.sync();  // no CTA leaves while others read its shared memory
}

template <int kVector, bool kGlobal>
void run(int ranks, int clusters, int bytes, float* scratch, long long* cycles, float* sink) {
  auto kernel = exchange<kVector, kGlobal>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), "smem");
  if (ranks > 8) check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1), "cluster");
  cudaLaunchAttribute attribute = dsv4::cuda::cluster_attribute(ranks);
  const cudaLaunchConfig_t config = dsv4::cuda::launch_config(dim3(static_cast<unsigned>(ranks * clusters)), dim3(kThreads),
                                                              static_cast<std::size_t>(bytes), nullptr, &attribute, 1);
  int fits = 0;  // a cluster's CTAs must share a GPC: skip the sizes this card cannot place
  if (cudaOccupancyMaxActiveClusters(&fits, kernel, &config) != cudaSuccess || fits == 0) {
    cudaGetLastError();
    std::printf("C=%-2d: no cluster of this size fits a GPC here, skipped\n", ranks);
    return;
  }
  std::vector<long long> all;
  for (int repeat = 0; repeat < 20; ++repeat) {
    check_cuda(cudaLaunchKernelEx(&config, kernel, bytes, scratch, cycles, sink), "launch");
    std::vector<long long> host(static_cast<std::size_t>(ranks * clusters));
    check_cuda(cudaMemcpy(host.data(), cycles, host.size() * sizeof(long long), cudaMemcpyDeviceToHost), "cycles");
    if (repeat >= 3) all.insert(all.end(), host.begin(), host.end());
  }
  std::sort(all.begin(), all.end());
  const double median = static_cast<double>(all[all.size() / 2]), largest = static_cast<double>(all.back());
  const double inbound = static_cast<double>(bytes) * (ranks - 1) / ranks;  // from the other CTAs
  std::printf("C=%-2d clusters=%-2d %6d B %-6s %-7s | median %7.0f cycles (%5.1f B/cycle in) | largest %7.0f\n", ranks,
              clusters, bytes, kVector == 4 ? "float4" : "float", kGlobal ? "global" : "dsmem", median,
              inbound / median, largest);
}

}  // namespace

int main() {
  float *scratch = nullptr, *sink = nullptr;
  long long* cycles = nullptr;
  constexpr int kMaxBlocks = 16 * 16, kMaxBytes = 64 * 1024;
  check_cuda(cudaMalloc(&scratch, static_cast<std::size_t>(kMaxBlocks) * kMaxBytes), "scratch");
  check_cuda(cudaMalloc(&cycles, kMaxBlocks * sizeof(long long)), "cycles");
  check_cuda(cudaMalloc(&sink, sizeof(float)), "sink");
  // The latency split's merge (64 heads × 128 dims of float32 a chunk, 4 clusters of 10), then the
  // same bytes in other cluster sizes and counts, and half the bytes (8 output parts, or bf16 partials).
  const struct {
    int ranks, clusters, bytes;
  } cases[] = {{10, 4, 32768}, {10, 1, 32768}, {10, 4, 16384}, {5, 8, 32768}, {2, 20, 32768}, {16, 2, 32768}};
  for (const auto& c : cases) {
    run<4, false>(c.ranks, c.clusters, c.bytes, scratch, cycles, sink);
    run<1, false>(c.ranks, c.clusters, c.bytes, scratch, cycles, sink);
    run<4, true>(c.ranks, c.clusters, c.bytes, scratch, cycles, sink);
  }
  cudaFree(scratch);
  cudaFree(cycles);
  cudaFree(sink);
  return 0;
}
