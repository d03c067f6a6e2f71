// src/cuda/compressor/params.hpp — what the host hands the compressor kernels (plain C++, no CUDA
// types), so the host planner in launch.cu and the device headers share one definition.
//
// Work is split into "items": every request of the step that brings tokens has one HEAD item and
// one BODY item per further compress event (two-pass kernels add ring_pieces RING items per request,
// see KernelParams::ring_items).
//   head: the events that read the old state (two-pass: those of the first coff events whose windows
//         start before the prefix — none in a fresh prefill; online: the first block, continued from
//         the snapshot), then
//         the state writes of the request (after a barrier of its own unit; two-pass: unless its
//         ring item writes them);
//   body: one event whose window lies entirely in this step's new rows;
//   ring (two-pass): the ring writes of a request whose writes cannot alias its head's reads (no
//         head event, or every decode step), in parallel with its head; first in the grid where the
//         step has bodies, last in decode steps.
//   split unit (two-pass long windows, steps whose ring items all write in parallel: launch.cu): one
//         block computing a share of one event's candidate slices (config.hpp); the request's head
//         then computes nothing (a split step has one item a request, and its grid no head), and the
//         last split unit of the event to finish merges the partials and stores the entry. Split
//         units come first in the grid, then one block per request that computes a slice or its
//         event from its slice chains instead (runtime/slice_chains.hpp; those requests first in the
//         step), then the ring items. Only events and slices read ring rows, never one the step
//         writes, so the ring item's rule holds.
// Only a request's head reads its state, and a state write runs in parallel with it only where it
// cannot touch those reads, so no state write can overtake a read of the same step (SPEC §6), with
// one kernel launch per step.
#pragma once

#include <cstdint>

#include "cuda/common/fast_divisor.hpp"
#include "ref/compress_buffers.hpp"

