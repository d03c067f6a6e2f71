// src/cuda/compressor/launch.cu — host side of the CUDA compressor: CUDA-specific checks, the step's
// work items and metadata, the launch, and the small device operations of rollback and fork.
#include "cuda/compressor/launch.hpp"
#include "runtime/slice_chains.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "cuda/compressor/config.hpp"
#include "cuda/compressor/kernels.hpp"
#include "cuda/compressor/params.hpp"
#include "cuda/common/runtime.hpp"
#include "dsv4/error.hpp"
#include "dsv4/rope.hpp"

namespace dsv4::cuda {

namespace {

using compressor::KernelParams;
using compressor::StepRequest;

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

void require_aligned(const void* p, const std::string& name) {
  require(aligned16(p), name, "must be 16-byte aligned for the CUDA compressor");
}

void require_rows(const float* data, std::int64_t stride, std::int64_t rows, const std::string& name) {
  if (rows == 0) return;
  require_aligned(data, name);
  require(stride % 4 == 0, name,
          "row stride " + std::to_string(stride) + " floats is not a multiple of 4 (16-byte rows on CUDA)");
}

std::size_t align16(std::size_t n) { return (n + 15) / 16 * 16; }

// Whether the step's windows are long (C128): more candidates than one group folds; they split over
// groups and, where launch.hpp's rule allows, over split units.
bool has_long_window(const CompressorSpec& spec) {
  return spec.coff() * spec.ratio > compressor::kSingleGroupMaxCandidates;
}

// Events a request's head item computes. Online: the first (it continues the slot's running state).
// Two-pass: params.hpp's rule, as the kernel applies it (two_pass.cuh, head_event_count).
std::int64_t head_events(const CompressorSpec& spec, const StepRequest& r) {
  if (spec.online) return std::min<std::int64_t>(r.num_events, 1);
  return compressor::two_pass_head_events(spec.overlap, r.prefix, r.prefix % spec.ratio != 0, r.num_events);
}

// Whether a two-pass request's ring item writes its ring in parallel with its head: two_pass.cuh's
// ring_item_writes (no head event, or end − first position of event 0's window ≤ R).
bool ring_writes_in_parallel(const CompressorSpec& spec, const StepRequest& r, std::int64_t head, int ring_rows) {
  if (head == 0) return true;
  const std::int64_t entry = r.prefix / spec.ratio;
  const std::int64_t first_read = entry * spec.ratio - ((spec.overlap && entry >= 1) ? spec.ratio : 0);
  return r.prefix + r.new_tokens - first_read <= ring_rows;
}

constexpr const char* kShortWindowPrefillVariable = "DSV4_C4_PREFILL_BLOCKS_PER_SM";
constexpr const char* kLeanVariable = "DSV4_C4_PREFILL_LEAN";

compressor::ShortWindowPrefill short_window_prefill_from_environment() {
  const char* blocks = std::getenv(kShortWindowPrefillVariable);
  const char* lean = std::getenv(kLeanVariable);
  // The lean instantiation (5 blocks only) is the default: measured on the H200, C4-512 prefill 256K
  // 81% -> 95% of copy, C4-128 67% -> 81%, same bytes. "0" = the 5-block kernel it replaced.
  if (lean != nullptr && std::strcmp(lean, "1") != 0 && std::strcmp(lean, "0") != 0) {
    throw Error(kLeanVariable, std::string("must be 0 or 1, got \"") + lean + "\"");
  }
  const bool lean_off = lean != nullptr && std::strcmp(lean, "0") == 0;
  // 5 blocks per SM is the default: measured faster on the H200 (C4-512 prefill 256K 73% -> 81% of copy).
  if (blocks == nullptr || std::strcmp(blocks, "5") == 0) {
    return lean_off ? compressor::ShortWindowPrefill::FiveBlocksPerSM : compressor::ShortWindowPrefill::FiveBlocksPerSMLean;
  }
  if (std::strcmp(blocks, "4") == 0) {
    if (lean != nullptr && !lean_off) throw Error(kLeanVariable, std::string("1 needs ") + kShortWindowPrefillVariable + "=5");
    return compressor::ShortWindowPrefill::FourBlocksPerSM;
  }
  throw Error(kShortWindowPrefillVariable, std::string("must be 4 or 5 (blocks per SM), got \"") + blocks + "\"");
}

}  // namespace

// Positions below 2^31 (32-bit entries, window starts and FastDivisor numerators), divisors in
// [1, 2^31), and every candidate offset from its per-event base — new rows up to K·stride + 2c,
// ring rows up to R·2·coff·c, ape up to m·coff·c floats — within an int (two_pass.cuh, WindowOffsets).
bool lean_prefill_fits(const ref::CompressArgs& a) {
  const CompressorSpec& spec = *a.spec;
  constexpr std::int64_t kIntMax = std::numeric_limits<std::int32_t>::max();
  for (const PlannedRequest& r : a.plan->requests) {
    if (r.prefix_len + r.new_tokens > kIntMax) return false;
  }
  const std::int64_t candidates = spec.coff() * spec.ratio;
  const std::int64_t row_width = spec.coff() * spec.width;
  return spec.ratio >= 1 && a.records_per_slot >= 1 && a.entries_per_page >= 1 &&
         candidates * std::max(a.kv_stride, a.score_stride) + row_width <= kIntMax &&
         static_cast<std::int64_t>(a.records_per_slot) * a.record_floats <= kIntMax &&
         static_cast<std::int64_t>(spec.ratio) * row_width <= kIntMax;
}

namespace {

// The override of set_short_window_prefill; 0 while none.
std::atomic<std::int32_t> short_window_prefill_override{0};
// set_split_units' setting; 0: automatic.
std::atomic<std::int32_t> split_units_setting{0};

// Split units a split event of `events` takes: the setting if one is in force, else
// split_units_by_waves (params.hpp) over the SMs' room. A T = 8K C128 prefill's 64 events at 8 units
// ran two waves of ≈ 8 µs at 2 blocks a SM (H200); at 4 units its 17 ring pieces (other_blocks)
// still started ≈ 11 µs late, in a second wave. A decode step's heads and ring items are short
// blocks, so the caller counts none for it: saving a wave of them by lengthening every event's chain
// was a loss (B = 256, n = 8 at one unit: 18.4 → 26.7 µs).
template <class Config>
int split_units_for(std::int64_t events, std::int64_t other_blocks) {
  const int set = split_units_setting.load(std::memory_order_relaxed);
  if (set != 0) return Config::kSplitUnits % set == 0 ? set : Config::kSplitUnits;
  const std::int64_t slots = static_cast<std::int64_t>(multiprocessor_count()) * Config::kMinBlocksPerSM;
  return compressor::split_units_by_waves(events, other_blocks, slots, Config::kSplitUnits);
}

// set_online_stages' choice (OnlineStages::Automatic unless set).
std::atomic<std::int32_t> online_stages_choice{0};

}  // namespace

compressor::ShortWindowPrefill short_window_prefill() {
  const std::int32_t set = short_window_prefill_override.load(std::memory_order_relaxed);
  if (set != 0) return static_cast<compressor::ShortWindowPrefill>(set);
  static const compressor::ShortWindowPrefill from_environment = short_window_prefill_from_environment();
  return from_environment;
}

int set_split_units(int units) {
  require(units >= 0 && (units & (units - 1)) == 0, "units",
          "split units must be 0 (automatic) or a power of two, got " + std::to_string(units));
  return split_units_setting.exchange(units);
}

compressor::OnlineStages set_online_stages(compressor::OnlineStages stages) {
  using compressor::OnlineStages;
  require(stages == OnlineStages::Automatic || stages == OnlineStages::TwoStages || stages == OnlineStages::Deep,
          "stages", "the online kernel's staging must be Automatic, TwoStages or Deep, got " +
                        std::to_string(static_cast<std::int32_t>(stages)));
  return static_cast<compressor::OnlineStages>(online_stages_choice.exchange(static_cast<std::int32_t>(stages)));
}

compressor::ShortWindowPrefill set_short_window_prefill(compressor::ShortWindowPrefill schedule) {
  const compressor::ShortWindowPrefill before = short_window_prefill();
  short_window_prefill_override.store(static_cast<std::int32_t>(schedule), std::memory_order_relaxed);
  return before;
}

CompressStepLayout plan_compress_step(const ref::CompressArgs& a) {
  const CompressorSpec& spec = *a.spec;
  const CompressPlan& plan = *a.plan;
  const bool attention = spec.output == EntryKind::Attention;
  require((attention && spec.width == 512) || (!attention && spec.width == 128), "width",
          std::string("the CUDA compressor implements 512-wide attention entries and 128-wide indexer keys, not ") +
              entry_kind_name(spec.output) + " entries of width " + std::to_string(spec.width));
  require(spec.rope.rope_dim % 4 == 0 && spec.rope.rope_dim / 2 <= compressor::kMaxRopePairs, "rope",
          "the CUDA compressor needs rope_dim to be a multiple of 4 and at most " +
              std::to_string(2 * compressor::kMaxRopePairs) + ", got " + std::to_string(spec.rope.rope_dim));
  require_rows(a.kv, a.kv_stride, plan.total_rows, "kv");
  require_rows(a.score, a.score_stride, plan.total_rows, "score");
  require_aligned(a.ape, "ape");
  require_aligned(a.norm, "norm");
  require_aligned(a.state, "pool");
  require_aligned(a.cache, "cache");
  if (a.out_compressed) require_aligned(a.out_compressed, "outputs.compressed");

  // The split (decode) path, layout rule in launch.hpp: checked per request below.
  bool split_step = !spec.online && has_long_window(spec) &&
                    spec.coff() * spec.ratio <= compressor::kMaxSplitSlices * compressor::kSliceCandidates;
  std::vector<compressor::SplitEvent> split;
  std::vector<StepRequest> requests;
  std::vector<std::int64_t> item_begin{0};
  std::int64_t step_events = 0;
  std::int32_t ring_pieces = 1;  // config.hpp, ring_write_pieces: from the longest write of a request
  bool long_requests = false;
  const int unit_threads = spec.width / 4 * compressor::two_pass_groups(spec.width, has_long_window(spec));
  std::vector<std::int32_t> pages;
  std::vector<std::int64_t> planned_index;  // of each step request in plan.requests
  bool online_saved = false;  // some head's starting snapshot is saved in the scratch (params.hpp)
  const int per_page = a.entries_per_page;
  for (const PlannedRequest& r : plan.requests) {
    if (r.new_tokens == 0) continue;  // nothing to read or write (also every padding request)
    StepRequest s;
    s.prefix = r.prefix_len;
    s.new_tokens = r.new_tokens;
    s.row_begin = r.row_begin;
    s.first_event = static_cast<std::int32_t>(r.first_event);
    s.slot = r.slot;
    s.num_events = static_cast<std::int32_t>(r.num_events);
    s.page_offset = static_cast<std::int32_t>(pages.size());
    if (r.new_tokens > compressor::kRingPiecesMinTokens) {
      long_requests = true;
      const int rows = static_cast<int>(std::min<std::int64_t>(r.new_tokens, a.records_per_slot));
      ring_pieces = std::max(ring_pieces, compressor::ring_write_pieces(rows, a.record_floats, unit_threads));
    }
    if (r.num_events > 0) {
      const std::int64_t first_entry = r.prefix_len / spec.ratio;
      const std::int64_t last_entry = first_entry + r.num_events - 1;
      s.first_page = static_cast<std::int32_t>(first_entry / per_page);
      // The physical page of each logical page, read off the first event stored in it.
      for (std::int64_t page = first_entry / per_page; page <= last_entry / per_page; ++page) {
        const std::int64_t event = std::max<std::int64_t>(0, page * per_page - first_entry);
        pages.push_back(plan.events[static_cast<std::size_t>(r.first_event + event)].cache_slot / per_page);
      }
    }
    // A split step spreads every event of every request over split units (but those computed from
    // slice chains, below), so its heads have nothing to do (none is launched), and its ring items
    // must write the whole ring (in parallel with the events: no head event reads a row the step writes).
    // Decode steps (≤ 8 tokens, m > 8) always qualify; so does a fresh prefill, or a chunk from a
    // block boundary with more than coff events.
    const std::int64_t head = head_events(spec, s);
    split_step = split_step && ring_writes_in_parallel(spec, s, head, a.records_per_slot);
    step_events += r.num_events;
    if (spec.online) {
      online_saved = online_saved ||
                     compressor::online_kept_counts(s.prefix, s.new_tokens, s.num_events, spec.ratio, spec.max_rollback)
                         .start_saved;
    }
    requests.push_back(s);
    planned_index.push_back(static_cast<std::int64_t>(&r - plan.requests.data()));
    item_begin.push_back(item_begin.back() + 1 + (r.num_events - head));
  }
  split_step = split_step && step_events <= compressor::kMaxSplitEvents;
  // In a split step, a request of at most one slice's tokens whose slice chains are complete keeps
  // them (runtime/slice_chains.hpp): a block of its own folds the slice it completes into them, or
  // computes its event from them and the last slice (two_pass.cuh, keep_slice_chains); its events are
  // no split events.
  const bool chains = split_step && a.chains != nullptr && slice_chain_floats(spec) > 0;
  std::vector<bool> chains_kept(plan.requests.size(), false);
  std::int32_t chain_requests = 0;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    StepRequest& s = requests[i];
    const PlannedRequest& r = plan.requests[static_cast<std::size_t>(planned_index[i])];
    if (chains && r.chains_complete && s.new_tokens <= compressor::kSliceCandidates) {
      chains_kept[static_cast<std::size_t>(planned_index[i])] = true;
      s.chain = s.num_events > 0 || completes_slice(s.prefix, s.prefix + s.new_tokens);
      chain_requests += s.chain;
      continue;
    }
    for (std::int64_t e = 0; split_step && e < s.num_events; ++e) {
      compressor::SplitEvent event;
      event.request = s;
      event.event = static_cast<std::int32_t>(e);
      event.page = static_cast<std::int32_t>(plan.events[static_cast<std::size_t>(r.first_event + e)].cache_slot / per_page);
      split.push_back(event);
    }
  }
  if (split_step) {  // one item a request, the head, which has nothing to do (the kernel skips it)
    for (std::size_t i = 0; i < item_begin.size(); ++i) item_begin[i] = static_cast<std::int64_t>(i);
    // The requests with a slice or an event to compute from their chains first: the kernel gives
    // them the blocks after the split units (two_pass_kernel). (Nothing else depends on the order:
    // each request carries its rows, pages and output rows.)
    std::stable_partition(requests.begin(), requests.end(), [](const StepRequest& r) { return r.chain != 0; });
  }

