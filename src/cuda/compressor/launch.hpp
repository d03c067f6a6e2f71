// src/cuda/compressor/launch.hpp — host entry points of the CUDA compressor backend (plain C++, so
// src/ops/compress.cpp can call them). Arguments arrive validated by plan_compress; these add only
// what the kernels need on top (supported widths, 16-byte alignment).
//
// Plan / run split: plan_compress_step builds a step's metadata on the host; launch_compress_step
// runs the kernel on a stream with that metadata already on the device, and is safe to capture in
// a CUDA graph (one kernel, no host synchronization). run_compress does both for the API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "cuda/compressor/params.hpp"
#include "dsv4/paged_cache.hpp"
#include "ref/compressor_ref.hpp"

namespace dsv4::cuda {

// One step's device metadata: [StepRequest × num_requests | int64 item_begin × (num_requests + 1) |
// int32 pages | SplitEvent × split_events | int32 counters × split_events (zero)], each section
// 16-byte aligned, uploaded with a single copy (params.hpp); then, not uploaded, the split events'
// partials scratch, or an online step's saved starting snapshots (params.hpp, online_kept_counts), up
// to device_bytes. The device buffer must hold device_bytes.
//
// Path rule: a two-pass long-window step (C128, windows of ≤ 128 candidates) with 1..kMaxSplitEvents
// (128) events, all of whose ring items can write in parallel with the events (no event reads a ring
// row the step writes: every decode step of ≤ 8 tokens, a fresh prefill, a chunk from a block
// boundary with more than coff events or a ring write within the ring), spreads every event over
// split units (split_events > 0, the split kernel; one item a request) — but a request of at most 8
// tokens whose slice chains are complete keeps them instead (chains_kept, chain_requests: it folds
// the slice it completes, or computes its event from them; runtime/slice_chains.hpp). Every other step — longer
// prefills, a chunk inside a block whose ring write is longer than the ring — runs the prefill
// kernel. Both fold a window in the same fixed slice shape (config.hpp), so the bytes do not depend
// on the path.
struct CompressStepLayout {
  std::vector<std::uint8_t> bytes;  // what to upload
  std::size_t item_begin_offset = 0;
  std::size_t pages_offset = 0;
  std::size_t split_events_offset = 0;
  std::size_t split_counters_offset = 0;
  std::size_t split_partials_offset = 0;  // ≥ bytes.size()
  std::size_t online_saved_offset = 0;    // ≥ bytes.size(); used where online_saved
  std::size_t device_bytes = 0;           // size of the device buffer: bytes + the scratch
  bool online_saved = false;              // an online step saving a head's snapshot (num_requests × 3·c floats)
  std::int32_t num_requests = 0;    // requests bringing ≥ 1 token
  std::int64_t num_items = 0;       // work items (0: nothing to launch)
  std::int32_t split_events = 0;    // head events computed by split units
  std::int32_t chain_requests = 0;  // requests whose heads keep their slice chains (split kernel also then)
  std::vector<bool> chains_kept;    // per planned request (CompressPlan order): its chains were kept
  std::int32_t ring_pieces = 0;     // ring items per request (params.hpp; 0: online, no ring items)
  bool one_item_per_request = false;
  bool long_requests = false;       // some request brings more than kRingPiecesMinTokens tokens (a prefill, a chunk)

