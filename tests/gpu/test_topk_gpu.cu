// GPU top-k (SPEC §7, §9): exactly the reference selection (ties toward the lower entry) made from
// the same scores — including the GPU's own scores — for K ∈ {512, 1024, 2048} and odd K, rows up
// to 262144 candidates, V_t around K, crowded bins (many ties), NaN / ±0 / ±inf, page translation,
// poisoned outputs, bit-identical reruns; "Sanitize" cases for compute-sanitizer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <vector>

#include "cpu/indexer_testing.hpp"
#include "gpu/late_writer.cuh"
#include "cuda/topk/bins.hpp"
#include "dsv4/indexer.hpp"
#include "dsv4/topk.hpp"

namespace dsv4 {
namespace {

struct TopkCase {
  std::int64_t rows = 0, cols = 0;
  int k = 0;
  int entries_per_page = 64;
  std::vector<float> scores;
  std::vector<std::int32_t> query_start, visible, page_table;
  int max_pages = 0;
};

// `rows` rows over `requests` requests (rows split evenly, the rest to the last), scattered pages.
TopkCase make_case(std::mt19937_64& rng, std::int64_t rows, std::int64_t cols, int k, std::vector<std::int32_t> visible,
                   int requests) {
  TopkCase c;
  c.rows = rows;
  c.cols = cols;
  c.k = k;
  c.visible = std::move(visible);
  c.scores = testing::random_normal(rng, static_cast<std::size_t>(rows * cols), 1.0f);
  c.query_start.push_back(0);
  for (int b = 0; b < requests; ++b)
    c.query_start.push_back(b + 1 == requests ? static_cast<std::int32_t>(rows)
                                              : static_cast<std::int32_t>((b + 1) * (rows / requests)));
  c.max_pages = static_cast<int>((cols + c.entries_per_page - 1) / c.entries_per_page);
  std::uniform_int_distribution<std::int32_t> page(0, 1 << 20);
  for (int i = 0; i < requests * c.max_pages; ++i) c.page_table.push_back(page(rng));
  return c;
}

struct TopkResult {
  std::vector<std::int32_t> indices, slots;
};

// `late`: on CUDA, the inputs are written 200 µs late by a kernel that allows early launches, on the
// stream the top-k runs on (the top-k must wait for it before reading).
TopkResult run(TopkCase& c, Device device, bool late = false) {
  const IndexerRowsView host_rows{
      testing::host_view(c.query_start, DType::I32, {static_cast<std::int64_t>(c.query_start.size())}),
      testing::host_view(c.visible, DType::I32, {c.rows}),
      testing::host_view(c.page_table, DType::I32,
                         {static_cast<std::int64_t>(c.query_start.size()) - 1, c.max_pages})};
  TopkResult r;
  r.indices.assign(static_cast<std::size_t>(c.rows * c.k), -77);
  r.slots.assign(r.indices.size(), -77);
  if (device == Device::CPU) {
    indexer_topk(testing::host_view(c.scores, DType::F32, {c.rows, c.cols}), host_rows, c.entries_per_page,
                 testing::host_view(r.indices, DType::I32, {c.rows, c.k}),
                 testing::host_view(r.slots, DType::I32, {c.rows, c.k}));
    return r;
  }
  const auto up = [](const TensorView& v) { return Tensor::from_host(v.dtype, v.shape, v.data, Device::CUDA); };
  Tensor scores = up(testing::host_view(c.scores, DType::F32, {c.rows, c.cols}));
  Tensor qs = up(host_rows.query_start), vis = up(host_rows.visible), pt = up(host_rows.page_table);
  Tensor indices = Tensor::empty(DType::I32, {c.rows, c.k}, Device::CUDA);
  Tensor slots = Tensor::empty(DType::I32, {c.rows, c.k}, Device::CUDA);
  indices.fill_bytes(0xEE);  // poison: −286331154
  slots.fill_bytes(0xEE);
  const testing::TestStream stream;
  IndexerOptions options;
  options.check_contents = !late;  // late: no host round trip between the two kernels
  options.stream = stream.stream;
  std::unique_ptr<testing::LateWriter> writer;
  if (late) writer = std::make_unique<testing::LateWriter>(std::initializer_list<Tensor*>{&scores, &qs, &vis, &pt},
                                                           stream.stream);
  indexer_topk(scores.view(), {qs.view(), vis.view(), pt.view()}, c.entries_per_page, indices.view(), slots.view(),
               options);
  EXPECT_EQ(cudaStreamSynchronize(stream.stream), cudaSuccess);
  Tensor hi = indices.to(Device::CPU), hs = slots.to(Device::CPU);
  std::memcpy(r.indices.data(), hi.data(), hi.nbytes());
  std::memcpy(r.slots.data(), hs.data(), hs.nbytes());
  return r;
}

void expect_same_selection(TopkCase& c) {
  const TopkResult got = run(c, Device::CUDA);
  const TopkResult want = run(c, Device::CPU);
  for (std::int64_t t = 0; t < c.rows; ++t) {
    const auto row = [&](const std::vector<std::int32_t>& v) {
      return std::vector<std::int32_t>(v.begin() + t * c.k, v.begin() + (t + 1) * c.k);
    };
    ASSERT_EQ(row(got.indices), row(want.indices)) << "row " << t << " V " << c.visible[t] << " K " << c.k;
    ASSERT_EQ(row(got.slots), row(want.slots)) << "row " << t;
  }
}

std::vector<std::int32_t> random_visible(std::mt19937_64& rng, std::int64_t rows, std::int64_t cols, int k) {
  std::uniform_int_distribution<std::int64_t> any(0, cols);
  std::vector<std::int32_t> v;
  const std::int64_t edges[] = {0, 1, k - 1, k, k + 1, cols};
  for (std::int64_t t = 0; t < rows; ++t) {
    const std::int64_t pick = t < 6 ? edges[t] : any(rng);
    v.push_back(static_cast<std::int32_t>(std::clamp<std::int64_t>(pick, 0, cols)));
  }
  return v;
}

struct Shape2 {
  std::int64_t rows, cols;
  int k;
};

class TopkGpu : public ::testing::TestWithParam<Shape2> {};

TEST_P(TopkGpu, ExactlyTheReferenceSelection) {
  std::mt19937_64 rng(testing::fresh_seed());
  const Shape2 s = GetParam();
  TopkCase c = make_case(rng, s.rows, s.cols, s.k, random_visible(rng, s.rows, s.cols, s.k), std::min<int>(3, s.rows));
  expect_same_selection(c);
}

INSTANTIATE_TEST_SUITE_P(Shapes, TopkGpu,
                         ::testing::Values(Shape2{1, 262144, 512}, Shape2{7, 262144, 2048}, Shape2{9, 65536, 1024},
                                           Shape2{40, 16384, 512}, Shape2{150, 4096, 7}, Shape2{300, 3000, 2048},
                                           Shape2{6, 131073, 513}),
                         [](const auto& param_info) {
                           return "rows" + std::to_string(param_info.param.rows) + "_cols" +
                                  std::to_string(param_info.param.cols) + "_k" + std::to_string(param_info.param.k);
                         });

TEST(TopkGpuTies, CrowdedBinsAndSpecialValues) {
  std::mt19937_64 rng(testing::fresh_seed());
  const std::int64_t rows = 8, cols = 200000;
  TopkCase c = make_case(rng, rows, cols, 2048, std::vector<std::int32_t>(rows, static_cast<std::int32_t>(cols)), 2);
  std::uniform_int_distribution<int> few(0, 9);
  for (std::int64_t t = 0; t < rows; ++t) {
    float* row = c.scores.data() + t * cols;
    for (std::int64_t s = 0; s < cols; ++s) {
      switch (t) {
        case 0: row[s] = static_cast<float>(few(rng)); break;          // 10 values: ~20000 ties per value
        case 1: row[s] = 1.0f; break;                                  // one value everywhere
        case 2: row[s] = round_to_bf16(row[s]); break;                 // bf16 logits: crowded fp16 bins
        case 3: row[s] = (s % 3 == 0) ? -0.0f : 0.0f; break;           // signed zeros tie
        case 4: row[s] = (s % 5 == 0) ? std::nanf("") : row[s]; break;  // NaN ranks last
        case 5:  // 200 +inf, then K − 200 of the −inf ties
          row[s] = std::numeric_limits<float>::infinity() * ((s % 1000 == 0) ? 1.0f : -1.0f);
          break;
        case 6: row[s] = row[s] * 1e-40f; break;                       // subnormals
        default: row[s] = static_cast<float>(s % 4096); break;         // ascending pattern, many ties
      }
    }
  }
  expect_same_selection(c);
}

// About a thousand candidates share the threshold's coarse bin: the local radix-select path (more
// than the 512 ranked by counting, fewer than the 2048 gathered).
TEST(TopkGpuTies, MediumCrowdedBin) {
  std::mt19937_64 rng(testing::fresh_seed());
  const std::int64_t rows = 3, cols = 50000;
  TopkCase c = make_case(rng, rows, cols, 300, std::vector<std::int32_t>(rows, static_cast<std::int32_t>(cols)), 1);
  std::uniform_int_distribution<std::int64_t> where(0, cols - 1);
  for (std::int64_t t = 0; t < rows; ++t) {
    float* row = c.scores.data() + t * cols;
    for (std::int64_t s = 0; s < cols; ++s) row[s] = std::fmin(row[s], 0.5f);
    for (int i = 0; i < 1000; ++i) row[where(rng)] = 1.0f + static_cast<float>(i % (700 + 100 * t)) * 1e-5f;
  }
  expect_same_selection(c);
}

// Whole rows of 262144 candidates, every entry visible, at K = 512, 1024 and 16: the threshold inside
// its bin, on ties, equal to every key, the top K all in the first CTA or equal keys in every CTA,
// crowded bins, NaN keys (order key 0) — each compared with the reference.
TEST(TopkGpuTies, WholeVisibleRowsAtSmallAndLargeK) {
  std::mt19937_64 rng(testing::fresh_seed());
  for (const int k : {512, 1024, 16}) {
    const std::int64_t rows = 7, cols = 262144;
    TopkCase c = make_case(rng, rows, cols, k, std::vector<std::int32_t>(rows, static_cast<std::int32_t>(cols)), 1);
    std::uniform_int_distribution<int> few(0, 9);
    for (std::int64_t t = 0; t < rows; ++t) {
      float* row = c.scores.data() + t * cols;
      for (std::int64_t s = 0; s < cols; ++s) {
        switch (t) {
          case 0: break;                                                    // normal scores
          case 1: row[s] = static_cast<float>(few(rng)); break;             // ties on the threshold
          case 2: row[s] = -2.5f; break;                                    // the threshold is every key
          case 3: row[s] = -static_cast<float>(s); break;                   // the top K all in the first CTA
          case 4: row[s] = static_cast<float>(s % 65536); break;            // every CTA holds equal top keys
          case 5: row[s] = round_to_bf16(row[s]); break;                    // crowded bins
          default: row[s] = s % 3 == 0 ? std::nanf("") : row[s]; break;   // NaN keys (order key 0)
        }
      }
    }
    expect_same_selection(c);
  }
}

// The kernel compares keys against the bounds of the threshold's histogram bin: scores exactly on
// and one ulp beside bin edges, magnitudes over the whole float range (the end bins beyond
// 2^±16 crowd), and rows whose top K all sit in the clamped end bin.
TEST(TopkGpuTies, BinEdgesAndExtremeMagnitudes) {
  std::mt19937_64 rng(testing::fresh_seed());
  const std::int64_t rows = 4, cols = 100003;  // odd width: the scalar load path
  TopkCase c = make_case(rng, rows, cols, 512, std::vector<std::int32_t>(rows, static_cast<std::int32_t>(cols)), 2);
  std::uniform_int_distribution<int> near_top(3000, 3200), step(-1, 1);
  std::uniform_real_distribution<float> exponent(-38.0f, 38.0f);
  for (std::int64_t t = 0; t < rows; ++t) {
    float* row = c.scores.data() + t * cols;
    for (std::int64_t s = 0; s < cols; ++s) {
      switch (t) {
        case 0: {  // on a bin edge, or one key below / above it
          const auto edge = static_cast<std::uint32_t>(cuda::topk::first_key_of_bin(near_top(rng)));
          row[s] = topk_key_value(edge + static_cast<std::uint32_t>(step(rng)));
          break;
        }
        case 1: row[s] = std::pow(10.0f, exponent(rng)) * (s % 2 ? 1.0f : -1.0f); break;
        case 2: row[s] = row[s] * 1e5f; break;  // the top K are all above 2^16: one end bin
        default: row[s] = s % 7 == 0 ? std::numeric_limits<float>::infinity() : row[s] * 1e-6f; break;
      }
    }
  }
  expect_same_selection(c);
}

// Physical slots through pages of 4 and 16 entries: a 16384-entry CTA then needs more page-table
// entries than it stages in shared memory (4096), or exactly as many (1024).
TEST(TopkGpuPages, SmallPagesStagedOrReadFromTheTable) {
  std::mt19937_64 rng(testing::fresh_seed());
  for (int entries_per_page : {4, 16}) {
    const std::int64_t rows = 3, cols = 262144;
    TopkCase c = make_case(rng, rows, cols, 1024, {static_cast<std::int32_t>(cols), 200000, 1000}, 2);
    c.entries_per_page = entries_per_page;
    c.max_pages = static_cast<int>(cols / entries_per_page);
    c.page_table.clear();
    std::uniform_int_distribution<std::int32_t> page(0, 1 << 22);
    for (int i = 0; i < 2 * c.max_pages; ++i) c.page_table.push_back(page(rng));
    expect_same_selection(c);
  }
}

TEST(TopkGpuTies, RerunIsBitIdentical) {
  std::mt19937_64 rng(testing::fresh_seed());
  TopkCase c = make_case(rng, 4, 100000, 1024, std::vector<std::int32_t>(4, 100000), 1);
  const auto a = run(c, Device::CUDA);
  const auto b = run(c, Device::CUDA);
  EXPECT_EQ(a.indices, b.indices);
}

// The selection made from the GPU's own scores equals the reference selection from those scores.
TEST(TopkGpuOnScores, SelectionFromGpuScores) {
  std::mt19937_64 rng(testing::fresh_seed());
  const std::vector<std::vector<int>> visible = {testing::causal_visible(20000, 2, 4), testing::causal_visible(2100, 3, 4)};
  testing::IndexerBatch batch = testing::make_indexer_batch(rng, IndexerKeyFormat::FP8, 64, 64, visible, 5008);
  const IndexerQueryView hq = batch.query_view();
  const auto up = [](const TensorView& v) { return Tensor::from_host(v.dtype, v.shape, v.data, Device::CUDA); };
  IndexerQuery q{up(hq.codes), up(hq.scales), up(hq.weights)};
  const IndexerRowsView hr = batch.rows_view();
  Tensor pages = up(batch.key_view().pages), qs = up(hr.query_start), vis = up(hr.visible), pt = up(hr.page_table);
  Tensor scores = Tensor::empty(DType::F32, {batch.num_rows, batch.num_cols}, Device::CUDA);
  const IndexerRowsView rows{qs.view(), vis.view(), pt.view()};
  indexer_scores(q.view(), {pages.view(), batch.format, 64}, rows, scores.view());
  const int k = 512;
  Tensor indices = Tensor::empty(DType::I32, {batch.num_rows, k}, Device::CUDA);
  Tensor slots = Tensor::empty(DType::I32, {batch.num_rows, k}, Device::CUDA);
  indices.fill_bytes(0xEE);
  slots.fill_bytes(0xEE);
  indexer_topk(scores.view(), rows, 64, indices.view(), slots.view());
  Tensor host_scores = scores.to(Device::CPU);
  std::vector<std::int32_t> want(static_cast<std::size_t>(batch.num_rows * k)), want_slots(want.size());
  indexer_topk(host_scores.view(), hr, 64, testing::host_view(want, DType::I32, {batch.num_rows, k}),
               testing::host_view(want_slots, DType::I32, {batch.num_rows, k}));
  Tensor got = indices.to(Device::CPU), got_slots = slots.to(Device::CPU);
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.nbytes()));
  EXPECT_EQ(0, std::memcmp(got_slots.data(), want_slots.data(), got_slots.nbytes()));
}

