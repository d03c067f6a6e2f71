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

// Running softmax statistics of 4 channels over the candidates seen so far.
struct SoftmaxPartial {
  float max[4], sum[4], weighted[4];
};

// Folds candidates [j_begin, j_end) of `window` into `acc`, kBatch at a time through the staging
// slots, the next batch in flight while one is folded.
template <class Config>
__device__ __forceinline__ void pool_candidates(const RingRows& rows, const EventWindow& window, int j_begin, int j_end,
                                                int lane, const Staging<Config>& staging, SoftmaxPartial& acc) {
  constexpr int kBatch = Config::kBatch;
  const int batches = (j_end - j_begin + kBatch - 1) / kBatch;
  const auto copy_batch = [&](int b) {
    const int stage = b % Config::kStages;
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int j = j_begin + b * kBatch + u;
      const Candidate c = window.candidate(rows, j < j_end ? j : j_begin, lane);  // padding copies a real row
      copy_async16(staging.slot(stage, u, 0), c.value);
      copy_async16(staging.slot(stage, u, 1), c.score);
      if constexpr (Config::kStageApe) copy_async16(staging.slot(stage, u, 2), c.ape);
    }
    copy_async_commit();
  };
  copy_batch(0);
  for (int b = 0; b < batches; ++b) {
    if constexpr (Config::kStages > 1) {
      if (b + 1 < batches) {
        copy_batch(b + 1);
        copy_async_wait<1>();
      } else {
        copy_async_wait<0>();
      }
    } else {
      copy_async_wait<0>();
    }
    const int stage = b % Config::kStages;
    // Scores first (their batch maximum rescales the running sums), values read back per row.
    float scores[kBatch][4];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int j = j_begin + b * kBatch + u;
      const bool valid = j < j_end;
      const Candidate c = window.candidate(rows, valid ? j : j_begin, lane);
      float4 bias = Config::kStageApe ? *staging.slot(stage, u, 2) : load_shared_input(c.ape);
      if (!c.is_new) bias = make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // the ring stores score + ape already
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
    if constexpr (Config::kStages == 1) {
      if (b + 1 < batches) copy_batch(b + 1);  // the only stage is free again
    }
  }
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

// Computes and stores event `event` of request `r` (every thread of the unit takes part).
template <class Config>
__device__ __forceinline__ void two_pass_event(const KernelParams& p, const RingRows& rows, const StepRequest& r,
                                               int event, int group, int lane, const float (&norm)[4],
                                               const Staging<Config>& staging, double* s_sum) {
  const EventWindow window = event_window<Config>(p, rows, r, event);
  const EntryTarget target = entry_target(p, r, event);
  SoftmaxPartial acc;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    acc.max[k] = -INFINITY;
    acc.sum[k] = 0.0f;
    acc.weighted[k] = 0.0f;
  }
  const int j_begin = group * window.count / Config::kGroups, j_end = (group + 1) * window.count / Config::kGroups;
  pool_candidates<Config>(rows, window, j_begin, j_end, lane, staging, acc);

  if constexpr (Config::kGroups > 1) {
    // Merge the groups' statistics in group order (deterministic), into group 0. The scratch
    // aliases the staging slots: every thread has finished reading its own before the first barrier.
    constexpr int c = Config::kWidth;
    float* merge = reinterpret_cast<float*>(staging.column - threadIdx.x);  // [group][max | sum | weighted][c]
    unit_sync<Config>();
    float* mine = merge + group * 3 * c;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      mine[4 * lane + k] = acc.max[k];
      mine[c + 4 * lane + k] = acc.sum[k];
      mine[2 * c + 4 * lane + k] = acc.weighted[k];
    }
    unit_sync<Config>();
    if (group == 0) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        float total_max = acc.max[k];
        for (int g = 1; g < Config::kGroups; ++g) total_max = fmaxf(total_max, merge[g * 3 * c + 4 * lane + k]);
        float sum = 0.0f, weighted = 0.0f;
        for (int g = 0; g < Config::kGroups; ++g) {
          const float* theirs = merge + g * 3 * c;
          const float rescale = __expf(__fsub_rn(theirs[4 * lane + k], total_max));
          sum = __fmaf_rn(theirs[c + 4 * lane + k], rescale, sum);
          weighted = __fmaf_rn(theirs[2 * c + 4 * lane + k], rescale, weighted);
        }
        acc.sum[k] = sum;
        acc.weighted[k] = weighted;
      }
    }
    unit_sync<Config>();  // the merge has been read: the staging slots may be refilled
  }
  float compressed[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) compressed[k] = __fdiv_rn(acc.weighted[k], acc.sum[k]);
  finish_event<Config>(p, compressed, lane, group == 0, target, norm, s_sum);
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
// one the head's events read (no event, or end − first read position ≤ R: every decode step), so
// the writes run in parallel with the head instead of in its critical path. Otherwise the head
// writes them after all of its reads.
template <class Config>
__device__ __forceinline__ bool ring_item_writes(const KernelParams& p, const RingRows& rows, const StepRequest& r,
                                                 int head_events) {
  return head_events == 0 || r.prefix + r.new_tokens - event_window<Config>(p, rows, r, 0).p0 <= rows.ring_rows;
}

// Unit u runs item u: items [0, num_items) are heads and bodies (params.hpp), items
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
  const std::int64_t item = static_cast<std::int64_t>(blockIdx.x) * Config::kUnitsPerBlock + unit;
  if (item >= p.num_items + p.ring_items) return;  // whole units only: a block-wide unit never splits here
  if (item >= p.num_items) {  // a ring item
    const StepRequest r = step_request(p, item - p.num_items);
    const RingRows rows(p, r);
    if (ring_item_writes<Config>(p, rows, r, head_event_count(p, r))) write_ring<Config>(p, rows, r, thread);
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
  // The head: the events whose windows may reach into the ring, then the ring writes unless the
  // ring item runs them.
  for (int e = 0; e < head_events; ++e) two_pass_event<Config>(p, rows, r, e, group, lane, norm, staging, s_sum);
  if (!ring_item_writes<Config>(p, rows, r, head_events)) {
    unit_sync<Config>();  // every read of the unit precedes the writes
    write_ring<Config>(p, rows, r, thread);
  }
}

}  // namespace dsv4::cuda::compressor
