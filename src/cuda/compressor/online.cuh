// src/cuda/compressor/online.cuh — the online compressor kernel (SPEC §4 "online variant"): per
// channel a running max M, sum S and normalized mean V over the rows of the open block; the state
// of SPEC §6 is a ring of max_rollback + 1 snapshots, the one after L tokens in slot
// L mod (max_rollback + 1), each [M (c) | S (c) | V (c)] float32.
//
// The recurrence is sequential per channel. A body item runs one whole block from its first row;
// the head runs the first block (continuing from the snapshot when the prefix is mid-block) and
// then writes the snapshots of the step's last max_rollback + 1 counts, re-running the block(s)
// holding them from their first row when they lie past its first block. Every path applies the
// same explicitly rounded float operations to the same rows, so the state and every entry are
// bit-identical however the stream was chunked.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/compressor/config.hpp"
#include "cuda/compressor/device_common.cuh"
#include "cuda/compressor/postprocess.cuh"

namespace dsv4::cuda::compressor {

struct OnlineState {
  float max[4], sum[4], mean[4];  // M, S, V of this lane's 4 channels
};

// One row of the recurrence for one channel: the first row of a block starts it.
__device__ __forceinline__ void online_update(bool first_row, float s, float v, float& max, float& sum, float& mean) {
  if (first_row) {
    max = s;
    sum = 1.0f;
    mean = v;
    return;
  }
  const float diff = __fsub_rn(s, max);
  const float e = expf(-fabsf(diff));  // e^(smaller − larger): one exponential per row
  const bool grows = diff > 0.0f;
  const float old_weight = grows ? e : 1.0f, new_weight = grows ? 1.0f : e;
  const float new_sum = __fmaf_rn(sum, old_weight, new_weight);
  // V' = (V·S·a + v·b) / S' = V + (v − V)·b / S': two roundings instead of four per row.
  mean = __fmaf_rn(__fsub_rn(v, mean), __fdiv_rn(new_weight, new_sum), mean);
  sum = new_sum;
  max = grows ? s : max;
}

// The request's new rows (online compressors have no overlap: row width c).
struct NewRows {
  const float* kv;      // [T, c]
  std::int64_t kv_stride;
  const float* score;   // [T, c] (no ape)
  std::int64_t score_stride;
  const float* ape;     // [m, c]
  std::int64_t prefix, row_begin;
  int width;

  __device__ NewRows(const KernelParams& p, const StepRequest& r, int c)
      : kv(p.kv), kv_stride(p.kv_stride), score(p.score), score_stride(p.score_stride), ape(p.ape), prefix(r.prefix),
        row_begin(r.row_begin), width(c) {}
};

// Applies positions [from, to) to `state` (a block's first row restarts it). After the row that
// brings the count to L ≥ keep_from, stores the snapshot of L into `snapshots`
// [num_snapshots, 3·c].
template <class Config>
__device__ __forceinline__ void run_rows(const KernelParams& p, const NewRows& rows, std::int64_t from, std::int64_t to,
                                         std::int64_t keep_from, float* snapshots, int lane, OnlineState& state) {
  constexpr int kBatch = Config::kBatch;
  constexpr int c = Config::kWidth;
  const int m = p.ratio, num_snapshots = p.records_per_slot;
  const int channel = 4 * lane;
  int in_block = static_cast<int>(from % m);
  for (std::int64_t batch = from; batch < to; batch += kBatch) {
    float values[kBatch][4], scores[kBatch][4];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const std::int64_t q = batch + u < to ? batch + u : from;  // padding reloads a real row
      const std::int64_t row = rows.row_begin + (q - rows.prefix);
      const int row_in_block = (in_block + u) % m;
      to_array(load_once(rows.kv + row * rows.kv_stride + channel), values[u]);
      to_array(add4(load_once(rows.score + row * rows.score_stride + channel),
                    load_shared_input(rows.ape + static_cast<std::int64_t>(row_in_block) * c + channel)),
               scores[u]);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const std::int64_t q = batch + u;
      if (q >= to) break;
#pragma unroll
      for (int k = 0; k < 4; ++k) online_update(in_block == 0, scores[u][k], values[u][k], state.max[k], state.sum[k], state.mean[k]);
      in_block = in_block + 1 == m ? 0 : in_block + 1;
      if (q + 1 >= keep_from) {
        float* snapshot = snapshots + ((q + 1) % num_snapshots) * p.record_floats;
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
  constexpr int c = Config::kWidth;
  static_assert(Config::kUnitsPerBlock == 1 || Config::kWarpsPerGroup == 1, "shared scratch is per block");
  __shared__ double s_sum[Config::kWarpsPerGroup];
  const int unit = static_cast<int>(threadIdx.x) / Config::kUnitThreads;
  const int lane = static_cast<int>(threadIdx.x) % Config::kUnitThreads;
  const std::int64_t item = static_cast<std::int64_t>(blockIdx.x) * Config::kUnitsPerBlock + unit;
  if (item >= p.num_items) return;
  const ItemPlace place = locate_item(p, item);
  const StepRequest& r = place.request;
  const NewRows rows(p, r, c);
  const int m = p.ratio;
  float* snapshots = p.state + static_cast<std::int64_t>(r.slot) * p.records_per_slot * p.record_floats;
  constexpr std::int64_t kNoSnapshots = INT64_MAX;
  OnlineState state = {};

  if (place.index != 0) {
    // A body item: block `entry`, entirely in this step's rows, from its first row.
    const int event = static_cast<int>(place.index);
    const std::int64_t start = (r.prefix / m + event) * m;
    run_rows<Config>(p, rows, start, start + m, kNoSnapshots, snapshots, lane, state);
    finish_event<Config>(p, state.mean, lane, true, entry_target(p, r, event), s_sum);
    return;
  }

  // The head. Snapshots to keep: the counts keep_from .. end (at most max_rollback + 1 of them).
  const std::int64_t end = r.prefix + r.new_tokens;
  const std::int64_t first_block_start = r.prefix / m * m;
  const std::int64_t first_block_end = end < first_block_start + m ? end : first_block_start + m;
  const std::int64_t keep_from = end - p.max_rollback > r.prefix + 1 ? end - p.max_rollback : r.prefix + 1;
  if (r.prefix % m != 0) {
    const float* snapshot = snapshots + (r.prefix % p.records_per_slot) * p.record_floats;
    to_array(load_once(snapshot + 4 * lane), state.max);
    to_array(load_once(snapshot + c + 4 * lane), state.sum);
    to_array(load_once(snapshot + 2 * c + 4 * lane), state.mean);
  }
  run_rows<Config>(p, rows, r.prefix, first_block_end, keep_from, snapshots, lane, state);
  if (first_block_end == first_block_start + m) {
    finish_event<Config>(p, state.mean, lane, true, entry_target(p, r, 0), s_sum);
  }
  // The kept counts past the first block: re-run their block(s) from the first row (the body
  // items compute the same values for their events; only the head writes state).
  const std::int64_t first_kept_row = keep_from - 1;
  if (first_kept_row >= first_block_end) {
    run_rows<Config>(p, rows, first_kept_row / m * m, end, keep_from, snapshots, lane, state);
  }
}

}  // namespace dsv4::cuda::compressor
