// bench/bench_indexer.cu — indexer scores (decode and prefill) and query preparation on the GPU.
//
// Decode: B requests × next_n rows, every row sees N entries of its request's paged key cache
// (pages scattered over one pool); metric: key bytes / time against the measured copy bandwidth.
// One-request, one-token cases also time 8 calls (other requests' keys, as other layers') in one graph,
// alone, each followed by the top-512, and as a CSA decode layer's whole selection and attention path
// (query preparation, scores, top-512, the sparse attention over the window and the selection, then an
// empty kernel for the rest of the model; time_layer_graphs).
// Prefill: one request of T tokens, causal (V_t = floor((t+1)/4)); metric: useful FLOP
// (Σ_t V_t · 2 · H · d) / time against the FP8 tensor ceiling (ANCHORS). Every case checks a sample
// of its scores against the CPU reference on the same bytes.
// Usage: bench_indexer <out_dir> [name-part...]   (with name parts: only the cases whose name holds one)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attention_fill.cuh"
#include "bench_common.hpp"
#include "cuda/common/spans.cuh"
#include "dsv4/indexer.hpp"
#include "dsv4/sparse_attention.hpp"
#include "dsv4/topk.hpp"

namespace {

using namespace dsv4;
using bench::check_cuda;

constexpr int kHeads = 64, kDim = 128, kEntriesPerPage = 64;
constexpr double kFp8TensorCeiling = 1432.0;  // TFLOP/s, ANCHORS.md (torch._scaled_mm 8192³ on this card)

// Random entries in an indexer page pool: e4m3 bytes that are not NaN, or any e2m1 pair; FP8 scales
// in [1e-3, 1e-2); ue8m0 bytes in [120, 127].
__global__ void fill_pages(std::uint8_t* pages, std::int64_t num_pages, IndexerEntryFormat fmt, int epp,
                           std::uint64_t seed) {
  const std::int64_t page_bytes = fmt.page_bytes(epp);
  const std::int64_t data_end = static_cast<std::int64_t>(epp) * fmt.data_bytes();
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < num_pages * page_bytes;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t in_page = i % page_bytes;
    const std::uint32_t h = bench::hash32(seed + static_cast<std::uint64_t>(i));
    if (in_page < data_end) {
      std::uint8_t b = static_cast<std::uint8_t>(h);
      if (fmt.format == IndexerKeyFormat::FP8 && (b & 0x7f) == 0x7f) b ^= 1;
      pages[i] = b;
    } else if (fmt.format == IndexerKeyFormat::FP8) {
      if ((in_page - data_end) % 4 == 0) {
        const float scale = 1e-3f + 9e-3f * static_cast<float>(h % 1000) / 1000.0f;
        std::memcpy(pages + i, &scale, 4);
      }
    } else {
      pages[i] = static_cast<std::uint8_t>(120 + h % 8);
    }
  }
}

// Random code bytes: e4m3 codes that are not NaN, or any e2m1 pair.
__global__ void fill_codes(std::uint8_t* x, std::int64_t n, bool fp8, std::uint64_t seed) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::uint8_t b = static_cast<std::uint8_t>(bench::hash32(seed + static_cast<std::uint64_t>(i)));
    if (fp8 && (b & 0x7f) == 0x7f) b ^= 1;
    x[i] = b;
  }
}

__global__ void fill_floats(float* x, std::int64_t n, float lo, float hi, std::uint64_t seed) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    x[i] = lo + (hi - lo) * static_cast<float>(bench::hash32(seed + static_cast<std::uint64_t>(i)) % 1000000) / 1e6f;
}

__global__ void fill_query_scales(std::uint8_t* x, std::int64_t n, bool fp8, std::uint64_t seed) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::uint32_t h = bench::hash32(seed + static_cast<std::uint64_t>(i));
    if (fp8) reinterpret_cast<float*>(x)[i] = 1e-3f + 9e-3f * static_cast<float>(h % 1000) / 1000.0f;
    else x[i] = static_cast<std::uint8_t>(120 + h % 8);
  }
}

// A key pool with `requests` requests of `entries` entries each, pages shuffled across the pool.
struct Pool {
  IndexerEntryFormat format;
  Tensor pages, page_table;
  std::vector<std::int32_t> host_table;
  int pages_per_request = 0;
  Pool(IndexerKeyFormat f, int requests, std::int64_t entries, std::uint64_t seed) : format{f, kDim} {
    pages_per_request = static_cast<int>((entries + kEntriesPerPage - 1) / kEntriesPerPage);
    const std::int64_t num_pages = static_cast<std::int64_t>(requests) * pages_per_request;
    pages = Tensor::empty(DType::U8, {num_pages, format.page_bytes(kEntriesPerPage)}, Device::CUDA);
    fill_pages<<<4096, 256>>>(pages.data_as<std::uint8_t>(), num_pages, format, kEntriesPerPage, seed);
    host_table.resize(static_cast<std::size_t>(num_pages));
    std::iota(host_table.begin(), host_table.end(), 0);
    std::shuffle(host_table.begin(), host_table.end(), std::mt19937_64(seed));
    page_table = Tensor::from_host(DType::I32, {requests, pages_per_request}, host_table.data(), Device::CUDA);
  }
};

