// tests/gpu/late_writer.cuh — a kernel that allows early launches and writes its tensors late: what a
// kernel launched early behind it (programmatic dependent launch) must wait for before reading.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "cuda/common/ptx_sm90.cuh"
#include "dsv4/tensor.hpp"

namespace dsv4::testing {

// Up to eight byte ranges a kernel copies late.
struct LateCopies {
  struct Range {
    void* dst;
    const void* src;
    std::size_t bytes;  // a multiple of 2
  } range[8];
  int count;
};

// Lets the next launch start at once, waits `delay_ns` (thread 0 of each block, then the block), then
// copies the ranges.
__global__ inline void copy_late(const LateCopies copies, unsigned long long delay_ns) {
  cuda::ptx::allow_dependent_launch();
  if (threadIdx.x == 0) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
      __nanosleep(1000);
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < delay_ns);
  }
  __syncthreads();
  for (int r = 0; r < copies.count; ++r) {
    auto* dst = static_cast<std::uint16_t*>(copies.range[r].dst);
    const auto* src = static_cast<const std::uint16_t*>(copies.range[r].src);
    for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < copies.range[r].bytes / 2; i += gridDim.x * blockDim.x)
      dst[i] = src[i];
  }
}

// The true contents of tensors a LateWriter fills late (kept alive until it is destroyed).
class LateWriter {
 public:
  // Saves the tensors' contents, fills them with `poison` bytes (0xFF: NaN for floats, −1 for
  // integers), and launches copy_late on `stream` to restore them after `delay_ns`. The call before
  // it is synchronized, so the poison lands first; nothing else should run on `stream` between this
  // and the kernel under test.
  LateWriter(std::initializer_list<Tensor*> tensors, cudaStream_t stream, unsigned long long delay_ns = 200'000,
             std::uint8_t poison = 0xFF) {
    static_assert(sizeof(LateCopies) <= 4096, "a kernel parameter");
    LateCopies copies{};
    for (Tensor* tensor : tensors) {
      if (tensor->numel() == 0) continue;
      EXPECT_LT(copies.count, 8) << "at most eight tensors";
      if (copies.count == 8) break;
      EXPECT_EQ(tensor->nbytes() % 2, 0u) << "copy_late copies 2-byte words";
      sources_.push_back(tensor->to(tensor->device()));
      tensor->fill_bytes(poison);
      copies.range[copies.count++] = {tensor->data(), sources_.back().data(), tensor->nbytes()};
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    copy_late<<<4, 256, 0, stream>>>(copies, delay_ns);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }

 private:
  std::vector<Tensor> sources_;
};

// A stream for one test, destroyed at scope end (blocking: the helpers' copies and memsets on the
// legacy stream stay ordered with it).
struct TestStream {
  cudaStream_t stream = nullptr;
  TestStream() { EXPECT_EQ(cudaStreamCreate(&stream), cudaSuccess); }
  ~TestStream() { cudaStreamDestroy(stream); }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
};

}  // namespace dsv4::testing
