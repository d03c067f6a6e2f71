// bench/attention_fill.cuh — random attention inputs on the device for the benches: FP8 entry pools in
// the 584-byte layout (SPEC §5.1) and bf16 queries. (Its kernels are defined here: one bench, one
// translation unit.)
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "bench_common.hpp"
#include "dsv4/cache_format.hpp"
#include "dsv4/formats.hpp"
#include "dsv4/tensor.hpp"

namespace dsv4::bench {

__device__ inline std::uint16_t random_bf16(std::uint64_t h) {  // uniform in [-2, 2)
  const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
  return bf16_bits_from_float(4.0f * u - 2.0f);
}

// One thread per entry: 448 e4m3 codes (NaN codes avoided), 64 bf16, scale bytes 2^-9..2^-2.
__global__ void fill_attention_entries(std::uint8_t* pages /*[num_pages, page_bytes]*/, std::int64_t num_pages,
                                              int entries_per_page, std::uint64_t seed) {
  using F = AttentionEntryFormat;
  const std::int64_t slot = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (slot >= num_pages * entries_per_page) return;
  std::uint8_t* page = pages + (slot / entries_per_page) * F::page_bytes(entries_per_page);
  const int i = static_cast<int>(slot % entries_per_page);
  std::uint8_t* data = page + F::data_offset(i);
  for (int k = 0; k < F::kNopeDim; ++k) {
    std::uint8_t code = static_cast<std::uint8_t>(mix64(seed ^ (slot * 1024 + k)) & 0xff);
    if ((code & 0x7f) == 0x7f) code = static_cast<std::uint8_t>(code - 1);
    data[k] = code;
  }
  for (int k = 0; k < F::kRopeDim; ++k) {
    const std::uint16_t v = random_bf16(mix64(seed ^ (slot * 1024 + 512 + k)));
    data[F::kNopeDim + 2 * k] = static_cast<std::uint8_t>(v & 0xff);
    data[F::kNopeDim + 2 * k + 1] = static_cast<std::uint8_t>(v >> 8);
  }
  std::uint8_t* scales = page + F::scale_offset(i, entries_per_page);
  for (int b = 0; b < F::kNumScales; ++b) scales[b] = static_cast<std::uint8_t>(118 + mix64(seed ^ (slot * 16 + b)) % 8);
  scales[F::kNumScales] = 0;
}

// A pool of `num_pages` pages of `entries_per_page` random entries.
inline Tensor random_attention_pool(std::int64_t num_pages, int entries_per_page, std::uint64_t seed) {
  Tensor pool = Tensor::empty(DType::U8, {num_pages, AttentionEntryFormat::page_bytes(entries_per_page)}, Device::CUDA);
  const std::int64_t entries = num_pages * entries_per_page;
  fill_attention_entries<<<static_cast<unsigned>((entries + 255) / 256), 256>>>(pool.data_as<std::uint8_t>(), num_pages,
                                                                                entries_per_page, seed);
  check_cuda(cudaGetLastError(), "fill_attention_entries");
  return pool;
}

__global__ void fill_bf16(std::uint16_t* out, std::int64_t n, std::uint64_t seed) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    out[i] = random_bf16(mix64(seed ^ i));
}

}  // namespace dsv4::bench