struct Queries {
  IndexerQuery q;
  Queries(IndexerKeyFormat f, std::int64_t rows, std::uint64_t seed) {
    q = IndexerQuery::empty(f, rows, kHeads, kDim, Device::CUDA);
    fill_codes<<<1024, 256>>>(q.codes.data_as<std::uint8_t>(), static_cast<std::int64_t>(q.codes.nbytes()),
                              f == IndexerKeyFormat::FP8, seed);
    fill_query_scales<<<256, 256>>>(q.scales.data_as<std::uint8_t>(),
                                    f == IndexerKeyFormat::FP8 ? rows * kHeads : rows * kHeads * 4,
                                    f == IndexerKeyFormat::FP8, seed + 1);
    fill_floats<<<256, 256>>>(q.weights.data_as<float>(), rows * kHeads, -0.2f, 0.25f, seed + 2);
  }
};

template <class T>
std::vector<T> download(const Tensor& t) {
  std::vector<T> out(t.nbytes() / sizeof(T));
  check_cuda(cudaMemcpy(out.data(), t.data(), t.nbytes(), cudaMemcpyDeviceToHost), "download");
  return out;
}

// Compares scores[row, c0 : c0 + width) with the CPU reference on the same query bytes and pages.
bool check_window(const Queries& queries, const Pool& pool, int request, std::int64_t row, std::int64_t c0,
                  int width, const Tensor& scores) {
  const IndexerEntryFormat fmt = pool.format;
  const std::int64_t num_cols = scores.shape()[1];
  // One-row query.
  const int code_bytes = kHeads * fmt.data_bytes();
  const int scale_bytes = kHeads * 4;  // FP8: a float per head; FP4: 4 ue8m0 bytes per head
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(code_bytes)), scales(static_cast<std::size_t>(scale_bytes));
  std::vector<float> weights(kHeads);
  check_cuda(cudaMemcpy(codes.data(), queries.q.codes.data_as<std::uint8_t>() + row * code_bytes, codes.size(),
                        cudaMemcpyDeviceToHost), "q");
  check_cuda(cudaMemcpy(scales.data(), queries.q.scales.data_as<std::uint8_t>() + row * scale_bytes, scales.size(),
                        cudaMemcpyDeviceToHost), "q");
  check_cuda(cudaMemcpy(weights.data(), queries.q.weights.data_as<float>() + row * kHeads, sizeof(float) * kHeads,
                        cudaMemcpyDeviceToHost), "q");
  // The pages holding [c0, c0 + width), as a small pool of their own.
  const int first_page = static_cast<int>(c0 / kEntriesPerPage);
  const int last_page = static_cast<int>((c0 + width - 1) / kEntriesPerPage);
  const int n_pages = last_page - first_page + 1;
  const std::int64_t page_bytes = fmt.page_bytes(kEntriesPerPage);
  std::vector<std::uint8_t> pages(static_cast<std::size_t>(n_pages * page_bytes));
  std::vector<std::int32_t> table;
  for (int p = 0; p < n_pages; ++p) {
    const std::int32_t physical = pool.host_table[static_cast<std::size_t>(request) * pool.pages_per_request + first_page + p];
    check_cuda(cudaMemcpy(pages.data() + p * page_bytes, pool.pages.data_as<std::uint8_t>() + physical * page_bytes,
                          static_cast<std::size_t>(page_bytes), cudaMemcpyDeviceToHost), "pages");
    table.push_back(p);
  }
  // Entries [c0, c0 + width) are entries [c0 − 64·first_page, …) of the small pool.
  const std::int64_t offset = c0 - static_cast<std::int64_t>(first_page) * kEntriesPerPage;
  const std::int64_t cols = offset + width;
  std::vector<std::int32_t> qs = {0, 1}, vis = {static_cast<std::int32_t>(cols)};
  std::vector<float> want(static_cast<std::size_t>(cols));
  const Shape scale_shape = fmt.format == IndexerKeyFormat::FP8 ? Shape{1, kHeads} : Shape{1, kHeads, 4};
  indexer_scores({TensorView{codes.data(), DType::U8, {1, kHeads, fmt.data_bytes()}, Device::CPU},
                  TensorView{scales.data(), fmt.format == IndexerKeyFormat::FP8 ? DType::F32 : DType::U8, scale_shape,
                             Device::CPU},
                  TensorView{weights.data(), DType::F32, {1, kHeads}, Device::CPU}},
                 {TensorView{pages.data(), DType::U8, {n_pages, page_bytes}, Device::CPU}, fmt, kEntriesPerPage},
                 {TensorView{qs.data(), DType::I32, {2}, Device::CPU}, TensorView{vis.data(), DType::I32, {1}, Device::CPU},
                  TensorView{table.data(), DType::I32, {1, n_pages}, Device::CPU}},
                 TensorView{want.data(), DType::F32, {1, cols}, Device::CPU});
  std::vector<float> got(static_cast<std::size_t>(width));
  check_cuda(cudaMemcpy(got.data(), scores.data_as<float>() + row * num_cols + c0, sizeof(float) * width,
                        cudaMemcpyDeviceToHost), "scores");
  double err = 0, norm = 0;
  for (int i = 0; i < width; ++i) {
    const double w = want[static_cast<std::size_t>(offset + i)], g = got[static_cast<std::size_t>(i)];
    if (!std::isfinite(g)) return false;
    err += (g - w) * (g - w);
    norm += w * w;
  }
  return norm > 0 && std::sqrt(err / norm) <= 1e-3;
}

