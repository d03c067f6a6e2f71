// src/cuda/topk/topk_kernel.cuh — exact top-K of each row by radix select in a thread-block cluster.
//
// One cluster of `cs` CTAs (1..16; 16 is a non-portable size, used where the device schedules it)
// per row; CTA `rank` holds entries [rank·512E, (rank+1)·512E) in shared memory (E ≤ 64 per thread,
// up to 128 KB) as order-preserving keys (topk.hpp), loaded with 16-byte reads. Warp w owns a
// contiguous run of 32E entries, lane l the entries run + 32j + l, so ballots visit entries in index
// order and shared-memory reads are conflict-free. The keys are walked three times in the common
// case: load (with the histogram), gather (with the per-warp counts above the threshold bin), output.
//
//  1. coarse histogram, counted while the keys are loaded: 4096 bins of the fp16-rounded score
//     (monotone in the score and well spread for real data). The cluster reduces it scattered: CTA r
//     sums slice r of the bins over all
//     CTAs (16-byte DSMEM reads); every CTA reads the cs slice totals, finds the slice holding the
//     K-th largest and scans that slice in its owner. No CTA serves more than its share of DSMEM
//     requests (one SM answering the whole cluster's requests cost tens of microseconds).
//  2. exact threshold τ = the key of the K-th largest among the bin's candidates. Few candidates
//     (the common case): they are gathered with their entry numbers into every CTA, which finds τ
//     locally — by counting, each candidate against all, up to 512; by radix select (4 × 8 bits)
//     up to 2048. The per-warp counts of keys > τ and == τ are then the counts above the bin (taken
//     during the gather) plus the gathered candidates of the warp: no walk over the keys. Many
//     (ties, crowded bins): radix select whose digit histograms are summed over the cluster by every
//     CTA, then a counting walk. All give the same τ and counts.
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
inline constexpr int kMaxPortableCluster = 8;  // the widest row needs 8 CTAs of kMaxPerThread entries each
inline constexpr int kMaxCluster = 16;          // non-portable: short batches of long rows use 16
inline constexpr int kCoarseBins = 4096;      // 12 bits of the fp16 order key
inline constexpr int kDigitBins = 256;        // 8-bit radix digits of the exact key
inline constexpr int kDigitPasses = 4;
inline constexpr int kGatherCapacity = 2048;  // candidates selected locally in every CTA
inline constexpr int kRankByCount = 512;      // up to this many gathered: rank each by counting (1 pass)
inline constexpr int kMaxPerThread = 64;      // entries per thread: 8 CTAs × 512 × 64 = 262144

