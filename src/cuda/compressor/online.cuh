// src/cuda/compressor/online.cuh — the online compressor kernel (SPEC §4 "online variant"): per
// channel a running max M, sum S and normalized mean V over the rows of the open block; the state
// of SPEC §6 is a ring of max_rollback + 1 snapshots, the one after L tokens in slot
// L mod (max_rollback + 1), each [M (c) | S (c) | V (c)] float32.
//
// The recurrence is sequential per channel. A body item runs one whole block from its first row;
// the head runs the first block (continuing from the snapshot when the prefix is mid-block), then
// re-runs the step's last, partial block (no event, so no body) from its first row. The snapshots of
// the step's last max_rollback + 1 counts are written in place by whichever item runs their rows.
// Where one of them lands on the slot a mid-block head reads its starting snapshot from (params.hpp,
// online_kept_counts), online_save_kernel copies that snapshot into the step's scratch first and the
// head reads it there. Every path applies the same explicitly rounded float operations to the same
// rows, so the state and every entry are bit-identical however the stream was chunked.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/fast_float.cuh"
#include "cuda/compressor/config.hpp"
#include "cuda/compressor/device_common.cuh"
#include "cuda/compressor/postprocess.cuh"

namespace dsv4::cuda::compressor {

struct OnlineState {
  float max[4], sum[4], mean[4];  // M, S, V of this lane's 4 channels
};

// One row of the recurrence for this lane's 4 channels: the first row of a block starts it. The
// four chains are independent and branch-free (the first row is a select, not a branch), so they
// interleave, and so do the rows of a batch: only M, S and V carry from row to row, each through
// one or two instructions, while the exponential and the reciprocal of a row hang off them. (With
// a per-channel IEEE division and its slow-path branch the chains ran one after another: ≈ 300
// cycles a row; with a branch per row, the rows did.) The quotient w / S' uses the fast reciprocal
// division (≤ 2 ulp; S' ∈ [1, m], so divide_normal, without __fdividef's range guards), and the
// exponential flushes subnormal results (exp_flushed: a weight below 2^-126 changes S' by nothing);
// both are off the fix-up instructions that lengthened the row's dependent chain. The CPU reference
// computes in double and the SPEC asks for float32 agreement, and every GPU path runs this same
// code, so chunked and whole runs stay bit-identical.
__device__ __forceinline__ void online_update(bool first_row, const float (&s)[4], const float (&v)[4],
                                              OnlineState& state) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float diff = __fsub_rn(s[k], state.max[k]);
    const float e = exp_flushed(-fabsf(diff));  // e^(smaller − larger): one exponential per row
    const bool grows = diff > 0.0f;
    const float old_weight = grows ? e : 1.0f, new_weight = grows ? 1.0f : e;
    const float new_sum = __fmaf_rn(state.sum[k], old_weight, new_weight);
    // V' = (V·S·a + v·b) / S' = V + (v − V)·b / S': two roundings instead of four per row.
    const float new_mean =
        __fmaf_rn(__fsub_rn(v[k], state.mean[k]), divide_normal(new_weight, new_sum), state.mean[k]);
    // A block's first row discards whatever the state held (the values above are never used then).
    state.max[k] = first_row || grows ? s[k] : state.max[k];
    state.sum[k] = first_row ? 1.0f : new_sum;
    state.mean[k] = first_row ? v[k] : new_mean;
  }
}

// Snapshot addresses, in one place so that every reader and writer of a snapshot agrees: a slot's
// ring [records_per_slot, record_floats], and the offset in it of the snapshot after `count` tokens.
// (An offset, not a pointer: a helper returning the pointer cost run_rows' stores their immediate
// offsets, c and 2·c — 131 more instructions in online_kernel.)
__device__ __forceinline__ float* slot_snapshots(const KernelParams& p, int slot) {
  return p.state + static_cast<std::int64_t>(slot) * p.records_per_slot * p.record_floats;
}
__device__ __forceinline__ std::int64_t snapshot_offset(const KernelParams& p, std::int64_t count) {
  return (count % p.records_per_slot) * p.record_floats;
}

// The request's new rows (online compressors have no overlap: row width c).
struct NewRows {
  const float* kv;      // [T, c]
  std::int64_t kv_stride;
  const float* score;   // [T, c] (no ape)
  std::int64_t score_stride;
  const float* ape;     // [m, c]
  std::int64_t prefix, row_begin;