struct DecodeCase {
  IndexerKeyFormat format;
  int batch;
  std::int64_t entries;
  int next_n;
};

std::string format_name(IndexerKeyFormat f) { return f == IndexerKeyFormat::FP8 ? "fp8" : "fp4"; }

std::string decode_name(const DecodeCase& c) {
  return "scores_" + format_name(c.format) + "_b" + std::to_string(c.batch) + "_n" + std::to_string(c.entries) +
         "_next" + std::to_string(c.next_n);
}

std::string prefill_name(IndexerKeyFormat f, std::int64_t tokens) {
  return "prefill_" + format_name(f) + "_t" + std::to_string(tokens);
}

std::string query_name(IndexerKeyFormat f, std::int64_t rows) {
  return "query_" + format_name(f) + "_rows" + std::to_string(rows);
}

// A one-request case in a graph of every layer's calls (bench::per_call_in_layer_graph_us): each call
// over its own request's pages of the pool (its own keys), its own queries and scores. Also per layer:
// the scores followed by the top-512 of the row (indices and slots), as a decode step runs them; and
// the layer's whole path (LayerPath), each layer's followed by an empty kernel launched plainly.
using bench::kLayerCalls;

// Row `row` of an I32 [rows, pages] page table, as a one-row table.
TensorView page_table_row(const Tensor& table, int row) {
  TensorView view = table.view();
  view.data = table.data_as<std::int32_t>() + static_cast<std::int64_t>(row) * view.shape[1];
  view.shape[0] = 1;
  return view;
}

struct LayerGraphTimes {
  double scores_us, scores_topk_us, query_scores_topk_us, path_us, boundary_us;
  double path_back_to_back_us;  // the path without the boundary kernel: the next layer launches early behind the attention
};

// Between two layers' paths a model runs other kernels (projections, the MoE), which need not allow
// early launches; one empty kernel launched plainly stands for them. Without it the next layer's query
// preparation and score kernel launch early behind the attention, which measured 2.2 µs slower a layer
// (twenty-fourth session) — an arrangement no model has.
__global__ void layer_boundary() { cuda::spans::stamp(cuda::spans::kOther); }

