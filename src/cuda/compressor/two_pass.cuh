// src/cuda/compressor/two_pass.cuh — the two-pass compressor kernel (softmax over the stored rows of
// the window; SPEC §4), with the ring state of SPEC §6: row p of a slot in ring row p mod R,
// [kv (coff·c) | score + ape (coff·c)] float32.
//
// Event n's candidates are the consecutive positions p0 .. p0 + K − 1, p0 = (n − 1)·m with overlap
// (n ≥ 1: the m rows of block n−1 on channels [0, c), then block n on [c, 2c)), else n·m (K = m).
// A thread loads kBatch candidates (kv, score and ape vectors, branch-free) before any math, then
// folds them into a running (max, Σw, Σw·v) per channel with explicitly rounded float operations,
// so every unit computes an event with exactly the same instructions whichever item it is.
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

  // kv and score (+ape) vectors of channels [channel, channel + 4) of position `p`, whose ring row
  // is `ring_row` and whose offset inside its block is `in_block`. Branch-free (a select of
  // addresses), so a thread's loads of several candidates are all in flight together.
  __device__ __forceinline__ void load(std::int64_t p, int ring_row, int in_block, int channel, float4& value,
                                       float4& score_out) const {
    const bool is_new = p >= prefix;
    const std::int64_t row = row_begin + (p - prefix);
    const float* record = ring + static_cast<std::int64_t>(ring_row) * record_floats;
    const float* value_at = is_new ? kv + row * kv_stride + channel : record + channel;
    const float* score_at = is_new ? score + row * score_stride + channel : record + row_width + channel;
    value = load_once(value_at);
    const float4 raw = load_once(score_at);
    float4 bias = load_shared_input(ape + static_cast<std::int64_t>(in_block) * row_width + channel);
    if (!is_new) bias = make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // the ring stores score + ape already
    score_out = add4(raw, bias);
  }
};

// Running softmax statistics of 4 channels over the candidates seen so far.
struct SoftmaxPartial {
  float max[4], sum[4], weighted[4];
};

// Folds candidates [j_begin, j_end) of an event into `acc`, kBatch at a time.
//   p0: position of candidate 0; ring0: its ring row; b_rows: candidates from the b branch
//   (block n−1, channel offset 0), the others are the a branch at channel offset a_offset.
template <int kBatch>
__device__ __forceinline__ void pool_candidates(const RingRows& rows, int ratio, std::int64_t p0, int ring0, int b_rows,
                                                int a_offset, int j_begin, int j_end, int lane, SoftmaxPartial& acc) {
  for (int jb = j_begin; jb < j_end; jb += kBatch) {
    float values[kBatch][4], scores[kBatch][4];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const bool valid = jb + u < j_end;
      const int j = valid ? jb + u : j_begin;  // a padding slot reloads a real candidate, then is masked
      const bool b_branch = j < b_rows;
      int ring_row = ring0 + j;
      if (ring_row >= rows.ring_rows) ring_row -= rows.ring_rows;  // K ≤ R, so one wrap at most
      float4 v, s;
      rows.load(p0 + j, ring_row, b_branch ? j : j - b_rows, (b_branch ? 0 : a_offset) + 4 * lane, v, s);
      to_array(v, values[u]);
      to_array(s, scores[u]);
      if (!valid) {
#pragma unroll
        for (int k = 0; k < 4; ++k) scores[u][k] = -INFINITY;
      }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float batch_max = scores[0][k];
#pragma unroll
      for (int u = 1; u < kBatch; ++u) batch_max = fmaxf(batch_max, scores[u][k]);
      const float new_max = fmaxf(acc.max[k], batch_max);
      const float rescale = expf(__fsub_rn(acc.max[k], new_max));  // 0 while nothing was seen (max = −inf)
      float sum = __fmul_rn(acc.sum[k], rescale);
      float weighted = __fmul_rn(acc.weighted[k], rescale);
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const float w = expf(__fsub_rn(scores[u][k], new_max));  // 0 for a masked slot
        sum = __fadd_rn(sum, w);
        weighted = __fmaf_rn(w, values[u][k], weighted);
      }
      acc.max[k] = new_max;
      acc.sum[k] = sum;
      acc.weighted[k] = weighted;
    }
  }
}