// The top-k launched right behind a kernel that allows early launches and writes its scores and rows
// 200 µs late (NaN scores, −1 rows until then): started early, it must wait for that kernel; the
// selection must be the plain run's. A row width that is not a multiple of 4 (the scalar loads), and
// rows that take clusters of 8 and of 16 CTAs (the widest).
TEST(TopkGpu, EarlyLaunchWaitsForTheKernelBefore) {
  std::mt19937_64 rng(testing::fresh_seed());
  for (const std::int64_t cols : {3001, 20000, 262144}) {
    TopkCase c = make_case(rng, 2, cols, 512, {static_cast<std::int32_t>(cols), static_cast<std::int32_t>(cols / 2)}, 1);
    const TopkResult plain = run(c, Device::CUDA);  // also loads the kernel
    const TopkResult late = run(c, Device::CUDA, true);
    EXPECT_EQ(late.indices, plain.indices) << cols << " columns";
    EXPECT_EQ(late.slots, plain.slots) << cols << " columns";
  }
}

TEST(TopkGpuErrors, RowsWiderThanTheClusterAreRefused) {
  Tensor scores = Tensor::empty(DType::F32, {1, kTopkMaxCandidates + 1}, Device::CUDA);
  std::vector<std::int32_t> qs = {0, 1}, vis = {5}, pt = {0};
  const auto up = [](std::vector<std::int32_t>& v, Shape s) {
    return Tensor::from_host(DType::I32, std::move(s), v.data(), Device::CUDA);
  };
  Tensor d_qs = up(qs, {2}), d_vis = up(vis, {1}), d_pt = up(pt, {1, 1});
  Tensor indices = Tensor::empty(DType::I32, {1, 8}, Device::CUDA);
  try {
    indexer_topk(scores.view(), {d_qs.view(), d_vis.view(), d_pt.view()}, 64, indices.view(), TensorView{});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "scores");
  }
}

TEST(TopkGpuSanitize, SmallClusterRows) {
  std::mt19937_64 rng(testing::fresh_seed());
  TopkCase c = make_case(rng, 3, 9000, 64, {9000, 64, 65}, 2);
  expect_same_selection(c);
  TopkCase ties = make_case(rng, 2, 5000, 100, {5000, 4000}, 1);
  for (auto& x : ties.scores) x = 2.0f;  // the many-candidates path
  expect_same_selection(ties);
}

}  // namespace
}  // namespace dsv4
