// GPU indexer (SPEC §7, §9): scores against the CPU reference on identical quantized inputs
// (relative L2 ≤ 1e-3, −inf exactly where the reference has it, every element written), decode with
// next_n 1..8, ragged prefill, scattered pages, visibility edges, pages outside the pool; query
// preparation against the reference; "Sanitize" cases for compute-sanitizer.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cpu/indexer_testing.hpp"
#include "gpu/late_writer.cuh"
#include "dsv4/indexer.hpp"
#include "dsv4/rope.hpp"

namespace dsv4 {
namespace {

using testing::IndexerBatch;
using testing::make_indexer_batch;

// A batch's tensors on the GPU (owning).
struct DeviceBatch {
  IndexerQuery q;
  Tensor pages, query_start, visible, page_table;
  IndexerEntryFormat format;
  int entries_per_page = 0;

  explicit DeviceBatch(IndexerBatch& b) : format(b.format), entries_per_page(b.entries_per_page) {
    const IndexerQueryView host = b.query_view();
    q.codes = Tensor::from_host(host.codes.dtype, host.codes.shape, host.codes.data, Device::CUDA);
    q.scales = Tensor::from_host(host.scales.dtype, host.scales.shape, host.scales.data, Device::CUDA);
    q.weights = Tensor::from_host(host.weights.dtype, host.weights.shape, host.weights.data, Device::CUDA);
    const IndexerKeyCacheView keys = b.key_view();
    pages = Tensor::from_host(DType::U8, keys.pages.shape, keys.pages.data, Device::CUDA);
    const IndexerRowsView rows = b.rows_view();
    query_start = Tensor::from_host(DType::I32, rows.query_start.shape, rows.query_start.data, Device::CUDA);
    visible = Tensor::from_host(DType::I32, rows.visible.shape, rows.visible.data, Device::CUDA);
    page_table = Tensor::from_host(DType::I32, rows.page_table.shape, rows.page_table.data, Device::CUDA);
  }
  IndexerKeyCacheView keys() const { return {pages.view(), format, entries_per_page}; }
  IndexerRowsView rows() const { return {query_start.view(), visible.view(), page_table.view()}; }
};

std::vector<float> to_host(const Tensor& t) {
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  Tensor host = t.to(Device::CPU);
  std::memcpy(out.data(), host.data(), out.size() * sizeof(float));
  return out;
}

// Runs the GPU kernel (output poisoned first) and the reference on the same bytes; checks the SPEC
// §9 bound and the −inf pattern. The GPU scores go to `gpu_scores` when given.
void check_scores(IndexerBatch& batch, std::vector<float>* gpu_scores = nullptr) {
  DeviceBatch device(batch);
  Tensor scores = Tensor::empty(DType::F32, {batch.num_rows, batch.num_cols}, Device::CUDA);
  scores.fill_bytes(0x7f);  // 0x7f7f7f7f: a huge finite value no kernel writes
  indexer_scores(device.q.view(), device.keys(), device.rows(), scores.view());
  const std::vector<float> got = to_host(scores);  // before the reference allocates anything
  if (gpu_scores) *gpu_scores = got;
  std::vector<float> want(got.size());
  indexer_scores(batch.query_view(), batch.key_view(), batch.rows_view(),
                 testing::host_view(want, DType::F32, {batch.num_rows, batch.num_cols}));
  double err = 0, norm = 0;
  std::int64_t finite = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const float poison = [] { float f; std::uint32_t u = 0x7f7f7f7fu; std::memcpy(&f, &u, 4); return f; }();
    ASSERT_NE(got[i], poison) << "element " << i << " not written";
    if (std::isinf(want[i])) {
      ASSERT_EQ(got[i], want[i]) << "element " << i;
      continue;
    }
    ASSERT_TRUE(std::isfinite(got[i])) << "element " << i << " = " << got[i] << ", reference " << want[i];
    err += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    norm += static_cast<double>(want[i]) * want[i];
    ++finite;
  }
  if (finite > 0) {
    EXPECT_GT(norm, 0.0);
    EXPECT_LE(std::sqrt(err / norm), 1e-3) << finite << " visible scores";
  }
}

class IndexerScoresGpu : public ::testing::TestWithParam<IndexerKeyFormat> {};

TEST_P(IndexerScoresGpu, DecodeNextN1To8ScatteredPages) {
  std::mt19937_64 rng(testing::fresh_seed());
  std::uniform_int_distribution<int> prefix(0, 9000);
  std::vector<std::vector<int>> visible;
  for (int next_n = 1; next_n <= 8; ++next_n) visible.push_back(testing::causal_visible(prefix(rng), next_n, 4));
  IndexerBatch batch = make_indexer_batch(rng, GetParam(), 64, 64, visible, 2400);
  check_scores(batch);
}

TEST_P(IndexerScoresGpu, RaggedPrefillCausal) {
  std::mt19937_64 rng(testing::fresh_seed());
  // Three requests: a fresh prompt, a chunk after a prefix, and a single token.
  const std::vector<std::vector<int>> visible = {testing::causal_visible(0, 301, 4),
                                                 testing::causal_visible(1000, 77, 4),
                                                 testing::causal_visible(4095, 1, 4)};
  IndexerBatch batch = make_indexer_batch(rng, GetParam(), 64, 64, visible, 1024);
  check_scores(batch);
}

TEST_P(IndexerScoresGpu, VisibilityEdgesAndSmallPages) {
  std::mt19937_64 rng(testing::fresh_seed());
  // V = 0, 1, one page ± 1, exactly the width; an empty request; tiles mixing requests; 16 entries a page.
  const std::vector<std::vector<int>> visible = {{0, 1, 15, 16, 17}, {300}, {}, {0}, {63, 64, 65, 128, 129}, {300, 299}};
  IndexerBatch batch = make_indexer_batch(rng, GetParam(), 64, 16, visible, 300);
  check_scores(batch);
}

TEST_P(IndexerScoresGpu, OneHundredTwentyEightHeads) {
  std::mt19937_64 rng(testing::fresh_seed());
  IndexerBatch batch = make_indexer_batch(rng, GetParam(), 128, 64, {testing::causal_visible(2000, 3, 4)}, 640);
  check_scores(batch);
}

TEST_P(IndexerScoresGpu, RerunIsBitIdentical) {
  std::mt19937_64 rng(testing::fresh_seed());
  IndexerBatch batch = make_indexer_batch(rng, GetParam(), 64, 64, {testing::causal_visible(3000, 4, 4)}, 800);
  std::vector<float> a, b;
  check_scores(batch, &a);
  check_scores(batch, &b);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

// The score kernel launched right behind a kernel that allows early launches and writes every input
// 200 µs late (queries, weights and scales NaN or 0xFF, rows −1, pages 0xFF until then): started early,
// it must wait for that kernel before reading; the scores must be the plain run's bytes.
TEST_P(IndexerScoresGpu, EarlyLaunchWaitsForTheKernelBefore) {
  std::mt19937_64 rng(testing::fresh_seed());
  // Two requests, and one (the one-request decode path reads its first pages right after the wait).
  for (const std::vector<std::vector<int>>& visible :
       {std::vector<std::vector<int>>{testing::causal_visible(4000, 2, 4), testing::causal_visible(900, 1, 4)},
        std::vector<std::vector<int>>{testing::causal_visible(4000, 1, 4)}}) {
    IndexerBatch batch = make_indexer_batch(rng, GetParam(), 64, 64, visible, 1100);
    DeviceBatch device(batch);
    const testing::TestStream stream;
    IndexerOptions options;
    options.check_contents = false;  // no host round trip between the two kernels
    options.stream = stream.stream;
    Tensor plain = Tensor::empty(DType::F32, {batch.num_rows, batch.num_cols}, Device::CUDA);
    Tensor late = Tensor::empty(DType::F32, {batch.num_rows, batch.num_cols}, Device::CUDA);
    indexer_scores(device.q.view(), device.keys(), device.rows(), plain.view(), options);  // also loads the kernel
    ASSERT_EQ(cudaStreamSynchronize(stream.stream), cudaSuccess);
    late.fill_bytes(0x7f);
    {
      const testing::LateWriter writer({&device.q.codes, &device.q.scales, &device.q.weights, &device.pages,
                                        &device.query_start, &device.visible, &device.page_table},
                                       stream.stream);
      indexer_scores(device.q.view(), device.keys(), device.rows(), late.view(), options);
      ASSERT_EQ(cudaStreamSynchronize(stream.stream), cudaSuccess);
    }
    const std::vector<float> want = to_host(plain), got = to_host(late);
    ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
        << visible.size() << " requests: scores differ from the plain run";
  }
}

TEST_P(IndexerScoresGpu, PageOutsideThePoolGivesNaNWithoutReadingIt) {
  std::mt19937_64 rng(testing::fresh_seed());
  IndexerBatch batch = make_indexer_batch(rng, GetParam(), 64, 64, {{200}}, 256);
  batch.page_table[1] = 1 << 30;  // entries 64..127
  DeviceBatch device(batch);
  Tensor scores = Tensor::empty(DType::F32, {1, 256}, Device::CUDA);
  IndexerOptions unchecked;
  unchecked.check_contents = false;
  indexer_scores(device.q.view(), device.keys(), device.rows(), scores.view(), unchecked);
  const auto got = to_host(scores);
  for (int s = 0; s < 256; ++s) {
    if (s >= 64 && s < 128) EXPECT_TRUE(std::isnan(got[s])) << s;
    else if (s < 200) EXPECT_TRUE(std::isfinite(got[s])) << s;
    else EXPECT_EQ(got[s], -std::numeric_limits<float>::infinity()) << s;
  }
  // With the default checks the same call is refused.
  try {
    indexer_scores(device.q.view(), device.keys(), device.rows(), scores.view());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "page_table");
  }
}

TEST_P(IndexerScoresGpu, SingleRowDecode) {
  // B = 1, next_n = 1: tiles of one row; with a single request the chunk's whole page-table slice is
  // read with the rows, including the wild columns past the request's pages (never dereferenced).
  std::mt19937_64 rng(testing::fresh_seed());
  const int entries = std::uniform_int_distribution<int>(15000, 20000)(rng);
  IndexerBatch batch = make_indexer_batch(rng, GetParam(), 64, 64, {{entries}}, entries + 100);
  check_scores(batch);
}

TEST_P(IndexerScoresGpu, ManyRequestsFindTheirRowsByBinarySearch) {
  std::mt19937_64 rng(testing::fresh_seed());
  // More requests than a CTA counts in parallel (1024), some empty, one or two rows each.
  std::uniform_int_distribution<int> seen(0, 150), shape(0, 9);
  std::vector<std::vector<int>> visible(1100);
  for (auto& rows : visible) {
    const int kind = shape(rng);
    if (kind == 0) continue;  // an empty request
    rows.push_back(seen(rng));
    if (kind < 3) rows.push_back(rows.back() + 1);
  }
  IndexerBatch batch = make_indexer_batch(rng, GetParam(), 64, 16, visible, 160, 0);
  check_scores(batch);
}

TEST_P(IndexerScoresGpu, SanitizeSmallDecodeAndPrefill) {
  std::mt19937_64 rng(testing::fresh_seed());
  const std::vector<std::vector<int>> visible = {testing::causal_visible(250, 3, 4), testing::causal_visible(0, 11, 4)};
  IndexerBatch batch = make_indexer_batch(rng, GetParam(), 64, 64, visible, 130);
  check_scores(batch);
}

INSTANTIATE_TEST_SUITE_P(Formats, IndexerScoresGpu, ::testing::Values(IndexerKeyFormat::FP8, IndexerKeyFormat::FP4),
                         [](const auto& param_info) { return param_info.param == IndexerKeyFormat::FP8 ? "FP8" : "FP4"; });

TEST(IndexerScoresGpuErrors, UnsupportedShapesAreRefused) {
  std::mt19937_64 rng(testing::fresh_seed());
  IndexerBatch batch = make_indexer_batch(rng, IndexerKeyFormat::FP8, 32, 64, {{10}}, 16);
  DeviceBatch device(batch);
  Tensor scores = Tensor::empty(DType::F32, {1, 16}, Device::CUDA);
  try {
    indexer_scores(device.q.view(), device.keys(), device.rows(), scores.view());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "q.codes");
  }
  IndexerKeyCacheView keys = device.keys();
  keys.pages.device = Device::CPU;  // mixed devices
  try {
    indexer_scores(device.q.view(), keys, device.rows(), scores.view());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "keys.pages");
  }
}