  __device__ NewRows(const KernelParams& p, const StepRequest& r)
      : kv(p.kv), kv_stride(p.kv_stride), score(p.score), score_stride(p.score_stride), ape(p.ape), prefix(r.prefix),
        row_begin(r.row_begin) {}
};

// Applies positions [from, to) to `state` (a block's first row restarts it), kBatch rows at a time
// through the staging slots, the next kStages − 1 batches in flight during this one's recurrence
// (each thread copies and reads only its own slots: no barrier). After the row that brings the count
// to L ≥ keep_from, stores the snapshot of L into `snapshots` (the slot's ring).
template <class Config>
__device__ __forceinline__ void run_rows(const KernelParams& p, const NewRows& rows, std::int64_t from, std::int64_t to,
                                         std::int64_t keep_from, float* snapshots, int lane,
                                         const Staging<Config>& staging, OnlineState& state) {
  constexpr int kBatch = Config::kBatch;
  constexpr int c = Config::kWidth;
  const int m = p.ratio;
  const int channel = 4 * lane;
  const int first_in_block = static_cast<int>(from % m);
  const int batches = static_cast<int>((to - from + kBatch - 1) / kBatch);
  // copy_batch runs for batches 0, 1, 2, ... in order: it carries the next batch's first row
  // pointers and its position in the block (no 64-bit multiply or modulo per row).
  const float* kv_next = rows.kv + (rows.row_begin + (from - rows.prefix)) * rows.kv_stride + channel;
  const float* score_next = rows.score + (rows.row_begin + (from - rows.prefix)) * rows.score_stride + channel;
  int copy_in_block = first_in_block;
  const auto copy_batch = [&](int b) {
    const int stage = b % Config::kStages;
    const std::int64_t first = from + static_cast<std::int64_t>(b) * kBatch;
    int in_block = copy_in_block;
    const float *kv_row = kv_next, *score_row = score_next;
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      ptx::cp_async_cg16(staging.slot(stage, u, 0), kv_row);
      ptx::cp_async_cg16(staging.slot(stage, u, 1), score_row);
      ptx::cp_async_cg16(staging.slot(stage, u, 2), rows.ape + in_block * c + channel);
      in_block = in_block + 1 == m ? 0 : in_block + 1;
      if (first + u + 1 < to) kv_row += rows.kv_stride, score_row += rows.score_stride;  // padding repeats a real row
    }
    ptx::cp_async_commit();
    copy_in_block = in_block;
    kv_next += kBatch * rows.kv_stride;
    score_next += kBatch * rows.score_stride;
  };
  if (batches == 0) return;
  copies_start<Config::kStages>(batches, copy_batch);
  int in_block = first_in_block;
  for (int b = 0; b < batches; ++b) {
    copies_before_batch<Config::kStages>(b, batches, copy_batch);
    const int stage = b % Config::kStages;
    const auto apply_row = [&](int u) {
      float values[4], scores[4];
      to_array(*staging.slot(stage, u, 0), values);
      to_array(add4(*staging.slot(stage, u, 1), *staging.slot(stage, u, 2)), scores);
      online_update(in_block == 0, scores, values, state);
      in_block = in_block + 1 == m ? 0 : in_block + 1;
    };
    const std::int64_t batch_first = from + static_cast<std::int64_t>(b) * kBatch;
    if (batch_first + kBatch <= to && batch_first + kBatch < keep_from) {
      // A whole batch that keeps no snapshot (almost every batch): straight-line code, so the
      // compiler interleaves its rows' exponentials and reciprocals.
#pragma unroll
      for (int u = 0; u < kBatch; ++u) apply_row(u);
      continue;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const std::int64_t q = batch_first + u;
      if (q >= to) break;
      apply_row(u);
      if (q + 1 >= keep_from) {
        float* snapshot = snapshots + snapshot_offset(p, q + 1);
        store4(snapshot + channel, make_float4(state.max[0], state.max[1], state.max[2], state.max[3]));
        store4(snapshot + c + channel, make_float4(state.sum[0], state.sum[1], state.sum[2], state.sum[3]));
        store4(snapshot + 2 * c + channel, make_float4(state.mean[0], state.mean[1], state.mean[2], state.mean[3]));
      }
    }
  }
}

