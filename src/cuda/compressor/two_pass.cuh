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
#include <type_traits>

#include "cuda/common/fast_float.cuh"
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
  static constexpr bool kAllNew = false;  // (may hold ring rows)
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

// EventWindow and RingRows of one thread with everything that does not depend on the candidate
// computed once per event (the lean short-window instantiation, config.hpp: kHoistedWindow):
// 64-bit bases of this lane's vectors — candidate 0 as a new row, the ring, the ape — and the first
// new candidate, so a candidate costs 32-bit offsets from them instead of 64-bit products and
// compares. launch.cu runs it only where every offset fits in an int (lean_prefill_fits). The
// candidates and vectors are EventWindow::candidate's. kAllNew: a window with no ring row
// (first_new ≤ 0: every body event), whose candidates need neither the ring test nor its address.
template <bool kAllNew_ = false>
struct WindowOffsets {
  static constexpr bool kAllNew = kAllNew_;
  const float* new_value;  // [4] kv vector of candidate 0 were it a new row (never read when it is not)
  const float* new_score;  // [4] its score vector (no ape)
  const float* ring;       // [4] this slot's ring + 4·lane
  const float* ape;        // [4] ape + 4·lane
  int kv_stride, score_stride;  // floats
  int record_floats, row_width, ring_rows;
  int ring0;      // ring row of candidate 0
  int b_rows;     // candidates of the b branch (channel offset 0)
  int a_offset;   // channel offset of the a branch
  int first_new;  // candidates j ≥ first_new are this step's rows (prefix − p0; may be ≤ 0)
  int count;      // K

  // (`rows` and `lane` are in the bases: the signature is EventWindow's, for pool_candidates.)
  __device__ Candidate candidate(const RingRows& /*rows*/, int j, int /*lane*/) const {
    const bool b_branch = j < b_rows;
    const int channel = b_branch ? 0 : a_offset;
    const int in_block = b_branch ? j : j - b_rows;  // p0 is a multiple of m
    int ring_row = ring0 + j;
    if (ring_row >= ring_rows) ring_row -= ring_rows;  // K ≤ R: one wrap at most
    const int ring_offset = ring_row * record_floats + channel;
    Candidate c;
    c.is_new = kAllNew || j >= first_new;
    c.value = c.is_new ? new_value + (j * kv_stride + channel) : ring + ring_offset;
    c.score = c.is_new ? new_score + (j * score_stride + channel) : ring + (ring_offset + row_width);
    c.ape = ape + (in_block * row_width + channel);
    return c;
  }

  // This window as one without ring rows (first_new ≤ 0).
  __device__ WindowOffsets<true> all_new() const {
    return WindowOffsets<true>{new_value, new_score, ring,      ape,    kv_stride, score_stride, record_floats,
                               row_width, ring_rows, ring0,     b_rows, a_offset,  first_new,    count};
  }
};

// `pointer`, opaque to the compiler: a per-event base stays in its register instead of being
// re-derived for every candidate from the parameter base and a 64-bit offset (two more
// instructions per address).
__device__ __forceinline__ const float* in_register(const float* pointer) {
  asm("mov.b64 %0, %0;" : "+l"(pointer));
  return pointer;
}

// The fold's exponential is exp_flushed (cuda/common/fast_float.cuh: __expf with subnormal results
// flushed). Every argument is a score minus a maximum of the set folded, so the set's largest weight
// is 1: a weight below 2^-126 changes the sum by nothing and the weighted sum by less than 2^-126 of
// a value, far inside the float32 agreement SPEC §4 asks. Every two-pass schedule folds with it, so
// they still give the same bytes.

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

// Stores a partial's [max | sum | weighted] rows of c floats at `to` (this lane's 4 channels: `to`
// already offset by 4·lane): a split unit's partial, a slice chain.
__device__ __forceinline__ void store_partial(float* to, int c, const SoftmaxPartial& partial) {
  store4(to, make_float4(partial.max[0], partial.max[1], partial.max[2], partial.max[3]));
  store4(to + c, make_float4(partial.sum[0], partial.sum[1], partial.sum[2], partial.sum[3]));
  store4(to + 2 * c, make_float4(partial.weighted[0], partial.weighted[1], partial.weighted[2], partial.weighted[3]));
}

// into ← into ⊕ next (the statistics of both candidate sets). Merging an empty partial (either
// side) copies the other exactly, so a chain's first slice and empty slices never change a bit. The
// cases are picked by selects, not branches, so the four channels' chains overlap (a split event's
// merging unit left-folds 8 slices a group: with a branch per channel they ran one after another).
__device__ __forceinline__ void merge_partial(SoftmaxPartial& into, const SoftmaxPartial& next) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const bool next_empty = next.max[k] == -INFINITY, into_empty = into.max[k] == -INFINITY;
    const float total_max = fmaxf(into.max[k], next.max[k]);
    const float mine = __expf(__fsub_rn(into.max[k], total_max)), theirs = __expf(__fsub_rn(next.max[k], total_max));
    const float sum = __fmaf_rn(next.sum[k], theirs, __fmul_rn(into.sum[k], mine));
    const float weighted = __fmaf_rn(next.weighted[k], theirs, __fmul_rn(into.weighted[k], mine));
    // (Where either side is empty the values above are unused: one side's max is −inf.)
    into.sum[k] = next_empty ? into.sum[k] : into_empty ? next.sum[k] : sum;
    into.weighted[k] = next_empty ? into.weighted[k] : into_empty ? next.weighted[k] : weighted;
    into.max[k] = next_empty ? into.max[k] : into_empty ? next.max[k] : total_max;
  }
}