  CompressStepLayout layout;
  layout.num_requests = static_cast<std::int32_t>(requests.size());
  layout.num_items = item_begin.back();
  layout.one_item_per_request = layout.num_items == layout.num_requests;
  layout.long_requests = long_requests;
  layout.ring_pieces = spec.online ? 0 : ring_pieces;
  require(layout.num_items + layout.ring_items() <= std::numeric_limits<std::int32_t>::max(), "batch",
          "the step has " + std::to_string(layout.num_items + layout.ring_items()) +
              " work items, more than one CUDA grid holds");
  layout.item_begin_offset = align16(requests.size() * sizeof(StepRequest));
  layout.pages_offset = layout.item_begin_offset + align16(item_begin.size() * sizeof(std::int64_t));
  layout.split_events = static_cast<std::int32_t>(split.size());
  layout.chain_requests = chain_requests;
  layout.chains_kept = std::move(chains_kept);
  layout.split_events_offset = layout.pages_offset + align16(pages.size() * sizeof(std::int32_t));
  layout.split_counters_offset = layout.split_events_offset + align16(split.size() * sizeof(compressor::SplitEvent));
  layout.bytes.assign(layout.split_counters_offset + split.size() * sizeof(std::int32_t), 0);  // counters start at 0
  std::memcpy(layout.bytes.data(), requests.data(), requests.size() * sizeof(StepRequest));
  std::memcpy(layout.bytes.data() + layout.item_begin_offset, item_begin.data(), item_begin.size() * sizeof(std::int64_t));
  std::memcpy(layout.bytes.data() + layout.pages_offset, pages.data(), pages.size() * sizeof(std::int32_t));
  if (!split.empty()) {
    std::memcpy(layout.bytes.data() + layout.split_events_offset, split.data(), split.size() * sizeof(compressor::SplitEvent));
  }
  layout.split_partials_offset = align16(layout.bytes.size());
  layout.device_bytes = layout.split_partials_offset + split.size() * compressor::kMaxSplitSlices * 3 *
                                                           static_cast<std::size_t>(spec.width) * sizeof(float);
  // (Online steps have no split events: their scratch starts where the partials would.)
  layout.online_saved = online_saved;
  layout.online_saved_offset = layout.split_partials_offset;
  if (online_saved) {
    layout.device_bytes = layout.online_saved_offset +
                          requests.size() * 3 * static_cast<std::size_t>(spec.width) * sizeof(float);
  }
  return layout;
}