// ---- query preparation ------------------------------------------------------------------------

class QueryPrepGpu : public ::testing::TestWithParam<IndexerKeyFormat> {};

// The GPU's codes and scales against the reference's (at least 99.9% of the bytes equal), the weights
// exactly; `behind_a_late_writer`: also the early launch.
void check_query_prep(IndexerKeyFormat format, int rows, int heads, std::mt19937_64& rng,
                      bool behind_a_late_writer = false) {
  const RopeTable rope(testing::published_compressed_rope());
  std::uniform_int_distribution<std::int64_t> position(0, 1048575);
  std::vector<float> q_rows = testing::random_normal(rng, static_cast<std::size_t>(rows) * heads * 128, 3.0f);
  std::vector<float> logits = testing::random_normal(rng, static_cast<std::size_t>(rows) * heads, 1.0f);
  std::vector<float> cos(static_cast<std::size_t>(rows) * 32), sin(cos.size());
  for (int t = 0; t < rows; ++t) {
    const std::int64_t p = position(rng);
    for (int i = 0; i < 32; ++i) rope.cos_sin(p, i, cos[t * 32 + i], sin[t * 32 + i]);
  }
  const auto host = [&](std::vector<float>& v, Shape s) { return testing::host_view(v, DType::F32, std::move(s)); };
  IndexerQuery want = IndexerQuery::empty(format, rows, heads, 128);
  prepare_indexer_queries(host(q_rows, {rows, heads * 128}), host(logits, {rows, heads}), host(cos, {rows, 32}),
                          host(sin, {rows, 32}), format, want.view());
  const auto device = [](const TensorView& v) { return Tensor::from_host(v.dtype, v.shape, v.data, Device::CUDA); };
  Tensor d_rows = device(host(q_rows, {rows, heads * 128})), d_logits = device(host(logits, {rows, heads}));
  Tensor d_cos = device(host(cos, {rows, 32})), d_sin = device(host(sin, {rows, 32}));
  IndexerQuery got = IndexerQuery::empty(format, rows, heads, 128, Device::CUDA);
  got.codes.fill_bytes(0xA5);
  got.scales.fill_bytes(0xA5);
  got.weights.fill_bytes(0xA5);
  prepare_indexer_queries(d_rows.view(), d_logits.view(), d_cos.view(), d_sin.view(), format, got.view());
  const Tensor codes = got.codes.to(Device::CPU), scales = got.scales.to(Device::CPU), weights = got.weights.to(Device::CPU);
  const auto equal_fraction = [](const Tensor& a, const Tensor& b) {
    const auto* x = static_cast<const std::uint8_t*>(a.data());
    const auto* y = static_cast<const std::uint8_t*>(b.data());
    std::size_t same = 0;
    for (std::size_t i = 0; i < a.nbytes(); ++i) same += x[i] == y[i];
    return static_cast<double>(same) / static_cast<double>(a.nbytes());
  };
  EXPECT_GE(equal_fraction(codes, want.codes), 0.999) << "codes";
  EXPECT_GE(equal_fraction(scales, want.scales), 0.999) << "scales";
  EXPECT_EQ(0, std::memcmp(weights.data(), want.weights.data(), weights.nbytes())) << "weights";
  if (!behind_a_late_writer) return;

  // Again, right behind a kernel that allows early launches and writes the inputs and the outputs'
  // old bytes 200 µs late (0xFF until then): the kernel, started early, must wait for it before
  // reading or writing anything — the same bytes as the plain run.
  IndexerQuery late = IndexerQuery::empty(format, rows, heads, 128, Device::CUDA);
  late.codes.fill_bytes(0xA5);
  late.scales.fill_bytes(0xA5);
  late.weights.fill_bytes(0xA5);
  const testing::TestStream stream;
  IndexerOptions options;
  options.stream = stream.stream;
  {
    const testing::LateWriter writer({&d_rows, &d_logits, &d_cos, &d_sin, &late.codes, &late.scales, &late.weights},
                                     stream.stream);
    prepare_indexer_queries(d_rows.view(), d_logits.view(), d_cos.view(), d_sin.view(), format, late.view(), options);
    ASSERT_EQ(cudaStreamSynchronize(stream.stream), cudaSuccess);
  }
  const auto same_bytes = [](const Tensor& a, const Tensor& b) {
    const Tensor x = a.to(Device::CPU), y = b.to(Device::CPU);
    return x.nbytes() == y.nbytes() && std::memcmp(x.data(), y.data(), x.nbytes()) == 0;
  };
  EXPECT_TRUE(same_bytes(late.codes, got.codes)) << "codes behind the late writer";
  EXPECT_TRUE(same_bytes(late.scales, got.scales)) << "scales behind the late writer";
  EXPECT_TRUE(same_bytes(late.weights, got.weights)) << "weights behind the late writer";
}

TEST_P(QueryPrepGpu, MatchesReferenceBytes) {
  std::mt19937_64 rng(testing::fresh_seed());
  check_query_prep(GetParam(), 37, 64, rng);
}

TEST_P(QueryPrepGpu, EarlyLaunchWaitsForTheKernelBefore) {
  std::mt19937_64 rng(testing::fresh_seed());
  check_query_prep(GetParam(), 37, 64, rng, true);
}

TEST_P(QueryPrepGpu, SanitizeOneRow) {
  std::mt19937_64 rng(testing::fresh_seed());
  check_query_prep(GetParam(), 1, 64, rng);
}

INSTANTIATE_TEST_SUITE_P(Formats, QueryPrepGpu, ::testing::Values(IndexerKeyFormat::FP8, IndexerKeyFormat::FP4),
                         [](const auto& param_info) { return param_info.param == IndexerKeyFormat::FP8 ? "FP8" : "FP4"; });

}  // namespace
}  // namespace dsv4
