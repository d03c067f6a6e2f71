// bench/bench_compressor.cu — the CUDA compressors (issue 4 item 8).
//
// Prefill: one request, T ∈ {8K, 64K, 256K} new rows, for C4-512 (attention), C4-128 (indexer
// FP8), C128 and online C128. Bytes moved = the float32 kv and score rows read once + the cache
// entries written + the state written (two-pass: the last R ring rows; online: max_rollback + 1
// snapshots); ceiling = the card's measured copy bandwidth. The kernel is timed alone (metadata
// uploaded beforehand), L2 flushed before every launch, median of 50.
// Chunked prefill: one request, 8K new rows on a prefix of 65536 (a block boundary) or 65538 tokens,
// over a random state; checked against the CPU reference.
// Decode: B ∈ {1, 8, 64, 256, 1024} requests with 1 or 4 new tokens each, and B ∈ {1, 256} with 8
// (the most draft tokens a step takes), random prefixes (every offset within a block occurs) over a
// random state. The step's kernel is captured in a CUDA graph
// with its metadata already on the device (one upload per step serves every layer's compressors)
// and the graph launch is timed; a second graph with the metadata upload from pinned memory in
// front of the kernel is timed too ("with_upload_us"). C128 slots reach their prefixes by decode
// steps from their open block's start (Step::warm_up), so their slice chains are complete, as in a
// serving loop (runtime/slice_chains.hpp). Bytes = new rows + the window rows read from the ring (or
// the snapshot; with chains, the completed slice's and the chains) + state and cache writes. Each decode case also times 8 steps of its
// shape (other layers' state) in one graph: "per_step_in_layer_graph_us" (per_step_in_layer_graph_us()).
// Checks: every 8K prefill and every decode step against the CPU reference (compressed rows within
// 1e-5, ≥ 99.9% of cache bytes equal); the 64K/256K prefills' first 8K tokens bit-identical to the
// 8K run (the inputs are a hash of (row, column), so they coincide).
// Usage: bench_compressor RESULTS_DIR [FILTER,...] — with filters, only the cases whose name contains
// one of them (and the 8K prefill of a kind whose larger prefill is wanted, for its check).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "cuda/compressor/launch.hpp"
#include "dsv4/compressor.hpp"
#include "ref/compressor_ref.hpp"
#include "runtime/compressor_state_access.hpp"

namespace {

using namespace dsv4;
using bench::check_cuda;

constexpr int kPageSize = 256;

struct Kind {
  const char* name;
  int ratio;
  bool overlap;
  EntryKind output;
  bool online;
};
const Kind kKinds[] = {
    {"C4-512", 4, true, EntryKind::Attention, false},
    {"C4-128", 4, true, EntryKind::IndexerFP8, false},
    {"C128", 128, false, EntryKind::Attention, false},
    {"C128-online", 128, false, EntryKind::Attention, true},
};

CompressorSpec spec_of(const Kind& k) {
  CompressorSpec spec;
  spec.ratio = k.ratio;
  spec.overlap = k.overlap;
  spec.online = k.online;
  spec.output = k.output;
  spec.width = k.output == EntryKind::Attention ? 512 : 128;
  spec.rope.base = 160000.0;  // the published compressor layers' YaRN table
  spec.rope.rope_dim = 64;
  spec.rope.yarn = true;
  spec.rope.factor = 16.0;
  spec.rope.original_max_positions = 65536.0;
  spec.rope.beta_fast = 32.0;
  spec.rope.beta_slow = 1.0;
  spec.max_positions = 1 << 20;
  return spec;
}

// ---- deterministic device data ---------------------------------------------------------------------

// out[i] uniform in [lo, hi), a function of (seed, i) only.
__global__ void fill_uniform(float* out, std::int64_t n, std::uint64_t seed, float lo, float hi) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float u = static_cast<float>(bench::mix64(seed ^ static_cast<std::uint64_t>(i)) >> 40) * (1.0f / 16777216.0f);
    out[i] = lo + (hi - lo) * u;
  }
}
void fill(Tensor& t, std::uint64_t seed, float lo, float hi) {
  fill_uniform<<<1024, 256>>>(t.data_as<float>(), t.numel(), seed, lo, hi);
  check_cuda(cudaGetLastError(), "fill");
}

