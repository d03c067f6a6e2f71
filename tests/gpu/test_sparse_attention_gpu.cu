// Sparse attention on the GPU against the CPU reference (SPEC §9: relative L2 ≤ 1e-2, no NaN, every
// element written), batch invariance (identical bytes alone and inside a batch), the exact FP8
// dequantization, and the CUDA-side argument checks. Tests named *Sanitize* are the reduced set
// scripts/gpu-check runs under compute-sanitizer.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu/indexer_testing.hpp"  // host_view
#include "gpu/late_writer.cuh"
#include "cuda/sparse_attention/dequant.cuh"
#include "cuda/sparse_attention/params.hpp"  // set_cluster_merge
#include "dsv4/cache_format.hpp"
#include "dsv4/entry_codec.hpp"
#include "dsv4/formats.hpp"
#include "dsv4/sparse_attention.hpp"
#include "dsv4/tensor.hpp"
#include "dsv4/topk.hpp"
#include "testing/attention_pool.hpp"
#include "testing/testing.hpp"

namespace dsv4 {
namespace {

using F = AttentionEntryFormat;
constexpr float kInf = std::numeric_limits<float>::infinity();

// A pool of random entries on the host and its copy on the GPU.
struct Pool : testing::RandomAttentionPool {
  Tensor device;

  Pool(std::mt19937_64& rng, int per_page_, int num_pages_, int binades = 7)
      : RandomAttentionPool(rng, per_page_, num_pages_, binades) {
    device = Tensor::from_host(DType::U8, {num_pages, F::page_bytes(per_page)}, bytes.data(), Device::CUDA);
  }
  AttentionPoolView device_view() const { return {device.view(), per_page}; }
};

struct Outputs {
  std::vector<std::uint16_t> out;  // bf16 [rows, heads, 512]
  std::vector<float> lse;          // [rows, heads]
};

// One call: inputs on the host (for the reference) and on the GPU.
// Most tests run with chunks of 384 candidates, so rows of a few hundred candidates already take the
// multi-chunk paths (partials, merge, arrival counters); the library default (1152) is tested apart.
constexpr int kTestSplit = 384;
SparseAttentionOptions chunked() {
  SparseAttentionOptions options;
  options.split_candidates = kTestSplit;
  return options;
}

struct Problem {
  const Pool* window;
  const Pool* compressed;
  int rows = 0, heads = 0, window_width = 0, compressed_width = 0;
  std::vector<std::uint16_t> q;
  std::vector<std::int32_t> window_slots, compressed_slots;
  std::vector<float> sink, rope_cos, rope_sin;

  Problem(std::mt19937_64& rng, const Pool& w, const Pool& c, int rows_, int heads_, int ww, int cw)
      : window(&w), compressed(&c), rows(rows_), heads(heads_), window_width(ww), compressed_width(cw) {
    for (float x : testing::random_normal(rng, static_cast<std::size_t>(rows) * heads * F::kDim, 2.0f))
      q.push_back(bf16_bits_from_float(x));
    window_slots.assign(static_cast<std::size_t>(rows) * ww, -1);
    compressed_slots.assign(static_cast<std::size_t>(rows) * cw, -1);
    sink = testing::random_floats(rng, static_cast<std::size_t>(heads), -1.0f, 3.0f);
  }

  // Every slot random over its pool, or −1 with probability `none`.
  void random_slots(std::mt19937_64& rng, double none) {
    std::bernoulli_distribution missing(none);
    std::uniform_int_distribution<int> in_window(0, window->slots() - 1), in_compressed(0, compressed->slots() - 1);
    for (auto& s : window_slots) s = missing(rng) ? -1 : in_window(rng);
    for (auto& s : compressed_slots) s = missing(rng) ? -1 : in_compressed(rng);
  }

  void random_rope(std::mt19937_64& rng) {
    rope_cos.clear();
    rope_sin.clear();
    for (float angle : testing::random_floats(rng, static_cast<std::size_t>(rows) * 32, -3.2f, 3.2f)) {
      rope_cos.push_back(std::cos(angle));
      rope_sin.push_back(std::sin(angle));
    }
  }

  // Rows [first, first + count) alone: their queries, slot lists and RoPE tables (same pools, sinks).
  Problem slice(int first, int count) const {
    const auto rows_of = [first, count](const auto& v, std::size_t per_row) {
      return v.empty() ? v
                       : std::decay_t<decltype(v)>(v.begin() + static_cast<std::ptrdiff_t>(first * per_row),
                                                   v.begin() + static_cast<std::ptrdiff_t>((first + count) * per_row));
    };
    Problem part = *this;
    part.rows = count;
    part.q = rows_of(q, static_cast<std::size_t>(heads) * F::kDim);
    part.window_slots = rows_of(window_slots, static_cast<std::size_t>(window_width));
    part.compressed_slots = rows_of(compressed_slots, static_cast<std::size_t>(compressed_width));
    part.rope_cos = rows_of(rope_cos, 32);
    part.rope_sin = rows_of(rope_sin, 32);
    return part;
  }

  // `before_call(inputs)`, if given, runs with the device inputs just before the call (the early-launch
  // test replaces them there by a kernel that writes them late).
  Outputs run(Device device, SparseAttentionOptions options = chunked(),
              const std::function<void(std::initializer_list<Tensor*>)>& before_call = nullptr) const {
    const auto put = [&](DType t, Shape shape, const void* data) {
      return Tensor::from_host(t, std::move(shape), data, device);
    };
    Tensor tq = put(DType::BF16, {rows, heads, F::kDim}, q.data());
    Tensor tw = put(DType::I32, {rows, window_width}, window_slots.data());
    Tensor tc = put(DType::I32, {rows, compressed_width}, compressed_slots.data());
    Tensor ts = put(DType::F32, {heads}, sink.data());
    Tensor out = Tensor::empty(DType::BF16, {rows, heads, F::kDim}, device);
    Tensor lse = Tensor::empty(DType::F32, {rows, heads}, device);
    out.fill_bytes(0xFF);  // NaN everywhere: an element left unwritten shows
    lse.fill_bytes(0xFF);
    Tensor cos_t, sin_t;
    if (!rope_cos.empty()) {
      cos_t = put(DType::F32, {rows, 32}, rope_cos.data());
      sin_t = put(DType::F32, {rows, 32}, rope_sin.data());
      options.rope_cos = cos_t.view();
      options.rope_sin = sin_t.view();
    }
    const bool gpu = device == Device::CUDA;
    if (before_call) before_call({&tq, &tw, &tc, &ts});
    sparse_attention(tq.view(), gpu ? window->device_view() : window->host_view(),
                     gpu ? compressed->device_view() : compressed->host_view(), tw.view(), tc.view(), ts.view(),
                     out.view(), lse.view(), options);
    Outputs r;
    r.out.resize(out.numel());
    r.lse.resize(lse.numel());
    Tensor host_out = out.to(Device::CPU), host_lse = lse.to(Device::CPU);
    std::copy_n(host_out.data_as<std::uint16_t>(), r.out.size(), r.out.begin());
    std::copy_n(host_lse.data_as<float>(), r.lse.size(), r.lse.begin());
    return r;
  }
};

// SPEC §9 on the GPU result against the reference.
void expect_close(const Outputs& gpu, const Outputs& ref, const char* what) {
  ASSERT_EQ(gpu.out.size(), ref.out.size());
  std::vector<float> a(gpu.out.size()), b(ref.out.size());
  std::size_t nan_out = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = float_from_bf16_bits(gpu.out[i]);
    b[i] = float_from_bf16_bits(ref.out[i]);
    nan_out += std::isnan(a[i]) ? 1 : 0;
  }
  EXPECT_EQ(nan_out, 0u) << what << ": NaN (unwritten) output elements";
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), den += double(b[i]) * b[i];
  if (den > 0) {
    EXPECT_LE(std::sqrt(num / den), 1e-2) << what << ": relative L2";
  } else {
    EXPECT_EQ(num, 0.0) << what << ": the reference is all zero";
  }
  for (std::size_t i = 0; i < gpu.lse.size(); ++i) {
    ASSERT_FALSE(std::isnan(gpu.lse[i])) << what << ": lse " << i << " not written";
    if (std::isinf(ref.lse[i])) {
      EXPECT_EQ(gpu.lse[i], ref.lse[i]) << what << ": lse " << i;
    } else {
      EXPECT_NEAR(gpu.lse[i], ref.lse[i], 1e-3 * std::max(1.0f, std::fabs(ref.lse[i]))) << what << ": lse " << i;
    }
  }
}

