// bench/bench_sparse_attention.cu — sparse FP8 attention with sink, decode and prefill shapes of issue 6.
//
// Pools of 262,144 random entries each (153 MB, well past the 60 MB L2), random slots over them (the
// "_local" prefill cases: one request's chunk after a 64K prefix, Case::local), every candidate valid. FLOPs = 2·H·N·(512 + 512) per query row (the FlashMLA convention), ceiling 787
// TFLOP/s (bf16 dense, ANCHORS.md). Each call is captured once in a CUDA graph and the graph is timed
// (CUDA events, L2 flushed before every launch, median), so host-side validation is not in the time.
// Each case checks two rows (8 heads each) against the CPU reference (relative L2 ≤ 1e-2). One-row
// decode cases also time 8 calls (other layers' inputs) in one graph: "per_call_in_layer_graph_us".
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "attention_fill.cuh"
#include "bench_common.hpp"
#include "sparse_attention_timeline.hpp"
#include "dsv4/cache_format.hpp"
#include "dsv4/formats.hpp"
#include "dsv4/sparse_attention.hpp"
#include "dsv4/tensor.hpp"

namespace {

using dsv4::AttentionEntryFormat;
using dsv4::DType;
using dsv4::Device;
using dsv4::Tensor;
using dsv4::TensorView;
using dsv4::bench::check_cuda;
using F = AttentionEntryFormat;

constexpr int kPerPage = 64;
constexpr int kPoolPages = 4096;  // 262,144 entries, 153 MB per pool
constexpr double kBf16Ceiling = 787.0;

struct Pools {
  Tensor window = dsv4::bench::random_attention_pool(kPoolPages, kPerPage, 1);
  Tensor compressed = dsv4::bench::random_attention_pool(kPoolPages, kPerPage, 2);
  Tensor window_host, compressed_host;
  Pools() {
    check_cuda(cudaDeviceSynchronize(), "fill pools");
    window_host = window.to(Device::CPU);
    compressed_host = compressed.to(Device::CPU);
  }
};

struct Case {
  std::string name;
  int rows, heads, next_n, batch, compressed;  // compressed = K; N = 128 + K
  int split = dsv4::kDefaultSplitCandidates;
  // Slots as one request's prefill chunk finds them (else random over the pools): row t is token
  // position = kLocalPrefix + t, with its window (the 128 tokens up to it, consecutive slots) and K
  // distinct entries of the request's visible compressed ones (the first (position + 1) / 4,
  // consecutive slots), in ascending order as the top-k writes them.
  bool local = false;
};
constexpr int kLocalPrefix = 65536;

double relative_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), den += double(b[i]) * b[i];
  return den > 0 ? std::sqrt(num / den) : (num == 0 ? 0.0 : 1.0);
}

// The inputs of one case (random Q, slots and sinks; poisoned outputs) and the call on its stream.
struct CaseInputs {
  static constexpr int kWindow = 128;
  int n;  // candidates per row: kWindow + K
  Tensor q, ws, cs, sink_d, out, lse, workspace;
  std::vector<std::int32_t> window_slots, compressed_slots;
  std::vector<float> sink;
  cudaStream_t stream{};
  dsv4::SparseAttentionOptions options;

  // code_only: every candidate of every row is entry 0 — the call runs the kernels' whole code (the
  // same instantiation as the case) on one entry of data.
  CaseInputs(const Case& c, std::mt19937_64& rng, bool code_only = false);
  CaseInputs(const CaseInputs&) = delete;
  CaseInputs& operator=(const CaseInputs&) = delete;
  ~CaseInputs() { cudaStreamDestroy(stream); }
  void call(const Pools& pools) const {
    const dsv4::AttentionPoolView window{pools.window.view(), kPerPage}, compressed{pools.compressed.view(), kPerPage};
    dsv4::sparse_attention(q.view(), window, compressed, ws.view(), cs.view(), sink_d.view(), out.view(), lse.view(),
                           options);
  }
  // The graph of one call, after a first call outside the capture (it sets the kernel attributes).
  dsv4::bench::CapturedGraph graph_of_call(const Pools& pools) const {
    call(pools);
    check_cuda(cudaStreamSynchronize(stream), "first call");
    return dsv4::bench::CapturedGraph(stream, [&](cudaStream_t) { call(pools); });
  }
};