void launch_compress_step(const ref::CompressArgs& a, const CompressStepLayout& layout, void* device_layout,
                          void* stream, StepMetadata metadata) {
  if (layout.num_items == 0) return;
  const CompressorSpec& spec = *a.spec;
  KernelParams p;
  static_cast<ref::CompressBuffers&>(p) = a;
  const auto* base = static_cast<const std::uint8_t*>(device_layout);
  p.requests = reinterpret_cast<const StepRequest*>(base);
  p.item_begin = reinterpret_cast<const std::int64_t*>(base + layout.item_begin_offset);
  p.pages = reinterpret_cast<const std::int32_t*>(base + layout.pages_offset);
  p.split_events_count = layout.split_events;
  if (layout.split_events > 0) {
    auto* writable = static_cast<std::uint8_t*>(device_layout);
    p.split_events = reinterpret_cast<const compressor::SplitEvent*>(base + layout.split_events_offset);
    p.split_counters = reinterpret_cast<std::int32_t*>(writable + layout.split_counters_offset);
    p.split_partials = reinterpret_cast<float*>(writable + layout.split_partials_offset);
    // (A split unit is one block, as is every other unit of a long window: config.hpp.) A prefill's
    // ring pieces (more than one a request) write many rows each; a decode step's blocks are short.
    const std::int64_t other_blocks = layout.ring_pieces > 1 ? layout.ring_items() : 0;  // (no head runs)
    p.split_units = spec.width == 512
                        ? split_units_for<compressor::TwoPassConfig<512, true, true>>(layout.split_events, other_blocks)
                        : split_units_for<compressor::TwoPassConfig<128, true, true>>(layout.split_events, other_blocks);
  }
  if (layout.online_saved) {
    p.online_saved = reinterpret_cast<float*>(static_cast<std::uint8_t*>(device_layout) + layout.online_saved_offset);
  }
  p.chain_requests = layout.chain_requests;
  p.num_requests = layout.num_requests;
  p.one_item_per_request = layout.one_item_per_request ? 1 : 0;
  p.num_items = layout.num_items;
  // Decode steps small enough travel in the parameters: [requests | pad to 16 | pages] (no item_begin:
  // one item per request needs no search).
  const std::size_t request_bytes = static_cast<std::size_t>(layout.num_requests) * sizeof(StepRequest);
  const std::size_t page_bytes = layout.split_events_offset - layout.pages_offset;  // with its padding
  const std::size_t inline_pages_offset = align16(request_bytes);
  if (metadata == StepMetadata::InParametersWhenSmall && layout.one_item_per_request &&
      inline_pages_offset + page_bytes <= sizeof(p.inline_metadata)) {
    p.metadata_inline = 1;
    p.inline_pages_offset = static_cast<std::int32_t>(inline_pages_offset);
    std::memcpy(p.inline_metadata, layout.bytes.data(), request_bytes);
    std::memcpy(p.inline_metadata + inline_pages_offset, layout.bytes.data() + layout.pages_offset, page_bytes);
  }
  // The split events too, where they fit after what the parameters already carry.
  const std::size_t inline_used = p.metadata_inline ? align16(inline_pages_offset + page_bytes) : 0;
  const std::size_t split_bytes = static_cast<std::size_t>(layout.split_events) * sizeof(compressor::SplitEvent);
  if (metadata == StepMetadata::InParametersWhenSmall && layout.split_events > 0 &&
      inline_used + split_bytes <= sizeof(p.inline_metadata)) {
    p.split_events_inline = 1;
    p.inline_split_offset = static_cast<std::int32_t>(inline_used);
    std::memcpy(p.inline_metadata + inline_used, layout.bytes.data() + layout.split_events_offset, split_bytes);
  }
  p.ring_pieces = std::max(layout.ring_pieces, 1);
  p.ring_items = layout.ring_items();
  p.ratio = spec.ratio;
  p.overlap = spec.overlap ? 1 : 0;
  p.max_rollback = spec.max_rollback;
  p.rope_dim = spec.rope.rope_dim;
  p.eps = spec.eps;
  p.output = spec.output == EntryKind::Attention    ? compressor::OutputKind::Attention
             : spec.output == EntryKind::IndexerFP8 ? compressor::OutputKind::IndexerFP8
                                                    : compressor::OutputKind::IndexerFP4;
  const RopeTable rope(spec.rope);
  std::copy(rope.frequencies().begin(), rope.frequencies().end(), p.rope_frequencies);

  const bool long_window = has_long_window(spec);
  // Decode steps (no body item) run the lean kernel too (measured on the H200: −0.3..0.6 µs at
  // B ≤ 256, −2.3 µs for C4-512 B=1024 n=4); with the lean kernel switched off they run the 4-block one.
  compressor::ShortWindowPrefill short_window = short_window_prefill();
  if (layout.one_item_per_request && short_window != compressor::ShortWindowPrefill::FiveBlocksPerSMLean)
    short_window = compressor::ShortWindowPrefill::FourBlocksPerSM;
  p.ratio_divisor = make_fast_divisor(static_cast<std::uint32_t>(spec.ratio));  // every two-pass kernel
  if (short_window == compressor::ShortWindowPrefill::FiveBlocksPerSMLean) {
    if (!long_window && !spec.online && lean_prefill_fits(a)) {
      p.ring_divisor = make_fast_divisor(static_cast<std::uint32_t>(a.records_per_slot));
      p.page_divisor = make_fast_divisor(static_cast<std::uint32_t>(a.entries_per_page));
    } else {  // same bytes
      short_window = layout.one_item_per_request ? compressor::ShortWindowPrefill::FourBlocksPerSM
                                                 : compressor::ShortWindowPrefill::FiveBlocksPerSM;
    }
  }
  // The online kernel: deep staging where a step with bodies has at most one block a SM.
  auto online_stages = static_cast<compressor::OnlineStages>(online_stages_choice.load(std::memory_order_relaxed));
  if (spec.online && online_stages == compressor::OnlineStages::Automatic) {
    const std::int64_t units_per_block = spec.width == 512 ? compressor::OnlineConfig<512>::kUnitsPerBlock
                                                           : compressor::OnlineConfig<128>::kUnitsPerBlock;
    const std::int64_t blocks = (layout.num_items + units_per_block - 1) / units_per_block;
    // (One item a request: decode steps, a few rows each, and prefills shorter than about two
    // blocks; the latter could gain too, not measured.)
    online_stages = !layout.one_item_per_request && blocks <= multiprocessor_count() ? compressor::OnlineStages::Deep
                                                                                     : compressor::OnlineStages::TwoStages;
  }
  auto s = static_cast<cudaStream_t>(stream);
  // long_requests: the lean and split kernels' evict-first instantiations (config.hpp, WithEvictFirstRows).
  const cudaError_t status =
      spec.width == 512
          ? compressor::launch_attention_width(p, spec.online, long_window, short_window, online_stages,
                                               layout.long_requests, s)
          : compressor::launch_indexer_width(p, spec.online, long_window, short_window, online_stages,
                                             layout.long_requests, s);
  check_cuda(status, "compressor kernel launch");
}