template <class Config>
struct TwoPassShared {
  static_assert(Config::kUnitsPerBlock == 1 || (Config::kGroups == 1 && Config::kWarpsPerGroup == 1),
                "shared scratch is used only by units that own their block");
  float merge[Config::kGroups > 1 ? Config::kGroups * 3 * Config::kWidth : 1];  // [group][max|sum|weighted][c]
  double sum_squares[Config::kWarpsPerGroup];
};

// Computes and stores event `event` of request `r` (every thread of the unit takes part).
template <class Config>
__device__ __forceinline__ void two_pass_event(const KernelParams& p, const RingRows& rows, const StepRequest& r,
                                               int event, int group, int lane, TwoPassShared<Config>& shared) {
  const EntryTarget target = entry_target(p, r, event);
  const int m = p.ratio;
  const int b_rows = (p.overlap && target.entry >= 1) ? m : 0;
  const int candidates = b_rows + m;
  const std::int64_t p0 = target.entry * m - b_rows;
  const int ring0 = static_cast<int>(p0 % rows.ring_rows);
  const int a_offset = p.overlap ? Config::kWidth : 0;

  SoftmaxPartial acc;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    acc.max[k] = -INFINITY;
    acc.sum[k] = 0.0f;
    acc.weighted[k] = 0.0f;
  }
  const int j_begin = group * candidates / Config::kGroups, j_end = (group + 1) * candidates / Config::kGroups;
  pool_candidates<Config::kBatch>(rows, m, p0, ring0, b_rows, a_offset, j_begin, j_end, lane, acc);

  if constexpr (Config::kGroups > 1) {
    // Merge the groups' statistics in group order (deterministic), into group 0.
    constexpr int c = Config::kWidth;
    unit_sync<Config>();  // the previous event's merge has been read
    float* mine = shared.merge + group * 3 * c;
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
        for (int g = 1; g < Config::kGroups; ++g) total_max = fmaxf(total_max, shared.merge[g * 3 * c + 4 * lane + k]);
        float sum = 0.0f, weighted = 0.0f;
        for (int g = 0; g < Config::kGroups; ++g) {
          const float* theirs = shared.merge + g * 3 * c;
          const float rescale = expf(__fsub_rn(theirs[4 * lane + k], total_max));
          sum = __fmaf_rn(theirs[c + 4 * lane + k], rescale, sum);
          weighted = __fmaf_rn(theirs[2 * c + 4 * lane + k], rescale, weighted);
        }
        acc.sum[k] = sum;
        acc.weighted[k] = weighted;
      }
    }
  }
  float compressed[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) compressed[k] = __fdiv_rn(acc.weighted[k], acc.sum[k]);
  finish_event<Config>(p, compressed, lane, group == 0, target, shared.sum_squares);
}

// Stores the rows the ring must hold after the step (the last R positions seen), from the new rows.
template <class Config>
__device__ __forceinline__ void write_ring(const KernelParams& p, const RingRows& rows, const StepRequest& r, int thread) {
  constexpr int kVectorsInFlight = 4;
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
      if (is_score) {
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

template <class Config>
__global__ void __launch_bounds__(Config::kBlockThreads, Config::kMinBlocksPerSM)
    two_pass_kernel(const __grid_constant__ KernelParams p) {
  __shared__ TwoPassShared<Config> shared;
  const int unit = static_cast<int>(threadIdx.x) / Config::kUnitThreads;
  const int thread = static_cast<int>(threadIdx.x) % Config::kUnitThreads;
  const int group = thread / Config::kLanes, lane = thread % Config::kLanes;
  const std::int64_t item = static_cast<std::int64_t>(blockIdx.x) * Config::kUnitsPerBlock + unit;
  if (item >= p.num_items) return;  // whole units only: a block-wide unit never splits here
  const ItemPlace place = locate_item(p, item);
  const StepRequest& r = place.request;
  const RingRows rows(p, r);
  const int head_events = r.num_events < (p.overlap ? 2 : 1) ? r.num_events : (p.overlap ? 2 : 1);
  if (place.index == 0) {
    // The head: the events whose windows may reach into the ring, then (after every read of the
    // unit) the ring writes.
    for (int e = 0; e < head_events; ++e) two_pass_event<Config>(p, rows, r, e, group, lane, shared);
    unit_sync<Config>();
    write_ring<Config>(p, rows, r, thread);
  } else {
    two_pass_event<Config>(p, rows, r, head_events + static_cast<int>(place.index) - 1, group, lane, shared);
  }
}

}  // namespace dsv4::cuda::compressor