// Two runs of the same problem give the same output and lse bytes; `what` says what differs between them.
void expect_same_bytes(const Outputs& a, const Outputs& b, const std::string& what) {
  EXPECT_TRUE(a.out == b.out) << what << " changes the output bytes";
  EXPECT_TRUE(a.lse == b.lse) << what << " changes the lse";
}

// Rows [first, first + count) of `batch` run alone give exactly their bytes of `all` (the batch's outputs).
void expect_rows_keep_bytes(const Problem& batch, const Outputs& all, int first, int count,
                            const SparseAttentionOptions& options, const std::string& what) {
  const Outputs some = batch.slice(first, count).run(Device::CUDA, options);
  const std::size_t row_out = static_cast<std::size_t>(batch.heads) * F::kDim;
  const std::string rows = what + " rows " + std::to_string(first) + ".." + std::to_string(first + count - 1);
  EXPECT_TRUE(std::equal(some.out.begin(), some.out.end(), all.out.begin() + first * row_out))
      << rows << ": output bytes differ from the whole batch";
  EXPECT_TRUE(std::equal(some.lse.begin(), some.lse.end(), all.lse.begin() + first * batch.heads))
      << rows << ": lse differs from the whole batch";
}

void expect_matches_reference(const Problem& p, const SparseAttentionOptions& options, const std::string& what) {
  const Outputs gpu = p.run(Device::CUDA, options);  // the kernel first: recycled memory cannot fake a pass
  const Outputs ref = p.run(Device::CPU, options);
  expect_close(gpu, ref, what.c_str());
}

// Sets a process-wide launcher setting (`kSet` returns the setting before) for a scope, then restores it.
template <class Value, Value (*kSet)(Value)>
struct SettingScope {
  Value before;
  explicit SettingScope(Value value) : before(kSet(value)) {}
  ~SettingScope() { kSet(before); }
};
using ClusterMergeScope = SettingScope<cuda::ClusterMerge, &cuda::set_cluster_merge>;
using AsymmetricScope = SettingScope<bool, &cuda::set_asymmetric_consumers>;
using PairDecodeScope = SettingScope<bool, &cuda::set_pair_decode>;
using EarlyLaunchScope = SettingScope<bool, &cuda::set_early_launch>;

class SparseAttentionGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) GTEST_SKIP() << "no CUDA device";
  }
  std::mt19937_64 rng{testing::fresh_seed()};
};

// ---- against the reference ----------------------------------------------------------------------

TEST_F(SparseAttentionGpu, DecodeShapesMatchReference) {
  const Pool window(rng, 64, 24), compressed(rng, 64, 24);
  for (int heads : {16, 64, 128}) {
    for (int next_n : {1, 2, 5, 8}) {
      // Three requests × next_n rows; the window is the row's last 128 raw tokens through a
      // random page table, the compressed list a random selection (some −1).
      Problem p(rng, window, compressed, 3 * next_n, heads, 128, 512);
      p.random_slots(rng, 0.05);
      std::uniform_int_distribution<int> page(0, window.num_pages - 1);
      for (int b = 0; b < 3; ++b) {
        std::vector<int> page_table(64);
        for (int& pg : page_table) pg = page(rng);
        const int start = std::uniform_int_distribution<int>(0, 2000)(rng);
        for (int j = 0; j < next_n; ++j) {
          const int t = start + j, row = b * next_n + j;
          for (int w = 0; w < 128; ++w) {
            const int pos = t - 127 + w;
            p.window_slots[row * 128 + w] = pos < 0 ? -1 : page_table[pos / 64] * 64 + pos % 64;
          }
        }
      }
      expect_matches_reference(p, chunked(), "H=" + std::to_string(heads) + " next_n=" + std::to_string(next_n));
    }
  }
}

TEST_F(SparseAttentionGpu, WindowOnlyAndSingleCandidateRows) {
  const Pool window(rng, 64, 8), compressed(rng, 2, 40);
  Problem window_only(rng, window, compressed, 8, 64, 128, 0);
  window_only.random_slots(rng, 0.0);
  expect_matches_reference(window_only, chunked(), "window only");

  Problem single(rng, window, compressed, 12, 64, 3, 7);  // exactly one valid slot per row
  std::uniform_int_distribution<int> where(0, 9), slot(0, 79);
  for (int r = 0; r < 12; ++r) {
    const int j = where(rng);
    if (j < 3) single.window_slots[r * 3 + j] = slot(rng);
    else single.compressed_slots[r * 7 + (j - 3)] = slot(rng);
  }
  expect_matches_reference(single, chunked(), "one candidate");
}

TEST_F(SparseAttentionGpu, RowsWithManyMissingSlotsAcrossChunks) {
  const Pool window(rng, 64, 16), compressed(rng, 16, 64);
  Problem p(rng, window, compressed, 10, 64, 128, 1024);  // three chunks of 384 (the tests' split)
  p.random_slots(rng, 0.9);
  for (int j = 0; j < 1024; ++j) p.compressed_slots[3 * 1024 + j] = -1;  // row 3: window only
  for (int j = 0; j < 128; ++j) p.window_slots[5 * 128 + j] = -1;        // row 5: compressed only
  for (int j = 0; j < 128; ++j) p.window_slots[7 * 128 + j] = -1;        // row 7: nothing at all
  for (int j = 0; j < 1024; ++j) p.compressed_slots[7 * 1024 + j] = -1;
  expect_matches_reference(p, chunked(), "many missing");
}

TEST_F(SparseAttentionGpu, SinkExtremes) {
  const Pool window(rng, 64, 8), compressed(rng, 64, 8);
  Problem p(rng, window, compressed, 6, 64, 128, 512);
  p.random_slots(rng, 0.1);
  for (int h = 0; h < 64; ++h) p.sink[h] = h % 3 == 0 ? -kInf : (h % 3 == 1 ? 1e4f : p.sink[h]);
  for (int j = 0; j < 128; ++j) p.window_slots[2 * 128 + j] = -1;  // row 2 has no candidates
  for (int j = 0; j < 512; ++j) p.compressed_slots[2 * 512 + j] = -1;
  const Outputs gpu = p.run(Device::CUDA);
  expect_close(gpu, p.run(Device::CPU), "sink extremes");
  for (int r = 0; r < 6; ++r) {
    for (int h = 1; h < 64; h += 3) {  // huge sink: exactly zero output, lse = sink
      for (int k = 0; k < F::kDim; ++k) ASSERT_EQ(float_from_bf16_bits(gpu.out[(r * 64 + h) * 512 + k]), 0.0f);
      EXPECT_NEAR(gpu.lse[r * 64 + h], 1e4f, 1.0f);
    }
  }
  for (int h = 0; h < 64; ++h) {  // the empty row: zero output; lse = sink (−inf without sink)
    for (int k = 0; k < F::kDim; ++k) ASSERT_EQ(float_from_bf16_bits(gpu.out[(2 * 64 + h) * 512 + k]), 0.0f);
    if (h % 3 == 0) EXPECT_EQ(gpu.lse[2 * 64 + h], -kInf);
  }
}

TEST_F(SparseAttentionGpu, HeadCountsThatNeedPadding) {
  const Pool window(rng, 64, 8), compressed(rng, 64, 8);
  for (int heads : {8, 24, 48, 80}) {
    Problem p(rng, window, compressed, 5, heads, 128, 256);
    p.random_slots(rng, 0.1);
    expect_matches_reference(p, chunked(), "H=" + std::to_string(heads));
  }
}