template <class T>
std::vector<T> host_vector(const Tensor& t) {
  const Tensor h = t.to(Device::CPU);
  const T* p = h.data_as<const T>();
  return std::vector<T>(p, p + h.numel());
}

// ---- one step: device state, its plan, and the CPU reference on copies -------------------------------

struct Step {
  CompressorSpec spec;
  Tensor ape, norm, kv, score;       // device
  CompressorStatePool pool;
  PagedCache cache;
  CompressBatch batch;
  std::vector<std::vector<std::int32_t>> page_tables;
  CompressPlan plan;
  ref::CompressArgs args;            // device pointers
  cuda::CompressStepLayout layout;

  Step(const Kind& kind, const std::vector<std::int64_t>& prefixes, std::int64_t new_tokens, std::uint64_t seed)
      : spec(spec_of(kind)) {
    const int m = spec.ratio, w = spec.row_width();
    const auto requests = static_cast<int>(prefixes.size());
    const std::int64_t rows = requests * new_tokens;
    ape = Tensor::empty(DType::F32, {m, w}, Device::CUDA);
    norm = Tensor::empty(DType::F32, {spec.width}, Device::CUDA);
    kv = Tensor::empty(DType::F32, {rows, w}, Device::CUDA);
    score = Tensor::empty(DType::F32, {rows, w}, Device::CUDA);
    fill(ape, 1, -1.0f, 1.0f);
    fill(norm, 2, 0.5f, 1.5f);
    fill(kv, 3, -2.0f, 2.0f);
    fill(score, 4, -4.0f, 4.0f);
    pool = CompressorStatePool(spec, requests + 1, Device::CUDA);
    // A random state (positive sums for the online snapshots), as if each slot had seen its prefix.
    Tensor state = pool.storage();
    fill(state, seed, spec.online ? 0.5f : -3.0f, spec.online ? 2.0f : 3.0f);
    const int per_page = kPageSize / m;
    std::int32_t pages = 2;  // page 1: the (never written) page of logical pages no event writes
    // Decode steps of C128 keep slice chains (runtime/slice_chains.hpp) in a serving loop: each
    // slot starts at its open block's first token and is brought to its prefix by decode steps
    // (warm_up), so its chains hold that block's complete slices, as they would in steady state.
    const bool chained = new_tokens <= kChainSliceRows && cuda::slice_chain_floats(spec) > 0;
    std::vector<std::int64_t> warm_tokens;
    for (std::int64_t prefix : prefixes) {
      const int slot = pool.allocate();
      CompressorStateAccess::start_at(pool, slot, chained ? prefix / m * m : prefix);
      warm_tokens.push_back(chained ? prefix % m : 0);
      std::vector<std::int32_t> table(static_cast<std::size_t>((prefix + new_tokens) / m / per_page + 1), 1);
      for (std::int64_t e = prefix / m; e < (prefix + new_tokens) / m; ++e) {
        auto& page = table[static_cast<std::size_t>(e / per_page)];
        if (page == 1) page = pages++;
      }
      page_tables.push_back(std::move(table));
    }
    cache = make_compressed_cache(spec, kPageSize, pages, Device::CUDA);
    if (chained) warm_up(warm_tokens, seed);
    for (int r = 0; r < requests; ++r) {
      batch.push_back(CompressRequest{r + 1, prefixes[static_cast<std::size_t>(r)], new_tokens, page_tables[static_cast<std::size_t>(r)]});
    }
    const CompressorWeights weights{ape.view(), norm.view()};
    plan = plan_compress(spec, weights, batch, MatrixF32View::of(kv.view(), "kv"), MatrixF32View::of(score.view(), "score"),
                         pool, cache);
    args = arguments(kv.data_as<const float>(), score.data_as<const float>(), ape.data_as<const float>(),
                     norm.data_as<const float>(), pool.storage().data_as<float>(), cache.storage().data_as<std::uint8_t>());
    layout = cuda::plan_compress_step(args);
  }