namespace dsv4::cuda::compressor {

// RoPE pairs the kernel parameters carry (r/2 ≤ 64, i.e. rope_dim ≤ 128).
inline constexpr int kMaxRopePairs = 64;

// Bytes of step metadata the kernel parameters can carry (KernelParams::inline_metadata): a decode
// step of up to 64 requests with one entry page each ([StepRequest × N | int32 pages], 52 B per
// request), keeping the parameters within the classic 4 KB.
inline constexpr int kInlineMetadataBytes = 3392;

// One request of a step that brings at least one token. 48 bytes.
struct StepRequest {
  std::int64_t prefix = 0;       // tokens before this step = position of its first new row
  std::int64_t new_tokens = 0;   // ≥ 1
  std::int64_t row_begin = 0;    // its first row in kv / score
  std::int32_t first_event = 0;  // its first event's row in the optional outputs
  std::int32_t chain = 0;        // 1: it keeps its slice chains and completes a slice or its block (launch.cu)
  std::int32_t slot = 0;         // state slot (≥ 1)
  std::int32_t num_events = 0;   // entries completed in this step
  std::int32_t page_offset = 0;  // index in StepLayout::pages of the page of its first event
  std::int32_t first_page = 0;   // logical page held at pages[page_offset]
};
static_assert(sizeof(StepRequest) == 48, "uploaded as raw bytes");

// Events a two-pass request's head item computes: those of its first coff whose windows start below
// the prefix (they read ring rows, which the step's ring write replaces; the windows' starts grow
// with the event, so these lead). Event e's window starts at (prefix / m + e)·m, one block earlier
// with overlap once that entry is ≥ 1: event 0's starts below the prefix iff it overlaps the
// previous block (any prefix > 0) or the prefix is inside a block, event 1's (overlap) iff the
// latter. The rest read this step's rows only and run as bodies: a fresh prefill has no head event.
// One rule for the host planner and the kernel (launch.cu, two_pass.cuh), which differ only in how
// they find `inside_block` (prefix mod m ≠ 0).
constexpr int two_pass_head_events(bool overlap, std::int64_t prefix, bool inside_block, int num_events) {
  // A request with no more events than coff keeps them all in its head (one item per request: a
  // decode step of up to 8 tokens keeps the decode path — metadata in the parameters, staged ring
  // writes — as before the thirteenth session).
  if (num_events <= (overlap ? 2 : 1)) return num_events;
  return overlap ? (prefix > 0 ? (inside_block ? 2 : 1) : 0) : (inside_block ? 1 : 0);
}

// Online kernel (online.cuh): which counts' snapshots a request keeps, and whether its head's
// starting snapshot is saved before the step. The kept counts are keep_from .. end (the last
// max_rollback + 1, none at or below the prefix), each written in place by the item that runs its
// row: the head (its first block, then the step's last, partial block, re-run from its first row) or
// a body (its whole block). A mid-block head reads its starting snapshot from slot prefix mod
// `slots` while the bodies run; where a body's count lands on that slot (at most one kept count can:
// they are at most `slots` consecutive ones), online_save_kernel copies
// the snapshot into the step's scratch first and the head reads it there. Plain C++ for the host's
// plan and tests (test_compressor.cpp checks the partition of the kept counts and the slot rule).
struct OnlineKeptCounts {
  std::int64_t keep_from = 0;          // first kept count
  std::int64_t first_block_start = 0;  // the head's first block: [start, end)
  std::int64_t first_block_end = 0;
  bool start_saved = false;            // the head reads its starting snapshot from the scratch
};
constexpr OnlineKeptCounts online_kept_counts(std::int64_t prefix, std::int64_t new_tokens, int num_events, int ratio,
                                              int max_rollback) {
  const int slots = max_rollback + 1;
  const std::int64_t end = prefix + new_tokens;
  OnlineKeptCounts k;
  k.keep_from = end - max_rollback > prefix + 1 ? end - max_rollback : prefix + 1;
  k.first_block_start = prefix / ratio * ratio;
  k.first_block_end = end < k.first_block_start + ratio ? end : k.first_block_start + ratio;
  // No body (num_events ≤ 1: every decode step), or a head that reads no snapshot: nothing to save.
  if (num_events <= 1 || prefix == k.first_block_start) return k;
  // The lowest kept count past the first block in the head's slot (≥ lowest, ≡ prefix); the bodies
  // write the counts up to the last block boundary (the head re-runs the rest, after its read).
  const std::int64_t lowest = k.keep_from > k.first_block_end + 1 ? k.keep_from : k.first_block_end + 1;
  k.start_saved = lowest + ((prefix - lowest) % slots + slots) % slots <= end / ratio * ratio;
  return k;
}

// The units a split event takes (launch.cu, split_units_for): `max_units` (one slice a group) while
// the step's blocks — events · units split blocks and `other_blocks` after them — need more waves of
// the `slots` (SMs · blocks a SM) than with half the units, each group then folding twice the
// slices. Halving stops at the first halving that saves no wave: a wave saved further down would
// cost every event's chain more than it gains (launch.cu counts only a prefill's long ring pieces
// in other_blocks). A power of two in [1, max_units]; with no other blocks, the largest units whose
// split blocks fit the slots (or 1). Plain C++ for the host's tests (test_compressor.cpp).
constexpr int split_units_by_waves(std::int64_t events, std::int64_t other_blocks, std::int64_t slots,
                                   int max_units) {
  const auto waves = [&](int units) { return (events * units + other_blocks + slots - 1) / slots; };
  int units = max_units;
  while (units > 1 && waves(units / 2) < waves(units)) units /= 2;
  return units;
}

// An event computed by split units: its request and entry page (copies, so a split unit's first load
// is its only metadata load) and the event index. 64 bytes.
struct SplitEvent {
  StepRequest request;
  std::int32_t event = 0;
  std::int32_t page = 0;  // physical cache page of its entry
  std::int32_t padding[2] = {};
};
static_assert(sizeof(SplitEvent) == 64, "uploaded as raw bytes");

// The split path's step rule (launch.hpp, launch.cu): a two-pass long-window step whose windows have at
// most kMaxSplitSlices · kSliceCandidates candidates and whose ring items can all write in parallel
// with its events spreads every event over split units when it has 1..kMaxSplitEvents of them (more
// fill the GPU on their own; the partials scratch, 16 · 3 · c floats per event, stays ≤ 12 MB).
// Every other step runs the unsplit (prefill) kernel.
inline constexpr int kMaxSplitEvents = 128;

enum class OutputKind : std::int32_t { Attention = 0, IndexerFP8 = 1, IndexerFP4 = 2 };

// The online kernel's staging (config.hpp, OnlineConfig): Automatic (launch.cu) takes Deep for steps
// with body items and at most one block a SM, else TwoStages. Both write the same bytes.
enum class OnlineStages : std::int32_t { Automatic = 0, TwoStages = 2, Deep = 8 };

// Which instantiation of the short-window (C4) two-pass kernel runs the steps that have body items
// (prefill, chunked prefill; launch.cu). All three write the same bytes. Decode steps (one item per
// request) run FiveBlocksPerSMLean when it is chosen, else FourBlocksPerSM.
enum class ShortWindowPrefill : std::int32_t {
  FourBlocksPerSM = 4,  // TwoPassConfig<c, false> (≤ 128 registers)
  FiveBlocksPerSM = 5,  // TwoPassFiveBlocksConfig<c> (≤ 96 registers)
  // TwoPassFiveBlocksConfig<c, true>: the same with fewer instructions per event (config.hpp: the
  // divisions and window addresses once per event in 32 bits, two_pass.cuh WindowOffsets).
  // launch.cu runs it only for steps whose positions and offsets fit (launch.hpp:
  // lean_prefill_fits); other steps take FiveBlocksPerSM.
  FiveBlocksPerSMLean = 6,
};

// The step's buffers (ref::CompressBuffers, first: the kernels read them at the offsets they always
// had), then what only the kernels need.
struct KernelParams : ref::CompressBuffers {
  // The step (device copies of StepLayout's arrays).
  const StepRequest* requests = nullptr;   // [num_requests]
  const std::int64_t* item_begin = nullptr;  // [num_requests + 1] first item of each request
  const std::int32_t* pages = nullptr;     // physical pages of the entries the step completes
  std::int32_t num_requests = 0;
  std::int32_t one_item_per_request = 0;   // 1: item i is request i's head (decode steps: no search)
  std::int64_t num_items = 0;
  // Two-pass kernels: ring_pieces ring items per request after the other items (item num_items +
  // i·ring_pieces + k writes piece k of request i's ring, when that can run in parallel with its
  // head, two_pass.cuh; config.hpp ring_write_pieces); 0 for online.
  std::int64_t ring_items = 0;
  std::int32_t ring_pieces = 1;
  // Small decode steps (one item per request): the requests and pages travel in the parameters
  // (constant bank, written by the launch), so a unit's first load does not wait on a DRAM miss.
  // 1: requests at inline_metadata[0], pages at inline_metadata[inline_pages_offset]; the pointers
  // above are then not read.
  std::int32_t metadata_inline = 0;
  std::int32_t inline_pages_offset = 0;
  // The compressor.
  std::int32_t ratio = 0;         // m
  std::int32_t overlap = 0;       // 1: b branch over block n−1 (coff = 2)
  std::int32_t max_rollback = 0;
  std::int32_t rope_dim = 0;      // r, a multiple of 4 (each lane's 4 channels rotate or not together)
  OutputKind output = OutputKind::Attention;
  double eps = 0;                 // RMSNorm eps
  float rope_frequencies[kMaxRopePairs] = {};  // f_i, float32, as RopeTable::frequencies()
  alignas(16) std::uint8_t inline_metadata[kInlineMetadataBytes] = {};  // [StepRequest × N | pad | int32 pages | pad | SplitEvent × E]
  // (Last: the fields above keep the offsets the other kernels had.)
  // Two-pass long windows, split (decode) instantiation only: split_events_count head events run as
  // split_units blocks each, grid blocks [0, split_events_count · split_units). split_units divides
  // the config's kSplitUnits; each group of a unit folds kMaxSplitSlices / (split_units · kGroups)
  // slices, each slice's partial from scratch, so the merge — and the bytes — never depend on it.
  const SplitEvent* split_events = nullptr;  // [split_events_count] (device copy of the layout's)
  float* split_partials = nullptr;           // [split_events_count, kMaxSplitSlices, 3 (max | sum | weighted), c] scratch
  std::int32_t* split_counters = nullptr;    // [split_events_count] zero between launches (the merging block resets)
  std::int32_t split_events_count = 0;
  std::int32_t split_units = 0;
  // 1: the split events are at inline_metadata[inline_split_offset] (after the inline requests and
  // pages, or alone when those are in device memory); split_events is then not read.
  std::int32_t split_events_inline = 0;
  std::int32_t inline_split_offset = 0;
  // Requests whose heads keep their slice chains (StepRequest::chain; the split instantiation runs
  // them, with or without split events).
  std::int32_t chain_requests = 0;
  // Online steps where a head's starting snapshot is saved (online_kept_counts): [num_requests, 3·c]
  // scratch, request i's at row i (copied by online_save_kernel before the step's kernel).
  float* online_saved = nullptr;
  // Short-window lean instantiation only (ShortWindowPrefill::FiveBlocksPerSMLean): the
  // divisors of its per-event integer arithmetic (m, R = records_per_slot, B = entries_per_page).
  FastDivisor ratio_divisor, ring_divisor, page_divisor;
};
static_assert(sizeof(KernelParams) <= 4096, "kernel parameters stay within the classic 4 KB");

}  // namespace dsv4::cuda::compressor
