// bench/probe_key_stream.cu — how fast can the indexer's FP8 key pattern be read at all? A probe, not a
// bench (scripts/gpu-check runs bench_* only): its figures bound the B = 1 score kernel, whose steps are
// slower with more key bytes in flight (notes-indexer, twelfth and nineteenth sessions).
//
// N = 262144 FP8 keys of 132 bytes in pages of 64 entries (8448 bytes: 64 × 128 code bytes, then 64 ×
// 4 scale bytes), the pool of bench_indexer (8 requests' pages, the page table a random permutation),
// read with the score kernel's mapping and grid and no arithmetic: 256 threads a CTA (two warpgroups),
// two CTAs a SM, 1024 keys a CTA; warpgroup w of a CTA takes 64-key steps w, w + 2, ...; lane (g, q) of
// warp v loads bytes [16q, 16q + 16) and [64 + 16q, 64 + 16q + 16) of rows 16v + g and 16v + g + 8 and
// their scales. Each case is timed as bench_common times a bench (L2 flushed before every launch):
//   pages shuffled / in order × steps of loads in flight 1, 2 (the score kernel's: step s + 1's loads
//   issued before step s is used), 4 × first lines prefetched or not,
// then a plain contiguous read of the same bytes (16-byte loads, 4 in flight a thread) and the copy
// bandwidth, for the ceiling, and the read-only rate of 1 GiB. Usage: probe_key_stream (no arguments; prints a
// table; DSV4_BENCH_FLUSH=clean times every case after a flush that leaves no modified line in the L2).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "bench_common.hpp"
#include "cuda/common/ptx_sm90.cuh"