CaseInputs::CaseInputs(const Case& c, std::mt19937_64& rng, bool code_only) : n(kWindow + c.compressed) {
  q = Tensor::empty(DType::BF16, {c.rows, c.heads, F::kDim}, Device::CUDA);
  dsv4::bench::fill_bf16<<<1024, 256>>>(q.data_as<std::uint16_t>(), q.numel(), rng());
  std::uniform_int_distribution<int> slot(0, kPoolPages * kPerPage - 1);
  window_slots.resize(static_cast<std::size_t>(c.rows) * kWindow);
  compressed_slots.resize(static_cast<std::size_t>(c.rows) * c.compressed);
  if (c.local && !code_only) {
    const int pool_entries = kPoolPages * kPerPage;
    std::vector<std::int32_t> visible;
    for (int r = 0; r < c.rows; ++r) {
      const int position = kLocalPrefix + r;  // the row's token; the window ends at it
      for (int i = 0; i < kWindow; ++i)
        window_slots[static_cast<std::size_t>(r) * kWindow + i] = (position - kWindow + 1 + i) % pool_entries;
      visible.resize(static_cast<std::size_t>(std::min((position + 1) / 4, pool_entries)));
      if (visible.size() < static_cast<std::size_t>(c.compressed)) {
        std::fprintf(stderr, "%s: %zu visible compressed entries, fewer than K = %d\n", c.name.c_str(), visible.size(),
                     c.compressed);
        std::exit(2);
      }
      std::iota(visible.begin(), visible.end(), 0);
      for (int i = 0; i < c.compressed; ++i)  // the first K of a partial Fisher–Yates shuffle
        std::swap(visible[static_cast<std::size_t>(i)],
                  visible[static_cast<std::size_t>(std::uniform_int_distribution<int>(i, static_cast<int>(visible.size()) - 1)(rng))]);
      std::sort(visible.begin(), visible.begin() + c.compressed);
      std::copy_n(visible.begin(), c.compressed, compressed_slots.begin() + static_cast<std::ptrdiff_t>(r) * c.compressed);
    }
  } else {
    for (auto& s : window_slots) s = code_only ? 0 : slot(rng);
    for (auto& s : compressed_slots) s = code_only ? 0 : slot(rng);
  }
  sink.resize(c.heads);
  for (auto& s : sink) s = std::uniform_real_distribution<float>(-1.0f, 2.0f)(rng);
  ws = Tensor::from_host(DType::I32, {c.rows, kWindow}, window_slots.data(), Device::CUDA);
  cs = Tensor::from_host(DType::I32, {c.rows, c.compressed}, compressed_slots.data(), Device::CUDA);
  sink_d = Tensor::from_host(DType::F32, {c.heads}, sink.data(), Device::CUDA);
  out = Tensor::empty(DType::BF16, {c.rows, c.heads, F::kDim}, Device::CUDA);
  lse = Tensor::empty(DType::F32, {c.rows, c.heads}, Device::CUDA);
  out.fill_bytes(0xFF);
  const std::size_t scratch = dsv4::sparse_attention_workspace_bytes(c.rows, c.heads, n, c.split);
  workspace = Tensor::zeros(DType::U8, {static_cast<std::int64_t>(std::max<std::size_t>(scratch, 1))}, Device::CUDA);
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  options.split_candidates = c.split;
  options.workspace = workspace.view();
  options.stream = stream;
}

// What each timed call finds in L2: nothing (flushed), its code but not its data (flushed, then the
// same kernels on one entry of other inputs), or everything from the previous call.
enum class L2State { cold, warm_code, warm };

// The case in a graph of every layer's calls (bench::per_call_in_layer_graph_us): calls of its shape
// with their own queries, slots and outputs (the first is `first`'s); random slots over the 153 MB
// pools, so each call's gathers stay cold.
using dsv4::bench::kLayerCalls;

double per_call_in_layer_graph_us(const Case& c, const Pools& pools, const CaseInputs& first) {
  std::mt19937_64 layer_rng(7 + static_cast<std::uint64_t>(c.heads) * 1000 + c.compressed);  // `rng` untouched
  std::vector<std::unique_ptr<CaseInputs>> layers;
  for (int l = 1; l < kLayerCalls; ++l) {
    layers.push_back(std::make_unique<CaseInputs>(c, layer_rng));
    layers.back()->options.stream = first.stream;
  }
  check_cuda(cudaDeviceSynchronize(), "layer inputs");
  return dsv4::bench::per_call_in_layer_graph_us(first.stream, [&](int l, cudaStream_t) {  // (their stream)
    (l == 0 ? first : *layers[l - 1]).call(pools);
  }, {3, 20, true});
}

