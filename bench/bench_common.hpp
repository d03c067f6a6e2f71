// bench/bench_common.hpp — timing and reporting shared by every benchmark.
//
// Times are CUDA-event medians after warm-up, with the L2 flushed (a 256 MB write; DSV4_BENCH_FLUSH below) before
// each timed launch unless the case asks for a warm cache. Each executable writes a JSON list of records
// to <out_dir>/<bench name>.json; scripts/gpu-check merges them with the PyTorch baselines.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#if defined(__CUDACC__)
#include "cuda/common/ptx_sm90.cuh"
#endif

namespace dsv4::bench {

inline void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "CUDA error in %s: %s\n", what, cudaGetErrorString(status));
    std::exit(2);
  }
}

// How the L2 is emptied before each timed launch, for the whole run: DSV4_BENCH_FLUSH = `dirty` (default) or
// `clean`; anything else is an error naming the variable.
//   dirty: a 256 MB write (as nvbench and Triton's do_bench flush). The L2 is left full of modified lines,
//          and memory is still writing them back while the timed kernel reads (read-heavy one-launch cases
//          ran 4–7% slower than after a clean flush on the H200; marking the kernels' own lines
//          evict-first recovered part of it in the compressor's prefills, none in the indexer's scores
//          or the attention). The reports use this, like the peers' published figures.
//   clean: the same write, then a read of another 128 MB buffer: the L2 then holds only unmodified lines
//          that are not the kernel's (a decode step's L2 holds mostly such lines: weights and cache reads).
// Records of a clean run carry "l2_flush": "clean".
enum class FlushKind { dirty, clean };

inline FlushKind flush_kind_from_environment() {
  static const FlushKind kind = [] {
    const char* value = std::getenv("DSV4_BENCH_FLUSH");
    if (value == nullptr || std::string(value) == "dirty") return FlushKind::dirty;
    if (std::string(value) == "clean") return FlushKind::clean;
    std::fprintf(stderr, "DSV4_BENCH_FLUSH must be dirty or clean, got '%s'\n", value);
    std::exit(2);
  }();
  return kind;
}

#if defined(__CUDACC__)
// Reads `vectors` 16-byte words contiguously (grid-stride, four loads in flight a thread) and keeps one
// bit of them (never true for the fills used: zeros, 0x5a bytes), so the loads stay. The clean flush's
// read, and the probes' contiguous-read figures. A template so that every bench including this header
// may define it. Launched with 256 threads a block.
template <int kUnused = 0>
__global__ void __launch_bounds__(256, 2) read_contiguous(const uint4* words, std::int64_t vectors, std::uint32_t* sink) {
  std::uint32_t acc = 0;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < vectors; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      v[k] = i + k * stride < vectors ? dsv4::cuda::ptx::load_stream_v4(words + i + k * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int k = 0; k < 4; ++k) acc ^= v[k].x ^ v[k].w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}
#endif

class L2Flusher {
 public:
  L2Flusher() {
    check_cuda(cudaMalloc(&buffer_, kBytes), "cudaMalloc(flush)");
    if (flush_kind_from_environment() == FlushKind::clean) {
      check_cuda(cudaMalloc(&clean_, kCleanBytes + 16), "cudaMalloc(clean flush)");
      check_cuda(cudaMemset(clean_, 0, kCleanBytes + 16), "clean flush fill");
    }
  }
  ~L2Flusher() {
    cudaFree(buffer_);
    if (clean_ != nullptr) cudaFree(clean_);
  }
  void flush(cudaStream_t stream) {
    check_cuda(cudaMemsetAsync(buffer_, 0, kBytes, stream), "flush");
#if defined(__CUDACC__)
    if (clean_ != nullptr) {
      read_contiguous<<<1024, 256, 0, stream>>>(static_cast<const uint4*>(clean_), kCleanBytes / 16,
                                                reinterpret_cast<std::uint32_t*>(static_cast<char*>(clean_) + kCleanBytes));
      check_cuda(cudaGetLastError(), "clean flush");
    }
#endif
  }