#if defined(DSV4_KERNEL_SPANS)
// A probe build's timeline of a path graph: 10 replays, each after an L2 flush and with its stamps
// alone in the buffer (one unstamped replay before them). A replay's stamps, in the order their blocks
// took a place in the buffer — which is launch order, since a block stamps after its wait and every
// stamp of a kernel lands before that kernel completes —, split into launches where the kernel or the
// grid changes; per launch the first and the last block's stamp, µs from the replay's first stamp,
// medians over the replays, a line a layer (a line ends with the layer's attention; the boundary
// kernel after it opens the next line). A kernel launched early has its blocks waiting already, so its
// first stamp is when the kernel before it ended (and its memory was flushed).
void print_path_spans(const bench::CapturedGraph& graph, cudaStream_t stream) {
  using cuda::spans::Stamp;
  constexpr std::uint32_t kCapacity = 1u << 16;
  constexpr int kReplays = 10;
  Stamp* buffer = nullptr;
  std::uint32_t* count = nullptr;
  check_cuda(cudaMalloc(&buffer, kCapacity * sizeof(Stamp)), "spans buffer");
  check_cuda(cudaMalloc(&count, sizeof(std::uint32_t)), "spans count");
  graph.launch(stream);  // the graph's first launch (its upload) outside the measurement
  check_cuda(cudaStreamSynchronize(stream), "spans warm-up");
  const double plain_us = bench::time_us([&](cudaStream_t s) { graph.launch(s); }, stream, {3, 20, true});
  check_cuda(cuda::spans::attach(buffer, count, kCapacity), "spans attach");
  struct Launch {
    std::uint32_t kernel;
    std::vector<double> first, last;
    std::vector<int> blocks;
    std::vector<double> sms, most_on_one_sm;  // SMs the blocks ran on, and the most blocks on one of them
  };
  std::vector<Launch> launches;
  bench::L2Flusher flusher;
  std::uint64_t step = ~0ull;  // the smallest positive gap between two stamps: the timer's resolution
  for (int r = 0; r < kReplays; ++r) {
    check_cuda(cudaMemset(count, 0, sizeof(std::uint32_t)), "spans count");
    flusher.flush(stream);
    graph.launch(stream);
    check_cuda(cudaStreamSynchronize(stream), "spans replay");
    std::uint32_t n = 0;
    check_cuda(cudaMemcpy(&n, count, sizeof n, cudaMemcpyDeviceToHost), "spans count");
    if (n > kCapacity) std::printf("spans: %u stamps, %u kept\n", n, kCapacity);
    std::vector<Stamp> stamps(std::min(n, kCapacity));
    check_cuda(cudaMemcpy(stamps.data(), buffer, stamps.size() * sizeof(Stamp), cudaMemcpyDeviceToHost), "spans");
    if (stamps.empty()) break;
    std::uint64_t t0 = stamps.front().ns;
    for (const Stamp& x : stamps) t0 = std::min(t0, x.ns);
    std::vector<std::uint64_t> sorted;
    for (const Stamp& x : stamps) sorted.push_back(x.ns);
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t k = 1; k < sorted.size(); ++k)
      if (sorted[k] > sorted[k - 1]) step = std::min(step, sorted[k] - sorted[k - 1]);
    std::size_t index = 0;
    for (std::size_t k = 0; k < stamps.size();) {
      std::size_t e = k;
      std::uint64_t lo = stamps[k].ns, hi = stamps[k].ns;
      std::map<std::uint32_t, int> per_sm;
      while (e < stamps.size() && stamps[e].kernel == stamps[k].kernel && stamps[e].grid == stamps[k].grid) {
        lo = std::min(lo, stamps[e].ns);
        hi = std::max(hi, stamps[e].ns);
        ++per_sm[stamps[e].sm];
        ++e;
      }
      int most = 0;
      for (const auto& [sm, n] : per_sm) most = std::max(most, n);
      if (r == 0) launches.push_back({stamps[k].kernel, {}, {}, {}});
      if (index < launches.size() && launches[index].kernel == stamps[k].kernel) {
        launches[index].first.push_back((lo - t0) / 1e3);
        launches[index].last.push_back((hi - t0) / 1e3);
        launches[index].blocks.push_back(static_cast<int>(e - k));
        launches[index].sms.push_back(static_cast<double>(per_sm.size()));
        launches[index].most_on_one_sm.push_back(most);
      }
      ++index;
      k = e;
    }
  }
  check_cuda(cuda::spans::attach(nullptr, nullptr, 0), "spans detach");
  const double stamped_us = [&] {
    check_cuda(cuda::spans::attach(buffer, count, 0), "spans attach");  // stamping on, nothing kept
    const double us = bench::time_us([&](cudaStream_t s) { graph.launch(s); }, stream, {3, 20, true});
    check_cuda(cuda::spans::attach(nullptr, nullptr, 0), "spans detach");
    return us;
  }();
  cudaFree(buffer);
  cudaFree(count);
  using bench::median;
  const char* names[] = {"?", "query", "scores", "top-k", "attention", "compressor", "boundary"};
  std::printf("%40s spans (medians of %d replays, us from the first stamp: first block .. last block, blocks / SMs / most on one SM); "
              "timer step %.3f us; the graph %.2f us, %.2f us with stamping\n", "", kReplays,
              step == ~0ull ? 0.0 : step / 1e3, plain_us, stamped_us);
  std::string line;
  int layer = 0;
  for (const Launch& l : launches) {
    char cell[128];
    std::snprintf(cell, sizeof cell, "  %s %.2f..%.2f (%d/%.0f/%.0f)", names[l.kernel < 7 ? l.kernel : 0],
                  median(l.first), median(l.last), l.blocks.empty() ? 0 : l.blocks.front(), median(l.sms),
                  median(l.most_on_one_sm));
    line += cell;
    if (l.kernel == cuda::spans::kAttention) {
      std::printf("%40s layer %d:%s\n", "", layer++, line.c_str());
      line.clear();
    }
  }
  if (!line.empty()) std::printf("%40s after the last layer:%s\n", "", line.c_str());
}
#endif

// The rest of a CSA decode layer's path around its scores: the query preparation in front (from
// random projected query rows, head logits and rotation), and behind the top-512 the sparse attention
// (H = 64, bf16 queries) over the row's 128 window entries and the 512 selected compressed entries, at
// the latency split (64 candidates a chunk, merged in a cluster). The compressed entries live in a pool
// of their own whose page table the top-k translates through, as a layer's attention cache has one.
struct LayerPath {
  static constexpr int kAttentionHeads = 64, kWindow = 128, kTopK = 512, kSplit = 64, kRopePairs = 32;
  Tensor attention_pool, window_pool, attention_table;
  std::vector<Tensor> q_rows, logits, cos, sin, q, window_slots, sink, out, lse, workspace;
  std::vector<TensorView> table_rows;
  std::vector<SparseAttentionOptions> options;