  // Brings slot r + 1 `tokens[r]` tokens further (none completes a block) in decode steps of up to 8
  // tokens of random rows, through the API.
  void warm_up(std::vector<std::int64_t> tokens, std::uint64_t seed) {
    const CompressorWeights weights{ape.view(), norm.view()};
    for (std::uint64_t round = 0;; ++round) {
      CompressBatch warm;
      for (std::size_t r = 0; r < tokens.size(); ++r) {
        const std::int64_t n = std::min<std::int64_t>(tokens[r], kChainSliceRows);
        if (n == 0) continue;
        const int slot = static_cast<int>(r) + 1;
        warm.push_back(CompressRequest{slot, pool.tokens(slot), n, {}});
        tokens[r] -= n;
      }
      if (warm.empty()) return;
      std::int64_t rows = 0;
      for (const CompressRequest& r : warm) rows += r.new_tokens;
      Tensor warm_kv = Tensor::empty(DType::F32, {rows, spec.row_width()}, Device::CUDA);
      Tensor warm_score = Tensor::empty(DType::F32, {rows, spec.row_width()}, Device::CUDA);
      fill(warm_kv, seed * 131 + 2 * round + 7, -2.0f, 2.0f);
      fill(warm_score, seed * 131 + 2 * round + 8, -4.0f, 4.0f);
      compress(spec, weights, warm, MatrixF32View::of(warm_kv.view(), "kv"), MatrixF32View::of(warm_score.view(), "score"),
               pool, cache);
    }
  }

  ref::CompressArgs arguments(const float* kv_p, const float* score_p, const float* ape_p, const float* norm_p,
                              float* state_p, std::uint8_t* cache_p) const {
    ref::CompressArgs a;
    a.spec = &spec;
    a.plan = &plan;
    a.kv = kv_p;
    a.kv_stride = spec.row_width();
    a.score = score_p;
    a.score_stride = spec.row_width();
    a.ape = ape_p;
    a.norm = norm_p;
    a.state = state_p;
    a.chains = CompressorStateAccess::chains(pool);  // (device; the CPU reference never reads them)
    a.records_per_slot = pool.records_per_slot();
    a.record_floats = pool.record_floats();
    a.cache = cache_p;
    a.page_bytes = cache.page_bytes();
    a.entries_per_page = cache.entries_per_page();
    return a;
  }

  // Bytes the step must move at least (see the file comment).
  double bytes() const {
    const int m = spec.ratio, c = spec.width, w = spec.row_width();
    double total = static_cast<double>(plan.events.size()) * spec.layout().entry_bytes();
    // A slot's chains: two buffers a group, 3·c floats each.
    const int groups = cuda::slice_chain_floats(spec) / (2 * 3 * c);
    const double record_bytes = 3.0 * c * 4;
    for (std::size_t i = 0; i < plan.requests.size(); ++i) {
      const PlannedRequest& r = plan.requests[i];
      const std::int64_t end = r.prefix_len + r.new_tokens;
      total += static_cast<double>(r.new_tokens) * 2 * w * 4;  // kv + score rows
      if (spec.online) {
        if (r.prefix_len % m != 0) total += 3.0 * c * 4;  // the snapshot read
        total += static_cast<double>(std::min<std::int64_t>(r.new_tokens, spec.max_rollback + 1)) * 3 * c * 4;
        continue;
      }
      total += static_cast<double>(std::min<std::int64_t>(r.new_tokens, pool.records_per_slot())) * 2 * w * 4;
      if (i < layout.chains_kept.size() && layout.chains_kept[i]) {
        // Slice chains kept: the rows before the prefix of the slice the step completes (its block's
        // last at an event), and the chains an event reads (every group's), or a fold reads and
        // writes (its group's chain through the slice before, and through this one; only the write
        // where the slice starts its group).
        if (!completes_slice(r.prefix_len, end)) continue;
        const std::int64_t slice_start = end / kChainSliceRows * kChainSliceRows - kChainSliceRows;
        if (slice_start < r.prefix_len) total += static_cast<double>(r.prefix_len - slice_start) * 2 * c * 4;
        if (r.num_events > 0) {
          total += groups * record_bytes;
        } else {
          const int slices = m / kChainSliceRows;
          const int slice = static_cast<int>(end % m) / kChainSliceRows - 1;
          bool starts_group = false;  // (group g's range starts at slice g·S/G)
          for (int g = 0; g < groups; ++g) starts_group = starts_group || slice == g * slices / groups;
          total += (starts_group ? 1 : 2) * record_bytes;  // the chain written; else also the one before read
        }
        continue;
      }
      // Window rows of the events that lie before the prefix (c kv + c score floats each).
      for (std::int64_t n = r.prefix_len / m; n < end / m; ++n) {
        const std::int64_t first = spec.overlap && n > 0 ? (n - 1) * m : n * m;
        if (first < r.prefix_len) total += static_cast<double>(r.prefix_len - first) * 2 * c * 4;
      }
    }
    return total;
  }