// H = 32 runs the mma.sync tiles, H = 64 the wgmma tile (launch.cu).
TEST_F(SparseAttentionGpu, SplitSizesMatchReference) {
  const Pool window(rng, 64, 8), compressed(rng, 64, 24);
  for (int heads : {32, 64}) {
    Problem p(rng, window, compressed, 6, heads, 128, 1024);
    p.random_slots(rng, 0.1);
    for (int split : {64, 192, 512, 1152, 2560}) {
      SparseAttentionOptions options = chunked();
      options.split_candidates = split;
      expect_matches_reference(p, options, "H=" + std::to_string(heads) + " split " + std::to_string(split));
    }
  }
}

TEST_F(SparseAttentionGpu, FusedInverseRope) {
  const Pool window(rng, 64, 8), compressed(rng, 64, 8);
  Problem p(rng, window, compressed, 6, 64, 128, 512);
  p.random_slots(rng, 0.1);
  p.random_rope(rng);
  expect_matches_reference(p, chunked(), "two chunks, rope");
  Problem one_chunk(rng, window, compressed, 6, 64, 128, 0);
  one_chunk.random_slots(rng, 0.1);
  one_chunk.random_rope(rng);
  expect_matches_reference(one_chunk, chunked(), "one chunk, rope");
}

// Prefill: three requests of ragged lengths, every token with its causal window and all the
// compressed (ratio 4) entries visible to it, through per-request page tables; −1 padded. H = 64 and
// 128 (two wgmma head tiles per row).
TEST_F(SparseAttentionGpu, PrefillRaggedBatch) {
  for (int heads : {64, 128}) {
    constexpr int kPage = 64, kRatio = 4, kWindow = 128;
    const Pool window(rng, kPage, 24), compressed(rng, kPage / kRatio, 40);
    const std::vector<int> lengths = {37, 130, 201};
    int rows = 0, max_visible = 0;
    for (int n : lengths) rows += n, max_visible = std::max(max_visible, n / kRatio);
    Problem p(rng, window, compressed, rows, heads, kWindow, max_visible);
    std::uniform_int_distribution<int> window_page(0, window.num_pages - 1), compressed_page(0, compressed.num_pages - 1);
    int row = 0;
    for (int n : lengths) {
      std::vector<int> raw_pages(8), entry_pages(8);
      for (int& pg : raw_pages) pg = window_page(rng);
      for (int& pg : entry_pages) pg = compressed_page(rng);
      for (int t = 0; t < n; ++t, ++row) {
        for (int w = 0; w < kWindow; ++w) {
          const int pos = t - kWindow + 1 + w;
          p.window_slots[row * kWindow + w] = pos < 0 ? -1 : raw_pages[pos / kPage] * kPage + pos % kPage;
        }
        const int visible = (t + 1) / kRatio;
        for (int s = 0; s < visible; ++s)
          p.compressed_slots[row * max_visible + s] = static_cast<std::int32_t>(physical_slot(entry_pages.data(), s, kPage / kRatio));
      }
    }
    expect_matches_reference(p, chunked(), "prefill H=" + std::to_string(heads));
  }
}

// Grids of 1.5 to 4 waves run chunk-major inside groups of 64 (row, head tile) pairs (launch.cu):
// on 132 SMs, 210 blocks of 70 pairs (not a multiple of 64) × 3 chunks (the last one short) on the
// 16-, 32- and 64-head tiles (the small ones with their load warps), against the reference; and a
// grid of more than 4 waves (600 blocks), which keeps a row's chunks adjacent.
TEST_F(SparseAttentionGpu, PartialSchedulingGroupsMatchReference) {
  const Pool window(rng, 64, 24), compressed(rng, 64, 24);
  struct Shape {
    int rows, heads, compressed_width;
  };
  // 70 × 16 heads: tile 16, 70 pairs; 70 × 32 heads: tile 32, 70 pairs; 70 × 64 heads: tile 64
  // (wgmma), 70 pairs (828 candidates: chunks of 384, 384, 60); 300 × 16 heads: 300 pairs × 2 chunks.
  for (const Shape s : {Shape{70, 16, 700}, Shape{70, 32, 700}, Shape{70, 64, 700}, Shape{300, 16, 512}}) {
    Problem p(rng, window, compressed, s.rows, s.heads, 128, s.compressed_width);
    p.random_slots(rng, 0.05);
    expect_matches_reference(p, chunked(), "rows " + std::to_string(s.rows) + " H=" + std::to_string(s.heads) + " K=" +
                                        std::to_string(s.compressed_width));
  }
}

// The largest split: one chunk of 40 blocks (128 + 2432 candidates, every slot-table entry, valid
// word and live-list place in use), and two chunks (128 + 2496).
TEST_F(SparseAttentionGpu, LargestSplitMatchesReference) {
  const Pool window(rng, 64, 8), compressed(rng, 64, 48);
  for (int compressed_width : {2432, 2496}) {
    Problem p(rng, window, compressed, 3, 64, 128, compressed_width);
    p.random_slots(rng, 0.05);
    SparseAttentionOptions options;
    options.split_candidates = kMaxSplitCandidates;
    expect_matches_reference(p, options, "split " + std::to_string(kMaxSplitCandidates) + ", K=" +
                                             std::to_string(compressed_width));
  }
}

// The library's default split: rows of 640 and 1152 candidates in one chunk, 2176 in two, on the
// mma.sync tile (H = 16) and the wgmma tile (H = 64, and H = 128: two tiles per row); a row alone gives
// the same bytes as in a batch of 128 at each width.
TEST_F(SparseAttentionGpu, DefaultSplitMatchesReferenceAndKeepsRowBytes) {
  const Pool window(rng, 64, 24), compressed(rng, 64, 48);
  for (int heads : {16, 64, 128}) {
    for (int compressed_width : {512, 1024, 2048}) {
      Problem batch(rng, window, compressed, 128, heads, 128, compressed_width);
      batch.random_slots(rng, 0.02);
      const Outputs all = batch.run(Device::CUDA, SparseAttentionOptions{});
      const std::string what = "default split, H=" + std::to_string(heads) + " K=" + std::to_string(compressed_width);
      for (int r : {0, 77, 127}) expect_rows_keep_bytes(batch, all, r, 1, SparseAttentionOptions{}, what);
      expect_matches_reference(batch.slice(0, 1), SparseAttentionOptions{}, what + " row 0");
    }
  }
}

// ---- batch invariance and determinism ------------------------------------------------------------

// H = 32: tile 16 alone, 32 in the batch (mma.sync); H = 64, 80 (padded) and 128: the wgmma tile
// at every batch size.
TEST_F(SparseAttentionGpu, RowAloneEqualsRowInBatchOf128) {
  const Pool window(rng, 64, 48), compressed(rng, 64, 48);
  for (int heads : {32, 64, 80, 128}) {
    Problem batch(rng, window, compressed, 128, heads, 128, 512);
    batch.random_slots(rng, 0.02);
    const Outputs all = batch.run(Device::CUDA);
    EXPECT_EQ(all.out, batch.run(Device::CUDA).out) << "rerun";
    for (int r : {0, 77, 127}) expect_rows_keep_bytes(batch, all, r, 1, chunked(), "H=" + std::to_string(heads));
  }
}