template <class Config>
__global__ void __launch_bounds__(Config::kBlockThreads, Config::kMinBlocksPerSM)
    online_kernel(const __grid_constant__ KernelParams p) {
  ptx::start_after_prerequisite_grids();  // launched early (launch_width.cuh)
  spans::stamp(spans::kCompressor);
  static_assert(Config::kStages >= 2 && Config::kStageApe, "run_rows pipelines its stages with ape staged");
  constexpr int c = Config::kWidth;
  static_assert(Config::kUnitsPerBlock == 1 || Config::kWarpsPerGroup == 1, "s_sum is per block");
  extern __shared__ float4 dynamic_shared[];  // [Config::kBytes / 16] staging
  __shared__ double s_sum[Config::kWarpsPerGroup];
  const int unit = static_cast<int>(threadIdx.x) / Config::kUnitThreads;
  const int lane = static_cast<int>(threadIdx.x) % Config::kUnitThreads;
  const std::int64_t item = static_cast<std::int64_t>(blockIdx.x) * Config::kUnitsPerBlock + unit;
  if (item >= p.num_items) return;
  float norm[4];
  load_norm<Config>(p, lane, norm);
  const Staging<Config> staging(dynamic_shared);
  const ItemPlace place = locate_item(p, item);
  const StepRequest& r = place.request;
  const NewRows rows(p, r);
  const int m = p.ratio;
  float* snapshots = slot_snapshots(p, r.slot);
  OnlineState state = {};
  const OnlineKeptCounts kept = online_kept_counts(r.prefix, r.new_tokens, r.num_events, m, p.max_rollback);
  const std::int64_t end = r.prefix + r.new_tokens;

  if (place.index != 0) {
    // A body item: block `entry`, entirely in this step's rows, from its first row.
    const int event = static_cast<int>(place.index);
    const std::int64_t start = (r.prefix / m + event) * m;
    run_rows<Config>(p, rows, start, start + m, kept.keep_from, snapshots, lane, staging, state);
    finish_event<Config>(p, state.mean, lane, true, entry_target(p, r, event), norm, s_sum);
    return;
  }

  // The head.
  if (r.prefix != kept.first_block_start) {
    const float* snapshot = snapshots + snapshot_offset(p, r.prefix);
    if (kept.start_saved) {  // a body overwrites its slot during the step (the launch saved it first)
      if (p.online_saved == nullptr) __trap();
      snapshot = p.online_saved + static_cast<std::int64_t>(place.request_index) * 3 * c;
    }
    to_array(load_once(snapshot + 4 * lane), state.max);
    to_array(load_once(snapshot + c + 4 * lane), state.sum);
    to_array(load_once(snapshot + 2 * c + 4 * lane), state.mean);
  }
  run_rows<Config>(p, rows, r.prefix, kept.first_block_end, kept.keep_from, snapshots, lane, staging, state);
  if (kept.first_block_end == kept.first_block_start + m) {
    finish_event<Config>(p, state.mean, lane, true, entry_target(p, r, 0), norm, s_sum);
  }
  // The step's last, partial block (its kept counts; the bodies wrote those of their blocks), re-run
  // from its first row. (Past the first block it starts at or after that block's end: decode steps,
  // inside their first block, divide nothing.)
  if (kept.first_block_end < end) {
    const std::int64_t rerun_from = end / m * m;
    if (rerun_from < end) run_rows<Config>(p, rows, rerun_from, end, kept.keep_from, snapshots, lane, staging, state);
  }
}

// Before an online step whose plan saves a head's starting snapshot (launch.cu): block i copies
// request i's, where online_kept_counts says so, from its slot into the scratch.
template <int kWidth>
__global__ void __launch_bounds__(128) online_save_kernel(const __grid_constant__ KernelParams p) {
  ptx::start_after_prerequisite_grids();  // launched early (launch_width.cuh)
  spans::stamp(spans::kCompressor);
  const StepRequest r = step_request(p, static_cast<int>(blockIdx.x));
  if (!online_kept_counts(r.prefix, r.new_tokens, r.num_events, p.ratio, p.max_rollback).start_saved) return;
  const float4* from = reinterpret_cast<const float4*>(slot_snapshots(p, r.slot) + snapshot_offset(p, r.prefix));
  float4* to = reinterpret_cast<float4*>(p.online_saved + static_cast<std::int64_t>(blockIdx.x) * 3 * kWidth);
  for (int v = static_cast<int>(threadIdx.x); v < 3 * kWidth / 4; v += static_cast<int>(blockDim.x)) to[v] = from[v];
}

}  // namespace dsv4::cuda::compressor
