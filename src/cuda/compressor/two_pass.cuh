// src/cuda/compressor/two_pass.cuh — the two-pass compressor kernel (softmax over the stored rows of
// the window; SPEC §4), with the ring state of SPEC §6: row p of a slot in ring row p mod R,
// [kv (coff·c) | score + ape (coff·c)] float32.
//
// Event n's candidates are the consecutive positions p0 .. p0 + K − 1, p0 = (n − 1)·m with overlap
// (n ≥ 1: the m rows of block n−1 on channels [0, c), then block n on [c, 2c)), else n·m (K = m).
// A thread copies kBatch candidates into its staging slots (config.hpp), then folds them into a
// running (max, Σw, Σw·v) per channel with explicitly rounded float operations, so every unit
// computes an event with exactly the same instructions whichever item it is.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/compressor/config.hpp"
#include "cuda/compressor/device_common.cuh"
#include "cuda/compressor/postprocess.cuh"

namespace dsv4::cuda::compressor {

// Where the rows of one request are during a step: positions ≥ prefix are this step's new rows
// (ape added here), older ones are in the slot's ring (ape already added).
struct RingRows {
  const float* kv;            // [T, coff·c] this step's rows
  std::int64_t kv_stride;
  const float* score;         // [T, coff·c] (no ape)
  std::int64_t score_stride;
  const float* ape;           // [m, coff·c]
  float* ring;                // [R, 2·coff·c] this slot's ring
  std::int64_t prefix;        // first position held by the new rows
  std::int64_t row_begin;     // new row of position `prefix`
  int row_width;              // coff·c
  int ring_rows;              // R
  int record_floats;          // 2·coff·c

  __device__ RingRows(const KernelParams& p, const StepRequest& r)
      : kv(p.kv), kv_stride(p.kv_stride), score(p.score), score_stride(p.score_stride), ape(p.ape),
        ring(p.state + static_cast<std::int64_t>(r.slot) * p.records_per_slot * p.record_floats), prefix(r.prefix),
        row_begin(r.row_begin), row_width(p.record_floats / 2), ring_rows(p.records_per_slot),
        record_floats(p.record_floats) {}
};

// One candidate of an event: its position and where its vectors are.
struct Candidate {
  bool is_new;           // a row of this step (else a ring row)
  const float* value;    // kv vector [4]
  const float* score;    // score vector [4] (ring: + ape)
  const float* ape;      // ape vector [4] (added only to new rows)
};

// The candidates of event n, as a function of the candidate index j (0 ≤ j < count).
struct EventWindow {
  std::int64_t p0;  // position of candidate 0
  int ring0;        // its ring row
  int b_rows;       // candidates of the b branch (block n − 1, channel offset 0)
  int a_offset;     // channel offset of the a branch
  int count;        // K

  __device__ Candidate candidate(const RingRows& rows, int j, int lane) const {
    const bool b_branch = j < b_rows;
    const int channel = (b_branch ? 0 : a_offset) + 4 * lane;
    const int in_block = b_branch ? j : j - b_rows;  // p0 is a multiple of m
    const std::int64_t p = p0 + j;
    int ring_row = ring0 + j;
    if (ring_row >= rows.ring_rows) ring_row -= rows.ring_rows;  // K ≤ R: one wrap at most
    const float* record = rows.ring + static_cast<std::int64_t>(ring_row) * rows.record_floats;
    const std::int64_t row = rows.row_begin + (p - rows.prefix);
    Candidate c;
    c.is_new = p >= rows.prefix;
    c.value = c.is_new ? rows.kv + row * rows.kv_stride + channel : record + channel;
    c.score = c.is_new ? rows.score + row * rows.score_stride + channel : record + rows.row_width + channel;
    c.ape = rows.ape + static_cast<std::int64_t>(in_block) * rows.row_width + channel;
    return c;
  }
};

// Running softmax statistics of 4 channels over the candidates seen so far (max = −inf: none yet).
struct SoftmaxPartial {
  float max[4], sum[4], weighted[4];
};

__device__ __forceinline__ SoftmaxPartial empty_partial() {
  SoftmaxPartial e;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    e.max[k] = -INFINITY;
    e.sum[k] = 0.0f;
    e.weighted[k] = 0.0f;
  }
  return e;
}