  // The ring items after the heads and bodies in the grid (KernelParams::ring_items).
  std::int64_t ring_items() const { return static_cast<std::int64_t>(num_requests) * ring_pieces; }
};

// Checks the CUDA-specific requirements and builds the metadata of the step `args` describes.
// Errors (nothing has changed when they are thrown):
//   Error("width")  for a width / entry kind the kernels do not implement (512-wide attention
//                   entries and 128-wide indexer keys are implemented);
//   Error("rope")   unless rope_dim is a multiple of 4 and at most 128;
//   Error("kv"), Error("score"), Error("ape"), Error("norm"), Error("pool"), Error("cache"),
//   Error("outputs.compressed") for a pointer that is not 16-byte aligned or a row stride that is
//                   not a multiple of 4 floats;
//   Error("batch")  when the step has more work items than one grid holds (2^31 − 1).
CompressStepLayout plan_compress_step(const ref::CompressArgs& args);

// How the kernel reads a step's metadata.
enum class StepMetadata {
  // From the kernel parameters when it fits (decode steps of up to 64 requests, one page each),
  // else from device_layout. A captured graph then replays the metadata of the captured step.
  InParametersWhenSmall,
  // Always from device_layout (a serving loop that rewrites device_layout between replays of one
  // captured graph needs this).
  InDeviceMemory,
};

// Launches the step on `stream` (a cudaStream_t; null = the default stream). `device_layout` (16-byte
// aligned, layout.device_bytes long) starts with a copy of layout.bytes and must stay valid until the
// kernel has run; the kernel uses the rest as scratch and leaves the uploaded bytes as they were
// (the split counters return to zero; a slice-chain fold writes the other buffer than it reads), so
// a captured graph may replay it.
// Throws Error("device") when the launch fails.
void launch_compress_step(const ref::CompressArgs& args, const CompressStepLayout& layout, void* device_layout,
                          void* stream, StepMetadata metadata = StepMetadata::InParametersWhenSmall);

// The instantiation of the short-window (C4) kernel that runs steps with body items (prefill,
// chunked prefill); decode steps (one item per request) run the lean one when it is chosen, else
// the 4-block one (also where the lean one cannot take the step: lean_prefill_fits). All three write
// the same bytes (params.hpp, config.hpp). Unless set_short_window_prefill was called, it comes from the
// environment variables DSV4_C4_PREFILL_BLOCKS_PER_SM, "5" (or unset) or "4", and
// DSV4_C4_PREFILL_LEAN, "1" (or unset; with 5 blocks: FiveBlocksPerSMLean, the default) or "0"
// (FiveBlocksPerSM), read once.
// Throws Error naming the variable for another value or "4" with "1" (read again on the next call).
compressor::ShortWindowPrefill short_window_prefill();
// Whether the lean short-window instantiation (ShortWindowPrefill::FiveBlocksPerSMLean) can run the
// step of `args`: its 32-bit positions and per-event offsets fit (launch.cu). A step it cannot run
// takes FiveBlocksPerSM (the same bytes).
bool lean_prefill_fits(const ref::CompressArgs& args);

// Overrides the environment for this process (tests and benches compare both in one process);
// returns the schedule in force before (throws as short_window_prefill when that was the environment's
// and it is invalid). Launches on other host threads see the new schedule from their next step.
compressor::ShortWindowPrefill set_short_window_prefill(compressor::ShortWindowPrefill schedule);

// The blocks a split event takes (params.hpp, split_units): 0, the default, chooses per step — the
// most (one slice a group) whose blocks fit the SMs at once, halved until they do; otherwise a
// power of two, used where it divides the kernel's maximum (else that maximum). Every choice writes
// the same bytes; tests compare them. Returns the setting in force before. Throws Error("units")
// for a negative value or one that is not a power of two.
int set_split_units(int units);

// The online kernel's staging: Automatic (the default) runs steps with body items and at most one
// block a SM with the deep staging (OnlineConfig, config.hpp), others with two stages. Both write the
// same bytes; tests compare them. Returns the choice in force before. Throws Error("stages") for a
// value that is none of OnlineStages' three.
compressor::OnlineStages set_online_stages(compressor::OnlineStages stages);

// plan_compress_step, one upload into stream-ordered scratch, launch_compress_step. Returns, per
// planned request, whether the step kept its slice chains (CompressStepLayout::chains_kept).
std::vector<bool> run_compress(const ref::CompressArgs& args, void* stream = nullptr);

// Floats of a slot's slice chains (runtime/slice_chains.hpp) for `spec`: groups × 2 buffers × 3 × c for
// two-pass long windows without overlap whose windows fit the split path (C128; ratios 24..128) and
// whose rollbacks stay within one slice (max_rollback ≤ 8: rollbacks_keep_chains_exact), else 0.
int slice_chain_floats(const CompressorSpec& spec);

// Zeroes the cache entries at physical `slots` (both byte runs of each entry) on the device.
void clear_entries(const EntryLayout& layout, std::uint8_t* pages /*[num_pages, page_bytes]*/, std::int64_t page_bytes,
                   int entries_per_page, std::span<const std::int64_t> slots, void* stream = nullptr);

// Device-to-device copy of `floats` state floats (fork_prefix).
void copy_state(float* destination, const float* source, std::size_t floats, void* stream = nullptr);

}  // namespace dsv4::cuda