namespace {

using dsv4::bench::check_cuda;

constexpr int kEntriesPerPage = 64, kCodeBytes = 128, kEntryBytes = 132;
constexpr int kPageBytes = kEntriesPerPage * kEntryBytes;
constexpr int kKeys = 262144, kRequests = 8;
constexpr int kPagesPerRequest = kKeys / kEntriesPerPage;
constexpr int kThreads = 256, kKeysPerCta = 1024, kStepKeys = 64, kCtaStepKeys = 2 * kStepKeys;
constexpr int kStepsPerWarpgroup = kKeysPerCta / kCtaStepKeys;
constexpr int kPagesPerCta = kKeysPerCta / kEntriesPerPage;

struct RowLoads {
  uint4 lo_g, hi_g, lo_g8, hi_g8;
  std::uint32_t scale_g, scale_g8;
};

__device__ __forceinline__ void load_rows(const std::uint8_t* pages, const int* s_pages, int key, int quad,
                                          RowLoads& r) {
  const auto row = [&](int s, uint4& lo, uint4& hi, std::uint32_t& scale) {
    const std::uint8_t* base = pages + static_cast<std::int64_t>(s_pages[s / kEntriesPerPage]) * kPageBytes;
    const int entry = s % kEntriesPerPage;
    const std::uint8_t* data = base + entry * kCodeBytes + quad * 16;
    lo = dsv4::cuda::ptx::load_stream_v4(data);
    hi = dsv4::cuda::ptx::load_stream_v4(data + kCodeBytes / 2);
    scale = dsv4::cuda::ptx::load_stream_u32(base + kEntriesPerPage * kCodeBytes + entry * 4);
  };
  row(key, r.lo_g, r.hi_g, r.scale_g);
  row(key + 8, r.lo_g8, r.hi_g8, r.scale_g8);
}

__device__ __forceinline__ std::uint32_t fold(const RowLoads& r) {
  return r.lo_g.x ^ r.lo_g.w ^ r.hi_g.y ^ r.hi_g.z ^ r.lo_g8.x ^ r.lo_g8.w ^ r.hi_g8.y ^ r.hi_g8.z ^ r.scale_g ^
         r.scale_g8;
}

// Keys [blockIdx.x · 1024, + 1024) through `page_table` (the CTA's 16 pages staged in shared memory),
// kAhead steps of loads in flight a warpgroup (step s + kAhead's issued once step s is used);
// kPrefetch: each staged page's first line prefetched.
// `zero` (0 at run time) ties step s + kAhead's addresses to step s's data, so the loads cannot be
// hoisted above the fold before them (ptxas issued all eight steps' loads first without it).
template <int kAhead, bool kPrefetch>
__global__ void __launch_bounds__(kThreads, 2)
    read_keys(const std::uint8_t* pages, const int* page_table, int zero, std::uint32_t* sink) {
  __shared__ int s_pages[kPagesPerCta];
  const int first_key = blockIdx.x * kKeysPerCta;
  if (threadIdx.x < kPagesPerCta) {
    const int page = page_table[first_key / kEntriesPerPage + threadIdx.x];
    s_pages[threadIdx.x] = page;
    if (kPrefetch) dsv4::cuda::ptx::prefetch_l2(pages + static_cast<std::int64_t>(page) * kPageBytes);
  }
  __syncthreads();
  const int warpgroup = threadIdx.x / 128, warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
  const int g = lane / 4, quad = lane % 4;
  const int local = warpgroup * kStepKeys + 16 * warp + g;  // the lane's first key, CTA-relative
  RowLoads ring[kAhead];
#pragma unroll
  for (int i = 0; i < kAhead; ++i) load_rows(pages, s_pages, local + i * kCtaStepKeys, quad, ring[i]);
  std::uint32_t acc = 0;
#pragma unroll
  for (int step = 0; step < kStepsPerWarpgroup; ++step) {
    acc ^= fold(ring[step % kAhead]);
    if (step + kAhead < kStepsPerWarpgroup)
      load_rows(pages, s_pages, local + (step + kAhead) * kCtaStepKeys + static_cast<int>(acc & zero), quad,
                ring[step % kAhead]);
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;  // keeps the loads; practically never written
}

}  // namespace

int main() {
  const std::int64_t num_pages = static_cast<std::int64_t>(kRequests) * kPagesPerRequest;
  std::uint8_t* pages = nullptr;
  int *shuffled = nullptr, *in_order = nullptr;
  std::uint32_t* sink = nullptr;
  check_cuda(cudaMalloc(&pages, num_pages * kPageBytes), "pages");
  check_cuda(cudaMemset(pages, 0x5a, num_pages * kPageBytes), "fill");
  std::vector<int> table(static_cast<std::size_t>(num_pages));
  std::iota(table.begin(), table.end(), 0);
  check_cuda(cudaMalloc(&in_order, table.size() * sizeof(int)), "table");
  check_cuda(cudaMemcpy(in_order, table.data(), table.size() * sizeof(int), cudaMemcpyHostToDevice), "table");
  std::shuffle(table.begin(), table.end(), std::mt19937_64(1));
  check_cuda(cudaMalloc(&shuffled, table.size() * sizeof(int)), "table");
  check_cuda(cudaMemcpy(shuffled, table.data(), table.size() * sizeof(int), cudaMemcpyHostToDevice), "table");
  check_cuda(cudaMalloc(&sink, sizeof(std::uint32_t)), "sink");
  const double key_bytes = static_cast<double>(kKeys) * kEntryBytes;
  const double copy_gbs = dsv4::bench::copy_bandwidth_gbs();
  std::printf("copy bandwidth %.0f GB/s (read + write); %d keys, %.1f MB; L2 flush %s\n", copy_gbs, kKeys,
              key_bytes / 1e6,
              dsv4::bench::flush_kind_from_environment() == dsv4::bench::FlushKind::clean ? "clean" : "dirty");
  const auto report = [&](const char* name, double us) {
    std::printf("%-44s %8.2f us %8.0f GB/s (%.0f%% of copy)\n", name, us, key_bytes / (us * 1e3),
                100.0 * key_bytes / (us * 1e3) / copy_gbs);
  };
  const int ctas = kKeys / kKeysPerCta;
  const auto time_keys = [&](auto kernel, const int* table_used) {
    return dsv4::bench::time_us([&](cudaStream_t s) { kernel<<<ctas, kThreads, 0, s>>>(pages, table_used, 0, sink); });
  };
  using ReadKeys = void (*)(const std::uint8_t*, const int*, int, std::uint32_t*);
  const struct {
    ReadKeys kernel;
    const char* what;
  } variants[] = {{read_keys<1, false>, "1 step in flight"},         {read_keys<1, true>, "1 step in flight, first lines"},
                  {read_keys<2, false>, "2 steps (as the kernel)"},  {read_keys<2, true>, "2 steps, first lines (kernel)"},
                  {read_keys<4, false>, "4 steps in flight"},        {read_keys<4, true>, "4 steps in flight, first lines"}};
  for (const bool shuffle : {true, false}) {
    for (const auto& v : variants) {
      char name[64];
      std::snprintf(name, sizeof name, "pages %s, %s", shuffle ? "shuffled" : "in order", v.what);
      report(name, time_keys(v.kernel, shuffle ? shuffled : in_order));
    }
  }
  int sms = 0;
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SMs");
  const std::int64_t vectors = static_cast<std::int64_t>(key_bytes) / 16;
  report("plain contiguous read, same bytes",
         dsv4::bench::time_us([&](cudaStream_t s) {
           dsv4::bench::read_contiguous<<<2 * sms, kThreads, 0, s>>>(reinterpret_cast<const uint4*>(pages), vectors, sink);
         }));
  // The card's read-only rate: 1 GiB read contiguously (the same kernel, 16 blocks a SM's worth of work in
  // flight), no flush needed (four times the L2 streams through it). A read-only kernel's ceiling is this,
  // not the copy's read + write figure.
  {
    const std::int64_t big_vectors = (std::int64_t{1} << 30) / 16;
    uint4* big = nullptr;
    check_cuda(cudaMalloc(&big, big_vectors * 16), "read ceiling buffer");
    check_cuda(cudaMemset(big, 0x5a, big_vectors * 16), "read ceiling fill");
    const double us = dsv4::bench::time_us(
        [&](cudaStream_t s) { dsv4::bench::read_contiguous<<<8 * sms, kThreads, 0, s>>>(big, big_vectors, sink); }, nullptr,
        {3, 20, false});
    std::printf("plain contiguous read of 1 GiB (read-only rate) %8.2f us %8.0f GB/s (%.0f%% of copy)\n", us,
                static_cast<double>(big_vectors * 16) / (us * 1e3),
                100.0 * static_cast<double>(big_vectors * 16) / (us * 1e3) / copy_gbs);
    cudaFree(big);
  }
  check_cuda(cudaGetLastError(), "launches");
  cudaFree(pages);
  cudaFree(shuffled);
  cudaFree(in_order);
  cudaFree(sink);
  return 0;
}