// Folds candidates [j_begin, j_end) of `window` into `result`, kBatch at a time through the staging
// slots, the next batch in flight while one is folded. Short windows: one running fold (result
// starts empty). Sliced folds (long windows, config.hpp; j_begin a multiple of kSliceCandidates):
// each slice is folded from scratch and merged into `result` (the chain, which starts empty) when it
// is complete, while the copies stream on across slice boundaries.
// kChainSlices = false on a sliced fold: [j_begin, j_end) is at most one slice, folded straight into
// `result` (empty on entry) — the same bits as the chain of that one slice (a merge into an empty
// chain copies), without the chain's registers.
// `slice_done` (a sliced fold with kChainSlices): instead of merging each complete slice into `result`,
// hands it over as slice_done(s, partial) (s: the slice's index in the window, computed from j_begin —
// which is why a sliced fold's j_begin must be a multiple of kSliceCandidates), so a split unit folds
// its consecutive slices in one stream of copies (split_event_unit).
struct MergeSlices {};
template <class Config, bool kChainSlices = Config::kSlicedFold, class Window, class SliceDone = MergeSlices>
__device__ __forceinline__ void pool_candidates(const RingRows& rows, const Window& window, int j_begin, int j_end,
                                                int lane, const Staging<Config>& staging, SoftmaxPartial& result,
                                                const SliceDone& slice_done = {}) {
  static_assert(kChainSlices || std::is_same_v<SliceDone, MergeSlices>, "slice_done needs a chained sliced fold");
  constexpr int kBatch = Config::kBatch;
  SoftmaxPartial slice;  // chained slices: the slice being folded
  SoftmaxPartial& acc = kChainSlices ? slice : result;
  if constexpr (Config::kSlicedFold) {
    static_assert(Config::kSliceBatches * kBatch == kSliceCandidates, "a slice is whole batches");
    if (j_begin >= j_end) return;  // an empty group or slice: nothing to copy
  }
  if constexpr (kChainSlices) slice = empty_partial();
  const int batches = (j_end - j_begin + kBatch - 1) / kBatch;
  // The real row a padding slot copies (its score is masked to −inf, its weight is 0). Sliced folds
  // pad only the window's last slice and take its last row, K − 1, whichever range it is folded in,
  // so even a zero's sign cannot depend on the path.
  const int padding_row = Config::kSlicedFold ? j_end - 1 : j_begin;
  const auto batch_candidate = [&](int b, int u) {
    const int j = j_begin + b * kBatch + u;
    return window.candidate(rows, j < j_end ? j : padding_row, lane);  // padding copies a real row
  };
  const auto copy_batch = [&](int b) {
    const int stage = b % Config::kStages;
    const auto copy_row = [&](int u, const Candidate& c) {
      copy_row_vector<Config::kEvictFirstRows>(staging.slot(stage, u, 0), c.value);
      copy_row_vector<Config::kEvictFirstRows>(staging.slot(stage, u, 1), c.score);
      if constexpr (!Config::kStageApe && !Window::kAllNew) {
        // A window that may hold ring rows (heads: every decode step): the ape vectors are read (from
        // L1) after the copies land, and in a step's cold start they are a DRAM round trip of their
        // own in the fold's chain — ask for them now. (Prefill bodies, all new, find ape in L1.)
        prefetch_l1(c.ape);
      }
      if constexpr (Config::kStageApe) {
        // The split (decode) kernel skips ring rows' ape (never read: the ring holds score + ape);
        // the prefill kernel keeps its unconditional copies.
        if (!Config::kSplit || c.is_new) ptx::cp_async_cg16(staging.slot(stage, u, 2), c.ape);
      }
    };
    // The batch's addresses first, then its copies back to back: ptxas puts three no-op guard
    // instructions before every run of cp.async, so copies interleaved with the address arithmetic
    // paid one guard a row (a C4 event: 18 more issue slots). Kernels staging ape keep each row's
    // copies beside its addresses (holding a batch's twelve addresses spills them).
    Candidate candidates[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      candidates[u] = batch_candidate(b, u);
      if constexpr (Config::kStageApe) copy_row(u, candidates[u]);
    }
    if constexpr (!Config::kStageApe) {
#pragma unroll
      for (int u = 0; u < kBatch; ++u) copy_row(u, candidates[u]);
    }
    ptx::cp_async_commit();
  };
  copies_start<Config::kStages>(batches, copy_batch);
  for (int b = 0; b < batches; ++b) {
    // Ape read from L1 (short windows): the batch's vectors are loaded before the wait for its copies,
    // so their round trip runs beside the copies' instead of after it (Nsight Compute, C4-128 prefill:
    // the first add of a loaded ape vector held a quarter of the kernel's stall samples).
    // The candidates located for those loads serve the fold too. Kernels without them locate each
    // candidate in the fold, where it is read (a whole batch located after the wait cost them up to
    // 9 instructions).
    Candidate candidates[kBatch];
    float4 ape[kBatch];
    if constexpr (Config::kApeBeforeWait) {
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        candidates[u] = batch_candidate(b, u);
        ape[u] = load_shared_input(candidates[u].ape);
      }
    }
    copies_before_batch<Config::kStages>(b, batches, copy_batch);
    const int stage = b % Config::kStages;
    // Scores first (their batch maximum rescales the running sums), values read back per row.
    float scores[kBatch][4];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const bool valid = j_begin + b * kBatch + u < j_end;
      const Candidate c = Config::kApeBeforeWait ? candidates[u] : batch_candidate(b, u);
      float4 bias = make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // the ring stores score + ape already
      if constexpr (Config::kSplit) {
        if (c.is_new) bias = *staging.slot(stage, u, 2);  // ring rows' ape slots were not copied
      } else {
        if constexpr (Config::kStageApe) {
          bias = *staging.slot(stage, u, 2);
        } else if constexpr (Config::kApeBeforeWait) {
          bias = ape[u];
        } else {
          bias = load_shared_input(c.ape);
        }
        if (!c.is_new) bias = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
      to_array(add4(*staging.slot(stage, u, 1), bias), scores[u]);
      if (!valid) {
#pragma unroll
        for (int k = 0; k < 4; ++k) scores[u][k] = -INFINITY;
      }
    }
    // The batch's new maxima, rescale and weights.
    float new_max[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float batch_max = scores[0][k];
#pragma unroll
      for (int u = 1; u < kBatch; ++u) batch_max = fmaxf(batch_max, scores[u][k]);
      new_max[k] = fmaxf(acc.max[k], batch_max);
      // (0 while nothing was seen: max = −inf)
      const float rescale = exp_flushed(__fsub_rn(acc.max[k], new_max[k]));
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
        const float w = exp_flushed(__fsub_rn(scores[u][k], new_max[k]));  // 0 for a masked slot
        acc.sum[k] = __fadd_rn(acc.sum[k], w);
        acc.weighted[k] = __fmaf_rn(w, values[k], acc.weighted[k]);
      }
    }
    if constexpr (Config::kStages == 1) {
      if (b + 1 < batches) copy_batch(b + 1);  // the only stage is free again
    }
    if constexpr (kChainSlices) {
      if (b % Config::kSliceBatches == Config::kSliceBatches - 1 || b + 1 == batches) {  // the slice is complete
        if constexpr (std::is_same_v<SliceDone, MergeSlices>) {
          merge_partial(result, slice);
        } else {
          slice_done((j_begin + b * kBatch) / kSliceCandidates, slice);
        }
        slice = empty_partial();
      }
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

// The window of event `event` of request `r` as WindowOffsets for this lane, entry n = `entry`
// (positions < 2^31: launch.cu).
template <class Config>
__device__ __forceinline__ WindowOffsets<> window_offsets(const KernelParams& p, const RingRows& rows, const StepRequest& r,
                                                          std::uint32_t entry, int lane) {
  WindowOffsets<> w;
  w.b_rows = (p.overlap && entry >= 1) ? p.ratio : 0;
  w.count = w.b_rows + p.ratio;
  const std::uint32_t p0 = entry * static_cast<std::uint32_t>(p.ratio) - static_cast<std::uint32_t>(w.b_rows);
  w.ring0 = static_cast<int>(p0 - fast_divide(p0, p.ring_divisor) * static_cast<std::uint32_t>(rows.ring_rows));
  w.a_offset = p.overlap ? Config::kWidth : 0;
  w.first_new = static_cast<int>(r.prefix) - static_cast<int>(p0);
  const std::int64_t row0 = rows.row_begin - w.first_new;  // new row of candidate 0 (< row_begin: a ring row)
  w.new_value = in_register(rows.kv + row0 * rows.kv_stride + 4 * lane);
  w.new_score = in_register(rows.score + row0 * rows.score_stride + 4 * lane);
  w.ring = in_register(rows.ring + 4 * lane);
  w.ape = in_register(rows.ape + 4 * lane);
  w.kv_stride = static_cast<int>(rows.kv_stride);
  w.score_stride = static_cast<int>(rows.score_stride);
  w.record_floats = rows.record_floats;
  w.row_width = rows.row_width;
  w.ring_rows = rows.ring_rows;
  return w;
}

// Slices of a window of `count` candidates (config.hpp).
__device__ __forceinline__ int slice_count(int count) { return (count + kSliceCandidates - 1) / kSliceCandidates; }

// Group 0's `acc` ← the merge of every group's statistics in group order (deterministic); every
// thread of the unit calls it, the other groups' `acc` are left as they were. The scratch aliases
// the staging slots: every thread has finished reading its own before the first barrier.
template <class Config>
__device__ __forceinline__ void merge_groups(int group, int lane, const Staging<Config>& staging, SoftmaxPartial& acc) {
  if constexpr (Config::kGroups > 1) {
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
}

// Folds the candidates of `window` and stores the entry at `target` (every thread of the unit takes
// part). Long windows: group g folds slices [g·S/G, (g+1)·S/G) into its chain (config.hpp), the
// shape split_event_unit reproduces; short windows: the one group folds all candidates.
template <class Config, class Window>
__device__ __forceinline__ void pool_and_finish(const KernelParams& p, const RingRows& rows, const Window& window,
                                                const EntryTarget& target, int group, int lane, const float (&norm)[4],
                                                const Staging<Config>& staging, double* s_sum) {
  SoftmaxPartial acc = empty_partial();
  int j_begin, j_end;
  if constexpr (Config::kSlicedFold) {
    const int slices = slice_count(window.count);
    j_begin = group * slices / Config::kGroups * kSliceCandidates;
    j_end = min((group + 1) * slices / Config::kGroups * kSliceCandidates, window.count);
  } else {
    j_begin = group * window.count / Config::kGroups;
    j_end = (group + 1) * window.count / Config::kGroups;
  }
  const auto pool = [&](const auto& candidates) {
    pool_candidates<Config, Config::kSlicedFold>(rows, candidates, j_begin, j_end, lane, staging, acc);
  };
  if constexpr (Config::kHoistedWindow) {
    if (window.first_new <= 0) {  // no ring row (every body event): the lighter candidates, same bytes
      pool(window.all_new());
    } else {
      pool(window);
    }
  } else {
    pool(window);
  }
  merge_groups<Config>(group, lane, staging, acc);
  float compressed[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) compressed[k] = __fdiv_rn(acc.weighted[k], acc.sum[k]);
  finish_event<Config>(p, compressed, lane, group == 0, target, norm, s_sum);
}

// Computes and stores event `event` of request `r` (every thread of the unit takes part).
template <class Config>
__device__ __forceinline__ void two_pass_event(const KernelParams& p, const RingRows& rows, const StepRequest& r,
                                               int event, int group, int lane, const float (&norm)[4],
                                               const Staging<Config>& staging, double* s_sum) {
  if constexpr (Config::kHoistedWindow) {
    // One FastDivisor division per event for the entry, one for its ring row, one for its page.
    const std::uint32_t entry = fast_divide(static_cast<std::uint32_t>(r.prefix), p.ratio_divisor) + event;
    pool_and_finish<Config>(p, rows, window_offsets<Config>(p, rows, r, entry, lane),
                            entry_target_hoisted(p, r, event, entry), group, lane, norm, staging, s_sum);
  } else {
    pool_and_finish<Config>(p, rows, event_window<Config>(p, rows, r, event), entry_target(p, r, event), group, lane,
                            norm, staging, s_sum);
  }
}

// Split unit `part` of split event `index` (one block; params.hpp): group g folds slices
// (part·kGroups + g)·n .. + n − 1 (n = kMaxSplitSlices / (split_units·kGroups)), each from scratch,
// into the step's partials scratch (in an order rotated by `index`: no byte depends on it); the last
// unit of the event to finish merges
// the partials in two_pass_event's shape (group g: left fold over its slices [g·S/G, (g+1)·S/G);
// then the groups in group order) and stores the entry.
template <class Config>
__device__ __forceinline__ void split_event_unit(const KernelParams& p, int index, int part, int group, int lane,
                                                 const float (&norm)[4], const Staging<Config>& staging,
                                                 double* s_sum, int* s_last) {
  constexpr int c = Config::kWidth;
  const SplitEvent split = step_split_event(p, index);
  const StepRequest& r = split.request;
  const RingRows rows(p, r);
  const EventWindow window = event_window<Config>(p, rows, r, split.event);
  float* partials = p.split_partials + static_cast<std::int64_t>(index) * kMaxSplitSlices * 3 * c;  // [16][3][c]
  const int per_group = kMaxSplitSlices / (p.split_units * Config::kGroups);
  // The group's slices are consecutive: one stream of copies a run (below) folds them, each slice from
  // scratch (the next slice's first rows land while this one is folded), each stored as it completes.
  const int first_slice = (part * Config::kGroups + group) * per_group;
  const auto store_slice = [&](int slice, const SoftmaxPartial& partial) {
    store_partial(partials + slice * 3 * c + 4 * lane, c, partial);
  };
  // The units of different events start at different slices of their ranges (the range rotated by
  // the event's index, in two runs): otherwise every event's units ask for the same few ape rows and
  // row offsets at once (H200: C128 T = 8K −2.8%). The slices are independent: no byte changes.
  const int rotate = index % per_group;
  SoftmaxPartial no_chain;  // (never read or written: each slice goes to store_slice)
#pragma unroll 1
  for (int run = 0; run < 2; ++run) {
    const int begin = first_slice + (run == 0 ? rotate : 0);
    const int end = run == 0 ? first_slice + per_group : first_slice + rotate;
    if (begin < end) {
      pool_candidates<Config, true>(rows, window, min(begin * kSliceCandidates, window.count),
                                    min(end * kSliceCandidates, window.count), lane, staging, no_chain, store_slice);
    }
  }
  // (Slices past the window's last are neither folded nor stored: the merge reads [0, slice_count).)
  __threadfence();  // this thread's partials are visible GPU-wide before its unit counts itself done
  __syncthreads();  // every thread of the unit has stored and fenced
  if (threadIdx.x == 0) *s_last = atomicAdd(p.split_counters + index, 1) == p.split_units - 1;
  __syncthreads();
  if (!*s_last) return;  // uniform across the block
  __threadfence();       // acquire: the other units' partials (fenced before their counts) are seen after ours
  if (threadIdx.x == 0) p.split_counters[index] = 0;  // every unit has counted: ready for the next launch
  // Each thread copies its 4 channels of its group's slices' partials into its own staging slots
  // (cp.async.cg reads L2, never a stale L1 line; one round trip for all of them), folds them into
  // its group's chain, and the groups merge as in two_pass_event.
  const int slices = slice_count(window.count);
  const int first = group * slices / Config::kGroups, end = (group + 1) * slices / Config::kGroups;
  static_assert(3 * kMaxSplitSlices / Config::kGroups <= Config::kStages * Config::kBatch * Config::kVectors,
                "a thread's staging slots hold its group's partials");
  for (int s = first; s < end; ++s) {
    const float* stored = partials + s * 3 * c + 4 * lane;  // [3][c], written by other SMs
    for (int v = 0; v < 3; ++v) ptx::cp_async_cg16(staging.linear(3 * (s - first) + v), stored + v * c);
  }
  ptx::cp_async_commit();
  ptx::cp_async_wait<0>();
  SoftmaxPartial chain = empty_partial();
  for (int s = first; s < end; ++s) {
    SoftmaxPartial theirs;
    to_array(*staging.linear(3 * (s - first)), theirs.max);
    to_array(*staging.linear(3 * (s - first) + 1), theirs.sum);
    to_array(*staging.linear(3 * (s - first) + 2), theirs.weighted);
    merge_partial(chain, theirs);
  }
  merge_groups<Config>(group, lane, staging, chain);
  float compressed[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) compressed[k] = __fdiv_rn(chain.weighted[k], chain.sum[k]);
  finish_event<Config>(p, compressed, lane, group == 0, entry_target_in_page(p, r, split.event, split.page), norm,
                       s_sum);
}

// A split step's request that keeps its slice chains and completes a slice or its block
// (StepRequest::chain; launch.cu, runtime/slice_chains.hpp). A group's chain is the left fold of the
// open block's complete slices in its range (no overlap: the window is the block, K = m), kept in one
// of two buffers by the parity of its last slice: [slot][group][2][max | sum | weighted][c]. Folding
// slice s reads the chain of s − 1 (or starts empty at the group's first slice) and writes the other
// buffer, so a fold repeated (a replayed step) writes the same values, and after a rollback that
// drops s the chain of s − 1 is still there. A step of at most one slice's tokens completes at most
// one slice: the owning group folds it from scratch, as a split unit would, and merges it into the
// chain; or the step completes the block, whose event folds only its last slice and merges the
// groups as two_pass_event does — the same operations in the same order as every other path, so the
// same bytes.
template <class Config>
__device__ __forceinline__ void keep_slice_chains(const KernelParams& p, const StepRequest& r, int group, int lane,
                                                  const Staging<Config>& staging, double* s_sum) {
  constexpr int c = Config::kWidth;
  const RingRows rows(p, r);
  const EventWindow window = event_window<Config>(p, rows, r, 0);  // the open block
  const int slices = slice_count(window.count);
  const int first = group * slices / Config::kGroups, end = (group + 1) * slices / Config::kGroups;
  float* const chains = p.chains + (static_cast<std::int64_t>(r.slot) * Config::kGroups + group) * 2 * 3 * c + 4 * lane;
  const auto chain_of = [&](int slice) { return chains + (slice % 2) * 3 * c; };  // the chain through `slice`
  const auto fold_slice = [&](int slice, SoftmaxPartial& chain) {
    SoftmaxPartial folded = empty_partial();
    pool_candidates<Config, false>(rows, window, slice * kSliceCandidates,
                                   min((slice + 1) * kSliceCandidates, window.count), lane, staging, folded);
    merge_partial(chain, folded);
  };
  // The group's chain through `slice` (empty before its range).
  const auto load_chain = [&](int slice) {
    SoftmaxPartial chain = empty_partial();
    if (slice >= first) {
      const float* from = chain_of(slice);
      to_array(load_once(from), chain.max);
      to_array(load_once(from + c), chain.sum);
      to_array(load_once(from + 2 * c), chain.weighted);
    }
    return chain;
  };
  if (r.num_events == 0) {
    const int done_before = static_cast<int>(r.prefix % p.ratio) / kSliceCandidates;
    const int done_after = static_cast<int>((r.prefix + r.new_tokens) % p.ratio) / kSliceCandidates;
    const int slice = done_after - 1;  // the one slice completed, if any
    if (done_after == done_before || slice < first || slice >= end) return;  // (no barrier follows)
    SoftmaxPartial chain = load_chain(slice - 1);
    fold_slice(slice, chain);
    store_partial(chain_of(slice), c, chain);
    return;
  }
  // The block's event: every slice but the last is in the chains; a group whose range holds none of
  // them starts empty, and the last group folds the last slice.
  float norm[4];
  load_norm<Config>(p, lane, norm);
  SoftmaxPartial chain = load_chain(min(end, slices - 1) - 1);
  if (group == Config::kGroups - 1) fold_slice(slices - 1, chain);
  merge_groups<Config>(group, lane, staging, chain);
  float compressed[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) compressed[k] = __fdiv_rn(chain.weighted[k], chain.sum[k]);
  finish_event<Config>(p, compressed, lane, group == 0, entry_target(p, r, 0), norm, s_sum);
}

// Vectors a thread loads into registers before its first store in a share of a chunk's ring write
// (ring_write_slots; a whole write's: kRingVectorsInRegisters, config.hpp), a second copy of the
// unrolled write in the kernel: at 8, its code cost fresh prefills 18% at C4-128 T = 8K (H200); at 4
// nothing (with the lean kernels' heads re-reading their request: below); at 2 the chunk cases lost 1–6%.
inline constexpr int kRingShareVectorsInRegisters = 4;

// The positions a request's ring holds after the step, which its ring write stores from the new rows:
// the last R seen, but none before the step's first new position.
// A share of it (ring_write_slots) visits ring slots from row `rotate` on, cyclically, skipping those
// past the last row.
struct RingWriteSpan {
  std::int64_t first;  // first position written
  int vectors;         // float4 vectors visited: visited rows · (kv row + score row); ≤ R · 2·coff·c / 4
  int rows;            // rows written by the whole write (n ≤ R)
  int rotate;          // row visited first (0 for the whole write)
};
__device__ __forceinline__ RingWriteSpan ring_write_span(const RingRows& rows, const StepRequest& r) {
  const std::int64_t end = r.prefix + r.new_tokens;
  const std::int64_t first = end - rows.ring_rows > r.prefix ? end - rows.ring_rows : r.prefix;
  const int n = static_cast<int>(end - first);
  return {first, n * 2 * (rows.row_width / 4), n, 0};
}

// The ring write in rounds of kRingVectorsInRegisters vectors a thread, each round's loads held in
// registers (a head writing its own ring, prefill, and every write of at most one round). kShare: a
// share of the write (ring_write_slots), a separate instance so that the whole write, which fresh
// prefills run, keeps its code.
// Piece `piece` of `pieces` runs rounds piece, piece + pieces, ... (ring items of a prefill step,
// config.hpp ring_write_pieces; a head runs the whole share as piece 0 of 1).
template <class Config, bool kShare = false>
__device__ __forceinline__ void write_ring_direct(const KernelParams& p, const RingRows& rows, const StepRequest& r,
                                                  const RingWriteSpan& span, int thread, int piece = 0,
                                                  int pieces = 1) {
  // Every load of a round is issued before its first store: the compiler cannot move a load above a
  // store that may alias it, so interleaved they would run one round trip at a time.
  constexpr int kVectorsInFlight = kShare ? kRingShareVectorsInRegisters : kRingVectorsInRegisters;
  const std::int64_t first = span.first;
  const int row_vectors = rows.row_width / 4;  // float4 per kv (or score) row
  const int vectors = span.vectors;
  const int first_ring_row = static_cast<int>(first % rows.ring_rows);
  const int first_in_block = static_cast<int>(first % p.ratio);
  constexpr int kRound = kVectorsInFlight * Config::kUnitThreads;
  for (int base = piece * kRound; base < vectors; base += pieces * kRound) {
    float4 data[kVectorsInFlight];
    float* destination[kVectorsInFlight];
#pragma unroll
    for (int u = 0; u < kVectorsInFlight; ++u) {
      const int i = base + u * Config::kUnitThreads + thread;
      const int visited_row = (i < vectors ? i : 0) / (2 * row_vectors);
      const int vector = (i < vectors ? i : 0) - visited_row * 2 * row_vectors;
      const int row_offset =
          kShare ? visited_row + span.rotate - (visited_row + span.rotate >= rows.ring_rows ? rows.ring_rows : 0)
                 : visited_row;
      const bool valid = i < vectors && (!kShare || row_offset < span.rows);
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

// Where vector i of a ring write is: row_offset = i / per_row of the rows written, `vector` = i mod
// per_row (kv vectors, then score vectors), with that row's ring row and place in its block. A
// thread visits its vectors i = thread + k·(unit threads) in order, so the cursor only ever adds
// (write_ring_staged rewinds it once a round, to replay the copies' positions for the stores).
struct RingCursor {
  int row_offset, vector, in_block, ring_row;

  __device__ void advance(int step, int per_row, int ratio, int ring_rows) {
    vector += step;
    while (vector >= per_row) {
      vector -= per_row;
      ++row_offset;
      if (++in_block == ratio) in_block = 0;
      if (++ring_row == ring_rows) ring_row = 0;
    }
  }
};

// The ring write of many vectors a thread: each thread copies as many as its staging slots hold
// into them (cp.async: no registers held), waits, and stores them (scores + ape, read from L1 after
// the wait) — every load of a round before its first store.
template <class Config>
__device__ __forceinline__ void write_ring_staged(const KernelParams& p, const RingRows& rows, const StepRequest& r,
                                                  const RingWriteSpan& span, int thread, const Staging<Config>& staging) {
  constexpr int kSlots = Config::kStages * Config::kBatch * Config::kVectors;  // copies in flight a thread
  constexpr int kThreads = Config::kUnitThreads;
  const std::int64_t first = span.first;
  const int row_vectors = rows.row_width / 4;  // float4 per kv (or score) row
  const int per_row = 2 * row_vectors;
  const int vectors = span.vectors;
  const std::int64_t row0 = rows.row_begin + (first - r.prefix);  // new row of the first position written
  RingCursor cursor;
  cursor.row_offset = thread / per_row;
  cursor.vector = thread - cursor.row_offset * per_row;
  cursor.in_block = static_cast<int>((first + cursor.row_offset) % p.ratio);
  cursor.ring_row = static_cast<int>((first + cursor.row_offset) % rows.ring_rows);
  const auto channel_of = [&](const RingCursor& c) { return 4 * (c.vector >= row_vectors ? c.vector - row_vectors : c.vector); };
  const auto ape_of = [&](const RingCursor& c) {
    return rows.ape + static_cast<std::int64_t>(c.in_block) * rows.row_width + channel_of(c);
  };
  for (int base = thread; base < vectors; base += kSlots * kThreads) {
    const RingCursor round_start = cursor;
    // (Rolled loops: the kernel's code is what the events pay for in instruction fetch; see write_ring.)
#pragma unroll 1
    for (int u = 0; u < kSlots; ++u) {
      if (base + u * kThreads < vectors) {
        const std::int64_t row = row0 + cursor.row_offset;
        const bool is_score = cursor.vector >= row_vectors;
        const float* source = is_score ? rows.score + row * rows.score_stride : rows.kv + row * rows.kv_stride;
        ptx::cp_async_cg16(staging.linear(u), source + channel_of(cursor));
        if (is_score) prefetch_l1(ape_of(cursor));  // read after the wait
      }
      cursor.advance(kThreads, per_row, p.ratio, rows.ring_rows);
    }
    ptx::cp_async_commit();
    ptx::cp_async_wait_all();
    cursor = round_start;
#pragma unroll 1
    for (int u = 0; u < kSlots; ++u) {
      if (base + u * kThreads < vectors) {
        const bool is_score = cursor.vector >= row_vectors;
        float4 value = *staging.linear(u);
        if (is_score) value = add4(value, load_shared_input(ape_of(cursor)));
        store4(rows.ring + static_cast<std::int64_t>(cursor.ring_row) * rows.record_floats + (is_score ? rows.row_width : 0) +
                   channel_of(cursor),
               value);
      }
      cursor.advance(kThreads, per_row, p.ratio, rows.ring_rows);
    }
  }
}

// A ring item's write of the rows the ring must hold after the step (the last R positions seen), from
// the new rows. In a decode step (one item per request, one ring item a request: ring_pieces = 1),
// more vectors a thread than one round of registers (C4: 3 tokens and up) go through the staging
// slots, where ape is L1-resident (short windows). Measured on the H200 at 4 tokens, same call:
// C4-512 B=1 10.8 → 9.2 µs, B=256 16.7 → 13.8, B=1024 41.9 → 38.0, C4-128 B=256 11.9 → 10.3; with
// staged ape (C128) the step at B = 1024 took +66%. A head writing its own ring (after its reads)
// calls write_ring_direct, so the staged loop is inlined once and rolled: unrolled and inlined at
// both call sites it made the lean kernel's code 85% larger and prefill C4-128 T=64K 57 → 70 µs (the
// events' instruction fetch); rolled, still 42%.
template <class Config>
__device__ __forceinline__ void write_ring(const KernelParams& p, const RingRows& rows, const StepRequest& r, int thread,
                                           const Staging<Config>& staging, int piece) {
  const RingWriteSpan span = ring_write_span(rows, r);
  if constexpr (!Config::kStageApe) {
    if (p.one_item_per_request && p.ring_pieces == 1 && span.vectors > kRingVectorsInRegisters * Config::kUnitThreads) {
      write_ring_staged<Config>(p, rows, r, span, thread, staging);
      return;
    }
  }
  write_ring_direct<Config>(p, rows, r, span, thread, piece, p.ring_pieces);
}

// Events a request's head computes (params.hpp, two_pass_head_events); with no head event its ring
// item writes the ring while the events run. Every item asks, so no 64-bit division: the prefix's
// place in its block by the divisor's multiply (positions below 2^32).
__device__ __forceinline__ int head_event_count(const KernelParams& p, const StepRequest& r) {
  const std::uint32_t low = static_cast<std::uint32_t>(r.prefix);
  const bool inside_block = r.prefix == static_cast<std::int64_t>(low)
                                ? fast_divide(low, p.ratio_divisor) * static_cast<std::uint32_t>(p.ratio) != low
                                : r.prefix % p.ratio != 0;
  return two_pass_head_events(p.overlap, r.prefix, inside_block, r.num_events);
}

// Whether the request's ring item writes its ring: whenever no ring row written this step can be
// one the head's events read (no event, or end − first read position ≤ R: every decode step), so
// the writes run in parallel with the head instead of in its critical path. Otherwise the head
// writes the rows landing on the slots its events read, after its reads, and the ring item the
// others, in parallel with them (ring_write_slots). (launch.cu applies the same rule when it plans
// split events.)
template <class Config>
__device__ __forceinline__ bool ring_item_writes(const KernelParams& p, const RingRows& rows, const StepRequest& r,
                                                 int head_events) {
  return head_events == 0 || r.prefix + r.new_tokens - event_window<Config>(p, rows, r, 0).p0 <= rows.ring_rows;
}

// The share of the step's ring write that lands on the slots the head's events read (`read`), or the
// others. The head reads the k = prefix − p0 slots of positions [p0, prefix) (event 0's window; later
// head events read fewer); row j written (position first + j) lands on a read slot iff
// (first + j − p0) mod R < k, that is j = (s + t) mod R for t in [0, k), s = (p0 − first) mod R. The
// two shares partition the write: no slot is written by both, and the ring item's never meets a read
// (SPEC §6).
template <class Config>
__device__ __forceinline__ RingWriteSpan ring_write_slots(const KernelParams& p, const RingRows& rows,
                                                          const StepRequest& r, bool read) {
  const RingWriteSpan all = ring_write_span(rows, r);
  const std::int64_t p0 = event_window<Config>(p, rows, r, 0).p0;
  const int ring = rows.ring_rows, k = static_cast<int>(r.prefix - p0);
  const int behind = static_cast<int>((all.first - p0) % ring);  // (first − p0) mod R
  const int s = behind == 0 ? 0 : ring - behind;
  const int rotate = read ? s : (s + k) % ring;
  return {all.first, (read ? k : ring - k) * 2 * (rows.row_width / 4), all.rows, rotate};
}

// The head's share of the ring write after its events, unless its ring item writes it all.
template <class Config>
__device__ __forceinline__ void write_head_share(const KernelParams& p, const RingRows& rows, const StepRequest& r,
                                                 int head_events, int thread) {
  if (ring_item_writes<Config>(p, rows, r, head_events)) return;
  unit_sync<Config>();  // every read of the unit precedes the writes
  // (write_ring's staged path only from ring items)
  write_ring_direct<Config, true>(p, rows, r, ring_write_slots<Config>(p, rows, r, true), thread);
}

// Split instantiation: grid blocks [0, split_events_count · split_units) are split units; then (both
// instantiations) the units run the items: [0, num_items) are heads and bodies (params.hpp),
// [num_items, num_items + ring_items) the ring items of the requests in order (ring_pieces a
// request, params.hpp) — unit u runs item u in decode steps, and in steps with bodies the ring items
// first (below).
template <class Config>
__global__ void __launch_bounds__(Config::kBlockThreads, Config::kMinBlocksPerSM)
    two_pass_kernel(const __grid_constant__ KernelParams p) {
  ptx::start_after_prerequisite_grids();  // launched early (launch_width.cuh)
  spans::stamp(spans::kCompressor);
  extern __shared__ float4 dynamic_shared[];  // [Config::kBytes / 16] staging (and the group merge)
  __shared__ double s_sum[Config::kWarpsPerGroup];
  static_assert(Config::kUnitsPerBlock == 1 || Config::kWarpsPerGroup == 1, "s_sum is per block");
  const int unit = static_cast<int>(threadIdx.x) / Config::kUnitThreads;
  const int thread = static_cast<int>(threadIdx.x) % Config::kUnitThreads;
  const int group = thread / Config::kLanes, lane = thread % Config::kLanes;
  std::int64_t block = blockIdx.x;
  if constexpr (Config::kSplit) {
    const std::int64_t split_blocks = static_cast<std::int64_t>(p.split_events_count) * p.split_units;
    if (block < split_blocks) {
      __shared__ int s_last;
      float norm[4];
      load_norm<Config>(p, lane, norm);
      const Staging<Config> staging(dynamic_shared);
      split_event_unit<Config>(p, static_cast<int>(block / p.split_units),
                               static_cast<int>(block % p.split_units), group, lane, norm, staging, s_sum,
                               &s_last);
      return;
    }
    block -= split_blocks;
    // Then one block a request that keeps its slice chains and completes a slice or its block in
    // this step (launch.cu puts those requests first), in parallel with the ring items.
    if (block < p.chain_requests) {
      keep_slice_chains<Config>(p, step_request(p, static_cast<int>(block)), group, lane,
                                Staging<Config>(dynamic_shared), s_sum);
      return;
    }
    block -= p.chain_requests;
  }
  // Steps with bodies (prefill) run their ring items first: a ring write is a chain of dependent
  // rounds, and started in a grid's last wave it outlasted every event (measured on the H200: C128
  // T=256K 273 → 326 µs with the ring items last and no head event). Decode steps keep them last.
  // The split instantiation's heads have nothing left to do (below): its ring items follow.
  const std::int64_t place_in_grid = block * Config::kUnitsPerBlock + unit;
  const std::int64_t item = Config::kSplit ? p.num_items + place_in_grid
                            : p.one_item_per_request || place_in_grid >= p.ring_items + p.num_items
                                ? place_in_grid
                            : place_in_grid < p.ring_items ? p.num_items + place_in_grid
                                                           : place_in_grid - p.ring_items;
  if (item >= p.num_items + p.ring_items) return;  // whole units only: a block-wide unit never splits here
  if (item >= p.num_items) {  // a ring item: piece `piece` of its request's write
    const int ring_item = static_cast<int>(item - p.num_items);
    const int request = ring_item / p.ring_pieces, piece = ring_item - request * p.ring_pieces;
    const StepRequest r = step_request(p, request);
    const RingRows rows(p, r);
    if (ring_item_writes<Config>(p, rows, r, head_event_count(p, r))) {
      write_ring<Config>(p, rows, r, thread, Staging<Config>(dynamic_shared), piece);
    } else {  // the rows on the slots the head does not read, while it reads
      write_ring_direct<Config, true>(p, rows, r, ring_write_slots<Config>(p, rows, r, false), thread, piece,
                                      p.ring_pieces);
    }
    return;
  }
  // The split instantiation runs only steps whose ring items all write and whose events are split
  // events (launch.cu's rule) or computed from slice chains (above): its heads have nothing left to
  // do (it launches none), and it has no bodies.
  if constexpr (Config::kSplit) return;
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
  // The head: the events whose windows reach into the ring, then the ring rows on the slots they
  // read unless the ring item writes them all.
  for (int e = 0; e < head_events; ++e) two_pass_event<Config>(p, rows, r, e, group, lane, norm, staging, s_sum);
  if constexpr (Config::kHoistedWindow) {
    // The lean kernels read the request again rather than hold it across the events (registers: the
    // lean C4-512 kernel spilled a field of it; the others spill when they re-read it).
    const StepRequest request = step_request(p, place.request_index);
    write_head_share<Config>(p, RingRows(p, request), request, head_events, thread);
  } else {
    write_head_share<Config>(p, rows, r, head_events, thread);
  }
}

}  // namespace dsv4::cuda::compressor
