// src/cuda/topk/topk_kernel.cuh — exact top-K of each row by radix select in a thread-block cluster.
//
// One cluster of `cs` CTAs (1..8) per row; CTA `rank` holds entries [rank·512E, (rank+1)·512E) in
// registers, E per thread, as order-preserving keys (topk.hpp). Warp w of a CTA owns a contiguous
// run of 32E entries, lane l the entries run + 32j + l, so ballots visit entries in index order.
//
//  1. coarse histogram: 4096 bins of the fp16-rounded score (monotone in the score and well spread
//     for real data); each CTA pushes its non-zero bins into rank 0 (DSMEM atomics); every CTA
//     then reads the totals and finds the bin holding the K-th largest and how many lie above it.
//  2. exact threshold τ = the key of the K-th largest: radix select (4 × 8 bits) over the bin's
//     candidates. Few candidates (the common case): they are gathered into every CTA, which
//     selects locally. Many (ties, crowded bins): the digit histograms are reduced across the
//     cluster pass by pass. Both give the same τ.
//  3. output: every key > τ and the first K − #(> τ) keys == τ in entry order; positions come from
//     ballots and per-warp / per-CTA prefix counts, so a row is written in ascending entry order,
//     deterministically, with its physical slots.
#pragma once

#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "cuda/topk/params.hpp"
#include "dsv4/topk.hpp"

namespace dsv4::cuda::topk {

namespace cg = cooperative_groups;

inline constexpr int kThreads = 512;
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kMaxCluster = 8;         // portable cluster size
inline constexpr int kCoarseBins = 4096;      // 12 bits of the fp16 order key
inline constexpr int kDigitBins = 256;        // 8-bit radix digits of the exact key
inline constexpr int kDigitPasses = 4;
inline constexpr int kGatherCapacity = 2048;  // candidates selected locally in every CTA

struct Shared {
  int coarse[kCoarseBins];                  // this CTA's coarse histogram
  int coarse_total[kCoarseBins];            // rank 0: the cluster's
  int digit_total[kDigitPasses][kDigitBins];  // rank 0: the cluster's digit histograms (many candidates)
  int digit[kDigitBins];                    // this CTA's digit histogram
  std::uint32_t gathered[kGatherCapacity];  // every CTA: the threshold bin's keys (few candidates)
  int gathered_count;                       // rank 0: positions handed out for the gather
  int scan[kWarps];                         // block-scan scratch
  int warp_greater[kWarps], warp_equal[kWarps];
  int cta_greater, cta_equal;               // this CTA's counts (read by higher ranks)
  int found_bin, found_above, found_count;  // results broadcast inside the CTA
};

// Coarse bin of a key: the top 12 bits of the fp16 order key of its value (NaN, key 0: bin 0).
__device__ __forceinline__ int coarse_bin(std::uint32_t key) {
  if (key == 0) return 0;
  const unsigned short h = __half_as_ushort(__float2half_rn(topk_key_value(key)));
  const unsigned short ordered = (h & 0x8000) ? static_cast<unsigned short>(~h) : static_cast<unsigned short>(h | 0x8000);
  return ordered >> 4;
}

// Exclusive prefix of `value` over the CTA's threads in thread order; `total` gets the sum.
__device__ __forceinline__ int block_exclusive_scan(int value, int* scratch, int& total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int inclusive = value;
  for (int d = 1; d < 32; d *= 2) {
    const int up = __shfl_up_sync(0xffffffffu, inclusive, d);
    if (lane >= d) inclusive += up;
  }
  if (lane == 31) scratch[warp] = inclusive;
  __syncthreads();
  int warp_base = 0;
  total = 0;
  for (int w = 0; w < kWarps; ++w) {
    const int t = scratch[w];
    if (w < warp) warp_base += t;
    total += t;
  }
  __syncthreads();  // scratch is reused by the next scan
  return warp_base + inclusive - value;
}

// Over `bins` counts read through `count(b)`, finds the bin b holding the `rank`-th largest
// (1-based): Σ_{b' > b} < rank ≤ Σ_{b' ≥ b}. Each thread takes bins_per_thread bins from the top.
// Results in s.found_bin (bin), s.found_above (count above it), s.found_count (its count).
template <int kBins, class Count>
__device__ __forceinline__ void find_rank_bin(Shared& s, int rank, Count count) {
  constexpr int kPerThread = (kBins + kThreads - 1) / kThreads;
  const int top = kBins - 1 - static_cast<int>(threadIdx.x) * kPerThread;  // this thread's highest bin
  int c[kPerThread];
  int mine = 0;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    c[j] = top - j >= 0 ? count(top - j) : 0;
    mine += c[j];
  }
  int total;
  int above = block_exclusive_scan(mine, s.scan, total);
  if (above < rank && rank <= above + mine) {
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      if (above < rank && rank <= above + c[j]) {
        s.found_bin = top - j;
        s.found_above = above;
        s.found_count = c[j];
      }
      above += c[j];
    }
  }
  __syncthreads();
}