// Runs one case: times the graph of one call, checks rows 0 and rows−1 (first 8 heads) on the CPU.
void run_case(const Case& c, const Pools& pools, dsv4::bench::Report& report, std::mt19937_64& rng, L2State l2) {
  CaseInputs in(c, rng);  // not const: the CPU reference reads the host slots through mutable views
  const int n = in.n;
  const cudaStream_t stream = in.stream;
  const dsv4::bench::CapturedGraph graph = in.graph_of_call(pools);
  dsv4::bench::TimingOptions timing{3, 20, l2 != L2State::warm};
  std::optional<CaseInputs> warmer;
  std::optional<dsv4::bench::CapturedGraph> warmer_graph;
  if (l2 == L2State::warm_code) {
    std::mt19937_64 warmer_rng(1);  // not from `rng`: the timed cases keep their inputs
    warmer.emplace(c, warmer_rng, true);
    warmer_graph.emplace(warmer->graph_of_call(pools));
    timing.after_flush = [&](cudaStream_t s) { warmer_graph->launch(s); };
  }
  const double us = dsv4::bench::time_us([&](cudaStream_t s) { graph.launch(s); }, stream, timing);
  nlohmann::json shape = {{"rows", c.rows}, {"B", c.batch}, {"next_n", c.next_n}, {"H", c.heads}, {"N", n}, {"split", c.split}};
  if (c.next_n == 1 && c.batch <= 128 && l2 == L2State::cold) {  // decode steps of one token a request
    shape["layer_graph_steps"] = kLayerCalls;
    shape["per_call_in_layer_graph_us"] = per_call_in_layer_graph_us(c, pools, in);
  }
  constexpr int kWindow = CaseInputs::kWindow;
  const Tensor &q = in.q, &out = in.out, &lse = in.lse;
  std::vector<std::int32_t>&window_slots = in.window_slots, &compressed_slots = in.compressed_slots;
  std::vector<float>& sink = in.sink;

  // Check two rows (first 8 heads) against the CPU reference.
  const int check_heads = std::min(c.heads, 8);
  bool ok = true;
  Tensor out_host = out.to(Device::CPU), q_host = q.to(Device::CPU), lse_host = lse.to(Device::CPU);
  for (int r : {0, c.rows - 1}) {
    std::vector<std::uint16_t> q_rows(static_cast<std::size_t>(check_heads) * F::kDim);
    for (int h = 0; h < check_heads; ++h)
      std::copy_n(q_host.data_as<std::uint16_t>() + (std::size_t(r) * c.heads + h) * F::kDim, F::kDim,
                  q_rows.begin() + std::size_t(h) * F::kDim);
    std::vector<std::uint16_t> ref_out(q_rows.size());
    std::vector<float> ref_lse(check_heads);
    dsv4::sparse_attention(TensorView{q_rows.data(), DType::BF16, {1, check_heads, F::kDim}},
                           {pools.window_host.view(), kPerPage}, {pools.compressed_host.view(), kPerPage},
                           TensorView{window_slots.data() + std::size_t(r) * kWindow, DType::I32, {1, kWindow}},
                           TensorView{compressed_slots.data() + std::size_t(r) * c.compressed, DType::I32, {1, c.compressed}},
                           TensorView{sink.data(), DType::F32, {check_heads}},
                           TensorView{ref_out.data(), DType::BF16, {1, check_heads, F::kDim}},
                           TensorView{ref_lse.data(), DType::F32, {1, check_heads}});
    std::vector<float> got(ref_out.size()), want(ref_out.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      got[i] = dsv4::float_from_bf16_bits(out_host.data_as<std::uint16_t>()[std::size_t(r) * c.heads * F::kDim + i]);
      want[i] = dsv4::float_from_bf16_bits(ref_out[i]);
      ok = ok && !std::isnan(got[i]);
    }
    ok = ok && relative_l2(got, want) <= 1e-2;
    for (int h = 0; h < check_heads; ++h)
      ok = ok && std::fabs(lse_host.data_as<float>()[std::size_t(r) * c.heads + h] - ref_lse[h]) <= 1e-3 * std::max(1.0f, std::fabs(ref_lse[h]));
  }

  const double flops = 2.0 * c.heads * n * 1024.0 * c.rows;
  const double bytes = double(c.rows) * n * F::kEntryBytes + 2.0 * c.rows * c.heads * F::kDim * 2;
  shape["gathered_GBps"] = bytes / (us * 1e3);
  report.add(l2 == L2State::warm_code ? c.name + "_warmcode" : c.name, shape, us, "TFLOP/s", flops / (us * 1e6),
             kBf16Ceiling, ok);
  if (shape.contains("per_call_in_layer_graph_us"))
    std::printf("%40s %10.2f us a call in a graph of %d layers' calls\n", "",
                shape["per_call_in_layer_graph_us"].get<double>(), kLayerCalls);
}