 private:
  static constexpr size_t kBytes = 256u << 20;       // > 4× the 60 MB L2
  static constexpr size_t kCleanBytes = 128u << 20;  // > 2× the L2: every modified line is written back
  void* buffer_ = nullptr;
  void* clean_ = nullptr;
};

struct TimingOptions {
  int warmup = 5;
  int repeats = 50;
  bool flush_l2 = true;
  // Enqueued after the flush and before the start event (not timed): e.g. a call that brings the
  // kernels' code back into L2 and leaves the timed call's data cold.
  std::function<void(cudaStream_t)> after_flush;
};

// The median of `samples` (the upper one of an even count; 0 for none).
inline double median(std::vector<double> samples) {
  if (samples.empty()) return 0.0;
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

// Median time in microseconds of `launch` (which enqueues work on `stream`).
inline double time_us(const std::function<void(cudaStream_t)>& launch, cudaStream_t stream = nullptr,
                      TimingOptions options = {}) {
  static L2Flusher flusher;
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "event");
  check_cuda(cudaEventCreate(&stop), "event");
  for (int i = 0; i < options.warmup; ++i) launch(stream);
  check_cuda(cudaStreamSynchronize(stream), "warmup");
  check_cuda(cudaGetLastError(), "warmup launch");
  std::vector<double> samples;
  for (int i = 0; i < options.repeats; ++i) {
    if (options.flush_l2) flusher.flush(stream);
    if (options.after_flush) options.after_flush(stream);
    check_cuda(cudaEventRecord(start, stream), "record");
    launch(stream);
    check_cuda(cudaEventRecord(stop, stream), "record");
    check_cuda(cudaEventSynchronize(stop), "sync");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    samples.push_back(ms * 1000.0);
  }
  check_cuda(cudaGetLastError(), "timed launch");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return median(std::move(samples));
}

// The card's device-to-device copy bandwidth in GB/s (bytes read + written), 1 GiB buffers.
inline double copy_bandwidth_gbs() {
  const size_t bytes = 1u << 30;
  void *a = nullptr, *b = nullptr;
  check_cuda(cudaMalloc(&a, bytes), "cudaMalloc");
  check_cuda(cudaMalloc(&b, bytes), "cudaMalloc");
  check_cuda(cudaMemset(a, 1, bytes), "memset");
  const double us = time_us([&](cudaStream_t s) { cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s); },
                            nullptr, {3, 20, false});
  cudaFree(a);
  cudaFree(b);
  return 2.0 * static_cast<double>(bytes) / (us * 1e-6) / 1e9;
}

// Which cases a run measures: every case when no filter is given, else those whose name contains
// one of the filters (command-line arguments after the results directory, each possibly a
// comma-separated list), so a short device run can re-measure only what it needs.
class CaseFilter {
 public:
  CaseFilter(int argc, char** argv, int first) {
    for (int i = first; i < argc; ++i) {
      const std::string arg = argv[i];
      for (std::size_t begin = 0; begin <= arg.size();) {
        const std::size_t end = std::min(arg.find(',', begin), arg.size());
        if (end > begin) parts_.push_back(arg.substr(begin, end - begin));
        begin = end + 1;
      }
    }
  }
  bool wants(const std::string& name) const {
    return parts_.empty() || std::any_of(parts_.begin(), parts_.end(),
                                         [&](const std::string& part) { return name.find(part) != std::string::npos; });
  }
  // The filters as given, in order (a caller that takes them as exact names).
  const std::vector<std::string>& parts() const { return parts_; }

 private:
  std::vector<std::string> parts_;
};