  LayerPath(const Pool& keys, cudaStream_t stream)
      : attention_pool(bench::random_attention_pool(static_cast<std::int64_t>(kLayerCalls) * keys.pages_per_request,
                                                    kEntriesPerPage, 77)),
        window_pool(bench::random_attention_pool(kLayerCalls * kWindow / kEntriesPerPage, kEntriesPerPage, 78)) {
    std::vector<std::int32_t> table(static_cast<std::size_t>(kLayerCalls) * keys.pages_per_request);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937_64(79));
    attention_table = Tensor::from_host(DType::I32, {kLayerCalls, keys.pages_per_request}, table.data(), Device::CUDA);
    const std::size_t scratch = sparse_attention_workspace_bytes(1, kAttentionHeads, kWindow + kTopK, kSplit);
    for (int l = 0; l < kLayerCalls; ++l) {
      const auto floats = [&](Shape shape, float lo, float hi, std::uint64_t seed) {
        Tensor t = Tensor::empty(DType::F32, std::move(shape), Device::CUDA);
        fill_floats<<<64, 256>>>(t.data_as<float>(), t.numel(), lo, hi, seed);
        return t;
      };
      const std::uint64_t seed = 1000 + 10 * static_cast<std::uint64_t>(l);
      q_rows.push_back(floats({1, kHeads * kDim}, -3.0f, 3.0f, seed));
      logits.push_back(floats({1, kHeads}, -1.0f, 1.0f, seed + 1));
      cos.push_back(floats({1, kRopePairs}, -1.0f, 1.0f, seed + 2));
      sin.push_back(floats({1, kRopePairs}, -1.0f, 1.0f, seed + 3));
      sink.push_back(floats({kAttentionHeads}, -1.0f, 2.0f, seed + 4));
      q.push_back(Tensor::empty(DType::BF16, {1, kAttentionHeads, AttentionEntryFormat::kDim}, Device::CUDA));
      bench::fill_bf16<<<64, 256>>>(q.back().data_as<std::uint16_t>(), q.back().numel(), seed + 5);
      std::vector<std::int32_t> window(kWindow);
      std::iota(window.begin(), window.end(), l * kWindow);  // the layer's own window entries
      window_slots.push_back(Tensor::from_host(DType::I32, {1, kWindow}, window.data(), Device::CUDA));
      out.push_back(Tensor::empty(DType::BF16, {1, kAttentionHeads, AttentionEntryFormat::kDim}, Device::CUDA));
      lse.push_back(Tensor::empty(DType::F32, {1, kAttentionHeads}, Device::CUDA));
      workspace.push_back(Tensor::zeros(DType::U8, {static_cast<std::int64_t>(scratch)}, Device::CUDA));
      table_rows.push_back(page_table_row(attention_table, l));
      SparseAttentionOptions o;
      o.split_candidates = kSplit;
      o.workspace = workspace.back().view();
      o.stream = stream;
      options.push_back(o);
    }
    check_cuda(cudaDeviceSynchronize(), "layer path inputs");
  }

  void prepare_queries(int l, IndexerKeyFormat format, const IndexerQuery& queries, const IndexerOptions& o) const {
    prepare_indexer_queries(q_rows[l].view(), logits[l].view(), cos[l].view(), sin[l].view(), format, queries.view(), o);
  }
  void attend(int l, const Tensor& selected_slots) const {
    sparse_attention(q[l].view(), {window_pool.view(), kEntriesPerPage}, {attention_pool.view(), kEntriesPerPage},
                     window_slots[l].view(), selected_slots.view(), sink[l].view(), out[l].view(), lse[l].view(),
                     options[l]);
  }
};