#ifdef DSV4_ATTENTION_TIMELINE
// Timeline mode (64-head tile only): the case's graph timed with the recording compiled in but off,
// then on; then one recorded call after an L2 flush, as in the timing, whose stamps are analyzed.
nlohmann::json run_timeline(const Case& c, const Pools& pools, std::mt19937_64& rng, L2State l2) {
  namespace tl = dsv4::cuda::sparse_attention::timeline;
  const CaseInputs in(c, rng);
  const cudaStream_t stream = in.stream;
  // --warm-code: after each flush the same kernels run on one entry of other inputs (as run_case).
  std::optional<CaseInputs> warmer;
  std::optional<dsv4::bench::CapturedGraph> warmer_graph;
  dsv4::bench::TimingOptions timing{3, 20, true}, recorded{0, 1, true};
  if (l2 == L2State::warm_code) {
    std::mt19937_64 warmer_rng(1);
    warmer.emplace(c, warmer_rng, true);
    warmer_graph.emplace(warmer->graph_of_call(pools));
    timing.after_flush = recorded.after_flush = [&](cudaStream_t s) { warmer_graph->launch(s); };
  }
  // One record per thread block: rows × 64-head tiles × chunks × at most 4 output-dim parts.
  const long long chunks = (in.n + c.split - 1) / c.split;
  const long long capacity = static_cast<long long>(c.rows) * ((c.heads + 63) / 64) * chunks * 4;
  Tensor records = Tensor::empty(DType::U8, {capacity * tl::kRecordWords * 8}, Device::CUDA);
  const dsv4::bench::CapturedGraph graph = in.graph_of_call(pools);
  const auto launch = [&](cudaStream_t s) { graph.launch(s); };
  const double off_us = dsv4::bench::time_us(launch, stream, timing);
  tl::set_timeline_buffer(records.data_as<std::uint64_t>(), static_cast<int>(capacity));
  const double on_us = dsv4::bench::time_us(launch, stream, timing);
  check_cuda(cudaMemsetAsync(records.data(), 0, records.nbytes(), stream), "clear timeline records");
  // The warmer's own stamps land in records too (its blocks have the same indices) but come first:
  // the timed call overwrites every word it stamps.
  const double recorded_us = dsv4::bench::time_us(launch, stream, recorded);
  tl::set_timeline_buffer(nullptr, 0);
  std::vector<std::uint64_t> words(records.nbytes() / 8);
  check_cuda(cudaMemcpy(words.data(), records.data(), records.nbytes(), cudaMemcpyDeviceToHost), "timeline records");
  int device = 0, clock_khz = 0;
  check_cuda(cudaGetDevice(&device), "device");
  check_cuda(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device), "clock rate");
  return dsv4::bench::attention_timeline::analyze(
      c.name, words, clock_khz / 1e6,
      {{"graph_median_recording_off", off_us}, {"graph_median_recording_on", on_us}, {"recorded_call", recorded_us}});
}
#endif

}  // namespace