// Collects records and writes <out_dir>/<name>.json.
class Report {
 public:
  Report(std::string name, std::string out_dir) : name_(std::move(name)), out_dir_(std::move(out_dir)) {}
  // metric: "GB/s" or "TFLOP/s"; ceiling in the same unit (0 when none applies).
  void add(const std::string& case_name, const nlohmann::json& shape, double time_us, const std::string& metric,
           double value, double ceiling, bool passed_check) {
    records_.push_back({{"bench", name_}, {"name", case_name}, {"shape", shape}, {"time_us", time_us},
                        {"metric", metric}, {"value", value}, {"ceiling", ceiling},
                        {"ratio", ceiling > 0 ? value / ceiling : 0.0}, {"checked", passed_check}});
    if (flush_kind_from_environment() == FlushKind::clean) records_.back()["l2_flush"] = "clean";
    std::printf("%-40s %10.2f us  %9.1f %-7s (%.0f%% of %.0f)%s\n", case_name.c_str(), time_us, value, metric.c_str(),
                ceiling > 0 ? 100.0 * value / ceiling : 0.0, ceiling, passed_check ? "" : "  RESULT CHECK FAILED");
  }
  void write() const {
    std::ofstream(out_dir_ + "/" + name_ + ".json") << nlohmann::json(records_).dump(1) << "\n";
  }

 private:
  std::string name_, out_dir_;
  std::vector<nlohmann::json> records_;
};

// A CUDA graph of what `enqueue` puts on `stream` (captured and instantiated; freed with the object),
// for timing a step the way a serving loop replays it.
class CapturedGraph {
 public:
  CapturedGraph(cudaStream_t stream, const std::function<void(cudaStream_t)>& enqueue) {
    cudaGraph_t graph;
    check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
    enqueue(stream);
    check_cuda(cudaStreamEndCapture(stream, &graph), "end capture");
    check_cuda(cudaGraphInstantiate(&exec_, graph, 0), "instantiate");
    cudaGraphDestroy(graph);
  }
  CapturedGraph(CapturedGraph&& other) noexcept : exec_(other.exec_) { other.exec_ = nullptr; }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  CapturedGraph& operator=(CapturedGraph&&) = delete;
  ~CapturedGraph() {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
  }
  void launch(cudaStream_t stream) const { check_cuda(cudaGraphLaunch(exec_, stream), "graph launch"); }

 private:
  cudaGraphExec_t exec_ = nullptr;
};

// A model's decode graph runs each layer's kernels one after another, so a graph of one call
// overstates a call by the graph launch's fixed cost. The per-layer figures: kLayerCalls calls
// (`enqueue(l, stream)` enqueues layer l's, each on its own inputs, state and caches) captured in one
// graph and timed together (L2 flushed before the graph only, as `options` says); the time per call.
inline constexpr int kLayerCalls = 8;
inline double per_call_in_layer_graph_us(cudaStream_t stream, const std::function<void(int, cudaStream_t)>& enqueue,
                                         TimingOptions options = {}) {
  const CapturedGraph graph(stream, [&](cudaStream_t s) {
    for (int l = 0; l < kLayerCalls; ++l) enqueue(l, s);
  });
  return time_us([&](cudaStream_t s) { graph.launch(s); }, stream, options) / kLayerCalls;
}

#if defined(__CUDACC__)
// Deterministic random bits for the benches' fill kernels: splitmix64 of (seed, index).
__device__ inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
__device__ inline std::uint32_t hash32(std::uint64_t x) { return static_cast<std::uint32_t>(mix64(x) >> 32); }
#endif

// What every bench's main starts with: `bench_X RESULTS_DIR [name-part...]` parsed (usage printed when
// the directory is missing), the report, and the card's copy bandwidth measured in this same run.
struct Session {
  Report report;
  CaseFilter filter;
  double copy_gbs;
};
inline std::optional<Session> start_session(const std::string& bench_name, int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s RESULTS_DIR [name-part[,name-part...]...]\n", argv[0]);
    return std::nullopt;
  }
  Session session{Report(bench_name, argv[1]), CaseFilter(argc, argv, 2), copy_bandwidth_gbs()};
  std::printf("copy bandwidth %.0f GB/s (read + write)\n", session.copy_gbs);
  return session;
}

}  // namespace dsv4::bench