  // The step's metadata in device memory (with room for the split scratch); the caller frees it.
  void* upload_layout() const {
    void* device_layout = nullptr;
    check_cuda(cudaMalloc(&device_layout, layout.device_bytes), "cudaMalloc(layout)");
    check_cuda(cudaMemcpy(device_layout, layout.bytes.data(), layout.bytes.size(), cudaMemcpyHostToDevice), "upload");
    return device_layout;
  }

  // Runs the step once more with its compressed rows as an output (poisoned first) and returns them.
  std::vector<float> compressed_rows(void* device_layout, cudaStream_t stream) const {
    Tensor compressed = Tensor::empty(DType::F32, {static_cast<std::int64_t>(plan.events.size()), spec.width}, Device::CUDA);
    compressed.fill_bytes(0xff);
    ref::CompressArgs a = args;
    a.out_compressed = compressed.data_as<float>();
    cuda::launch_compress_step(a, layout, device_layout, stream);
    check_cuda(cudaStreamSynchronize(stream), "compressed rows");
    return host_vector<float>(compressed);
  }

  // Runs the CPU reference on host copies of this step's inputs and state; compares its compressed
  // rows with the GPU's (`gpu_compressed` [E, c]) and its cache bytes with `gpu_cache` (the entries
  // the step writes). Returns whether both are within tolerance; prints the first failure.
  bool check_against_reference(const std::vector<float>& gpu_compressed, const std::vector<std::uint8_t>& gpu_cache,
                               const std::vector<float>& state_before) const {
    std::vector<float> kv_h = host_vector<float>(kv), score_h = host_vector<float>(score), ape_h = host_vector<float>(ape),
                       norm_h = host_vector<float>(norm), state_h = state_before;
    std::vector<std::uint8_t> cache_h(static_cast<std::size_t>(cache.total_bytes()), 0);
    std::vector<float> compressed(static_cast<std::size_t>(plan.events.size()) * static_cast<std::size_t>(spec.width));
    ref::CompressArgs a = arguments(kv_h.data(), score_h.data(), ape_h.data(), norm_h.data(), state_h.data(), cache_h.data());
    a.out_compressed = compressed.data();
    ref::compress(a);
    double worst = 0;
    for (std::size_t e = 0; e < plan.events.size(); ++e) {
      double scale = 0, diff = 0;
      for (int k = 0; k < spec.width; ++k) {
        const std::size_t i = e * static_cast<std::size_t>(spec.width) + static_cast<std::size_t>(k);
        scale = std::max(scale, static_cast<double>(std::fabs(compressed[i])));
        diff = std::max(diff, std::isfinite(gpu_compressed[i]) ? std::fabs(static_cast<double>(gpu_compressed[i]) - compressed[i]) : 1e30);
      }
      worst = std::max(worst, scale > 0 ? diff / scale : diff);
    }
    long bytes = 0, different = 0;
    std::vector<std::uint8_t> want(static_cast<std::size_t>(spec.layout().entry_bytes())), got(want.size());
    for (const PlannedEvent& e : plan.events) {
      const std::int64_t page = e.cache_slot / cache.entries_per_page() * cache.page_bytes();
      const int i = e.cache_slot % cache.entries_per_page();
      spec.layout().gather(cache_h.data() + page, i, cache.entries_per_page(), want.data());
      spec.layout().gather(gpu_cache.data() + page, i, cache.entries_per_page(), got.data());
      for (std::size_t b = 0; b < want.size(); ++b) different += want[b] != got[b];
      bytes += static_cast<long>(want.size());
    }
    const bool ok = worst <= 1e-5 && static_cast<double>(different) <= 1e-3 * static_cast<double>(bytes);
    if (!ok) std::printf("  reference check: compressed error %.3g, %ld of %ld cache bytes differ\n", worst, different, bytes);
    return ok;
  }
};

// ---- cases ---------------------------------------------------------------------------------------

struct Prefill8K {
  std::vector<std::uint8_t> cache;  // the whole pool after the 8K step
  std::int64_t page_bytes = 0;
};