// into ← into ⊕ next (the statistics of both candidate sets). Merging an empty partial (either
// side) copies the other exactly, so empty slices never change a bit.
__device__ __forceinline__ void merge_partial(SoftmaxPartial& into, const SoftmaxPartial& next) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (next.max[k] == -INFINITY) continue;
    if (into.max[k] == -INFINITY) {
      into.max[k] = next.max[k];
      into.sum[k] = next.sum[k];
      into.weighted[k] = next.weighted[k];
      continue;
    }
    const float total_max = fmaxf(into.max[k], next.max[k]);
    const float mine = __expf(__fsub_rn(into.max[k], total_max)), theirs = __expf(__fsub_rn(next.max[k], total_max));
    into.sum[k] = __fmaf_rn(next.sum[k], theirs, __fmul_rn(into.sum[k], mine));
    into.weighted[k] = __fmaf_rn(next.weighted[k], theirs, __fmul_rn(into.weighted[k], mine));
    into.max[k] = total_max;
  }
}

// A partial in this thread's 3 kept staging vectors (long windows).
template <class Config>
__device__ __forceinline__ void store_partial(const Staging<Config>& staging, const SoftmaxPartial& v) {
  *staging.kept(0) = make_float4(v.max[0], v.max[1], v.max[2], v.max[3]);
  *staging.kept(1) = make_float4(v.sum[0], v.sum[1], v.sum[2], v.sum[3]);
  *staging.kept(2) = make_float4(v.weighted[0], v.weighted[1], v.weighted[2], v.weighted[3]);
}
template <class Config>
__device__ __forceinline__ void load_partial(const Staging<Config>& staging, SoftmaxPartial& v) {
  to_array(*staging.kept(0), v.max);
  to_array(*staging.kept(1), v.sum);
  to_array(*staging.kept(2), v.weighted);
}

// First candidate of slice s of `window` (slice s = [slice_start(s), slice_start(s + 1))).
template <class Config>
__device__ __forceinline__ int slice_start(const EventWindow& window, int s) {
  return s * window.count / Config::kSlices;
}