// Small grids split the 64-head tile's output dims over 2 or 4 blocks (launch.cu; on 132 SMs: a
// row alone → 4 parts, 20 rows × 2 chunks at H = 64 or 12 rows × 2 tiles × 2 chunks at H = 128 → 2
// parts, a batch of 128 → none). The same rows must give the same bytes with the fused inverse RoPE
// (dims 448..511 in the last part), merged over two chunks or from one chunk, and match the reference.
TEST_F(SparseAttentionGpu, DimSplitKeepsBytesWithRopeAndMerge) {
  const ClusterMergeScope off(cuda::ClusterMerge::off);  // split rows merge through the workspace here
  const Pool window(rng, 64, 48), compressed(rng, 64, 48);
  struct Case {
    int heads, compressed_width, small_batch;
  };
  for (const Case c : {Case{64, 512, 20}, Case{64, 0, 20}, Case{128, 512, 12}}) {
    const std::string what = "H=" + std::to_string(c.heads) + " K=" + std::to_string(c.compressed_width);
    Problem batch(rng, window, compressed, 128, c.heads, 128, c.compressed_width);
    batch.random_slots(rng, 0.02);
    batch.random_rope(rng);
    const Outputs all = batch.run(Device::CUDA);
    // The whole batch forced into output parts: the same bytes (in 4 parts the kernel also decodes with
    // two producer warpgroups, otherwise with one).
    for (const int parts : {2, 4}) {
      SparseAttentionOptions forced = chunked();
      forced.output_parts = parts;
      const Outputs split = batch.run(Device::CUDA, forced);
      expect_same_bytes(split, all, what + ": " + std::to_string(parts) + " output parts");
    }
    for (const auto& [first, count] : {std::pair{0, 1}, std::pair{77, 1}, std::pair{127, 1}, std::pair{3, c.small_batch}})
      expect_rows_keep_bytes(batch, all, first, count, chunked(), what);
    expect_matches_reference(batch.slice(0, 1), chunked(), what + " alone");  // one row (4 parts)
  }
}

// Rows split into 2..16 chunks merged inside a thread-block cluster give exactly the bytes of the merge
// through the workspace, and match the reference: one row of 5 chunks in 4 output parts, one row of
// 10 chunks in 4 parts (a non-portable size on a dim-split instantiation), 12 chunks
// (a non-portable cluster size) with padded heads, 3 chunks over two head tiles in 4 parts, 5 chunks
// over two head tiles in 2 parts, and a batch of 128 rows of 2 chunks; RoPE fused in every case. The
// launcher must report the cluster path when forced (a fallback to the workspace merge would compare it
// with itself). The default (automatic) mode gives the same bytes, and takes the cluster path at least
// where the plain grid is more than one wave (128 rows) or its clusters surely fit at once (1 row, 4
// clusters of 5).
TEST_F(SparseAttentionGpu, ClusterMergeKeepsBytes) {
  const Pool window(rng, 64, 48), compressed(rng, 64, 48);
  struct Case {
    int rows, heads, compressed_width, split;
  };
  // (H = 72 at 16 chunks: the second tile's 8 heads leave half its merging blocks without a head.)
  for (const Case c : {Case{1, 64, 512, 128}, Case{1, 64, 512, 64}, Case{2, 96, 2048, 192}, Case{5, 128, 1024, 384},
                       Case{4, 128, 512, 128}, Case{128, 64, 512, 384}, Case{1, 72, 896, 64}}) {
    const std::string what = "rows=" + std::to_string(c.rows) + " H=" + std::to_string(c.heads) +
                             " K=" + std::to_string(c.compressed_width) + " split=" + std::to_string(c.split);
    Problem p(rng, window, compressed, c.rows, c.heads, 128, c.compressed_width);
    p.random_slots(rng, 0.05);
    p.random_rope(rng);
    SparseAttentionOptions options = chunked();
    options.split_candidates = c.split;
    Outputs through_workspace, in_cluster, automatic;
    {
      const ClusterMergeScope off(cuda::ClusterMerge::off);
      through_workspace = p.run(Device::CUDA, options);
      EXPECT_FALSE(cuda::last_launch_merged_in_cluster()) << what << ": merged in clusters with the mode off";
    }
    {
      const ClusterMergeScope on(cuda::ClusterMerge::forced);
      in_cluster = p.run(Device::CUDA, options);
      const int chunks = (128 + c.compressed_width + c.split - 1) / c.split;
      if (cuda::attention_clusters_at_once(chunks) > 0)  // else this device cannot cluster that size
        EXPECT_TRUE(cuda::last_launch_merged_in_cluster()) << what << ": the launch fell back to the workspace merge";
    }
    {
      const ClusterMergeScope on(cuda::ClusterMerge::automatic);
      automatic = p.run(Device::CUDA, options);
      if (c.rows == 128 || (c.rows == 1 && c.split == 128))
        EXPECT_TRUE(cuda::last_launch_merged_in_cluster()) << what << ": automatic mode kept the workspace merge";
    }
    expect_same_bytes(in_cluster, through_workspace, what + ": the cluster merge");
    expect_same_bytes(automatic, through_workspace, what + ": the automatic mode");
    if (c.rows <= 5) expect_close(in_cluster, p.run(Device::CPU, options), what.c_str());
  }
}

// Runs `p` with a kernel variant's switch (Scope) off, then on: the launch record `ran` must follow
// the switch (a lost switch would compare a kernel with itself) and the bytes must not change;
// `with_reference` also checks the variant against the CPU reference.
template <class Scope>
void expect_variant_keeps_bytes(const Problem& p, const SparseAttentionOptions& options, bool (*ran)(),
                                const std::string& what, bool with_reference) {
  Outputs without, with;
  {
    const Scope off(false);
    without = p.run(Device::CUDA, options);
    EXPECT_FALSE(ran()) << what << ": the variant ran with its switch off";
  }
  {
    const Scope on(true);
    with = p.run(Device::CUDA, options);
    EXPECT_TRUE(ran()) << what << ": the switch did not reach the launch";
  }
  expect_same_bytes(with, without, what);
  if (with_reference) expect_close(with, p.run(Device::CPU, options), what.c_str());
}

// The asymmetric consumers (one warpgroup computes S and P of all 64 candidates and hands P over)
// give exactly the symmetric kernel's bytes: one chunk and split rows (workspace and cluster merge),
// 1, 2 and 4 output parts (forced, also with clusters), padded heads, RoPE, missing slots, rows whose
// every slot is missing (no live block) and rows of a single block. The launch must report the
// asymmetric kernel (a lost switch would compare the symmetric kernel with itself).
TEST_F(SparseAttentionGpu, AsymmetricConsumersKeepBytes) {
  const Pool window(rng, 64, 48), compressed(rng, 64, 48);
  struct Case {
    int rows, heads, window_width, compressed_width, split, parts;
    double missing;
    cuda::ClusterMerge merge;
  };
  for (const Case c : {Case{128, 64, 128, 512, 1152, 0, 0.05, cuda::ClusterMerge::automatic},
                       Case{1, 64, 128, 512, 1152, 0, 0.05, cuda::ClusterMerge::automatic},
                       Case{12, 128, 128, 1024, 384, 0, 0.05, cuda::ClusterMerge::off},
                       Case{12, 128, 128, 1024, 384, 2, 0.05, cuda::ClusterMerge::forced},
                       Case{6, 64, 128, 512, 256, 4, 0.05, cuda::ClusterMerge::forced},
                       Case{20, 64, 128, 512, 1152, 2, 0.05, cuda::ClusterMerge::automatic},
                       Case{5, 96, 128, 2048, 768, 0, 0.6, cuda::ClusterMerge::automatic},
                       Case{9, 64, 128, 256, 1152, 0, 1.0, cuda::ClusterMerge::automatic},
                       Case{9, 64, 64, 0, 1152, 0, 0.3, cuda::ClusterMerge::automatic}}) {
    const std::string what = "rows=" + std::to_string(c.rows) + " H=" + std::to_string(c.heads) +
                             " W=" + std::to_string(c.window_width) + " K=" + std::to_string(c.compressed_width) +
                             " split=" + std::to_string(c.split) + " parts=" + std::to_string(c.parts) +
                             " missing=" + std::to_string(c.missing);
    Problem p(rng, window, compressed, c.rows, c.heads, c.window_width, c.compressed_width);
    p.random_slots(rng, c.missing);
    p.random_rope(rng);
    SparseAttentionOptions options = chunked();
    options.split_candidates = c.split;
    options.output_parts = c.parts;
    const ClusterMergeScope merge(c.merge);
    expect_variant_keeps_bytes<AsymmetricScope>(p, options, &cuda::last_launch_asymmetric,
                                                what + ": the asymmetric consumers", c.rows <= 9);
  }
}