// Usage: bench_sparse_attention [OUT_DIR] [--warm-l2 | --warm-code] [--split N] [name-part...]
// (--split N runs every case with split_candidates N, the names suffixed _splitN; --warm-code runs the
// same kernels on one entry of other inputs after each L2 flush, the names suffixed _warmcode)
//    or: bench_sparse_attention --timeline OUT.json [--split N] CASE[,CASE...]  (exact names; only in a
// build with -DDSV4_ATTENTION_TIMELINE: per-phase tables of each case, raw stamps into OUT.json)
int main(int argc, char** argv) {
  const bool timeline = argc > 2 && std::string(argv[1]) == "--timeline";
#ifndef DSV4_ATTENTION_TIMELINE
  if (timeline) {
    std::fprintf(stderr, "--timeline needs a build with -DDSV4_ATTENTION_TIMELINE (docs/notes-sparse-attention.md §13)\n");
    return 2;
  }
#endif
  const std::string out_dir = argc > 1 ? argv[timeline ? 2 : 1] : ".";
  L2State l2 = L2State::cold;
  int split = 0;
  std::vector<char*> name_parts = {argv[0], argv[0]};  // CaseFilter reads from index 2
  for (int i = timeline ? 3 : 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--warm-l2") l2 = L2State::warm;
    else if (arg == "--warm-code") l2 = L2State::warm_code;
    else if (arg == "--split" && i + 1 < argc) split = std::stoi(argv[++i]);
    else name_parts.push_back(argv[i]);
  }
  const dsv4::bench::CaseFilter filter(static_cast<int>(name_parts.size()), name_parts.data(), 2);
  dsv4::bench::Report report("bench_sparse_attention", out_dir);
  if (!timeline)
    std::printf("copy bandwidth %.0f GB/s (read + write); bf16 ceiling %.0f TFLOP/s\n",
                dsv4::bench::copy_bandwidth_gbs(), kBf16Ceiling);
  const Pools pools;
  std::mt19937_64 rng(20261129);
  std::vector<Case> cases;
  for (int heads : {64, 128})
    for (int k : {512, 1024, 2048})
      for (int next_n : {1, 2})
        for (int batch : {1, 32, 128})
          cases.push_back({"decode_B" + std::to_string(batch) + "_H" + std::to_string(heads) + "_N" +
                               std::to_string(128 + k) + "_nn" + std::to_string(next_n),
                           batch * next_n, heads, next_n, batch, k});
  for (int heads : {64, 128})
    for (int k : {512, 1024})
      for (bool local : {false, true})
        cases.push_back({"prefill_T4096_H" + std::to_string(heads) + "_N" + std::to_string(128 + k) +
                             (local ? "_local" : ""),
                         4096, heads, 1, 4096, k, dsv4::kDefaultSplitCandidates, local});
  // The split size trade-off (latency at small batches vs merge traffic at large ones): the
  // latency-first choices (64: B=1 only) and one between; for rows of 2176 candidates (HCA at 256K
  // tokens) also one chunk per row (2560, the largest split), the throughput-first choice.
  std::vector<Case> variants;
  const auto add_variant = [&](const Case& c, int variant_split) {
    variants.push_back(c);
    variants.back().split = variant_split;
    variants.back().name += "_split" + std::to_string(variant_split);
  };
  for (const Case& c : cases) {
    if (c.name == "decode_B1_H64_N640_nn1" || c.name == "decode_B128_H64_N640_nn1" ||
        c.name == "decode_B128_H128_N2176_nn2") {
      for (int variant_split : {64, 384, 768}) {
        if (variant_split == 64 && c.name != "decode_B1_H64_N640_nn1") continue;
        add_variant(c, variant_split);
      }
    }
    if (c.name == "decode_B1_H64_N2176_nn1" || c.name == "decode_B32_H128_N2176_nn2" ||
        c.name == "decode_B128_H64_N2176_nn1" || c.name == "decode_B128_H128_N2176_nn1" ||
        c.name == "decode_B128_H128_N2176_nn2")
      add_variant(c, dsv4::kMaxSplitCandidates);
  }
  cases.insert(cases.end(), variants.begin(), variants.end());
  if (split > 0) {
    cases.erase(cases.begin() + static_cast<std::ptrdiff_t>(cases.size() - variants.size()), cases.end());
    for (Case& c : cases) {
      c.split = split;
      c.name += "_split" + std::to_string(split);
    }
  }
#ifdef DSV4_ATTENTION_TIMELINE
  if (timeline) {
    const std::vector<std::string>& names = filter.parts();  // exact case names here
    nlohmann::json runs = nlohmann::json::array();
    for (const Case& c : cases)
      if (std::find(names.begin(), names.end(), c.name) != names.end())
        runs.push_back(run_timeline(c, pools, rng, l2));
    if (runs.size() != names.size()) std::fprintf(stderr, "timeline: some of the named cases do not exist\n");
    std::ofstream(out_dir) << nlohmann::json{{"cases", runs}}.dump() << "\n";
    return runs.size() == names.size() && !names.empty() ? 0 : 1;
  }
#endif
  for (const Case& c : cases)
    if (filter.wants(c.name)) run_case(c, pools, report, rng, l2);
  report.write();
  return 0;
}