struct Shared {
  alignas(16) int coarse[kCoarseBins];        // this CTA's coarse histogram
  alignas(16) int coarse_slice[kCoarseBins];  // the cluster's counts of this CTA's slice of the bins
  alignas(16) int digit[kDigitPasses][kDigitBins];  // this CTA's digit histograms, one per pass
  uint2 gathered[kGatherCapacity];            // every CTA: the threshold bin's {key, entry} (few candidates)
  int gathered_count;                         // rank 0: positions handed out for the gather
  int scan[kWarps];                           // block-scan scratch
  int warp_greater[kWarps], warp_equal[kWarps];
  int slice_total;                            // Σ coarse_slice (read by every CTA)
  int cta_greater, cta_equal;                 // this CTA's counts (read by higher ranks)
  int found_bin, found_above, found_count;    // results broadcast inside the CTA
  std::uint32_t found_key;
  int before_greater, before_equal;           // counts in lower-ranked CTAs
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

// Over `bins` (a multiple of 4, ≤ 4096) counts, finds the bin b holding the `rank`-th largest
// (1-based): Σ_{b' > b} < rank ≤ Σ_{b' ≥ b}. `counts4(b)` returns the counts of bins b..b+3 (b a
// multiple of 4) as an int4. Thread t takes a run of bins from the top, so thread order is bin order
// descending. Results in s.found_bin (bin), s.found_above (count above it), s.found_count (its count).
template <class Counts4>
__device__ __forceinline__ void find_rank_bin(Shared& s, int bins, int rank, Counts4 counts4) {
  constexpr int kMaxPerThread = kCoarseBins / kThreads;  // 8
  const int per_thread = max(4, bins / kThreads);
  const int top = bins - per_thread * static_cast<int>(threadIdx.x);  // this thread's bins: [top − per, top)
  int c[kMaxPerThread];
  int mine = 0;
#pragma unroll
  for (int q = 0; q < kMaxPerThread / 4; ++q) {
    int4 v = make_int4(0, 0, 0, 0);
    if (4 * q < per_thread && top - 4 * (q + 1) >= 0) v = counts4(top - 4 * (q + 1));
    c[4 * q] = v.w;  // descending: bin top − 4q − 1 first
    c[4 * q + 1] = v.z;
    c[4 * q + 2] = v.y;
    c[4 * q + 3] = v.x;
    mine += v.x + v.y + v.z + v.w;
  }
  int total;
  int above = block_exclusive_scan(mine, s.scan, total);
  if (above < rank && rank <= above + mine) {
#pragma unroll
    for (int j = 0; j < kMaxPerThread; ++j) {
      if (above < rank && rank <= above + c[j]) {
        s.found_bin = top - 1 - j;
        s.found_above = above;
        s.found_count = c[j];
      }
      above += c[j];
    }
  }
  __syncthreads();
}

__device__ __forceinline__ int4 add4(int4 a, int4 b) { return make_int4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }

// The `rank`-th largest key (1-based) among keys selected by `visit`, which calls its argument on
// each candidate key of this thread; `counts4(pass)` returns the int4 accessor the decision of
// pass `pass` reads, once this CTA's digit histogram s.digit[pass] is complete. On return, `rank`
// is the rank of the result among the keys equal to it.
template <class Visit, class Counts4>
__device__ __forceinline__ std::uint32_t radix_select(Shared& s, int& rank, Visit visit, Counts4 counts4) {
  std::uint32_t prefix = 0, mask = 0;
  for (int pass = 0; pass < kDigitPasses; ++pass) {
    const int shift = 8 * (kDigitPasses - 1 - pass);
    int* digit = s.digit[pass];
    visit([&](std::uint32_t key) {
      if ((key & mask) == prefix) atomicAdd(&digit[(key >> shift) & 0xff], 1);
    });
    __syncthreads();
    find_rank_bin(s, kDigitBins, rank, counts4(pass));
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

// Bytes of dynamic shared memory for `per_thread` entries per thread (the CTA's keys).
constexpr std::size_t key_bytes(int per_thread) { return static_cast<std::size_t>(kThreads) * per_thread * 4; }

// grid: num_rows · cs CTAs in clusters of cs (launch attribute); dynamic shared memory key_bytes(E).
__global__ void __launch_bounds__(kThreads, 1) topk_kernel(const TopkParams p, const int per_thread) {
  extern __shared__ std::uint32_t s_keys[];  // [kThreads · per_thread]: this CTA's keys in entry order
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
    for (int i = rank * kThreads + threadIdx.x; i < k; i += cs * kThreads) out.write(i, i < visible ? i : -1);
    return;
  }

  // ---- load this CTA's entries [base, base + here) as keys, counting the coarse histogram ----
  for (int i = threadIdx.x; i < kCoarseBins; i += kThreads) s.coarse[i] = 0;
  for (int i = threadIdx.x; i < kDigitPasses * kDigitBins; i += kThreads) (&s.digit[0][0])[i] = 0;
  if (threadIdx.x == 0) s.gathered_count = 0;
  __syncthreads();
  const int slice_len = kThreads * per_thread;
  const int base = rank * slice_len;
  const int here = min(max(visible - base, 0), slice_len);
  const float* scores = p.scores + row * p.num_cols + base;
  const auto count = [&](std::uint32_t key) { atomicAdd(&s.coarse[coarse_bin(key)], 1); };
  int vector_end = 0;  // entries loaded 4 at a time (16-byte aligned rows only)
  if (p.num_cols % 4 == 0 && reinterpret_cast<std::uintptr_t>(p.scores) % 16 == 0) {
    vector_end = here / 4 * 4;
#pragma unroll 16
    for (int i = 4 * static_cast<int>(threadIdx.x); i < vector_end; i += 4 * kThreads) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(scores + i));
      const uint4 keys = make_uint4(topk_order_key(v.x), topk_order_key(v.y), topk_order_key(v.z), topk_order_key(v.w));
      *reinterpret_cast<uint4*>(s_keys + i) = keys;
      count(keys.x);
      count(keys.y);
      count(keys.z);
      count(keys.w);
    }
  }
  for (int i = vector_end + threadIdx.x; i < here; i += kThreads) {
    s_keys[i] = topk_order_key(__ldg(scores + i));
    count(s_keys[i]);
  }