// The pair decode (the two head tiles of a row as a 2-CTA cluster, each CTA decoding half of every K
// block into both tiles) gives exactly the unpaired asymmetric kernel's bytes: one chunk at B = 128
// and B = 1 (output parts forced to 1: the pair has no dim split), rows of three chunks (workspace
// merge: the cluster merge off, else it takes those rows), padded heads (H = 96) with 60% missing
// slots, rows with every slot missing and rows of one block. The launch must report the pair.
TEST_F(SparseAttentionGpu, PairDecodeKeepsBytes) {
  const Pool window(rng, 64, 48), compressed(rng, 64, 48);
  struct Case {
    int rows, heads, window_width, compressed_width, split;
    double missing;
  };
  for (const Case c : {Case{128, 128, 128, 512, 1152, 0.05}, Case{1, 128, 128, 512, 1152, 0.05},
                       Case{12, 128, 128, 1024, 384, 0.05}, Case{5, 96, 128, 2048, 768, 0.6},
                       Case{9, 128, 128, 256, 1152, 1.0}, Case{9, 128, 64, 0, 1152, 0.3}}) {
    const std::string what = "rows=" + std::to_string(c.rows) + " H=" + std::to_string(c.heads) +
                             " W=" + std::to_string(c.window_width) + " K=" + std::to_string(c.compressed_width) +
                             " split=" + std::to_string(c.split) + " missing=" + std::to_string(c.missing);
    Problem p(rng, window, compressed, c.rows, c.heads, c.window_width, c.compressed_width);
    p.random_slots(rng, c.missing);
    p.random_rope(rng);
    SparseAttentionOptions options = chunked();
    options.split_candidates = c.split;
    options.output_parts = 1;
    const AsymmetricScope asymmetric(true);
    const ClusterMergeScope merge(cuda::ClusterMerge::off);
    expect_variant_keeps_bytes<PairDecodeScope>(p, options, &cuda::last_launch_pair_decode, what + ": the pair decode",
                                                c.rows <= 12);
  }
  // Rows of several chunks where the cluster merge is asked for keep it (launch.cu): no pair.
  Problem p(rng, window, compressed, 12, 128, 128, 1024);
  p.random_slots(rng, 0.05);
  SparseAttentionOptions options = chunked();
  options.split_candidates = 384;
  const AsymmetricScope asymmetric(true);
  const ClusterMergeScope merge(cuda::ClusterMerge::automatic);
  const PairDecodeScope on(true);
  expect_close(p.run(Device::CUDA, options), p.run(Device::CPU, options), "three chunks, automatic merge");
  EXPECT_FALSE(cuda::last_launch_pair_decode()) << "a cluster-merged row went to the pair decode";
}

TEST_F(SparseAttentionGpu, ClusterMergeAutomaticKeepsWaves) {
  const Pool window(rng, 64, 48), compressed(rng, 64, 48);
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  struct Case {
    int rows, heads, compressed_width, split;
  };
  for (const Case c : {Case{1, 128, 512, 64}, Case{2, 64, 512, 384}}) {
    const std::string what = "rows=" + std::to_string(c.rows) + " H=" + std::to_string(c.heads) +
                             " split=" + std::to_string(c.split);
    Problem p(rng, window, compressed, c.rows, c.heads, 128, c.compressed_width);
    p.random_slots(rng, 0.05);
    SparseAttentionOptions options = chunked();
    options.split_candidates = c.split;
    options.output_parts = 4;
    const int chunks = (128 + c.compressed_width + c.split - 1) / c.split;
    const long long grid = static_cast<long long>(c.rows) * (c.heads / 64) * chunks * 4;
    const bool expected =
        cuda::clusters_keep_waves(grid, grid / chunks, cuda::attention_clusters_at_once(chunks, options.output_parts), sms);
    Outputs through_workspace, automatic;
    {
      const ClusterMergeScope off(cuda::ClusterMerge::off);
      through_workspace = p.run(Device::CUDA, options);
    }
    {
      const ClusterMergeScope on(cuda::ClusterMerge::automatic);
      automatic = p.run(Device::CUDA, options);
      EXPECT_EQ(cuda::last_launch_merged_in_cluster(), expected) << what << ": the automatic mode's choice";
    }
    expect_same_bytes(automatic, through_workspace, what + ": the automatic mode");
  }
  EXPECT_FALSE(cuda::clusters_keep_waves(80, 8, 7, 132)) << "8 clusters of 10, 7 at once: two rounds for one wave";
  EXPECT_TRUE(cuda::clusters_keep_waves(256, 128, 66, 132)) << "128 clusters of 2, 66 at once: two rounds, two waves";
  EXPECT_FALSE(cuda::clusters_keep_waves(160, 16, 7, 132)) << "16 clusters of 10: three rounds for two waves";
  EXPECT_FALSE(cuda::clusters_keep_waves(8, 4, 0, 132)) << "a size the device cannot schedule";
}

// Trailing −1 columns (a batch padded to its longest row) add only empty chunks: same bytes, also
// when they turn a one-chunk row into a merged one.
TEST_F(SparseAttentionGpu, MissingSlotPaddingKeepsBytes) {
  const Pool window(rng, 64, 8), compressed(rng, 64, 24);
  Problem narrow(rng, window, compressed, 9, 64, 128, 300);
  narrow.random_slots(rng, 0.05);
  for (int r = 0; r < 3; ++r)  // rows 0..2 use the window only
    for (int j = 0; j < 300; ++j) narrow.compressed_slots[r * 300 + j] = -1;
  Problem wide = narrow;
  wide.compressed_width = 1500;
  wide.compressed_slots.assign(std::size_t(9) * 1500, -1);
  for (int r = 0; r < 9; ++r)
    std::copy_n(narrow.compressed_slots.begin() + r * 300, 300, wide.compressed_slots.begin() + r * 1500);
  Problem window_only = narrow;
  window_only.compressed_width = 0;
  window_only.compressed_slots.clear();
  // At the tests' split of 384 the 428-candidate rows are two chunks; at the default (1152) they are
  // one and the padded 1628-candidate rows two.
  for (const SparseAttentionOptions& options : {chunked(), SparseAttentionOptions{}}) {
    const std::string what = "split " + std::to_string(options.split_candidates);
    const Outputs a = narrow.run(Device::CUDA, options), b = wide.run(Device::CUDA, options),
                  c = window_only.run(Device::CUDA, options);
    EXPECT_EQ(a.out, b.out) << what;
    EXPECT_EQ(a.lse, b.lse) << what;
    const std::size_t three_rows = std::size_t(3) * 64 * 512;
    EXPECT_TRUE(std::equal(c.out.begin(), c.out.begin() + three_rows, a.out.begin())) << what << ": one chunk vs merged";
  }
}

TEST_F(SparseAttentionGpu, CallerWorkspaceIsLeftReusable) {
  const ClusterMergeScope off(cuda::ClusterMerge::off);  // the workspace merge is what this tests
  const Pool window(rng, 64, 8), compressed(rng, 64, 24);
  Problem p(rng, window, compressed, 20, 64, 128, 1000);
  p.random_slots(rng, 0.05);
  const std::size_t bytes = sparse_attention_workspace_bytes(20, 64, 1128, kTestSplit);
  ASSERT_GT(bytes, 0u);
  Tensor workspace = Tensor::zeros(DType::U8, {static_cast<std::int64_t>(bytes)}, Device::CUDA);
  SparseAttentionOptions options = chunked();
  options.workspace = workspace.view();
  const Outputs first = p.run(Device::CUDA, options);
  const Outputs second = p.run(Device::CUDA, options);  // needs the arrival counters back at zero
  EXPECT_EQ(first.out, second.out);
  EXPECT_EQ(first.out, p.run(Device::CUDA).out) << "own workspace vs the caller's";
  expect_close(second, p.run(Device::CPU), "caller workspace");
}