// Folds slices [first_slice, end_slice) of `window` and merges them, in slice order, into `chain`
// (which starts empty): each slice is folded from scratch, kBatch candidates at a time through the
// staging slots, and the copies stream across slice boundaries (the next batch is always in
// flight while one is folded). With one slice per event (short windows), chain = that fold.
template <class Config>
__device__ __forceinline__ void pool_slices(const RingRows& rows, const EventWindow& window, int first_slice,
                                            int end_slice, int lane, const Staging<Config>& staging,
                                            SoftmaxPartial& chain) {
  static_assert(Config::kStages == 2, "one batch in flight while the other is folded");
  constexpr int kBatch = Config::kBatch;
  // A batch: candidates [j, min(j + kBatch, end)) of slice `slice` (end = the slice's end).
  struct Batch {
    int slice, j, end;
  };
  const auto first_batch_of = [&](int s) {  // of slice s, or of the next non-empty one
    Batch b{s, 0, 0};
    for (; b.slice < end_slice; ++b.slice) {
      b.j = slice_start<Config>(window, b.slice);
      b.end = slice_start<Config>(window, b.slice + 1);
      if (b.j < b.end) break;
    }
    return b;
  };
  const auto next_batch = [&](Batch b) { return b.j + kBatch < b.end ? Batch{b.slice, b.j + kBatch, b.end} : first_batch_of(b.slice + 1); };
  const auto copy_batch = [&](const Batch& b, int stage) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int j = b.j + u;
      const Candidate c = window.candidate(rows, j < b.end ? j : b.j, lane);  // padding copies a real row
      copy_async16(staging.slot(stage, u, 0), c.value);
      copy_async16(staging.slot(stage, u, 1), c.score);
      // Ring rows hold score + ape already: their ape slot is never copied nor read.
      if constexpr (Config::kStageApe) {
        if (c.is_new) copy_async16(staging.slot(stage, u, 2), c.ape);
      }
    }
    copy_async_commit();
  };

  chain = empty_partial();
  Batch fold = first_batch_of(first_slice);
  if (fold.slice >= end_slice) return;  // no candidate
  Batch copy = fold;
  copy_batch(copy, 0);
  copy = next_batch(copy);
  SoftmaxPartial acc = empty_partial();
  bool first = true;  // no slice merged yet
  for (int t = 0;; ++t) {
    const int stage = t % Config::kStages;
    if (copy.slice < end_slice) {
      copy_batch(copy, (t + 1) % Config::kStages);
      copy = next_batch(copy);
      copy_async_wait<1>();
    } else {
      copy_async_wait<0>();
    }
    // Scores first (their batch maximum rescales the running sums), values read back per row.
    float scores[kBatch][4];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int j = fold.j + u;
      const bool valid = j < fold.end;
      const Candidate c = window.candidate(rows, valid ? j : fold.j, lane);
      float4 bias = make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // the ring stores score + ape already
      if (c.is_new) bias = Config::kStageApe ? *staging.slot(stage, u, 2) : load_shared_input(c.ape);
      to_array(add4(*staging.slot(stage, u, 1), bias), scores[u]);
      if (!valid) {
#pragma unroll
        for (int k = 0; k < 4; ++k) scores[u][k] = -INFINITY;
      }
    }
    float new_max[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float batch_max = scores[0][k];
#pragma unroll
      for (int u = 1; u < kBatch; ++u) batch_max = fmaxf(batch_max, scores[u][k]);
      new_max[k] = fmaxf(acc.max[k], batch_max);
      const float rescale = __expf(__fsub_rn(acc.max[k], new_max[k]));  // 0 while nothing was seen (max = −inf)
      acc.sum[k] = __fmul_rn(acc.sum[k], rescale);
      acc.weighted[k] = __fmul_rn(acc.weighted[k], rescale);
      acc.max[k] = new_max[k];
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      float values[4];
      to_array(*staging.slot(stage, u, 0), values);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float w = __expf(__fsub_rn(scores[u][k], new_max[k]));  // 0 for a masked slot
        acc.sum[k] = __fadd_rn(acc.sum[k], w);
        acc.weighted[k] = __fmaf_rn(w, values[k], acc.weighted[k]);
      }
    }
    const Batch after = next_batch(fold);
    if (after.slice != fold.slice) {  // the slice is complete
      if constexpr (Config::kSlices == 1) {
        chain = acc;
      } else {
        // The chain waits in this thread's kept slots between slices (registers are at the limit).
        SoftmaxPartial kept = empty_partial();
        if (!first) load_partial(staging, kept);
        merge_partial(kept, acc);
        store_partial(staging, kept);
        first = false;
        acc = empty_partial();
      }
    }
    fold = after;
    if (fold.slice >= end_slice) break;
  }
  if constexpr (Config::kSlices > 1) load_partial(staging, chain);
}

// The window of event `event` of request `r`.
template <class Config>
__device__ __forceinline__ EventWindow event_window(const KernelParams& p, const RingRows& rows, const StepRequest& r,
                                                    int event) {
  const std::int64_t entry = r.prefix / p.ratio + event;
  EventWindow w;
  w.b_rows = (p.overlap && entry >= 1) ? p.ratio : 0;
  w.count = w.b_rows + p.ratio;
  w.p0 = entry * p.ratio - w.b_rows;
  w.ring0 = static_cast<int>(w.p0 % rows.ring_rows);
  w.a_offset = p.overlap ? Config::kWidth : 0;
  return w;
}

// The merged statistics → this lane's 4 channels of the compressed row.
__device__ __forceinline__ void normalize(const SoftmaxPartial& total, float (&compressed)[4]) {
#pragma unroll
  for (int k = 0; k < 4; ++k) compressed[k] = __fdiv_rn(total.weighted[k], total.sum[k]);
}