  const int run = warp * 32 * per_thread;       // first entry of this warp's run (CTA-relative)
  const int run_len = min(here - run, 32 * per_thread);  // valid entries of the run (≤ 0: none)
  const int valid_span = run_len - lane;        // entry run + 32j + lane is valid iff 32j < valid_span
  const auto valid = [&](int j) { return 32 * j < valid_span; };
  const auto key_of = [&](int j) { return s_keys[run + 32 * j + lane]; };
  cluster.sync();  // every CTA runs, has its keys and histogram, and has cleared what the others add into

  // ---- 1. the coarse histogram summed slice by slice over the cluster ----
  const int slice = kCoarseBins / cs;  // this CTA owns bins [rank·slice, (rank+1)·slice)
  int slice_sum = 0;
  for (int i = 4 * static_cast<int>(threadIdx.x); i < slice; i += 4 * kThreads) {
    int4 sum = make_int4(0, 0, 0, 0);
    for (int r = 0; r < cs; ++r)
      sum = add4(sum, *reinterpret_cast<const int4*>(cluster.map_shared_rank(s.coarse, r) + rank * slice + i));
    *reinterpret_cast<int4*>(s.coarse_slice + i) = sum;
    slice_sum += sum.x + sum.y + sum.z + sum.w;
  }
  int total;
  block_exclusive_scan(slice_sum, s.scan, total);
  if (threadIdx.x == 0) s.slice_total = total;
  cluster.sync();
  // The slice holding the K-th largest (slices descend from rank cs − 1) and the count above it:
  // warp 0 reads the cs totals.
  if (warp == 0) {
    const int r = cs - 1 - lane;  // lane 0 takes the highest slice
    const int t = lane < cs ? *cluster.map_shared_rank(&s.slice_total, r) : 0;
    int inclusive = t;
    for (int d = 1; d < 32; d *= 2) {
      const int up = __shfl_up_sync(0xffffffffu, inclusive, d);
      if (lane >= d) inclusive += up;
    }
    if (lane < cs && inclusive - t < k && k <= inclusive) {
      s.found_bin = r;  // the owner rank, for now
      s.found_above = inclusive - t;
    }
  }
  __syncthreads();
  const int owner = s.found_bin;
  const int slice_above = s.found_above;
  __syncthreads();
  const int* owner_slice = cluster.map_shared_rank(s.coarse_slice, owner);
  find_rank_bin(s, slice, k - slice_above, [&](int b) { return *reinterpret_cast<const int4*>(owner_slice + b); });
  const int bin = owner * slice + s.found_bin;
  const int bin_count = s.found_count;
  int remaining = k - slice_above - s.found_above;  // how many to take from the bin, 1..bin_count
  __syncthreads();

