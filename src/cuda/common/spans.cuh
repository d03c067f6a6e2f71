// src/cuda/common/spans.cuh — kernel spans of a probe build (-DDSV4_KERNEL_SPANS in CMAKE_CUDA_FLAGS):
// thread 0 of every block stamps the global timer as the block passes its wait for the kernels before
// it, so the stamps of a captured graph show when each kernel's blocks got going — and with the next
// kernel launched early (its blocks waiting already), when the kernel before it ended. The timeline
// of a decode layer's kernels without a profiler. Compiles to nothing in other builds.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsv4::cuda::spans {

struct Stamp {
  std::uint32_t kernel;  // Kernel
  std::uint32_t grid;    // low bits of %gridid: tells apart two launches of one Kernel in a row
  std::uint64_t ns;      // %globaltimer
  std::uint32_t sm;      // %smid: where the block runs
  std::uint32_t unused;
};
enum Kernel : std::uint32_t { kQuery = 1, kScores, kTopk, kAttention, kCompressor, kOther };

#if defined(DSV4_KERNEL_SPANS)
// Host: every translation unit that includes this header keeps its own device pointers (no relocatable
// device code), registered here at static initialization; attach() points all of them at one buffer
// of `capacity` stamps and its counter (nullptr: stamping off), synchronizes the device and returns
// the first error.
void register_unit(cudaError_t (*set)(Stamp*, std::uint32_t*, std::uint32_t));
cudaError_t attach(Stamp* buffer, std::uint32_t* count, std::uint32_t capacity);

namespace {
__device__ Stamp* g_buffer = nullptr;
__device__ std::uint32_t* g_count = nullptr;
__device__ std::uint32_t g_capacity = 0;
// The buffer last: it switches stamping on, so a kernel that sees it sees the counter too.
static cudaError_t set_unit(Stamp* buffer, std::uint32_t* count, std::uint32_t capacity) {
  cudaError_t status = cudaMemcpyToSymbol(g_count, &count, sizeof count);
  if (status == cudaSuccess) status = cudaMemcpyToSymbol(g_capacity, &capacity, sizeof capacity);
  if (status == cudaSuccess) status = cudaMemcpyToSymbol(g_buffer, &buffer, sizeof buffer);
  return status;
}
[[maybe_unused]] const bool g_registered = (register_unit(&set_unit), true);
}  // namespace

__device__ __forceinline__ void stamp(Kernel kernel) {
  if (threadIdx.x != 0 || g_buffer == nullptr) return;
  std::uint64_t now, grid;
  std::uint32_t sm;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  asm volatile("mov.u64 %0, %%gridid;" : "=l"(grid));
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  const std::uint32_t i = atomicAdd(g_count, 1u);
  if (i < g_capacity)
    g_buffer[i] = Stamp{static_cast<std::uint32_t>(kernel), static_cast<std::uint32_t>(grid), now, sm, 0};
}
#else
__device__ __forceinline__ void stamp(Kernel) {}
#endif

}  // namespace dsv4::cuda::spans
