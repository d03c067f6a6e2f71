// src/cuda/topk/topk_kernel.cuh — exact top-K of each row by a histogram and a short candidate list,
// in a thread-block cluster.
//
// One cluster of `cs` CTAs (1..16; 16 is a non-portable size, used where the device schedules it)
// per row; CTA `rank` holds entries [rank·S, (rank+1)·S), S = 1024·E (E = 4·kVectors ≤ 32 per
// thread), in shared memory as order-preserving keys (topk.hpp). Warp w owns a contiguous run of
// 32E entries, lane l the entries run + 32j + l (j < E), so bit j of a thread's 32-bit masks names
// one entry, ballots over j visit entries in index order, and shared-memory reads are conflict-free.
// The keys are binned once and compared twice; only the selected entries are visited at the end.
//
//  1. load: every 16-byte load of the CTA's slice is issued (cp.async, straight into shared memory;
//     one group a vector) before `visible` is waited on; each thread turns its scores into keys in
//     place, vector by vector as they land, and counts them in a 4096-bin histogram (bins.hpp).
//  2. every CTA finds the bin b* of the K-th largest, the count above it and its count, from the
//     cluster's sums in two levels of 64: the totals of the 64 groups of 64 bins (each CTA publishes
//     its own before the cluster barrier), then the 64 bins of the group found. A level is one
//     256-byte DSMEM read per CTA of the cluster and a warp scan; no second cluster barrier, and 8 KB
//     of DSMEM traffic a CTA instead of the whole histogram.
//  3. one walk over the keys: each thread's masks of the entries above b* (selected whatever the
//     exact threshold) and inside b* (candidates), by comparing keys against the bin's two bounds.
//     Up to 2048 candidates are gathered as {key, entry} into every CTA of the cluster; each CTA
//     publishes its count above b*.
//  4. exact threshold τ = the key of the K-th largest, found in every CTA from the gathered list:
//     by counting (≤ 256 candidates, 4 lanes each) or by a 4 × 8-bit radix select. Counts of keys
//     > τ and == τ in lower-ranked CTAs come from their published counts and the gathered entries, so
//     no further cluster barrier is needed. More candidates (ties, crowded bins): a radix select
//     whose digit histograms are summed over the cluster, then the CTAs' counts are exchanged.
//  5. output: every key > τ and the first K − #(> τ) keys == τ in entry order; positions from
//     per-warp / per-CTA prefix counts and ballots over only the j that hold a selected entry, so a
//     row is written in ascending entry order, deterministically, with its physical slots (the
//     CTA's page-table slice is staged in shared memory while the threshold is found).
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "cuda/common/ptx_sm90.cuh"
#include "cuda/common/spans.cuh"  // a probe build's kernel spans
#include "cuda/topk/bins.hpp"
#include "cuda/topk/params.hpp"
#include "dsv4/topk.hpp"