void prefill_case(bench::Report& report, const Kind& kind, std::int64_t tokens, double copy_gbs,
                  std::map<std::string, Prefill8K>& first_8k) {
  Step step(kind, {0}, tokens, 7);
  void* device_layout = step.upload_layout();
  const std::vector<float> state_before = host_vector<float>(step.pool.storage());
  const double us = bench::time_us([&](cudaStream_t s) { cuda::launch_compress_step(step.args, step.layout, device_layout, s); });

  bool checked;
  const std::vector<std::uint8_t> cache = host_vector<std::uint8_t>(step.cache.storage());
  if (tokens == 8192) {
    checked = step.check_against_reference(step.compressed_rows(device_layout, nullptr), cache, state_before);
    first_8k[kind.name] = Prefill8K{cache, step.cache.page_bytes()};
  } else {
    // The first 8192 tokens' entries are those of the 8K run: logical pages 0..31 are physical
    // pages 2..33 in both (page 1 is the never-written page of Step).
    const Prefill8K& small = first_8k.at(kind.name);
    const std::int64_t first = 2 * small.page_bytes, end = (2 + 8192 / kPageSize) * small.page_bytes;
    checked = std::equal(small.cache.begin() + first, small.cache.begin() + end, cache.begin() + first);
    for (std::size_t e = 0; checked && e < step.plan.events.size(); e += 997) {  // and a sample is not blank
      const std::vector<std::uint8_t> bytes = step.cache.entry_bytes(step.plan.events[e].cache_slot);
      checked = std::any_of(bytes.begin(), bytes.end(), [](std::uint8_t b) { return b != 0; });
    }
  }
  check_cuda(cudaFree(device_layout), "cudaFree");
  const double bytes = step.bytes();
  report.add(std::string("prefill ") + kind.name + " T=" + std::to_string(tokens),
             {{"T", tokens}, {"ratio", kind.ratio}, {"width", step.spec.width}, {"online", kind.online},
              {"events", step.plan.events.size()}, {"split_events", step.layout.split_events}, {"bytes", bytes}},
             us, "GB/s", bytes / (us * 1e3), copy_gbs, checked);
}

// A chunk of a chunked prefill: one request, `tokens` new rows on top of `prefix` tokens, over a
// random state (the slot as if it had seen its prefix). Timed like the prefills (the kernel alone,
// metadata uploaded beforehand). A chunk's ring write overwrites ring rows its head reads, so the
// timed replays change the state: the checked launch runs on the state from before the timing.
void chunk_case(bench::Report& report, const Kind& kind, std::int64_t prefix, std::int64_t tokens, double copy_gbs) {
  Step step(kind, {prefix}, tokens, 17);
  void* device_layout = step.upload_layout();
  const std::vector<float> state_before = host_vector<float>(step.pool.storage());
  const double us = bench::time_us([&](cudaStream_t s) { cuda::launch_compress_step(step.args, step.layout, device_layout, s); });

  check_cuda(cudaMemcpy(step.pool.storage().data_as<float>(), state_before.data(), state_before.size() * sizeof(float),
                        cudaMemcpyHostToDevice),
             "state restore");
  const std::vector<float> compressed = step.compressed_rows(device_layout, nullptr);
  const bool checked = step.check_against_reference(compressed, host_vector<std::uint8_t>(step.cache.storage()), state_before);
  check_cuda(cudaFree(device_layout), "cudaFree");
  const double bytes = step.bytes();
  report.add(std::string("prefill chunk ") + kind.name + " P=" + std::to_string(prefix) + " T=" + std::to_string(tokens),
             {{"prefix", prefix}, {"T", tokens}, {"ratio", kind.ratio}, {"width", step.spec.width}, {"online", kind.online},
              {"events", step.plan.events.size()}, {"bytes", bytes}},
             us, "GB/s", bytes / (us * 1e3), copy_gbs, checked);
}

// The step in a graph of every layer's steps (bench::per_call_in_layer_graph_us): kLayerCalls steps of
// the same shape on separate inputs, state and caches (the other layers); each still reads cold rows
// and state.
double per_step_in_layer_graph_us(const Kind& kind, const std::vector<std::int64_t>& prefixes, int new_tokens,
                                  cudaStream_t stream) {
  std::vector<std::unique_ptr<Step>> layers;
  std::vector<void*> layouts;
  for (int l = 0; l < bench::kLayerCalls; ++l) {
    layers.push_back(std::make_unique<Step>(kind, prefixes, new_tokens, 5000 + 97 * l + prefixes.size()));
    layouts.push_back(layers.back()->upload_layout());
  }
  const double us = bench::per_call_in_layer_graph_us(stream, [&](int l, cudaStream_t s) {
    cuda::launch_compress_step(layers[l]->args, layers[l]->layout, layouts[l], s, cuda::StepMetadata::InParametersWhenSmall);
  });
  for (void* layout : layouts) cudaFree(layout);
  return us;
}