// One caller workspace, sized for the largest call, serves calls of other shapes in turn: fewer
// candidates (fewer chunks) and fewer rows move the chunk counters over the previous call's partial
// sums, which must not leave a row unmerged (unwritten output) or merge it early.
TEST_F(SparseAttentionGpu, CallerWorkspaceServesEveryShapeUpToItsSize) {
  const ClusterMergeScope off(cuda::ClusterMerge::off);  // the workspace merge is what this tests
  const Pool window(rng, 64, 8), compressed(rng, 64, 24);
  const std::size_t bytes = sparse_attention_workspace_bytes(20, 64, 128 + 1024, kTestSplit);
  Tensor workspace = Tensor::empty(DType::U8, {static_cast<std::int64_t>(bytes)}, Device::CUDA);
  workspace.fill_bytes(0x5A);  // any contents
  SparseAttentionOptions shared = chunked();
  shared.workspace = workspace.view();
  struct Shape {
    int rows, compressed_width;
  };
  for (const Shape shape : {Shape{20, 1024}, Shape{20, 640}, Shape{10, 1024}, Shape{1, 256}, Shape{20, 1024}}) {
    Problem p(rng, window, compressed, shape.rows, 64, 128, shape.compressed_width);
    p.random_slots(rng, 0.05);
    const std::string what = std::to_string(shape.rows) + " rows, K=" + std::to_string(shape.compressed_width);
    const Outputs with_shared = p.run(Device::CUDA, shared);  // outputs are poisoned inside run()
    const Outputs with_own = p.run(Device::CUDA);
    expect_same_bytes(with_shared, with_own, what + ": the caller's workspace (against an own one)");
    expect_close(with_shared, p.run(Device::CPU), what.c_str());
  }
}

// ---- the early launch ------------------------------------------------------------------------------

// The attention launched right behind a kernel that allows early launches and writes the attention's
// inputs only after 200 µs — Q and the sinks NaN, the slot lists −1 until then — so that its blocks,
// starting early, must wait for that kernel before reading any input: a read before the wait shows as
// NaN or as missing candidates. Each shape runs once before (its kernel loaded: a first launch of a
// lazily loaded module may synchronize). One-chunk rows, the pair decode, rows merged in a cluster and
// the 16-head tile start early; rows merged through the workspace (the counters' memset stands
// between the two kernels) and a plain launch in 4 output parts (launch_blocks keeps it ordinary) do
// not, and must give the same results.
TEST_F(SparseAttentionGpu, EarlyLaunchWaitsForTheKernelBefore) {
  const EarlyLaunchScope early(true);
  const Pool window(rng, 64, 4), compressed(rng, 64, 16);
  const testing::TestStream stream;
  struct Shape {
    int rows, heads, split, parts;
    cuda::ClusterMerge merge;
    bool early;
    const char* what;
  };
  for (const Shape shape : {Shape{2, 64, 1152, 1, cuda::ClusterMerge::automatic, true, "one chunk"},
                            Shape{1, 128, 1152, 1, cuda::ClusterMerge::automatic, true, "pair decode"},
                            Shape{1, 64, 64, 0, cuda::ClusterMerge::forced, true, "cluster merge"},
                            Shape{3, 64, 192, 1, cuda::ClusterMerge::off, true, "workspace merge"},
                            Shape{2, 16, 1152, 0, cuda::ClusterMerge::automatic, true, "16-head tile"},
                            Shape{1, 64, 1152, 0, cuda::ClusterMerge::automatic, false, "4 output parts"}}) {
    const ClusterMergeScope merge(shape.merge);
    Problem p(rng, window, compressed, shape.rows, shape.heads, 128, 512);
    p.random_slots(rng, 0.05);
    SparseAttentionOptions options;
    options.split_candidates = shape.split;
    options.output_parts = shape.parts;
    options.stream = stream.stream;
    Tensor workspace;
    const std::size_t scratch = sparse_attention_workspace_bytes(shape.rows, shape.heads, 128 + 512, shape.split);
    if (scratch > 0) {
      workspace = Tensor::empty(DType::U8, {static_cast<std::int64_t>(scratch)}, Device::CUDA);
      workspace.fill_bytes(0x5A);
      options.workspace = workspace.view();
    }
    const Outputs warm = p.run(Device::CUDA, options);  // the kernel loaded; also the plain result
    ASSERT_EQ(cudaStreamSynchronize(stream.stream), cudaSuccess);
    std::unique_ptr<testing::LateWriter> late;  // the inputs' true contents, written 200 µs late
    const Outputs gpu = p.run(Device::CUDA, options, [&](std::initializer_list<Tensor*> inputs) {
      late = std::make_unique<testing::LateWriter>(inputs, stream.stream);
    });
    ASSERT_EQ(cudaStreamSynchronize(stream.stream), cudaSuccess);
    EXPECT_EQ(cuda::last_launch_early(), shape.early) << shape.what;
    if (shape.merge == cuda::ClusterMerge::forced) EXPECT_TRUE(cuda::last_launch_merged_in_cluster()) << shape.what;
    if (shape.heads == 128) EXPECT_TRUE(cuda::last_launch_pair_decode()) << shape.what;
    expect_same_bytes(gpu, warm, std::string(shape.what) + ": the late inputs");
    expect_close(gpu, p.run(Device::CPU), shape.what);
  }
}

// The decode layer's order: the top-k writes a row's physical slots, the attention reads them. With
// the top-k allowing early launches, the attention's blocks start while it runs and must wait for its
// slots; the result must be the reference's on the CPU top-k's slots (which must be the same). Whether
// the blocks did start early is not observable here (last_launch_early() reports the launch's
// attribute); a read before the wait would find the slots' poison (−1) on any run where they did.
TEST_F(SparseAttentionGpu, EarlyLaunchBehindTheTopk) {
  const EarlyLaunchScope early(true);
  const ClusterMergeScope merge(cuda::ClusterMerge::forced);  // the early-launching cluster path, on any device
  constexpr int kCandidates = 16384, kK = 512, kPerPage = 64, kPages = kCandidates / kPerPage;
  const Pool window(rng, 64, 4), compressed(rng, kPerPage, kPages);
  std::vector<float> scores = testing::random_floats(rng, kCandidates, -4.0f, 4.0f);
  std::vector<std::int32_t> query_start = {0, 1}, visible = {kCandidates}, page_table(kPages);
  for (int i = 0; i < kPages; ++i) page_table[i] = (i * 37) % kPages;  // 37 is prime to 256: a permutation
  const testing::TestStream test_stream;
  const cudaStream_t stream = test_stream.stream;
  const auto on_gpu = [](DType t, Shape shape, const void* data) { return Tensor::from_host(t, shape, data, Device::CUDA); };
  Tensor d_scores = on_gpu(DType::F32, {1, kCandidates}, scores.data());
  Tensor d_start = on_gpu(DType::I32, {2}, query_start.data()), d_visible = on_gpu(DType::I32, {1}, visible.data());
  Tensor d_pages = on_gpu(DType::I32, {1, kPages}, page_table.data());
  Tensor d_indices = Tensor::empty(DType::I32, {1, kK}, Device::CUDA), d_slots = Tensor::empty(DType::I32, {1, kK}, Device::CUDA);
  d_slots.fill_bytes(0xFF);

  Problem p(rng, window, compressed, 1, 64, 128, kK);
  p.random_slots(rng, 0.05);
  Tensor d_q = on_gpu(DType::BF16, {1, 64, F::kDim}, p.q.data());
  Tensor d_window = on_gpu(DType::I32, {1, 128}, p.window_slots.data());
  Tensor d_sink = on_gpu(DType::F32, {64}, p.sink.data());
  Tensor d_out = Tensor::empty(DType::BF16, {1, 64, F::kDim}, Device::CUDA), d_lse = Tensor::empty(DType::F32, {1, 64}, Device::CUDA);
  d_out.fill_bytes(0xFF);
  d_lse.fill_bytes(0xFF);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  IndexerOptions topk_options;
  topk_options.check_contents = false;  // no host round trip between the two launches
  topk_options.stream = stream;
  SparseAttentionOptions options;
  options.split_candidates = 64;  // the latency split: clusters of 10 chunks
  options.stream = stream;
  Tensor workspace = Tensor::empty(DType::U8, {static_cast<std::int64_t>(sparse_attention_workspace_bytes(1, 64, 128 + kK, 64))},
                                   Device::CUDA);
  options.workspace = workspace.view();
  // The attention's first call (kernel loading, attribute queries) once before, on the slots as poisoned.
  sparse_attention(d_q.view(), window.device_view(), compressed.device_view(), d_window.view(), d_slots.view(),
                   d_sink.view(), d_out.view(), d_lse.view(), options);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  d_out.fill_bytes(0xFF);
  d_lse.fill_bytes(0xFF);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  indexer_topk(d_scores.view(), {d_start.view(), d_visible.view(), d_pages.view()}, kPerPage, d_indices.view(),
               d_slots.view(), topk_options);
  sparse_attention(d_q.view(), window.device_view(), compressed.device_view(), d_window.view(), d_slots.view(),
                   d_sink.view(), d_out.view(), d_lse.view(), options);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_TRUE(cuda::last_launch_early());
  EXPECT_TRUE(cuda::last_launch_merged_in_cluster());

  std::vector<std::int32_t> want_indices(kK), want_slots(kK);
  indexer_topk(testing::host_view(scores, DType::F32, {1, kCandidates}),
               {testing::host_view(query_start, DType::I32, {2}), testing::host_view(visible, DType::I32, {1}),
                testing::host_view(page_table, DType::I32, {1, kPages})},
               kPerPage, testing::host_view(want_indices, DType::I32, {1, kK}),
               testing::host_view(want_slots, DType::I32, {1, kK}));
  Tensor got_slots = d_slots.to(Device::CPU);
  ASSERT_TRUE(std::equal(want_slots.begin(), want_slots.end(), got_slots.data_as<std::int32_t>()))
      << "the top-k's slots differ from the CPU's";
  p.compressed_slots = want_slots;
  Outputs gpu;
  Tensor host_out = d_out.to(Device::CPU), host_lse = d_lse.to(Device::CPU);
  gpu.out.assign(host_out.data_as<std::uint16_t>(), host_out.data_as<std::uint16_t>() + host_out.numel());
  gpu.lse.assign(host_lse.data_as<float>(), host_lse.data_as<float>() + host_lse.numel());
  expect_close(gpu, p.run(Device::CPU), "behind the top-k");
}