namespace dsv4::cuda::topk {

namespace cg = cooperative_groups;

inline constexpr int kThreads = 1024;
inline constexpr int kWarps = kThreads / 32;
static_assert(kWarps == 32, "block scans are two warp scans");
inline constexpr int kMaxPortableCluster = 8;  // the widest row needs 8 CTAs of kMaxPerThread entries each
inline constexpr int kMaxCluster = 16;         // non-portable: short batches of long rows use 16
inline constexpr int kMaxVectors = 8;          // 16-byte loads per thread
inline constexpr int kMaxPerThread = 4 * kMaxVectors;  // 8 CTAs × 1024 × 32 = 262144; one bit each in a mask
inline constexpr int kDigitBins = 256;         // 8-bit radix digits of the exact key
inline constexpr int kDigitPasses = 4;
inline constexpr int kGatherCapacity = 2048;   // candidates selected locally in every CTA
inline constexpr int kRankByCount = 256;       // up to this many gathered: rank each by counting (1 pass)
inline constexpr int kRankSplit = kThreads / kRankByCount;  // lanes counting for one candidate
inline constexpr int kPageStage = 1024;        // page-table entries a CTA stages in shared memory
inline constexpr int kGroupBins = 64;          // the bin search's first level: groups of 64 bins (an octave of |score|)
inline constexpr unsigned kFull = 0xffffffffu;

struct Shared {
  alignas(16) int coarse[kCoarseBins];       // this CTA's histogram (summed by the cluster)
  alignas(16) int group[kCoarseBins / kGroupBins];  // this CTA's totals of each group of kGroupBins bins
  int totals[2][kGroupBins];                 // the cluster's sums of the counters of the two search levels
  alignas(16) int digit[kDigitPasses][kDigitBins];  // this CTA's digit histograms, one per pass
  uint2 gathered[kGatherCapacity];           // every CTA: the threshold bin's {key, entry} (few candidates)
  int pages[kPageStage];                     // page_row[page_first + i] (slots only)
  int scan[kWarps];                          // block-scan scratch
  int warp_greater[kWarps], warp_equal[kWarps];
  int gathered_count;                        // rank 0: positions handed out for the gather
  int cta_above;                             // this CTA's keys above the threshold bin (read by higher ranks)
  int lower_candidates;                      // gathered keys of lower ranks: (> τ) + (== τ) << 16
  int lower_above;                           // Σ cta_above of lower ranks
  int found_bin, found_above, found_count;   // results broadcast inside the CTA
  std::uint32_t found_key;
  int cta_greater, cta_equal;                // this CTA's counts (many-candidates path; read by higher ranks)
  int before_greater, before_equal;          // counts in lower-ranked CTAs (many-candidates path)
  int request;                               // the row's request (slots only)
};

__device__ __forceinline__ int warp_inclusive_scan(int value) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int up = __shfl_up_sync(kFull, value, d);
    if (lane >= d) value += up;
  }
  return value;
}

// Exclusive prefix of `value` over the CTA's threads in thread order; `total` gets the sum.
__device__ __forceinline__ int block_exclusive_scan(int value, int* scratch, int& total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int inclusive = warp_inclusive_scan(value);
  if (lane == 31) scratch[warp] = inclusive;
  __syncthreads();
  const int warp_sum = scratch[lane];
  const int warps_inclusive = warp_inclusive_scan(warp_sum);
  total = __shfl_sync(kFull, warps_inclusive, 31);
  const int warp_base = __shfl_sync(kFull, warps_inclusive - warp_sum, warp);
  __syncthreads();  // scratch is reused by the next scan
  return warp_base + inclusive - value;
}

// Over 256 digit counts, finds the bin b holding the `rank`-th largest (1-based):
// Σ_{b' > b} < rank ≤ Σ_{b' ≥ b}. `counts4(b)` returns the counts of bins b..b+3 (b a multiple of
// 4) as an int4. Thread t takes bins [252 − 4t, 256 − 4t), so thread order is bin order descending.
// Results in s.found_bin (bin), s.found_above (count above it), s.found_count (its count).
template <class Counts4>
__device__ __forceinline__ void find_digit(Shared& s, int rank, Counts4 counts4) {
  const int first = kDigitBins - 4 * (static_cast<int>(threadIdx.x) + 1);
  const int4 v = first >= 0 ? counts4(first) : make_int4(0, 0, 0, 0);
  const int c[4] = {v.w, v.z, v.y, v.x};  // descending: bin first + 3 first
  int total;
  int above = block_exclusive_scan(v.x + v.y + v.z + v.w, s.scan, total);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (above < rank && rank <= above + c[j]) {
      s.found_bin = first + 3 - j;
      s.found_above = above;
      s.found_count = c[j];
    }
    above += c[j];
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
    find_digit(s, rank, counts4(pass));
    rank -= s.found_above;
    prefix |= static_cast<std::uint32_t>(s.found_bin) << shift;
    mask |= 0xffu << shift;
    __syncthreads();  // found_* are rewritten by the next pass
  }
  return prefix;
}

