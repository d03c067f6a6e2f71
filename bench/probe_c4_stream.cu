// bench/probe_c4_stream.cu — how fast can a C4 prefill's rows be streamed at all? A probe, not a bench
// (scripts/gpu-check runs bench_* only): it bounds the C4-128 prefill at T = 256K (89.6% of copy in the
// nineteenth session; C4-512, the same pattern with 4× the bytes an event, 98.8%).
//
// T = 262144 tokens of kv and score rows [T, 2c] float32 (overlap: b half [0, c), a half [c, 2c)), as
// bench_compressor's; event j reads the b halves of rows 4j − 4 .. 4j − 1 and the a halves of rows 4j ..
// 4j + 3 of both tensors (8 KB at c = 128, 32 KB at c = 512) and writes one 132-byte entry. Here each
// event is a unit of c / 4 threads (one warp at c = 128, four at c = 512) that copies its rows into its
// own shared-memory slots with cp.async (as the compressor's staging: 16 bytes a lane a row), waits, adds
// them up and stores the entry — no fold, no post-processing. Blocks of 128 threads with 32 KB of
// staging, 5 a SM (the lean kernel's shape), one unit an event. Each case is timed as bench_common times
// a bench (L2 flushed before every launch); GB/s count the rows read once plus the entries written,
// as bench_compressor does. Usage: probe_c4_stream (no arguments; prints a table).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "bench_common.hpp"
#include "cuda/common/ptx_sm90.cuh"

namespace {

using dsv4::bench::check_cuda;

constexpr std::int64_t kTokens = 262144;
constexpr int kRatio = 4, kCandidates = 2 * kRatio, kEntryBytes = 132;
constexpr int kBlockThreads = 128;

// One event per unit of kWidth / 4 threads; lane l owns channels [4l, 4l + 4) of each half.
template <int kWidth>
__global__ void __launch_bounds__(kBlockThreads, 5)
    stream_events(const float* kv, const float* score, std::uint8_t* entries, std::int64_t events) {
  constexpr int kUnitThreads = kWidth / 4, kUnitsPerBlock = kBlockThreads / kUnitThreads;
  constexpr int kRowFloats = 2 * kWidth;
  __shared__ float4 staging[kCandidates * 2 * kBlockThreads];  // 32 KB: [candidate][kv | score][thread]
  const int unit = threadIdx.x / kUnitThreads, lane = threadIdx.x % kUnitThreads;
  const std::int64_t event = static_cast<std::int64_t>(blockIdx.x) * kUnitsPerBlock + unit;
  if (event >= events) return;
#pragma unroll
  for (int j = 0; j < kCandidates; ++j) {
    const bool b_half = j < kRatio;
    std::int64_t row = event * kRatio - kRatio + j;  // the b rows of event 0 are the a rows' own (no block before)
    if (row < 0) row += kRatio;
    const std::int64_t offset = row * kRowFloats + (b_half ? 0 : kWidth) + 4 * lane;
    dsv4::cuda::ptx::cp_async_cg16(&staging[(2 * j) * kBlockThreads + threadIdx.x], kv + offset);
    dsv4::cuda::ptx::cp_async_cg16(&staging[(2 * j + 1) * kBlockThreads + threadIdx.x], score + offset);
  }
  dsv4::cuda::ptx::cp_async_commit();
  dsv4::cuda::ptx::cp_async_wait_all();
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < 2 * kCandidates; ++k) {
    const float4 v = staging[k * kBlockThreads + threadIdx.x];
    sum += v.x + v.y + v.z + v.w;
  }
  // The entry: 132 bytes, one word a lane for the first 33 lanes' worth (a warp's first 32 + the scale).
  std::uint32_t* entry = reinterpret_cast<std::uint32_t*>(entries + event * kEntryBytes);
  if (lane < kEntryBytes / 4) entry[lane] = __float_as_uint(sum);
  if (kUnitThreads == 32 && lane == 0) entry[32] = __float_as_uint(sum);
}

template <int kWidth>
void run(float* kv, float* score, std::uint8_t* entries, double copy_gbs) {
  const std::int64_t events = kTokens / kRatio;
  constexpr int kUnitsPerBlock = kBlockThreads / (kWidth / 4);
  const unsigned blocks = static_cast<unsigned>((events + kUnitsPerBlock - 1) / kUnitsPerBlock);
  // The most shared memory the SM can give, so that 5 blocks of 32 KB fit (as the compressor asks for its carveout).
  check_cuda(cudaFuncSetAttribute(stream_events<kWidth>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  cudaSharedmemCarveoutMaxShared),
             "carveout");
  const double us = dsv4::bench::time_us(
      [&](cudaStream_t s) { stream_events<kWidth><<<blocks, kBlockThreads, 0, s>>>(kv, score, entries, events); });
  check_cuda(cudaGetLastError(), "launch");
  const double bytes = 2.0 * kTokens * (2 * kWidth) * 4 + static_cast<double>(events) * kEntryBytes;
  std::printf("c = %-3d  %8.2f us  %7.0f GB/s  (%.1f%% of copy)\n", kWidth, us, bytes / (us * 1e3),
              100.0 * bytes / (us * 1e3) / copy_gbs);
}

}  // namespace

int main() {
  float *kv = nullptr, *score = nullptr;
  std::uint8_t* entries = nullptr;
  const std::size_t row_bytes = static_cast<std::size_t>(kTokens) * 2 * 512 * sizeof(float);  // room for c = 512
  check_cuda(cudaMalloc(&kv, row_bytes), "kv");
  check_cuda(cudaMalloc(&score, row_bytes), "score");
  check_cuda(cudaMalloc(&entries, static_cast<std::size_t>(kTokens / kRatio) * kEntryBytes), "entries");
  check_cuda(cudaMemset(kv, 0, row_bytes), "fill");
  check_cuda(cudaMemset(score, 0, row_bytes), "fill");
  const double copy_gbs = dsv4::bench::copy_bandwidth_gbs();
  std::printf("copy bandwidth %.0f GB/s (read + write); T = %lld, C4 with overlap, no arithmetic\n", copy_gbs,
              static_cast<long long>(kTokens));
  run<128>(kv, score, entries, copy_gbs);
  run<512>(kv, score, entries, copy_gbs);
  cudaFree(kv);
  cudaFree(score);
  cudaFree(entries);
  return 0;
}