// Group 0's `chain` ← the merge of every group's chain in group order (the unit's threads all call
// it; the others' chains are left as they were). The scratch aliases the staging slots: every
// thread has finished reading its own before the first barrier.
template <class Config>
__device__ __forceinline__ void merge_groups(int group, int lane, const Staging<Config>& staging, SoftmaxPartial& chain) {
  if constexpr (Config::kGroups > 1) {
    constexpr int c = Config::kWidth;
    float* merge = reinterpret_cast<float*>(staging.column - threadIdx.x);  // [group][max | sum | weighted][c]
    unit_sync<Config>();
    float* mine = merge + group * 3 * c;
    store4(mine + 4 * lane, make_float4(chain.max[0], chain.max[1], chain.max[2], chain.max[3]));
    store4(mine + c + 4 * lane, make_float4(chain.sum[0], chain.sum[1], chain.sum[2], chain.sum[3]));
    store4(mine + 2 * c + 4 * lane, make_float4(chain.weighted[0], chain.weighted[1], chain.weighted[2], chain.weighted[3]));
    unit_sync<Config>();
    if (group == 0) {
      SoftmaxPartial total = empty_partial();
      for (int g = 0; g < Config::kGroups; ++g) {
        SoftmaxPartial theirs;
        const float* stored = merge + g * 3 * c;
        to_array(*reinterpret_cast<const float4*>(stored + 4 * lane), theirs.max);
        to_array(*reinterpret_cast<const float4*>(stored + c + 4 * lane), theirs.sum);
        to_array(*reinterpret_cast<const float4*>(stored + 2 * c + 4 * lane), theirs.weighted);
        merge_partial(total, theirs);
      }
      chain = total;
    }
    unit_sync<Config>();  // the merge has been read: the staging slots may be refilled
  }
}

// Computes and stores event `event` of request `r` in one unit (every thread takes part): group g
// folds slices [g·kSlicesPerGroup, (g + 1)·kSlicesPerGroup), then group 0 merges the groups' chains
// in group order (the shape split_event_unit reproduces).
template <class Config>
__device__ __forceinline__ void two_pass_event(const KernelParams& p, const RingRows& rows, const StepRequest& r,
                                               int event, int group, int lane, const float (&norm)[4],
                                               const Staging<Config>& staging, double* s_sum) {
  const EventWindow window = event_window<Config>(p, rows, r, event);
  const EntryTarget target = entry_target(p, r, event);
  SoftmaxPartial chain;
  pool_slices<Config>(rows, window, group * Config::kSlicesPerGroup, (group + 1) * Config::kSlicesPerGroup, lane,
                      staging, chain);

  merge_groups<Config>(group, lane, staging, chain);
  float compressed[4];
  normalize(chain, compressed);
  finish_event<Config>(p, compressed, lane, group == 0, target, norm, s_sum);
}