// ---- the FP8 dequantization, exhaustively --------------------------------------------------------

// One block per scale byte, one thread per code pair (lo, hi): the pair fills both byte positions
// of each 16-bit selector (codes.x = lo | hi << 8 | lo << 16 | hi << 24, codes.y the same with the
// bytes swapped), so every code meets every other code — sign and position — in one call.
// kOneFactor: the one-multiply path (scale bytes ≤ kSingleMultiplyMaxScale only).
template <bool kOneFactor>
__global__ void dequantize_all_pairs(const std::uint8_t* scales /*[n]*/, int n, std::uint16_t* out /*[n][65536][8]*/) {
  const int s = blockIdx.y;
  const int pair = blockIdx.x * blockDim.x + threadIdx.x;  // lo + 256·hi
  if (s >= n || pair >= 65536) return;
  const std::uint32_t lo = pair & 0xff, hi = pair >> 8;
  const uint2 packed = make_uint2(lo | hi << 8 | lo << 16 | hi << 24, hi | lo << 8 | hi << 16 | lo << 24);
  const uint4 v = cuda::sparse_attention::dequantize_e4m3x8<kOneFactor>(packed, scales[s]);
  memcpy(out + (static_cast<std::size_t>(s) * 65536 + pair) * 8, &v, 16);
}

// Every decoded pair of dequantize_all_pairs equals bf16(code × 2^(e − 127)).
void expect_dequantized_exactly(const std::uint16_t* got, const std::vector<std::uint8_t>& scales) {
  const int n = static_cast<int>(scales.size());
  for (int s = 0; s < n; ++s) {
    std::uint16_t expected[256];  // bf16 of code × 2^(e−127): exact in float, one rounding to bf16
    for (int code = 0; code < 256; ++code)
      expected[code] = bf16_bits_from_float(float_from_e4m3(static_cast<std::uint8_t>(code)) * float_from_ue8m0(scales[s]));
    for (int pair = 0; pair < 65536; ++pair) {
      const int lo = pair & 0xff, hi = pair >> 8;
      if ((lo & 0x7f) == 0x7f || (hi & 0x7f) == 0x7f) continue;  // NaN codes are never written
      const int order[8] = {lo, hi, lo, hi, hi, lo, hi, lo};
      for (int i = 0; i < 8; ++i)
        ASSERT_EQ(got[(static_cast<std::size_t>(s) * 65536 + pair) * 8 + i], expected[order[i]])
            << "codes " << lo << ", " << hi << " position " << i << " scale byte " << int(scales[s]);
    }
  }
}

// Every scale byte, both paths (the two-multiply one for all 255, the one-multiply one where it
// applies), under- and overflow.
TEST_F(SparseAttentionGpu, DequantizesEveryCodeAndScaleExactly) {
  for (const bool one_factor : {false, true}) {
    SCOPED_TRACE(one_factor ? "one multiply" : "two multiplies");
    std::vector<std::uint8_t> scales;
    const int last = one_factor ? static_cast<int>(cuda::sparse_attention::kSingleMultiplyMaxScale) : 254;
    for (int e = 0; e <= last; ++e) scales.push_back(static_cast<std::uint8_t>(e));
    const int n = static_cast<int>(scales.size());
    Tensor d_scales = Tensor::from_host(DType::U8, {n}, scales.data(), Device::CUDA);
    Tensor d_out = Tensor::empty(DType::BF16, {n, 65536, 8}, Device::CUDA);
    d_out.fill_bytes(0xFF);
    const auto kernel = one_factor ? dequantize_all_pairs<true> : dequantize_all_pairs<false>;
    kernel<<<dim3(65536 / 256, n), 256>>>(d_scales.data_as<std::uint8_t>(), n, d_out.data_as<std::uint16_t>());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    Tensor host = d_out.to(Device::CPU);
    expect_dequantized_exactly(host.data_as<std::uint16_t>(), scales);
  }
}

// Extreme block scales in the attention itself: values over 36 binades put scale bytes above
// kSingleMultiplyMaxScale in about one block in twelve, so entries of both decode paths meet in every
// warp (the scale test above covers the arithmetic; this one the choice per entry). Queries scaled
// down so that the scores stay in a range the tolerance is made for.
TEST_F(SparseAttentionGpu, ExtremeBlockScalesDecodeExactly) {
  const Pool window(rng, 64, 4, 36), compressed(rng, 64, 8, 36);
  Problem p(rng, window, compressed, 4, 64, 128, 512);
  for (auto& x : p.q) x = bf16_bits_from_float(float_from_bf16_bits(x) * 0x1p-17f);
  p.random_slots(rng, 0.05);
  std::vector<int> high(2, 0);  // entries with a scale byte above the range, below it
  for (const Pool* pool : {&window, &compressed})
    for (std::int64_t slot = 0; slot < pool->slots(); ++slot) {
      const std::uint8_t* page = pool->bytes.data() + (slot / pool->per_page) * F::page_bytes(pool->per_page);
      const std::uint8_t* record = page + F::scale_offset(static_cast<int>(slot % pool->per_page), pool->per_page);
      const bool above = std::any_of(record, record + F::kNumScales,
                                     [](std::uint8_t e) { return e > cuda::sparse_attention::kSingleMultiplyMaxScale; });
      ++high[above ? 0 : 1];
    }
  ASSERT_GT(high[0], 0) << "no entry takes the two-multiply path";
  ASSERT_GT(high[1], 0) << "no entry takes the one-multiply path";
  expect_matches_reference(p, chunked(), "extreme block scales");
}

// ---- CUDA-side argument checks -------------------------------------------------------------------