// The `rank`-th largest key (1-based) among keys selected by `visit`, which calls its argument on
// each candidate key of this thread; `reduce` turns this CTA's digit histogram (s.digit) of pass
// `pass` into the histogram the decision reads (returns a bin → count accessor). On return,
// `rank` is the rank of the result among the keys equal to it.
template <class Visit, class Reduce>
__device__ __forceinline__ std::uint32_t radix_select(Shared& s, int& rank, Visit visit, Reduce reduce) {
  std::uint32_t prefix = 0, mask = 0;
  for (int pass = 0; pass < kDigitPasses; ++pass) {
    const int shift = 8 * (kDigitPasses - 1 - pass);
    for (int i = threadIdx.x; i < kDigitBins; i += kThreads) s.digit[i] = 0;
    __syncthreads();
    visit([&](std::uint32_t key) {
      if ((key & mask) == prefix) atomicAdd(&s.digit[(key >> shift) & 0xff], 1);
    });
    __syncthreads();
    const auto count = reduce(pass);
    find_rank_bin<kDigitBins>(s, rank, count);
    rank -= s.found_above;
    prefix |= static_cast<std::uint32_t>(s.found_bin) << shift;
    mask |= 0xffu << shift;
    __syncthreads();  // found_* are rewritten by the next pass
  }
  return prefix;
}

// Where a row's selection goes: entry numbers and, when asked, physical slots through the page
// table row of the row's request.
struct RowOutput {
  std::int32_t* indices;        // [k]
  std::int32_t* slots;          // [k] or null
  const std::int32_t* page_row;  // [max_pages] (when slots)
  int entries_per_page;

  __device__ RowOutput(const TopkParams& p, std::int64_t row)
      : indices(p.indices + row * p.k), slots(p.slots ? p.slots + row * p.k : nullptr), page_row(nullptr),
        entries_per_page(p.entries_per_page) {
    if (!slots) return;
    int lo = 0, hi = p.num_requests - 1;  // the row's request: last b with query_start[b] ≤ row
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (p.query_start[mid] <= row) lo = mid;
      else hi = mid - 1;
    }
    page_row = p.page_table + static_cast<std::int64_t>(lo) * p.max_pages;
  }
  // Writes `entry` (−1: none) at `position` of the row.
  __device__ void write(int position, int entry) const {
    indices[position] = entry;
    if (slots)
      slots[position] = entry < 0 ? -1 : page_row[entry / entries_per_page] * entries_per_page + entry % entries_per_page;
  }
};

