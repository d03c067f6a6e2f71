// src/cuda/compressor/device_common.cuh — memory access, unit barriers, lane reductions and the
// work-item lookup shared by the compressor kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/ptx_sm90.cuh"
#include "cuda/common/spans.cuh"  // a probe build's kernel spans
#include "cuda/compressor/config.hpp"
#include "cuda/compressor/params.hpp"

namespace dsv4::cuda::compressor {

// ---- 16-byte accesses ------------------------------------------------------------------------

// Rows and state read once per step: evict-first, so they do not push hot data (ape, norm, the
// metadata) out of the caches. A coherent load (not .nc): the state is also written by this kernel.
__device__ __forceinline__ float4 load_once(const float* p /*16-B aligned*/) {
  return __ldcs(reinterpret_cast<const float4*>(p));
}
// Small tensors every unit reads (ape [m, coff·c], norm [c]): the read-only path.
__device__ __forceinline__ float4 load_shared_input(const float* p /*16-B aligned*/) {
  return __ldg(reinterpret_cast<const float4*>(p));
}
__device__ __forceinline__ void store4(float* p /*16-B aligned*/, float4 v) { *reinterpret_cast<float4*>(p) = v; }
// Asks for the line of `p` in L1 (no register, no wait): a load_shared_input of it later hits.
__device__ __forceinline__ void prefetch_l1(const float* p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }

// (16 bytes global → a thread's staging slot, asynchronously, L2 only: ptx::cp_async_cg16; groups of
// copies: ptx::cp_async_commit, ptx::cp_async_wait — cuda/common/ptx_sm90.cuh.)
// A row vector read once by the step, into a staging slot: with kEvictFirst its L2 lines are the
// first to leave (Config::kEvictFirstRows).
template <bool kEvictFirst>
__device__ __forceinline__ void copy_row_vector(float4* slot, const float* row) {
  if constexpr (kEvictFirst) {
    ptx::cp_async_cg16(slot, row, ptx::evict_first_policy());
  } else {
    ptx::cp_async_cg16(slot, row);
  }
}

// This thread's staging slots: [stage][row of the batch][vector] float4, interleaved across the
// block's threads so that a warp's accesses are consecutive 16-byte words (no bank conflicts).
template <class Config>
struct Staging {
  float4* column;  // dynamic shared memory + threadIdx.x
  __device__ explicit Staging(float4* shared) : column(shared + threadIdx.x) {}
  __device__ float4* slot(int stage, int row, int vector) const {
    return column + ((stage * Config::kBatch + row) * Config::kVectors + vector) * Config::kBlockThreads;
  }
  // Staging slot k < kStages·kBatch·kVectors in any order (for uses other than batches of rows).
  __device__ float4* linear(int k) const { return column + k * Config::kBlockThreads; }
};

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
  return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w));
}
__device__ __forceinline__ void to_array(float4 v, float (&out)[4]) {
  out[0] = v.x;
  out[1] = v.y;
  out[2] = v.z;
  out[3] = v.w;
}

// A chain of `batches` batches of copies through kStages staging stages, each thread its own
// cp.async groups: copies_start issues the first copies before batch 0 is read, copies_before_batch
// (b) the copies of batch b + kStages − 1 — into the stage batch b − 1 used, whose reads are done —
// and waits for batch b's. `copy(b)` issues and commits batch b's group. Two stages: batch 0 first,
// then one ahead; deeper: kStages − 1 ahead, an empty group where no batch is left keeping every wait
// at kStages − 1 groups. One stage: the caller copies batch b + 1 after its reads of batch b.
template <int kStages, class Copy>
__device__ __forceinline__ void copies_start(int batches, const Copy& copy) {
  if constexpr (kStages <= 2) {
    copy(0);
  } else {
#pragma unroll
    for (int b = 0; b < kStages - 1; ++b) {
      if (b == 0 || b < batches) {  // (batches ≥ 1)
        copy(b);
      } else {
        ptx::cp_async_commit();
      }
    }
  }
}
template <int kStages, class Copy>
__device__ __forceinline__ void copies_before_batch(int b, int batches, const Copy& copy) {
  if constexpr (kStages == 1) {
    ptx::cp_async_wait<0>();
  } else if constexpr (kStages == 2) {
    if (b + 1 < batches) {
      copy(b + 1);
      ptx::cp_async_wait<1>();
    } else {
      ptx::cp_async_wait<0>();
    }
  } else {
    if (b + kStages - 1 < batches) {
      copy(b + kStages - 1);
    } else {
      ptx::cp_async_commit();
    }
    ptx::cp_async_wait<kStages - 1>();  // batch b has landed
  }
}

// ---- barriers and reductions -----------------------------------------------------------------

template <class Config>
__device__ __forceinline__ void unit_sync() {
  if constexpr (Config::kWarpUnit) {
    __syncwarp();
  } else {
    __syncthreads();
  }
}