void decode_case(bench::Report& report, const Kind& kind, int requests, int new_tokens, double copy_gbs) {
  std::mt19937_64 rng(1000 + requests * 10 + new_tokens);
  std::vector<std::int64_t> prefixes;
  for (int r = 0; r < requests; ++r) prefixes.push_back(kind.ratio * std::uniform_int_distribution<std::int64_t>(8, 200)(rng) + std::uniform_int_distribution<std::int64_t>(0, kind.ratio - 1)(rng));
  Step step(kind, prefixes, new_tokens, 11 + requests);
  const std::vector<float> state_before = host_vector<float>(step.pool.storage());

  // The step as a serving loop would replay it: upload the metadata from pinned memory, launch.
  void *pinned = nullptr, *device_layout = nullptr;
  check_cuda(cudaMallocHost(&pinned, step.layout.bytes.size()), "cudaMallocHost");
  check_cuda(cudaMalloc(&device_layout, step.layout.device_bytes), "cudaMalloc(layout)");  // + split scratch
  std::memcpy(pinned, step.layout.bytes.data(), step.layout.bytes.size());
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  check_cuda(cudaMemcpy(device_layout, pinned, step.layout.bytes.size(), cudaMemcpyHostToDevice), "upload");
  // The kernel reads small steps' metadata from its parameters; `in_memory` times the same kernel
  // reading it from device_layout (what the parameters save).
  const auto graph_of = [&](bool with_upload, cuda::StepMetadata metadata) {
    return bench::CapturedGraph(stream, [&](cudaStream_t s) {
      if (with_upload) {
        check_cuda(cudaMemcpyAsync(device_layout, pinned, step.layout.bytes.size(), cudaMemcpyHostToDevice, s), "upload");
      }
      cuda::launch_compress_step(step.args, step.layout, device_layout, s, metadata);
    });
  };
  const bench::CapturedGraph kernel_only = graph_of(false, cuda::StepMetadata::InParametersWhenSmall),
                             with_upload = graph_of(true, cuda::StepMetadata::InParametersWhenSmall),
                             in_memory = graph_of(false, cuda::StepMetadata::InDeviceMemory);
  const double us = bench::time_us([&](cudaStream_t s) { kernel_only.launch(s); }, stream);
  const double in_memory_us = bench::time_us([&](cudaStream_t s) { in_memory.launch(s); }, stream);
  const double upload_us = bench::time_us([&](cudaStream_t s) { with_upload.launch(s); }, stream);
  // The same step with the kernel's code in L2 (and possibly the SMs' instruction caches): after the
  // flush, the same kernel runs once on another step's buffers (same shape, other seed), so the timed
  // call's data stays cold. The difference to `us` is what fetching cold code costs a decode step.
  Step other(kind, prefixes, new_tokens, 911 + requests);
  void* other_layout = other.upload_layout();
  const bench::CapturedGraph other_graph(stream, [&](cudaStream_t s) {
    cuda::launch_compress_step(other.args, other.layout, other_layout, s, cuda::StepMetadata::InParametersWhenSmall);
  });
  bench::TimingOptions code_warm;
  code_warm.after_flush = [&](cudaStream_t s) { other_graph.launch(s); };
  const double code_warm_us = bench::time_us([&](cudaStream_t s) { kernel_only.launch(s); }, stream, code_warm);
  const double layer_graph_us = per_step_in_layer_graph_us(kind, prefixes, new_tokens, stream);

  // Replays write the same entries (no step writes state its events read: a C128 request that folds a
  // slice into its chain re-folds it each replay, but that chain is read by no event of the step), so
  // the reference runs on the state from before the timing; the kernel runs once more with the
  // compressed rows as output.
  const std::vector<float> compressed = step.compressed_rows(device_layout, stream);
  const bool checked = step.check_against_reference(compressed, host_vector<std::uint8_t>(step.cache.storage()), state_before);
  cudaStreamDestroy(stream);
  cudaFree(device_layout);
  cudaFree(other_layout);
  cudaFreeHost(pinned);
  const double bytes = step.bytes();
  report.add(std::string("decode ") + kind.name + " B=" + std::to_string(requests) + " n=" + std::to_string(new_tokens),
             {{"B", requests}, {"new_tokens", new_tokens}, {"ratio", kind.ratio}, {"width", step.spec.width},
              {"online", kind.online}, {"events", step.plan.events.size()}, {"split_events", step.layout.split_events},
              {"bytes", bytes}, {"target_us", 8},
              {"with_upload_us", upload_us}, {"metadata_in_memory_us", in_memory_us}, {"code_warm_us", code_warm_us},
              {"layer_graph_steps", bench::kLayerCalls}, {"per_step_in_layer_graph_us", layer_graph_us}},
             us, "GB/s", bytes / (us * 1e3), copy_gbs, checked);
  std::printf("%40s %10.2f us with the metadata upload in the graph, %.2f us with the metadata read from memory, "
              "%.2f us with the code in L2, %.2f us a step in a graph of %d layers' steps\n", "", upload_us,
              in_memory_us, code_warm_us, layer_graph_us, bench::kLayerCalls);
}