  // ---- 2. the exact threshold key, and the per-warp counts of keys > τ and == τ ----
  std::uint32_t threshold;
  if (bin_count <= kGatherCapacity) {
    // One walk: gather the bin's {key, entry} into every CTA; count the warp's keys above the bin.
    int* counter = cluster.map_shared_rank(&s.gathered_count, 0);
    int above_bin = 0;
    for (int j = 0; 32 * j < run_len; ++j) {
      const int entry_bin = valid(j) ? coarse_bin(key_of(j)) : -1;
      above_bin += __popc(__ballot_sync(0xffffffffu, entry_bin > bin));
      const bool mine = entry_bin == bin;
      const unsigned ballot = __ballot_sync(0xffffffffu, mine);
      if (ballot == 0) continue;
      int position = 0;
      if (lane == 0) position = atomicAdd(counter, __popc(ballot));
      position = __shfl_sync(0xffffffffu, position, 0) + __popc(ballot & ((1u << lane) - 1));
      if (mine) {
        const uint2 item = make_uint2(key_of(j), static_cast<std::uint32_t>(base + run + 32 * j + lane));
        for (int r = 0; r < cs; ++r) cluster.map_shared_rank(s.gathered, r)[position] = item;
      }
    }
    if (lane == 0) {
      s.warp_greater[warp] = above_bin;
      s.warp_equal[warp] = 0;
    }
    cluster.sync();
    if (bin_count <= kRankByCount) {
      // Candidate t is the threshold when #(greater) < remaining ≤ #(greater or equal).
      if (static_cast<int>(threadIdx.x) < bin_count) {
        const std::uint32_t mine = s.gathered[threadIdx.x].x;
        int greater_count = 0, equal_count = 0;
        for (int i = 0; i < bin_count; ++i) {
          const std::uint32_t other = s.gathered[i].x;  // the same address across the warp: a broadcast
          greater_count += other > mine;
          equal_count += other == mine;
        }
        if (greater_count < remaining && remaining <= greater_count + equal_count) {
          s.found_key = mine;  // equal candidates write equal values
          s.found_above = greater_count;
        }
      }
      __syncthreads();
      threshold = s.found_key;
      remaining -= s.found_above;
    } else {
      threshold = radix_select(
          s, remaining,
          [&](auto&& f) {
            for (int i = threadIdx.x; i < bin_count; i += kThreads) f(s.gathered[i].x);
          },
          [&](int pass) {
            const int* digit = s.digit[pass];
            return [digit](int b) { return *reinterpret_cast<const int4*>(digit + b); };
          });
    }
    // The bin's keys > τ and == τ, added to the warp of this CTA that holds them.
    for (int i = threadIdx.x; i < bin_count; i += kThreads) {
      const uint2 item = s.gathered[i];
      const int local = static_cast<int>(item.y) - base;
      if (local < 0 || local >= here) continue;  // another CTA's entry
      const int owner_warp = local / (32 * per_thread);
      if (item.x > threshold) atomicAdd(&s.warp_greater[owner_warp], 1);
      else if (item.x == threshold) atomicAdd(&s.warp_equal[owner_warp], 1);
    }
  } else {
    threshold = radix_select(
        s, remaining,
        [&](auto&& f) {
          for (int j = 0; j < per_thread && valid(j); ++j) {
            const std::uint32_t key = key_of(j);
            if (coarse_bin(key) == bin) f(key);
          }
        },
        [&](int pass) {
          cluster.sync();  // every CTA's histogram of this pass is complete
          return [&, pass](int b) {  // pass by value: the accessor outlives this call
            int4 sum = make_int4(0, 0, 0, 0);
            for (int r = 0; r < cs; ++r)
              sum = add4(sum, *reinterpret_cast<const int4*>(cluster.map_shared_rank(s.digit[pass], r) + b));
            return sum;
          };
        });
    int greater = 0, equal = 0;
    for (int j = 0; 32 * j < run_len; ++j) {
      const std::uint32_t key = valid(j) ? key_of(j) : 0u;
      greater += __popc(__ballot_sync(0xffffffffu, valid(j) && key > threshold));
      equal += __popc(__ballot_sync(0xffffffffu, valid(j) && key == threshold));
    }
    if (lane == 0) {
      s.warp_greater[warp] = greater;
      s.warp_equal[warp] = equal;
    }
  }
  const int ties = remaining;  // keys equal to the threshold to take, in entry order

  // ---- 3. counts before each warp and CTA, then the ordered output ----
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
  if (warp == 0) {  // counts in lower-ranked CTAs: lane r reads rank r
    const int greater_r = lane < rank ? *cluster.map_shared_rank(&s.cta_greater, lane) : 0;
    const int equal_r = lane < rank ? *cluster.map_shared_rank(&s.cta_equal, lane) : 0;
    const int greater_sum = __reduce_add_sync(0xffffffffu, greater_r);
    const int equal_sum = __reduce_add_sync(0xffffffffu, equal_r);
    if (lane == 0) {
      s.before_greater = greater_sum;
      s.before_equal = equal_sum;
    }
  }
  __syncthreads();
  const int greater_before = s.before_greater, equal_before = s.before_equal;
  // No CTA reads another's shared memory after this point; the wait below keeps each one alive
  // until all have arrived.
  auto arrival = cluster.barrier_arrive();

  const RowOutput out(p, row);
  const int ties_here = min(max(ties - equal_before, 0), cta_equal);  // taken from this CTA
  int position = greater_before + min(equal_before, ties) + warp_greater_before + min(warp_equal_before, ties_here);
  int equal_seen = warp_equal_before;  // ties in this CTA before the current entry
  const unsigned below = (1u << lane) - 1;
  for (int j = 0; 32 * j < run_len; ++j) {  // warp-uniform bound
    const std::uint32_t key = valid(j) ? key_of(j) : 0u;
    const bool is_greater = valid(j) && key > threshold;
    const bool is_equal = valid(j) && key == threshold;
    const unsigned equal_ballot = __ballot_sync(0xffffffffu, is_equal);
    const bool take = is_greater || (is_equal && equal_seen + __popc(equal_ballot & below) < ties_here);
    const unsigned take_ballot = __ballot_sync(0xffffffffu, take);
    if (take) out.write(position + __popc(take_ballot & below), base + run + 32 * j + lane);
    position += __popc(take_ballot);
    equal_seen += __popc(equal_ballot);
  }
  cluster.barrier_wait(std::move(arrival));
}

}  // namespace dsv4::cuda::topk