// grid: num_rows · cs CTAs in clusters of cs (launch attribute); kPerThread = E.
template <int kPerThread>
__global__ void __launch_bounds__(kThreads, 1) topk_kernel(const TopkParams p) {
  __shared__ Shared s;
  cg::cluster_group cluster = cg::this_cluster();
  const int cs = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  const std::int64_t row = blockIdx.x / cs;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int visible = min(max(p.visible[row], 0), p.num_cols);
  const int k = p.k;

  if (visible <= k) {  // every entry, then −1 (the same branch in every CTA of the cluster)
    const RowOutput out(p, row);
    for (int i = rank * kThreads + threadIdx.x; i < k; i += cs * kThreads) {
      out.write(i, i < visible ? i : -1);
    }
    return;
  }

  // ---- load: this thread's keys; entries ≥ visible are not candidates ----
  const int run = rank * kThreads * kPerThread + warp * 32 * kPerThread;  // first entry of the warp
  const int valid_span = visible - run - lane;  // entry run + 32j + lane is valid iff 32j < valid_span
  const float* scores = p.scores + row * p.num_cols;
  std::uint32_t key[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) key[j] = 32 * j < valid_span ? topk_order_key(__ldg(scores + run + 32 * j + lane)) : 0u;
  const auto valid = [&](int j) { return 32 * j < valid_span; };

  for (int i = threadIdx.x; i < kCoarseBins; i += kThreads) s.coarse[i] = s.coarse_total[i] = 0;
  for (int i = threadIdx.x; i < kDigitPasses * kDigitBins; i += kThreads) (&s.digit_total[0][0])[i] = 0;
  if (threadIdx.x == 0) s.gathered_count = 0;
  cluster.sync();  // every CTA runs and has cleared what the others will add into

  // ---- 1. coarse histogram, reduced into rank 0 ----
#pragma unroll
  for (int j = 0; j < kPerThread; ++j)
    if (valid(j)) atomicAdd(&s.coarse[coarse_bin(key[j])], 1);
  __syncthreads();
  int* coarse_total = cluster.map_shared_rank(s.coarse_total, 0);
  for (int i = threadIdx.x; i < kCoarseBins; i += kThreads)
    if (s.coarse[i]) atomicAdd(coarse_total + i, s.coarse[i]);
  cluster.sync();
  find_rank_bin<kCoarseBins>(s, k, [&](int b) { return coarse_total[b]; });
  const int bin = s.found_bin;
  const int bin_count = s.found_count;
  int remaining = k - s.found_above;  // how many to take from the bin, 1..bin_count
  __syncthreads();
  std::uint64_t candidates = 0;  // bit j: key[j] lies in the threshold bin
#pragma unroll
  for (int j = 0; j < kPerThread; ++j)
    if (valid(j) && coarse_bin(key[j]) == bin) candidates |= 1ull << j;
  const auto candidate = [&](int j) { return ((candidates >> j) & 1) != 0; };

  // ---- 2. the exact threshold key ----
  std::uint32_t threshold;
  if (bin_count <= kGatherCapacity) {
    int* counter = cluster.map_shared_rank(&s.gathered_count, 0);
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const bool mine = candidate(j);
      const unsigned ballot = __ballot_sync(0xffffffffu, mine);
      if (ballot == 0) continue;
      int base = 0;
      if (lane == 0) base = atomicAdd(counter, __popc(ballot));
      base = __shfl_sync(0xffffffffu, base, 0);
      if (mine) {
        const int position = base + __popc(ballot & ((1u << lane) - 1));
        for (int r = 0; r < cs; ++r) cluster.map_shared_rank(s.gathered, r)[position] = key[j];
      }
    }
    cluster.sync();
    threshold = radix_select(
        s, remaining,
        [&](auto&& f) {
          for (int i = threadIdx.x; i < bin_count; i += kThreads) f(s.gathered[i]);
        },
        [&](int) { return [&](int b) { return s.digit[b]; }; });
  } else {
    threshold = radix_select(
        s, remaining,
        [&](auto&& f) {
#pragma unroll
          for (int j = 0; j < kPerThread; ++j)
            if (candidate(j)) f(key[j]);
        },
        [&](int pass) {
          int* total = cluster.map_shared_rank(s.digit_total[pass], 0);
          for (int i = threadIdx.x; i < kDigitBins; i += kThreads)
            if (s.digit[i]) atomicAdd(total + i, s.digit[i]);
          cluster.sync();
          return [total](int b) { return total[b]; };
        });
  }
  const int ties = remaining;  // keys equal to the threshold to take, in entry order

  // ---- 3. counts before each warp and CTA, then the ordered output ----
  int greater = 0, equal = 0;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    greater += __popc(__ballot_sync(0xffffffffu, valid(j) && key[j] > threshold));
    equal += __popc(__ballot_sync(0xffffffffu, valid(j) && key[j] == threshold));
  }
  if (lane == 0) {
    s.warp_greater[warp] = greater;
    s.warp_equal[warp] = equal;
  }
  __syncthreads();
  int warp_greater_before = 0, warp_equal_before = 0, cta_greater = 0, cta_equal = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) {
      warp_greater_before += s.warp_greater[w];
      warp_equal_before += s.warp_equal[w];
    }
    cta_greater += s.warp_greater[w];
    cta_equal += s.warp_equal[w];
  }
  if (threadIdx.x == 0) {
    s.cta_greater = cta_greater;
    s.cta_equal = cta_equal;
  }
  cluster.sync();
  int greater_before = 0, equal_before = 0;  // in lower-ranked CTAs
  for (int r = 0; r < rank; ++r) {
    greater_before += *cluster.map_shared_rank(&s.cta_greater, r);
    equal_before += *cluster.map_shared_rank(&s.cta_equal, r);
  }
  // No CTA reads another's shared memory after this point; the wait below keeps each one alive
  // until all have arrived.
  auto arrival = cluster.barrier_arrive();

  const RowOutput out(p, row);
  const int ties_here = min(max(ties - equal_before, 0), cta_equal);  // taken from this CTA
  int position = greater_before + min(equal_before, ties) + warp_greater_before + min(warp_equal_before, ties_here);
  int equal_seen = warp_equal_before;  // ties in this CTA before the current element
  const unsigned below = (1u << lane) - 1;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const bool is_greater = valid(j) && key[j] > threshold;
    const bool is_equal = valid(j) && key[j] == threshold;
    const unsigned equal_ballot = __ballot_sync(0xffffffffu, is_equal);
    const bool take = is_greater || (is_equal && equal_seen + __popc(equal_ballot & below) < ties_here);
    const unsigned take_ballot = __ballot_sync(0xffffffffu, take);
    if (take) {
      const int entry = run + 32 * j + lane;
      out.write(position + __popc(take_ballot & below), entry);
    }
    position += __popc(take_ballot);
    equal_seen += __popc(equal_ballot);
  }
  cluster.barrier_wait(std::move(arrival));
}

}  // namespace dsv4::cuda::topk