// Among 64 counters summed over the cluster — entries [first, first + 64) of `counters(r)`, CTA r's
// array, in shared memory — visited from the highest, finds the one holding the `wanted`-th largest
// (1-based): s.found_bin = first + j, s.found_above = above + the sum of the counters after it,
// s.found_count = its sum. Every CTA finds the same one. Warp r < cs reads CTA r's 64 counters with
// one 8-byte DSMEM load a lane (a warp's remote loads go to one CTA, contiguous: a transaction per
// 128 bytes — scattered over the cluster, every lane's load was a transaction of its own; one warp
// reading the CTAs in turn was slower too, its reads being served one after another) and adds them
// into `totals` (zero on entry) with shared-memory atomics.
template <class Counters>
__device__ __forceinline__ void find_in_cluster_sums(Shared& s, int* totals, int cs, int wanted, int above, int first,
                                                     Counters counters) {
  static_assert(kGroupBins == 64, "a warp reads 64 counters, two a lane");
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (warp < cs) {
    const int2 v = *reinterpret_cast<const int2*>(counters(warp) + first + 2 * lane);
    atomicAdd(&totals[2 * lane], v.x);
    atomicAdd(&totals[2 * lane + 1], v.y);
  }
  __syncthreads();
  if (warp == 0) {  // lane l: counters 63 − 2l and 62 − 2l, so lane order is descending
    const int high = totals[kGroupBins - 1 - 2 * lane], low = totals[kGroupBins - 2 - 2 * lane];
    const int before = warp_inclusive_scan(high + low) - high - low;  // the counters above both
    if (before < wanted && wanted <= before + high) {
      s.found_bin = first + kGroupBins - 1 - 2 * lane;
      s.found_above = above + before;
      s.found_count = high;
    } else if (before + high < wanted && wanted <= before + high + low) {
      s.found_bin = first + kGroupBins - 2 - 2 * lane;
      s.found_above = above + before + high;
      s.found_count = low;
    }
  }
  __syncthreads();
}

// The row's request: the last b with query_start[b] ≤ row, found by a 32-way search (one round for
// up to 33 requests, two up to 1057). Called by a whole warp; every lane gets the result.
__device__ __forceinline__ int find_request(const TopkParams& p, std::int64_t row) {
  const int lane = threadIdx.x % 32;
  int lo = 0, hi = p.num_requests - 1;  // the answer is in [lo, hi]
  while (lo < hi) {
    const int step = (hi - lo + 31) / 32;
    const int probe = lo + (lane + 1) * step;
    const bool at_or_before = probe <= hi && p.query_start[probe] <= row;  // a prefix of the lanes
    const int passed = __popc(__ballot_sync(kFull, at_or_before));
    lo += passed * step;
    hi = min(hi, lo + step - 1);
  }
  return lo;
}

// Where a row's selection goes: entry numbers and, when asked, physical slots through the page
// table row of the row's request (the CTA's pages from shared memory where they were staged).
struct RowOutput {
  std::int32_t* indices;         // [k]
  std::int32_t* slots;           // [k] or null
  const std::int32_t* page_row;  // [max_pages] (when slots)
  const int* staged;             // [staged_count]: page_row[page_first + i], in shared memory
  int entries_per_page, page_first, staged_count;

  __device__ void write(int position, int entry) const {
    indices[position] = entry;
    if (!slots) return;
    if (entry < 0) {
      slots[position] = -1;
      return;
    }
    const int page = entry / entries_per_page;
    const int physical = page - page_first < staged_count ? staged[page - page_first] : page_row[page];
    slots[position] = physical * entries_per_page + entry % entries_per_page;
  }
};

__device__ __forceinline__ RowOutput row_output(const TopkParams& p, std::int64_t row, int request, const int* staged,
                                                int page_first, int staged_count) {
  return {p.indices + row * p.k,
          p.slots ? p.slots + row * p.k : nullptr,
          p.slots ? p.page_table + static_cast<std::int64_t>(request) * p.max_pages : nullptr,
          staged,
          p.entries_per_page,
          page_first,
          staged_count};
}

// Bytes of dynamic shared memory for `vectors` 16-byte loads per thread (the CTA's keys).
constexpr std::size_t key_bytes(int vectors) { return static_cast<std::size_t>(kThreads) * vectors * 16; }