// Split unit `part` of split event `index` (a block; config.hpp): group g folds slice
// part·kGroups + g into the step's partials scratch; the last unit of the event to finish merges
// all kSlices partials in two_pass_event's shape (group g: left fold over slices
// [g·kSlicesPerGroup, (g + 1)·kSlicesPerGroup); then left fold over the groups) and stores the entry.
template <class Config>
__device__ __forceinline__ void split_event_unit(const KernelParams& p, int index, int part, int group, int lane,
                                                 const float (&norm)[4], const Staging<Config>& staging,
                                                 double* s_sum, int* s_last) {
  constexpr int c = Config::kWidth;
  const SplitEvent split = step_split_event(p, index);
  const StepRequest& r = split.request;
  const RingRows rows(p, r);
  const EventWindow window = event_window<Config>(p, rows, r, split.event);
  const int slice = part * Config::kGroups + group;
  SoftmaxPartial partial;
  pool_slices<Config>(rows, window, slice, slice + 1, lane, staging, partial);
  float* partials = p.split_partials + static_cast<std::int64_t>(index) * Config::kSlices * 3 * c;  // [kSlices][3][c]
  float* mine = partials + slice * 3 * c;
  store4(mine + 4 * lane, make_float4(partial.max[0], partial.max[1], partial.max[2], partial.max[3]));
  store4(mine + c + 4 * lane, make_float4(partial.sum[0], partial.sum[1], partial.sum[2], partial.sum[3]));
  store4(mine + 2 * c + 4 * lane,
         make_float4(partial.weighted[0], partial.weighted[1], partial.weighted[2], partial.weighted[3]));
  __threadfence();  // the partials are visible GPU-wide before the unit counts itself done
  __syncthreads();
  if (threadIdx.x == 0) *s_last = atomicAdd(p.split_counters + index, 1) == Config::kSplitUnits - 1;
  __syncthreads();
  if (!*s_last) return;
  __threadfence();  // every other unit's partials are seen after its count
  if (threadIdx.x == 0) p.split_counters[index] = 0;  // ready for the next launch (graph replays)
  // Each thread copies its 4 channels of its group's slices' partials into its own staging slots
  // (one L2 round trip for all of them, instead of one per slice), folds them into its group's
  // chain, and the groups merge as in two_pass_event.
  static_assert(3 * Config::kSlicesPerGroup <= Config::kStages * Config::kBatch * Config::kVectors,
                "a thread's staging slots hold its group's partials");
  for (int i = 0; i < Config::kSlicesPerGroup; ++i) {
    const float* stored = partials + (group * Config::kSlicesPerGroup + i) * 3 * c + 4 * lane;  // by other SMs: L2
    for (int v = 0; v < 3; ++v) copy_async16(staging.linear(3 * i + v), stored + v * c);
  }
  copy_async_commit();
  copy_async_wait<0>();
  SoftmaxPartial chain = empty_partial();
  for (int i = 0; i < Config::kSlicesPerGroup; ++i) {
    SoftmaxPartial theirs;
    to_array(*staging.linear(3 * i), theirs.max);
    to_array(*staging.linear(3 * i + 1), theirs.sum);
    to_array(*staging.linear(3 * i + 2), theirs.weighted);
    merge_partial(chain, theirs);
  }
  merge_groups<Config>(group, lane, staging, chain);
  float compressed[4];
  normalize(chain, compressed);
  finish_event<Config>(p, compressed, lane, group == 0, entry_target_in_page(p, r, split.event, split.page), norm,
                       s_sum);
}