TEST_F(SparseAttentionGpu, ArgumentErrors) {
  const Pool window(rng, 64, 2), compressed(rng, 64, 2);
  Problem p(rng, window, compressed, 2, 16, 8, 8);
  p.random_slots(rng, 0.0);
  Tensor q = Tensor::from_host(DType::BF16, {2, 16, 512}, p.q.data(), Device::CUDA);
  Tensor q_big = Tensor::empty(DType::BF16, {2 * 16 * 512 + 8}, Device::CUDA);
  Tensor ws = Tensor::from_host(DType::I32, {2, 8}, p.window_slots.data(), Device::CUDA);
  Tensor cs = Tensor::from_host(DType::I32, {2, 8}, p.compressed_slots.data(), Device::CUDA);
  Tensor sink = Tensor::from_host(DType::F32, {16}, p.sink.data(), Device::CUDA);
  Tensor out = Tensor::empty(DType::BF16, {2, 16, 512}, Device::CUDA);
  Tensor lse = Tensor::empty(DType::F32, {2, 16}, Device::CUDA);
  Tensor host_sink = Tensor::from_host(DType::F32, {16}, p.sink.data());
  const auto expect_error = [](const std::string& argument, auto&& call) {
    try {
      call();
      ADD_FAILURE() << "no error for " << argument;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), argument) << e.what();
    }
  };
  expect_error("window_cache", [&] {
    sparse_attention(q.view(), window.host_view(), compressed.device_view(), ws.view(), cs.view(), sink.view(),
                     out.view(), lse.view());
  });
  expect_error("attn_sink", [&] {
    sparse_attention(q.view(), window.device_view(), compressed.device_view(), ws.view(), cs.view(),
                     host_sink.view(), out.view(), lse.view());
  });
  TensorView misaligned{static_cast<std::uint16_t*>(q_big.data()) + 1, DType::BF16, {2, 16, 512}, Device::CUDA};
  expect_error("q", [&] {
    sparse_attention(misaligned, window.device_view(), compressed.device_view(), ws.view(), cs.view(), sink.view(),
                     out.view(), lse.view());
  });
  Tensor small = Tensor::zeros(DType::U8, {16}, Device::CUDA);
  SparseAttentionOptions options = chunked();
  options.split_candidates = 64;  // two chunks, so a workspace is needed
  Tensor ws_wide = Tensor::from_host(DType::I32, {2, 8}, p.window_slots.data(), Device::CUDA);
  Tensor cs_wide = Tensor::zeros(DType::I32, {2, 120}, Device::CUDA);
  options.workspace = small.view();
  expect_error("workspace", [&] {
    sparse_attention(q.view(), window.device_view(), compressed.device_view(), ws_wide.view(), cs_wide.view(),
                     sink.view(), out.view(), lse.view(), options);
  });
  // Large enough, but 8 bytes off a 16-byte boundary.
  const std::size_t needed = sparse_attention_workspace_bytes(2, 16, 128, 64);
  Tensor big = Tensor::zeros(DType::U8, {static_cast<std::int64_t>(needed) + 16}, Device::CUDA);
  options.workspace = TensorView{static_cast<std::uint8_t*>(big.data()) + 8, DType::U8,
                                 {static_cast<std::int64_t>(needed)}, Device::CUDA};
  expect_error("workspace", [&] {
    sparse_attention(q.view(), window.device_view(), compressed.device_view(), ws_wide.view(), cs_wide.view(),
                     sink.view(), out.view(), lse.view(), options);
  });
  // Device outputs over device inputs: in-place attention over q, and a workspace over the output.
  expect_error("out", [&] {
    sparse_attention(q.view(), window.device_view(), compressed.device_view(), ws.view(), cs.view(), sink.view(),
                     q.view(), lse.view());
  });
  options.workspace = TensorView{out.data(), DType::U8, {static_cast<std::int64_t>(out.nbytes())}, Device::CUDA};
  expect_error("out", [&] {
    sparse_attention(q.view(), window.device_view(), compressed.device_view(), ws_wide.view(), cs_wide.view(),
                     sink.view(), out.view(), lse.view(), options);
  });
}

// ---- the reduced set for compute-sanitizer ---------------------------------------------------------

TEST_F(SparseAttentionGpu, SanitizeMergedChunks) {
  const Pool window(rng, 64, 2), compressed(rng, 16, 8);
  Problem p(rng, window, compressed, 3, 16, 64, 100);
  p.random_slots(rng, 0.2);
  p.random_rope(rng);
  SparseAttentionOptions options = chunked();
  options.split_candidates = 64;  // three chunks
  expect_matches_reference(p, options, "sanitize merged");
}

// The small problem of several sanitizer cases: 2 rows × `heads`, 128 window and 256 compressed slots
// (10% missing), RoPE on.
Problem sanitizer_problem(std::mt19937_64& rng, const Pool& window, const Pool& compressed, int heads) {
  Problem p(rng, window, compressed, 2, heads, 128, 256);
  p.random_slots(rng, 0.1);
  p.random_rope(rng);
  return p;
}

TEST_F(SparseAttentionGpu, SanitizeClusterMerge) {
  const Pool window(rng, 64, 4), compressed(rng, 64, 8);
  const Problem p = sanitizer_problem(rng, window, compressed, 64);
  SparseAttentionOptions options = chunked();
  options.split_candidates = 64;  // six chunks, one cluster per (row, part)
  const ClusterMergeScope on(cuda::ClusterMerge::forced);
  expect_matches_reference(p, options, "sanitize cluster merge");
  EXPECT_TRUE(cuda::last_launch_merged_in_cluster()) << "the launch fell back to the workspace merge";
}

// The other sanitizer cases run the default (asymmetric) kernel; this one the symmetric kernel.
TEST_F(SparseAttentionGpu, SanitizeSymmetricConsumers) {
  const Pool window(rng, 64, 4), compressed(rng, 64, 8);
  const Problem p = sanitizer_problem(rng, window, compressed, 64);
  SparseAttentionOptions options = chunked();
  options.split_candidates = 128;  // three chunks of two blocks
  const AsymmetricScope off(false);
  expect_matches_reference(p, options, "sanitize symmetric consumers");
  EXPECT_FALSE(cuda::last_launch_asymmetric()) << "the switch did not reach the launch";
}

TEST_F(SparseAttentionGpu, SanitizePairDecode) {
  const Pool window(rng, 64, 4), compressed(rng, 64, 8);
  const Problem p = sanitizer_problem(rng, window, compressed, 128);
  SparseAttentionOptions options = chunked();
  options.split_candidates = 128;  // three chunks of two blocks
  options.output_parts = 1;
  const AsymmetricScope asymmetric(true);
  const ClusterMergeScope no_merge(cuda::ClusterMerge::off);  // the pair takes no cluster-merged rows
  const PairDecodeScope on(true);
  expect_matches_reference(p, options, "sanitize pair decode");
  EXPECT_TRUE(cuda::last_launch_pair_decode()) << "the switch did not reach the launch";
}

TEST_F(SparseAttentionGpu, SanitizeLargeChunks) {
  const Pool window(rng, 64, 2), compressed(rng, 64, 24);
  Problem p(rng, window, compressed, 2, 64, 64, 1400);  // the default split: 1152 + 312
  p.random_slots(rng, 0.1);
  const ClusterMergeScope off(cuda::ClusterMerge::off);  // the 64-head tile's merge through the workspace
  expect_matches_reference(p, SparseAttentionOptions{}, "sanitize default split");
}

TEST_F(SparseAttentionGpu, SanitizeOneChunkAndPaddedHeads) {
  const Pool window(rng, 64, 2), compressed(rng, 2, 30);
  Problem p(rng, window, compressed, 2, 24, 100, 20);
  p.random_slots(rng, 0.3);
  expect_matches_reference(p, chunked(), "sanitize one chunk");
  Problem wide(rng, window, compressed, 140, 64, 64, 0);  // enough blocks for the 64-head tile
  wide.random_slots(rng, 0.1);
  expect_matches_reference(wide, chunked(), "sanitize 64-head tile");
}

}  // namespace
}  // namespace dsv4