// grid: num_rows · cs CTAs in clusters of cs (launch attribute); dynamic shared memory
// key_bytes(kVectors). A CTA takes 4·kVectors entries a thread.
template <int kVectors>
__global__ void __launch_bounds__(kThreads, 1) topk_kernel(const TopkParams p) {
  constexpr int kPerThread = 4 * kVectors;
  constexpr int kSlice = kThreads * kPerThread;  // entries of one CTA
  constexpr std::uint32_t kAllBits = kPerThread == 32 ? kFull : (1u << kPerThread) - 1u;
  // The attention that reads this row's slots may launch now (its early launch: it takes free SMs and
  // reads its parameters, then waits for this grid's end before reading anything). This kernel is
  // launched early itself (topk.cu): it reads and writes nothing before the kernel before it is done.
  ptx::start_after_prerequisite_grids();
  spans::stamp(spans::kTopk);
  extern __shared__ uint4 s_dynamic[];
  std::uint32_t* s_keys = reinterpret_cast<std::uint32_t*>(s_dynamic);  // [kSlice]: this CTA's keys in entry order
  __shared__ Shared s;
  cg::cluster_group cluster = cg::this_cluster();
  const int cs = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  const std::int64_t row = blockIdx.x / cs;
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int base = rank * kSlice;
  const float* scores = p.scores + row * p.num_cols + base;  // [kSlice] (fewer at the row's end)
  const int k = p.k;

  // ---- 1. loads in flight first: up to the row's width, before `visible` is known ----
  const bool vector_rows = p.num_cols % 4 == 0 && reinterpret_cast<std::uintptr_t>(p.scores) % 16 == 0;
  const int loaded = min(max(p.num_cols - base, 0), kSlice);  // entries of the row in this CTA's range
  const int visible = min(max(__ldg(p.visible + row), 0), p.num_cols);
  if (vector_rows) {  // the scores land in s_keys (no registers held); each thread converts its own
#pragma unroll
    for (int q = 0; q < kVectors; ++q) {
      const int i = 4 * (q * kThreads + tid);
      if (i < loaded) ptx::cp_async_cg16(s_keys + i, scores + i);
      ptx::cp_async_commit();  // one group a vector: the counting starts on the first to land
    }
  }

  // The counters are cleared while `visible` is in flight (the short-row path below does not need them).
  for (int i = tid; i < kCoarseBins; i += kThreads) s.coarse[i] = 0;
  for (int i = tid; i < kDigitPasses * kDigitBins; i += kThreads) (&s.digit[0][0])[i] = 0;
  if (tid < 2 * kGroupBins) (&s.totals[0][0])[tid] = 0;
  if (tid == 0) {
    s.gathered_count = 0;
    s.cta_above = 0;
    s.lower_candidates = 0;
  }
  __syncthreads();

  if (visible <= k) {  // every entry, then −1 (the same branch in every CTA of the cluster)
    ptx::cp_async_wait_all();
    if (p.slots && warp == 0) {
      const int request = find_request(p, row);
      if (lane == 0) s.request = request;
    }
    __syncthreads();
    const RowOutput out = row_output(p, row, p.slots ? s.request : 0, s.pages, 0, 0);  // request: only with slots
    for (int i = rank * kThreads + tid; i < k; i += cs * kThreads) out.write(i, i < visible ? i : -1);
    return;
  }

  const int here = min(max(visible - base, 0), kSlice);  // visible entries of this CTA
  const auto count = [&](std::uint32_t key) { atomicAdd(&s.coarse[coarse_bin(key)], 1); };
  if (vector_rows) {  // each thread makes keys of the scores it copied, and counts the visible ones
#pragma unroll
    for (int q = 0; q < kVectors; ++q) {
      ptx::cp_async_wait_pending(kVectors - 1 - q);  // this thread's vector q has landed
      const int i = 4 * (q * kThreads + tid);
      if (i >= here) continue;
      const float4 v = *reinterpret_cast<const float4*>(s_keys + i);
      const uint4 keys =
          make_uint4(topk_order_key(v.x), topk_order_key(v.y), topk_order_key(v.z), topk_order_key(v.w));
      *reinterpret_cast<uint4*>(s_keys + i) = keys;
      if (i + 4 <= here) {  // a whole vector (all but the last of the visible range): no branches
        count(keys.x);
        count(keys.y);
        count(keys.z);
        count(keys.w);
      } else {
        count(keys.x);
        if (i + 1 < here) count(keys.y);
        if (i + 2 < here) count(keys.z);
      }
    }
  } else {
    for (int i = tid; i < here; i += kThreads) {
      s_keys[i] = topk_order_key(__ldg(scores + i));
      count(s_keys[i]);
    }
  }
  if (p.slots && warp == 0) {  // found while the other warps still count; read after the barrier
    const int request = find_request(p, row);
    if (lane == 0) s.request = request;
  }
  __syncthreads();
  {  // the group totals this CTA publishes: thread t sums bins [4t, 4t + 4), 16 threads a group
    static_assert(kCoarseBins == 4 * kThreads && kGroupBins == 64, "a group is 16 threads' bins");
    const int4 c = *reinterpret_cast<const int4*>(s.coarse + 4 * tid);
    int sum = c.x + c.y + c.z + c.w;
#pragma unroll
    for (int offset = 1; offset < kGroupBins / 4; offset *= 2) sum += __shfl_xor_sync(kFull, sum, offset);
    if (lane % (kGroupBins / 4) == 0) s.group[tid / (kGroupBins / 4)] = sum;
  }
  cluster.sync();  // every CTA runs, has its keys, histogram and group totals, and has cleared what the others add into

  // ---- 2. the bin of the K-th largest, found in every CTA from the cluster's sums: first its group
  //         of 64 bins (64 group totals from each CTA), then the bin inside it (64 bins from each) ----
  // The page-table slice of this CTA's visible entries: loads issued now, stored after step 2.
  const int page_first = base / p.entries_per_page;
  int staged_count = 0, page_value = 0;
  if (p.slots) {
    const int pages = here > 0 ? min((base + here - 1) / p.entries_per_page + 1, p.max_pages) - page_first : 0;
    staged_count = pages <= kPageStage ? max(pages, 0) : 0;
    if (tid < staged_count)
      page_value = __ldg(p.page_table + static_cast<std::int64_t>(s.request) * p.max_pages + page_first + tid);
  }
  find_in_cluster_sums(s, s.totals[0], cs, k, 0, 0, [&](int from) { return cluster.map_shared_rank(s.group, from); });
  {
    const int group = s.found_bin, group_above = s.found_above;  // read before the next search rewrites them
    find_in_cluster_sums(s, s.totals[1], cs, k - group_above, group_above, group * kGroupBins,
                         [&](int from) { return cluster.map_shared_rank(s.coarse, from); });
  }
  if (tid < staged_count) s.pages[tid] = page_value;
  __syncthreads();
  const int bin = s.found_bin, bin_count = s.found_count;
  int remaining = k - s.found_above;  // how many to take from the bin, 1..bin_count
  // Keys of the bin: [low, high); high is 2^32 − 1 when no bin is above (no order key reaches it).
  const std::uint32_t low = static_cast<std::uint32_t>(first_key_of_bin(bin));
  const std::uint64_t high_bound = first_key_of_bin(bin + 1);
  const std::uint32_t high = high_bound > kFull ? kFull : static_cast<std::uint32_t>(high_bound);

  // ---- 3. one walk: masks of the entries above the bin and in it; gather the candidates ----
  const int run = warp * 32 * kPerThread;  // first entry of this warp's run (CTA-relative)
  const int valid_span = here - run - lane;  // entry run + 32j + lane is visible iff 32j < valid_span
  const std::uint32_t valid_mask = valid_span <= 0                      ? 0u
                                   : valid_span >= 32 * (kPerThread - 1) + 1 ? kAllBits
                                                                              : (1u << ((valid_span + 31) / 32)) - 1u;
  std::uint32_t above_mask = 0, candidate_mask = 0;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const std::uint32_t key = s_keys[run + 32 * j + lane];
    above_mask |= static_cast<std::uint32_t>(key >= high) << j;
    candidate_mask |= static_cast<std::uint32_t>(key >= low && key < high) << j;
  }
  above_mask &= valid_mask;
  candidate_mask &= valid_mask;
  const int warp_above = __reduce_add_sync(kFull, __popc(above_mask));
  if (lane == 0 && warp_above > 0) atomicAdd(&s.cta_above, warp_above);
  const bool gather = bin_count <= kGatherCapacity;
  if (gather) {  // into every CTA at the same positions, so every CTA holds the same list
    const int mine = __popc(candidate_mask);
    const int inclusive = warp_inclusive_scan(mine);
    const int warp_total = __shfl_sync(kFull, inclusive, 31);
    if (warp_total > 0) {
      int start = 0;
      if (lane == 0) start = atomicAdd(cluster.map_shared_rank(&s.gathered_count, 0), warp_total);
      int position = __shfl_sync(kFull, start, 0) + inclusive - mine;
      for (std::uint32_t m = candidate_mask; m != 0; m &= m - 1) {
        const int local = run + 32 * (__ffs(static_cast<int>(m)) - 1) + lane;
        const uint2 item = make_uint2(s_keys[local], static_cast<std::uint32_t>(base + local));
        for (int r = 0; r < cs; ++r) cluster.map_shared_rank(s.gathered, r)[position] = item;
        ++position;
      }
    }
  }
  cluster.sync();  // gathered lists and cta_above complete in every CTA

  // ---- 4. the exact threshold key τ, and the counts of keys > τ and == τ ----
  std::uint32_t threshold;
  if (gather) {
    if (bin_count <= kRankByCount) {
      // Candidate c is the threshold when #(greater) < remaining ≤ #(greater or equal). kRankSplit
      // consecutive lanes count for one candidate, each over a stride of the list.
      const int c = tid / kRankSplit, part = tid % kRankSplit;
      const std::uint32_t mine = c < bin_count ? s.gathered[c].x : 0u;
      int greater_count = 0, equal_count = 0;
      const int end = c < bin_count ? bin_count : 0;  // lanes past the list only join the shuffles
#pragma unroll 4
      for (int i = part; i < end; i += kRankSplit) {
        const std::uint32_t other = s.gathered[i].x;
        greater_count += other > mine;
        equal_count += other == mine;
      }
#pragma unroll
      for (int offset = 1; offset < kRankSplit; offset *= 2) {
        greater_count += __shfl_xor_sync(kFull, greater_count, offset);
        equal_count += __shfl_xor_sync(kFull, equal_count, offset);
      }
      if (part == 0 && c < bin_count && greater_count < remaining && remaining <= greater_count + equal_count) {
        s.found_key = mine;  // equal candidates write equal values
        s.found_above = greater_count;
      }
      __syncthreads();
      threshold = s.found_key;
      remaining -= s.found_above;
    } else {
      threshold = radix_select(
          s, remaining,
          [&](auto&& f) {
            for (int i = tid; i < bin_count; i += kThreads) f(s.gathered[i].x);
          },
          [&](int pass) {
            const int* digit = s.digit[pass];
            return [digit](int b) { return *reinterpret_cast<const int4*>(digit + b); };
          });
    }
  } else {
    threshold = radix_select(
        s, remaining,
        [&](auto&& f) {
          for (std::uint32_t m = candidate_mask; m != 0; m &= m - 1)
            f(s_keys[run + 32 * (__ffs(static_cast<int>(m)) - 1) + lane]);
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
  }
  const int ties = remaining;  // keys equal to the threshold to take, in entry order

  std::uint32_t greater_mask = above_mask, equal_mask = 0;
  for (std::uint32_t m = candidate_mask; m != 0; m &= m - 1) {
    const int j = __ffs(static_cast<int>(m)) - 1;
    const std::uint32_t key = s_keys[run + 32 * j + lane];
    if (key > threshold) greater_mask |= 1u << j;
    else if (key == threshold) equal_mask |= 1u << j;
  }
  const int warp_greater = __reduce_add_sync(kFull, __popc(greater_mask));
  const int warp_equal = __reduce_add_sync(kFull, __popc(equal_mask));
  if (lane == 0) {
    s.warp_greater[warp] = warp_greater;
    s.warp_equal[warp] = warp_equal;
  }
  if (gather) {
    // Lower ranks: their published counts above the bin, and their gathered keys > τ and == τ.
    int lower = 0;
    for (int i = tid; i < bin_count; i += kThreads) {
      const uint2 item = s.gathered[i];
      if (static_cast<int>(item.y) < base) lower += item.x > threshold ? 1 : item.x == threshold ? 1 << 16 : 0;
    }
    lower = __reduce_add_sync(kFull, lower);  // each part ≤ 2048 candidates: no carry between halves
    if (lane == 0 && lower != 0) atomicAdd(&s.lower_candidates, lower);
    if (warp == 0) {
      const int above = lane < rank ? *cluster.map_shared_rank(&s.cta_above, lane) : 0;
      const int sum = __reduce_add_sync(kFull, above);
      if (lane == 0) s.lower_above = sum;
    }
  }
  __syncthreads();
  // Counts before this warp inside the CTA (every warp reduces the 32 warp counts).
  const int greater_w = s.warp_greater[lane], equal_w = s.warp_equal[lane];
  // (three single-instruction warp reductions instead of two shuffle scans)
  const int cta_equal = __reduce_add_sync(kFull, equal_w);
  const int warp_greater_before = __reduce_add_sync(kFull, lane < warp ? greater_w : 0);
  const int warp_equal_before = __reduce_add_sync(kFull, lane < warp ? equal_w : 0);
  int greater_before, equal_before;  // in lower-ranked CTAs
  if (gather) {
    greater_before = s.lower_above + (s.lower_candidates & 0xffff);
    equal_before = s.lower_candidates >> 16;
  } else {
    const int cta_greater = __reduce_add_sync(kFull, greater_w);
    if (tid == 0) {
      s.cta_greater = cta_greater;
      s.cta_equal = cta_equal;
    }
    cluster.sync();
    if (warp == 0) {  // counts in lower-ranked CTAs: lane r reads rank r
      const int greater_r = lane < rank ? *cluster.map_shared_rank(&s.cta_greater, lane) : 0;
      const int equal_r = lane < rank ? *cluster.map_shared_rank(&s.cta_equal, lane) : 0;
      const int greater_sum = __reduce_add_sync(kFull, greater_r);
      const int equal_sum = __reduce_add_sync(kFull, equal_r);
      if (lane == 0) {
        s.before_greater = greater_sum;
        s.before_equal = equal_sum;
      }
    }
    __syncthreads();
    greater_before = s.before_greater;
    equal_before = s.before_equal;
  }
  // No CTA reads another's shared memory after this point; the wait below keeps each one alive
  // until all have arrived.
  auto arrival = cluster.barrier_arrive();

  // ---- 5. ordered output: only the j where some lane of the warp has a selected entry ----
  const RowOutput out = row_output(p, row, p.slots ? s.request : 0, s.pages, page_first, staged_count);
  const int ties_here = min(max(ties - equal_before, 0), cta_equal);  // taken from this CTA
  int position = greater_before + min(equal_before, ties) + warp_greater_before + min(warp_equal_before, ties_here);
  int equal_seen = warp_equal_before;  // ties in this CTA before the current entry
  const unsigned below = (1u << lane) - 1;
  for (std::uint32_t any = __reduce_or_sync(kFull, greater_mask | equal_mask); any != 0; any &= any - 1) {
    const int j = __ffs(static_cast<int>(any)) - 1;  // warp-uniform
    const bool is_greater = (greater_mask >> j) & 1u;
    const bool is_equal = (equal_mask >> j) & 1u;
    const unsigned equal_ballot = __ballot_sync(kFull, is_equal);
    const bool take = is_greater || (is_equal && equal_seen + __popc(equal_ballot & below) < ties_here);
    const unsigned take_ballot = __ballot_sync(kFull, take);
    if (take) out.write(position + __popc(take_ballot & below), base + run + 32 * j + lane);
    position += __popc(take_ballot);
    equal_seen += __popc(equal_ballot);
  }
  cluster.barrier_wait(std::move(arrival));
}

}  // namespace dsv4::cuda::topk