// Stores the rows the ring must hold after the step (the last R positions seen), from the new rows.
template <class Config>
__device__ __forceinline__ void write_ring(const KernelParams& p, const RingRows& rows, const StepRequest& r, int thread) {
  constexpr int kVectorsInFlight = 8;  // loads issued before the first store (a store may alias a later load)
  const std::int64_t end = r.prefix + r.new_tokens;
  const std::int64_t first = end - rows.ring_rows > r.prefix ? end - rows.ring_rows : r.prefix;
  const int row_vectors = rows.row_width / 4;        // float4 per kv (or score) row
  const int vectors = static_cast<int>(end - first) * 2 * row_vectors;  // ≤ R · 2·coff·c / 4
  const int first_ring_row = static_cast<int>(first % rows.ring_rows);
  const int first_in_block = static_cast<int>(first % p.ratio);
  for (int base = 0; base < vectors; base += kVectorsInFlight * Config::kUnitThreads) {
    float4 data[kVectorsInFlight];
    float* destination[kVectorsInFlight];
#pragma unroll
    for (int u = 0; u < kVectorsInFlight; ++u) {
      const int i = base + u * Config::kUnitThreads + thread;
      const bool valid = i < vectors;
      const int row_offset = (valid ? i : 0) / (2 * row_vectors);
      const int vector = (valid ? i : 0) - row_offset * 2 * row_vectors;
      const bool is_score = vector >= row_vectors;
      const int channel = 4 * (is_score ? vector - row_vectors : vector);
      const std::int64_t row = rows.row_begin + (first - r.prefix) + row_offset;
      const int in_block = (first_in_block + row_offset) % p.ratio;
      const int ring_row = (first_ring_row + row_offset) % rows.ring_rows;
      if (!valid) {
        data[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // past the last row: no load
      } else if (is_score) {
        data[u] = add4(load_once(rows.score + row * rows.score_stride + channel),
                       load_shared_input(rows.ape + static_cast<std::int64_t>(in_block) * rows.row_width + channel));
      } else {
        data[u] = load_once(rows.kv + row * rows.kv_stride + channel);
      }
      destination[u] = valid ? rows.ring + static_cast<std::int64_t>(ring_row) * rows.record_floats +
                                   (is_score ? rows.row_width : 0) + channel
                             : nullptr;
    }
#pragma unroll
    for (int u = 0; u < kVectorsInFlight; ++u) {
      if (destination[u]) store4(destination[u], data[u]);
    }
  }
}

// Events a request's head computes: the first coff, whose windows may reach below the prefix.
__device__ __forceinline__ int head_event_count(const KernelParams& p, const StepRequest& r) {
  const int coff = p.overlap ? 2 : 1;
  return r.num_events < coff ? r.num_events : coff;
}

// Whether the request's ring item writes its ring: whenever no ring row written this step can be
// one the head's events read (params.hpp: every decode step), so the writes run in parallel with
// the head instead of in its critical path. Otherwise the head writes them after all of its reads.
__device__ __forceinline__ bool ring_item_writes(const KernelParams& p, const RingRows& rows, const StepRequest& r,
                                                 int head_events) {
  return ring_writes_in_parallel(r.prefix, r.new_tokens, head_events, p.ratio, p.overlap != 0, rows.ring_rows);
}

// Grid blocks [0, split_events_count · kSplitUnits) are split units (long windows only); then
// unit u runs item u: items [0, num_items) are heads and bodies (params.hpp), items
// [num_items, num_items + ring_items) the ring items of the requests in order.
template <class Config>
__global__ void __launch_bounds__(Config::kBlockThreads, Config::kMinBlocksPerSM)
    two_pass_kernel(const __grid_constant__ KernelParams p) {
  extern __shared__ float4 dynamic_shared[];  // [Config::kBytes / 16] staging (and the group merge)
  __shared__ double s_sum[Config::kWarpsPerGroup];
  static_assert(Config::kUnitsPerBlock == 1 || Config::kWarpsPerGroup == 1, "s_sum is per block");
  const int unit = static_cast<int>(threadIdx.x) / Config::kUnitThreads;
  const int thread = static_cast<int>(threadIdx.x) % Config::kUnitThreads;
  const int group = thread / Config::kLanes, lane = thread % Config::kLanes;
  const std::int64_t split_blocks = static_cast<std::int64_t>(p.split_events_count) * Config::kSplitUnits;
  if constexpr (Config::kSlices > 1) {
    if (blockIdx.x < split_blocks) {
      __shared__ int s_last;
      float norm[4];
      load_norm<Config>(p, lane, norm);
      const Staging<Config> staging(dynamic_shared);
      split_event_unit<Config>(p, static_cast<int>(blockIdx.x / Config::kSplitUnits),
                               static_cast<int>(blockIdx.x % Config::kSplitUnits), group, lane, norm, staging, s_sum,
                               &s_last);
      return;
    }
  }
  const std::int64_t item = (static_cast<std::int64_t>(blockIdx.x) - split_blocks) * Config::kUnitsPerBlock + unit;
  if (item >= p.num_items + p.ring_items) return;  // whole units only: a block-wide unit never splits here
  if (item >= p.num_items) {  // a ring item
    const StepRequest r = step_request(p, item - p.num_items);
    const RingRows rows(p, r);
    if (ring_item_writes(p, rows, r, head_event_count(p, r))) write_ring<Config>(p, rows, r, thread);
    return;
  }
  float norm[4];
  load_norm<Config>(p, lane, norm);
  const Staging<Config> staging(dynamic_shared);
  const ItemPlace place = locate_item(p, item);
  const StepRequest& r = place.request;
  const RingRows rows(p, r);
  const int head_events = head_event_count(p, r);
  if (place.index != 0) {
    two_pass_event<Config>(p, rows, r, head_events + static_cast<int>(place.index) - 1, group, lane, norm, staging,
                           s_sum);
    return;
  }
  // The head: the events whose windows may reach into the ring (unless split units compute them),
  // then the ring writes unless the ring item runs them.
  const bool parallel_ring = ring_item_writes(p, rows, r, head_events);
  if (p.split_events_count > 0 && parallel_ring) return;  // every such head's events are split (launch.cu)
  for (int e = 0; e < head_events; ++e) two_pass_event<Config>(p, rows, r, e, group, lane, norm, staging, s_sum);
  if (!parallel_ring) {
    unit_sync<Config>();  // every read of the unit precedes the writes
    write_ring<Config>(p, rows, r, thread);
  }
}

}  // namespace dsv4::cuda::compressor