// The floor of the decode rows' method: a CUDA graph of one empty kernel, timed the same way (L2
// flushed, events around the graph launch). Whatever a decode step does costs on top of this.
__global__ void empty_kernel() {}

void decode_floor_case(bench::Report& report, double copy_gbs) {
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  {
    const bench::CapturedGraph graph(stream, [](cudaStream_t s) { empty_kernel<<<1, 128, 0, s>>>(); });
    const double us = bench::time_us([&](cudaStream_t s) { graph.launch(s); }, stream);
    const double per_layer_us =
        bench::per_call_in_layer_graph_us(stream, [](int, cudaStream_t s) { empty_kernel<<<1, 128, 0, s>>>(); });
    report.add("decode floor (an empty kernel in a graph)",
               {{"blocks", 1}, {"threads", 128}, {"layer_graph_steps", bench::kLayerCalls}, {"per_step_in_layer_graph_us", per_layer_us}},
               us, "GB/s", 0.0, copy_gbs, true);
    std::printf("%40s %10.2f us a kernel in a graph of %d\n", "", per_layer_us, bench::kLayerCalls);
  }
  cudaStreamDestroy(stream);
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<bench::Session> session = bench::start_session("bench_compressor", argc, argv);
  if (!session) return 2;
  auto& [report, filter, copy_gbs] = *session;
  std::map<std::string, Prefill8K> first_8k;
  for (const Kind& kind : kKinds) {
    const auto prefill_wanted = [&](std::int64_t tokens) {
      return filter.wants(std::string("prefill ") + kind.name + " T=" + std::to_string(tokens));
    };
    // The 64K/256K checks compare with the 8K run: it runs whenever a larger one does.
    const bool any_prefill = prefill_wanted(8192) || prefill_wanted(65536) || prefill_wanted(262144);
    for (const std::int64_t tokens : {8192, 65536, 262144}) {
      if (tokens == 8192 ? any_prefill : prefill_wanted(tokens)) prefill_case(report, kind, tokens, copy_gbs, first_8k);
    }
  }
  // Chunks of 8K on a prefix at a block boundary of every compressor, and inside a block.
  for (const Kind& kind : kKinds) {
    for (const std::int64_t prefix : {65536, 65538}) {
      const std::string name = std::string("prefill chunk ") + kind.name + " P=" + std::to_string(prefix) + " T=8192";
      if (filter.wants(name)) chunk_case(report, kind, prefix, 8192, copy_gbs);
    }
  }
  if (filter.wants("decode floor (an empty kernel in a graph)")) decode_floor_case(report, copy_gbs);
  for (const Kind& kind : kKinds) {
    for (const int new_tokens : {1, 4, 8}) {
      for (const int requests : {1, 8, 64, 256, 1024}) {
        if (new_tokens == 8 && requests != 1 && requests != 256) continue;
        const std::string name = std::string("decode ") + kind.name + " B=" + std::to_string(requests) + " n=" +
                                 std::to_string(new_tokens);
        if (filter.wants(name)) decode_case(report, kind, requests, new_tokens, copy_gbs);
      }
    }
  }
  report.write();
  return 0;
}