// Reductions over the lanes xor-adjacent below `kSpan` (a power of two ≤ 32) of one warp.
template <int kSpan, class T>
__device__ __forceinline__ T lanes_sum(T v) {
#pragma unroll
  for (int offset = kSpan / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
template <int kSpan>
__device__ __forceinline__ float lanes_max(float v) {
#pragma unroll
  for (int offset = kSpan / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// ---- work items ------------------------------------------------------------------------------

// Request r of the step and entry page i of the step (params.hpp), from the parameters when the
// launch put them there.
__device__ __forceinline__ StepRequest step_request(const KernelParams& p, std::int64_t r) {
  if (p.metadata_inline) return reinterpret_cast<const StepRequest*>(p.inline_metadata)[r];
  return p.requests[r];
}
__device__ __forceinline__ std::int32_t step_page(const KernelParams& p, std::int64_t i) {
  if (p.metadata_inline) return reinterpret_cast<const std::int32_t*>(p.inline_metadata + p.inline_pages_offset)[i];
  return p.pages[i];
}

// Split event i of the step (params.hpp).
__device__ __forceinline__ SplitEvent step_split_event(const KernelParams& p, std::int64_t i) {
  if (p.split_events_inline) return reinterpret_cast<const SplitEvent*>(p.inline_metadata + p.inline_split_offset)[i];
  return p.split_events[i];
}

// The request owning work item `item`: item_begin[r] ≤ item < item_begin[r + 1].
__device__ __forceinline__ int request_of_item(const KernelParams& p, std::int64_t item) {
  if (p.one_item_per_request) return static_cast<int>(item);
  int lo = 0, hi = p.num_requests;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (p.item_begin[mid] <= item) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Where the unit's item sits: which request, and which of its items (0 = the head).
struct ItemPlace {
  StepRequest request;
  std::int64_t index = 0;
  int request_index = 0;
};
__device__ __forceinline__ ItemPlace locate_item(const KernelParams& p, std::int64_t item) {
  const int r = request_of_item(p, item);
  ItemPlace place;
  place.request = step_request(p, r);
  place.request_index = r;
  place.index = p.one_item_per_request ? 0 : item - p.item_begin[r];
  return place;
}

// Cache position of entry n of a request: its page pointer and index inside the page.
struct EntryTarget {
  std::int64_t entry = 0;      // n
  std::int64_t event_row = 0;  // row in the optional outputs
  std::uint8_t* page = nullptr;
  int index_in_page = 0;
  std::int32_t cache_slot = 0;
};
// `physical`: the cache page holding the entry (split events carry it; entry_target looks it up).
__device__ __forceinline__ EntryTarget entry_target_in_page(const KernelParams& p, const StepRequest& r, int event,
                                                            std::int32_t physical) {
  EntryTarget t;
  t.entry = r.prefix / p.ratio + event;
  t.event_row = r.first_event + event;
  const std::int64_t logical_page = t.entry / p.entries_per_page;
  t.index_in_page = static_cast<int>(t.entry - logical_page * p.entries_per_page);
  t.page = p.cache + static_cast<std::int64_t>(physical) * p.page_bytes;
  t.cache_slot = physical * p.entries_per_page + t.index_in_page;
  return t;
}

// entry_target for the lean short-window instantiation: entry n = `entry` (< 2^31, launch.cu),
// its logical page by a FastDivisor instead of a 64-bit division.
__device__ __forceinline__ EntryTarget entry_target_hoisted(const KernelParams& p, const StepRequest& r, int event,
                                                            std::uint32_t entry) {
  EntryTarget t;
  t.entry = entry;
  t.event_row = r.first_event + event;
  const std::uint32_t logical_page = fast_divide(entry, p.page_divisor);
  const std::int32_t physical = step_page(p, r.page_offset + (static_cast<std::int32_t>(logical_page) - r.first_page));
  t.index_in_page = static_cast<int>(entry - logical_page * p.page_divisor.divisor);
  t.page = p.cache + static_cast<std::int64_t>(physical) * p.page_bytes;
  t.cache_slot = physical * p.entries_per_page + t.index_in_page;
  return t;
}

// (The prefill kernels' own lookup, kept as it was.)
__device__ __forceinline__ EntryTarget entry_target(const KernelParams& p, const StepRequest& r, int event) {
  EntryTarget t;
  t.entry = r.prefix / p.ratio + event;
  t.event_row = r.first_event + event;
  const std::int64_t logical_page = t.entry / p.entries_per_page;
  const std::int32_t physical = step_page(p, r.page_offset + (logical_page - r.first_page));
  t.index_in_page = static_cast<int>(t.entry - logical_page * p.entries_per_page);
  t.page = p.cache + static_cast<std::int64_t>(physical) * p.page_bytes;
  t.cache_slot = physical * p.entries_per_page + t.index_in_page;
  return t;
}

}  // namespace dsv4::cuda::compressor