LayerGraphTimes time_layer_graphs(const DecodeCase& c, const Pool& pool) {
  constexpr int kTopK = LayerPath::kTopK;
  std::vector<std::int32_t> qs = {0, 1}, vis = {static_cast<std::int32_t>(c.entries)};
  const Tensor d_qs = Tensor::from_host(DType::I32, {2}, qs.data(), Device::CUDA);
  const Tensor d_vis = Tensor::from_host(DType::I32, {1}, vis.data(), Device::CUDA);
  const IndexerKeyCacheView keys{pool.pages.view(), pool.format, kEntriesPerPage};
  std::vector<Queries> queries;
  std::vector<Tensor> scores, indices, slots;
  std::vector<IndexerRowsView> rows;
  for (int l = 0; l < kLayerCalls; ++l) {
    queries.emplace_back(c.format, 1, 4321 + l);
    scores.push_back(Tensor::empty(DType::F32, {1, c.entries}, Device::CUDA));
    indices.push_back(Tensor::empty(DType::I32, {1, kTopK}, Device::CUDA));
    slots.push_back(Tensor::empty(DType::I32, {1, kTopK}, Device::CUDA));
    // request l's row: keys no other layer reads
    rows.push_back({d_qs.view(), d_vis.view(), page_table_row(pool.page_table, l)});
  }
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  IndexerOptions fast;
  fast.check_contents = false;
  fast.stream = stream;
  const LayerPath path(pool, stream);
  enum class Calls { scores, scores_topk, query_scores_topk, path, path_back_to_back, boundary };
  const auto enqueue = [&](int l, Calls calls) {
    if (calls == Calls::boundary) {
      layer_boundary<<<1, 32, 0, stream>>>();
      return;
    }
    if (calls >= Calls::query_scores_topk) path.prepare_queries(l, c.format, queries[l].q, fast);
    indexer_scores(queries[l].q.view(), keys, rows[l], scores[l].view(), fast);
    if (calls >= Calls::scores_topk) {  // the path's slots are in the layer's attention pool
      const IndexerRowsView topk_rows =
          calls == Calls::scores_topk ? rows[l] : IndexerRowsView{d_qs.view(), d_vis.view(), path.table_rows[l]};
      indexer_topk(scores[l].view(), topk_rows, kEntriesPerPage, indices[l].view(), slots[l].view(), fast);
    }
    if (calls >= Calls::path) path.attend(l, slots[l]);
    if (calls == Calls::path) layer_boundary<<<1, 32, 0, stream>>>();
  };
  const auto time_graph = [&](Calls calls) {
    for (int l = 0; l < kLayerCalls; ++l) enqueue(l, calls);  // first calls outside the capture (kernel attributes)
    check_cuda(cudaStreamSynchronize(stream), "layer calls");
    return bench::per_call_in_layer_graph_us(stream, [&](int l, cudaStream_t) { enqueue(l, calls); },  // (on `stream`)
                                             {3, 20, true});
  };
  const LayerGraphTimes times{time_graph(Calls::scores), time_graph(Calls::scores_topk),
                              time_graph(Calls::query_scores_topk), time_graph(Calls::path),
                              time_graph(Calls::boundary), time_graph(Calls::path_back_to_back)};
#if defined(DSV4_KERNEL_SPANS)
  // DSV4_SPANS_NO_BOUNDARY=1: the layers back to back, without the boundary kernel.
  const bool no_boundary = std::getenv("DSV4_SPANS_NO_BOUNDARY") != nullptr;
  print_path_spans(bench::CapturedGraph(stream, [&](cudaStream_t) {
                     for (int l = 0; l < kLayerCalls; ++l) enqueue(l, no_boundary ? Calls::path_back_to_back : Calls::path);
                   }),
                   stream);
#endif
  cudaStreamDestroy(stream);
  return times;
}

// The cases asked for on the command line: all when no name part is given.
void run_decode(bench::Report& report, const DecodeCase& c, double copy_gbs, const Pool& pool) {
  const std::int64_t rows = static_cast<std::int64_t>(c.batch) * c.next_n;
  Queries queries(c.format, rows, 1234 + rows);
  std::vector<std::int32_t> qs(static_cast<std::size_t>(c.batch + 1)), vis(static_cast<std::size_t>(rows),
                                                                           static_cast<std::int32_t>(c.entries));
  for (int b = 0; b <= c.batch; ++b) qs[static_cast<std::size_t>(b)] = b * c.next_n;
  Tensor d_qs = Tensor::from_host(DType::I32, {c.batch + 1}, qs.data(), Device::CUDA);
  Tensor d_vis = Tensor::from_host(DType::I32, {rows}, vis.data(), Device::CUDA);
  Tensor scores = Tensor::empty(DType::F32, {rows, c.entries}, Device::CUDA);
  // The pool holds 128 requests; this case uses the first `batch` page-table rows.
  TensorView table = pool.page_table.view();
  table.shape[0] = c.batch;
  const IndexerRowsView rows_view{d_qs.view(), d_vis.view(), table};
  const IndexerKeyCacheView keys{pool.pages.view(), pool.format, kEntriesPerPage};
  indexer_scores(queries.q.view(), keys, rows_view, scores.view());  // checked once, with validation
  check_cuda(cudaDeviceSynchronize(), "scores");
  bool ok = check_window(queries, pool, 0, 0, 0, 256, scores) &&
            check_window(queries, pool, c.batch - 1, rows - 1, c.entries - 192, 192, scores);
  IndexerOptions fast;
  fast.check_contents = false;
  const double us = bench::time_us([&](cudaStream_t s) {
    fast.stream = s;
    indexer_scores(queries.q.view(), keys, rows_view, scores.view(), fast);
  }, nullptr, {3, 20, true});
  const double key_bytes = static_cast<double>(c.batch) * c.entries * pool.format.entry_bytes();
  const std::string name = decode_name(c);
  const double tflops = 2.0 * rows * c.entries * kHeads * kDim / (us * 1e-6) / 1e12;
  nlohmann::json shape = {{"batch", c.batch},          {"entries", c.entries}, {"next_n", c.next_n},
                          {"format", format_name(c.format)}, {"key_bytes", key_bytes}, {"tflops", tflops}};
  if (c.batch == 1 && c.next_n == 1) {
    const LayerGraphTimes layers = time_layer_graphs(c, pool);
    shape["layer_graph_steps"] = kLayerCalls;
    shape["per_call_in_layer_graph_us"] = layers.scores_us;
    shape["per_layer_scores_topk512_in_graph_us"] = layers.scores_topk_us;
    shape["per_layer_query_scores_topk512_in_graph_us"] = layers.query_scores_topk_us;
    shape["per_layer_query_scores_topk512_attention_in_graph_us"] = layers.path_us;  // with the boundary kernel
    shape["per_layer_boundary_kernel_in_graph_us"] = layers.boundary_us;
    shape["per_layer_query_scores_topk512_attention_back_to_back_in_graph_us"] = layers.path_back_to_back_us;
    std::printf("%40s %10.2f us a call in a graph of %d layers' calls; scores + top-512 %.2f us a layer; with the "
                "query preparation %.2f; query + scores + top-512 + attention %.2f us a layer (an empty kernel "
                "between layers: %.2f us a layer alone; back to back, no kernel between layers: %.2f us a layer)\n", "",
                layers.scores_us, kLayerCalls, layers.scores_topk_us, layers.query_scores_topk_us, layers.path_us,
                layers.boundary_us, layers.path_back_to_back_us);
  }
  report.add(name, shape, us, "GB/s", key_bytes / (us * 1e-6) / 1e9, copy_gbs, ok);
}