std::vector<bool> run_compress(const ref::CompressArgs& args, void* stream) {
  const CompressStepLayout layout = plan_compress_step(args);
  if (layout.num_items == 0) return layout.chains_kept;
  auto s = static_cast<cudaStream_t>(stream);
  void* device_layout = nullptr;
  check_cuda(cudaMallocAsync(&device_layout, layout.device_bytes, s), "cudaMallocAsync(step metadata)");
  // The host bytes may go away on return: a copy from pageable memory is staged before it returns.
  cudaError_t status = cudaMemcpyAsync(device_layout, layout.bytes.data(), layout.bytes.size(), cudaMemcpyHostToDevice, s);
  if (status == cudaSuccess) {
    try {
      launch_compress_step(args, layout, device_layout, stream);
    } catch (...) {
      cudaFreeAsync(device_layout, s);
      throw;
    }
  }
  const cudaError_t freed = cudaFreeAsync(device_layout, s);
  check_cuda(status, "cudaMemcpyAsync(step metadata)");
  check_cuda(freed, "cudaFreeAsync(step metadata)");
  return layout.chains_kept;
}

int slice_chain_floats(const CompressorSpec& spec) {
  static_assert(compressor::kSliceCandidates == kChainSliceRows, "the host's slices are the kernels'");
  // (keep_slice_chains starts a group whose range holds no slice before the block's last empty.)
  const int groups = compressor::two_pass_groups(spec.width, true);
  const bool chained = !spec.online && !spec.overlap && has_long_window(spec) &&
                       spec.ratio % compressor::kSliceCandidates == 0 &&
                       spec.ratio <= compressor::kMaxSplitSlices * compressor::kSliceCandidates &&
                       rollbacks_keep_chains_exact(spec.max_rollback);
  return chained ? groups * 2 * 3 * spec.width : 0;  // two buffers a group
}

void clear_entries(const EntryLayout& layout, std::uint8_t* pages, std::int64_t page_bytes, int entries_per_page,
                   std::span<const std::int64_t> slots, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  for (const std::int64_t slot : slots) {
    std::uint8_t* page = pages + slot / entries_per_page * page_bytes;
    const int i = static_cast<int>(slot % entries_per_page);
    check_cuda(cudaMemsetAsync(page + layout.data_offset(i), 0, static_cast<std::size_t>(layout.data_bytes()), s),
               "cudaMemsetAsync(cache entry)");
    check_cuda(cudaMemsetAsync(page + layout.scale_offset(i, entries_per_page), 0,
                               static_cast<std::size_t>(layout.scale_bytes()), s),
               "cudaMemsetAsync(cache entry scales)");
  }
}

void copy_state(float* destination, const float* source, std::size_t floats, void* stream) {
  check_cuda(cudaMemcpyAsync(destination, source, floats * sizeof(float), cudaMemcpyDeviceToDevice,
                             static_cast<cudaStream_t>(stream)),
             "cudaMemcpyAsync(state)");
}

}  // namespace dsv4::cuda
