// src/cuda/common/spans.cu — the host side of a probe build's kernel spans (spans.cuh).
#if defined(DSV4_KERNEL_SPANS)
#include "cuda/common/spans.cuh"

#include <vector>

namespace dsv4::cuda::spans {

namespace {
std::vector<cudaError_t (*)(Stamp*, std::uint32_t*, std::uint32_t)>& units() {
  static std::vector<cudaError_t (*)(Stamp*, std::uint32_t*, std::uint32_t)> all;  // built before its first use
  return all;
}
}  // namespace

void register_unit(cudaError_t (*set)(Stamp*, std::uint32_t*, std::uint32_t)) { units().push_back(set); }

cudaError_t attach(Stamp* buffer, std::uint32_t* count, std::uint32_t capacity) {
  cudaError_t first = cudaSuccess;
  for (auto* set : units()) {
    const cudaError_t status = set(buffer, count, capacity);
    if (first == cudaSuccess) first = status;
  }
  const cudaError_t synchronized = cudaDeviceSynchronize();  // every copy landed before a kernel runs
  return first != cudaSuccess ? first : synchronized;
}

}  // namespace dsv4::cuda::spans
#endif