void run_prefill(bench::Report& report, IndexerKeyFormat format, std::int64_t tokens) {
  const std::int64_t entries = tokens / 4;
  Pool pool(format, 1, entries, 99 + tokens);
  Queries queries(format, tokens, 4321 + tokens);
  std::vector<std::int32_t> qs = {0, static_cast<std::int32_t>(tokens)}, vis(static_cast<std::size_t>(tokens));
  double pairs = 0;
  for (std::int64_t t = 0; t < tokens; ++t) {
    vis[static_cast<std::size_t>(t)] = static_cast<std::int32_t>((t + 1) / 4);
    pairs += static_cast<double>((t + 1) / 4);
  }
  Tensor d_qs = Tensor::from_host(DType::I32, {2}, qs.data(), Device::CUDA);
  Tensor d_vis = Tensor::from_host(DType::I32, {tokens}, vis.data(), Device::CUDA);
  Tensor scores = Tensor::empty(DType::F32, {tokens, entries}, Device::CUDA);
  const IndexerRowsView rows_view{d_qs.view(), d_vis.view(), pool.page_table.view()};
  const IndexerKeyCacheView keys{pool.pages.view(), pool.format, kEntriesPerPage};
  indexer_scores(queries.q.view(), keys, rows_view, scores.view());
  check_cuda(cudaDeviceSynchronize(), "prefill");
  // The last row sees every entry; a middle row half of them.
  const std::int64_t mid = tokens / 2;
  bool ok = check_window(queries, pool, 0, tokens - 1, entries - 256, 256, scores) &&
            check_window(queries, pool, 0, mid, (mid + 1) / 4 - 128, 128, scores);
  std::vector<float> beyond(1);
  check_cuda(cudaMemcpy(beyond.data(), scores.data_as<float>() + mid * entries + entries - 1, 4, cudaMemcpyDeviceToHost),
             "beyond");
  ok = ok && std::isinf(beyond[0]) && beyond[0] < 0;
  IndexerOptions fast;
  fast.check_contents = false;
  const double us = bench::time_us([&](cudaStream_t s) {
    fast.stream = s;
    indexer_scores(queries.q.view(), keys, rows_view, scores.view(), fast);
  }, nullptr, {2, 10, true});
  const double tflops = pairs * 2.0 * kHeads * kDim / (us * 1e-6) / 1e12;
  report.add(prefill_name(format, tokens),
             {{"tokens", tokens}, {"entries", entries}, {"format", format_name(format)},
              {"score_bytes", 4.0 * tokens * entries}},
             us, "TFLOP/s", tflops, kFp8TensorCeiling, ok);
}

void run_query_prep(bench::Report& report, IndexerKeyFormat format, std::int64_t rows, double copy_gbs) {
  Tensor q_rows = Tensor::empty(DType::F32, {rows, kHeads * kDim}, Device::CUDA);
  Tensor logits = Tensor::empty(DType::F32, {rows, kHeads}, Device::CUDA);
  Tensor cos = Tensor::empty(DType::F32, {rows, 32}, Device::CUDA), sin = Tensor::empty(DType::F32, {rows, 32}, Device::CUDA);
  fill_floats<<<1024, 256>>>(q_rows.data_as<float>(), q_rows.numel(), -2.0f, 2.0f, 5);
  fill_floats<<<64, 256>>>(logits.data_as<float>(), logits.numel(), -1.0f, 1.0f, 6);
  fill_floats<<<64, 256>>>(cos.data_as<float>(), cos.numel(), -1.0f, 1.0f, 7);
  fill_floats<<<64, 256>>>(sin.data_as<float>(), sin.numel(), -1.0f, 1.0f, 8);
  IndexerQuery out = IndexerQuery::empty(format, rows, kHeads, kDim, Device::CUDA);
  const auto launch = [&](cudaStream_t s) {
    IndexerOptions o;
    o.stream = s;
    prepare_indexer_queries(q_rows.view(), logits.view(), cos.view(), sin.view(), format, out.view(), o);
  };
  launch(nullptr);
  check_cuda(cudaDeviceSynchronize(), "query prep");
  // Check against the reference on the first rows (bit-exact codes expected).
  const std::int64_t check_rows = std::min<std::int64_t>(rows, 4);
  std::vector<float> h_rows(static_cast<std::size_t>(check_rows * kHeads * kDim)), h_logits(static_cast<std::size_t>(check_rows * kHeads)),
      h_cos(static_cast<std::size_t>(check_rows * 32)), h_sin(h_cos.size());
  check_cuda(cudaMemcpy(h_rows.data(), q_rows.data(), h_rows.size() * 4, cudaMemcpyDeviceToHost), "rows");
  check_cuda(cudaMemcpy(h_logits.data(), logits.data(), h_logits.size() * 4, cudaMemcpyDeviceToHost), "logits");
  check_cuda(cudaMemcpy(h_cos.data(), cos.data(), h_cos.size() * 4, cudaMemcpyDeviceToHost), "cos");
  check_cuda(cudaMemcpy(h_sin.data(), sin.data(), h_sin.size() * 4, cudaMemcpyDeviceToHost), "sin");
  IndexerQuery want = IndexerQuery::empty(format, check_rows, kHeads, kDim);
  prepare_indexer_queries(TensorView{h_rows.data(), DType::F32, {check_rows, kHeads * kDim}, Device::CPU},
                          TensorView{h_logits.data(), DType::F32, {check_rows, kHeads}, Device::CPU},
                          TensorView{h_cos.data(), DType::F32, {check_rows, 32}, Device::CPU},
                          TensorView{h_sin.data(), DType::F32, {check_rows, 32}, Device::CPU}, format, want.view());
  std::vector<std::uint8_t> got(want.codes.nbytes());
  check_cuda(cudaMemcpy(got.data(), out.codes.data(), got.size(), cudaMemcpyDeviceToHost), "codes");
  std::size_t same = 0;
  for (std::size_t i = 0; i < got.size(); ++i) same += got[i] == want.codes.data_as<std::uint8_t>()[i];
  const bool ok = same >= got.size() * 999 / 1000;
  const double us = bench::time_us(launch, nullptr, {3, 20, true});
  const double bytes = static_cast<double>(q_rows.nbytes() + logits.nbytes() + cos.nbytes() + sin.nbytes() +
                                           out.codes.nbytes() + out.scales.nbytes() + out.weights.nbytes());
  report.add(query_name(format, rows), {{"rows", rows}, {"bytes", bytes}}, us,
             "GB/s", bytes / (us * 1e-6) / 1e9, copy_gbs, ok);
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<bench::Session> session = bench::start_session("bench_indexer", argc, argv);
  if (!session) return 2;
  auto& [report, filter, copy_gbs] = *session;
  for (IndexerKeyFormat f : {IndexerKeyFormat::FP8, IndexerKeyFormat::FP4}) {
    std::vector<DecodeCase> cases;
    for (int batch : {1, 32, 128})
      for (std::int64_t n : {16384, 65536, 262144})
        for (int next_n : {1, 2, 4})
          if (filter.wants(decode_name({f, batch, n, next_n}))) cases.push_back({f, batch, n, next_n});
    if (cases.empty()) continue;
    const Pool pool(f, 128, 262144, 7 + static_cast<int>(f));  // 128 requests × 256K entries: every decode case
    for (const DecodeCase& c : cases) run_decode(report, c, copy_gbs, pool);
  }
  for (IndexerKeyFormat f : {IndexerKeyFormat::FP8, IndexerKeyFormat::FP4})
    for (std::int64_t t : {8192, 65536})
      if (filter.wants(prefill_name(f, t))) run_prefill(report, f, t);
  for (IndexerKeyFormat f : {IndexerKeyFormat::FP8, IndexerKeyFormat::FP4})
    for (std::int64_t rows : {1, 128, 65536})
      if (filter.wants(query_name(f, rows)))
        run_query_prep(report, f, rows, copy_gbs);
  report.write();
  return 0;
}
