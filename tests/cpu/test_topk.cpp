// Top-k reference (SPEC §7): exact selection against a full sort, ties toward the lower entry,
// V_t around K, −1 padding, page translation, the order key, errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "cuda/topk/bins.hpp"  // plain C++: the CUDA top-k's histogram bins
#include "dsv4/topk.hpp"
#include "indexer_testing.hpp"

namespace dsv4 {
namespace {

struct TopkRows {
  std::vector<std::int32_t> query_start, visible, page_table;
  int max_pages = 0;
  IndexerRowsView view(std::int64_t rows) {
    return {testing::host_view(query_start, DType::I32, {static_cast<std::int64_t>(query_start.size())}),
            testing::host_view(visible, DType::I32, {rows}),
            testing::host_view(page_table, DType::I32,
                               {static_cast<std::int64_t>(query_start.size()) - 1, max_pages})};
  }
};

// One request per row, each with its own shuffled page table of `max_pages` pages.
TopkRows rows_per_request(std::mt19937_64& rng, const std::vector<std::int32_t>& visible, int max_pages) {
  TopkRows r;
  r.visible = visible;
  r.max_pages = max_pages;
  r.query_start.resize(visible.size() + 1);
  std::iota(r.query_start.begin(), r.query_start.end(), 0);
  for (std::size_t b = 0; b < visible.size(); ++b) {
    std::vector<std::int32_t> pages(static_cast<std::size_t>(max_pages));
    std::iota(pages.begin(), pages.end(), static_cast<std::int32_t>(1000 * b + 1));
    std::shuffle(pages.begin(), pages.end(), rng);
    r.page_table.insert(r.page_table.end(), pages.begin(), pages.end());
  }
  return r;
}

// The expected row: sort every visible entry by (score desc, entry asc) with a full sort.
std::vector<std::int32_t> full_sort_topk(const float* row, int visible, int k) {
  std::vector<std::int32_t> order(static_cast<std::size_t>(visible));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    const bool a_nan = std::isnan(row[a]), b_nan = std::isnan(row[b]);
    if (a_nan || b_nan) return !a_nan && b_nan;  // numbers before NaN
    return row[a] > row[b];                      // stable: equal scores (−0 = +0) keep ascending entries
  });
  if (static_cast<int>(order.size()) > k) order.resize(static_cast<std::size_t>(k));
  std::sort(order.begin(), order.end());
  order.resize(static_cast<std::size_t>(k), -1);
  return order;
}

void run_topk(const std::vector<float>& scores, std::int64_t cols, TopkRows& rows, int epp, int k,
              std::vector<std::int32_t>& indices, std::vector<std::int32_t>& slots) {
  const std::int64_t n = static_cast<std::int64_t>(rows.visible.size());
  indices.assign(static_cast<std::size_t>(n * k), -99);
  slots.assign(static_cast<std::size_t>(n * k), -99);
  std::vector<float> copy = scores;
  indexer_topk(testing::host_view(copy, DType::F32, {n, cols}), rows.view(n), epp,
               testing::host_view(indices, DType::I32, {n, k}), testing::host_view(slots, DType::I32, {n, k}));
}

TEST(TopkRef, ExactAgainstFullSortWithTiesAndPadding) {
  std::mt19937_64 rng(testing::fresh_seed());
  const int k = 64, cols = 300, epp = 16;
  // V around K (K−1, K, K+1), none, all, and in between.
  const std::vector<std::int32_t> visible = {0, 1, k - 1, k, k + 1, 150, cols, cols};
  TopkRows rows = rows_per_request(rng, visible, (cols + epp - 1) / epp);
  std::vector<float> scores = testing::random_normal(rng, visible.size() * cols, 1.0f);
  // The last row: only 5 distinct values, so ties decide most of the selection.
  std::uniform_int_distribution<int> few(0, 4);
  for (int s = 0; s < cols; ++s) scores[7 * cols + s] = static_cast<float>(few(rng)) * 0.5f;
  std::vector<std::int32_t> indices, slots;
  run_topk(scores, cols, rows, epp, k, indices, slots);
  for (std::size_t t = 0; t < visible.size(); ++t) {
    const auto want = full_sort_topk(scores.data() + t * cols, visible[t], k);
    const std::vector<std::int32_t> got(indices.begin() + t * k, indices.begin() + (t + 1) * k);
    EXPECT_EQ(got, want) << "row " << t << " V " << visible[t];
    for (int i = 0; i < k; ++i) {
      const std::int32_t s = got[i];
      const std::int32_t slot = slots[t * k + i];
      if (s < 0) {
        EXPECT_EQ(slot, -1);
        continue;
      }
      EXPECT_EQ(slot, rows.page_table[t * rows.max_pages + s / epp] * epp + s % epp);
    }
  }
  // V ≤ K returns every visible entry; K+1 drops exactly the smallest.
  for (int i = 0; i < k - 1; ++i) EXPECT_EQ(indices[2 * k + i], i);
  EXPECT_EQ(indices[2 * k + k - 1], -1);
}

TEST(TopkRef, TiesGoToTheLowerEntryAndSignedZerosTie) {
  std::vector<float> scores = {1.0f, -0.0f, 3.0f, 0.0f, 3.0f, std::nanf(""), -0.0f, 1.0f, 3.0f};
  std::mt19937_64 rng(testing::fresh_seed());
  TopkRows rows = rows_per_request(rng, {9}, 1);
  std::vector<std::int32_t> indices, slots;
  run_topk(scores, 9, rows, 16, 5, indices, slots);
  // 3, 3, 3 (entries 2, 4, 8), then 1, 1 (entries 0, 7).
  EXPECT_EQ(indices, (std::vector<std::int32_t>{0, 2, 4, 7, 8}));
  run_topk(scores, 9, rows, 16, 7, indices, slots);
  // then the zeros: −0 at entry 1 ties with +0 at entry 3 and wins by its lower entry.
  EXPECT_EQ(indices, (std::vector<std::int32_t>{0, 1, 2, 3, 4, 7, 8}));
  run_topk(scores, 9, rows, 16, 8, indices, slots);
  EXPECT_EQ(indices, (std::vector<std::int32_t>{0, 1, 2, 3, 4, 6, 7, 8})) << "NaN ranks last";
}

TEST(TopkRef, OrderKeyIsMonotone) {
  std::mt19937_64 rng(testing::fresh_seed());
  std::vector<float> v = testing::random_normal(rng, 2000, 100.0f);
  v.insert(v.end(), {0.0f, -0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                     std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min()});
  for (std::size_t i = 0; i + 1 < v.size(); ++i) {
    const float a = v[i], b = v[i + 1];
    EXPECT_EQ(a < b, topk_order_key(a) < topk_order_key(b)) << a << " " << b;
    EXPECT_EQ(a == b, topk_order_key(a) == topk_order_key(b)) << a << " " << b;
    EXPECT_EQ(topk_key_value(topk_order_key(a)), a == 0.0f ? 0.0f : a);
  }
  EXPECT_EQ(topk_order_key(std::nanf("")), 0u);
  EXPECT_LT(0u, topk_order_key(-std::numeric_limits<float>::infinity()));
}

// The CUDA top-k compares keys against the bounds of one histogram bin instead of binning them
// again: each bin must be exactly the keys [first_key_of_bin(b), first_key_of_bin(b + 1)). Checked
// at both sides of every edge and on random keys and scores (an exhaustive sweep of all 2^32 keys
// passed once, offline: too slow for the suite).
TEST(TopkBins, EveryBinIsTheIntervalOfItsBounds) {
  using cuda::topk::coarse_bin;
  using cuda::topk::first_key_of_bin;
  using cuda::topk::kCoarseBins;
  EXPECT_EQ(first_key_of_bin(0), 0u);
  EXPECT_EQ(first_key_of_bin(kCoarseBins), std::uint64_t{1} << 32);
  for (int b = 1; b < kCoarseBins; ++b) {
    const std::uint64_t first = first_key_of_bin(b);
    ASSERT_GT(first, first_key_of_bin(b - 1)) << "bin " << b - 1 << " is empty";
    EXPECT_EQ(coarse_bin(static_cast<std::uint32_t>(first)), b);
    EXPECT_EQ(coarse_bin(static_cast<std::uint32_t>(first - 1)), b - 1);
  }
  const auto inside = [&](std::uint32_t key) {
    const int b = coarse_bin(key);
    return first_key_of_bin(b) <= key && key < first_key_of_bin(b + 1);
  };
  std::mt19937_64 rng(testing::fresh_seed());
  for (int i = 0; i < 200000; ++i) {
    const auto key = static_cast<std::uint32_t>(rng());
    ASSERT_TRUE(inside(key)) << key;
  }
  std::vector<float> v = testing::random_normal(rng, 2000, 1.0f);
  for (float scale : {1e-30f, 1e-6f, 1e6f, 1e30f}) v.push_back(scale * v[v.size() % 100]);
  v.insert(v.end(), {0.0f, -0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                     std::nanf(""), 65536.0f, -65536.0f, 1.0f / 65536.0f});
  for (float x : v) {
    EXPECT_TRUE(inside(topk_order_key(x))) << x;
    for (float y : v) {  // monotone: a larger score never falls in a lower bin
      if (topk_order_key(x) < topk_order_key(y)) {
        ASSERT_LE(coarse_bin(topk_order_key(x)), coarse_bin(topk_order_key(y)));
      }
    }
  }
  EXPECT_EQ(coarse_bin(topk_order_key(std::nanf(""))), 0);
  EXPECT_EQ(coarse_bin(topk_order_key(-0.0f)), coarse_bin(topk_order_key(0.0f)));
  EXPECT_EQ(coarse_bin(topk_order_key(1.0f)) + 64, coarse_bin(topk_order_key(2.0f))) << "64 bins an octave";
}

TEST(TopkRef, SeveralRowsPerRequestShareThePageTable) {
  std::mt19937_64 rng(testing::fresh_seed());
  const int epp = 4, k = 6, cols = 40;
  TopkRows rows;
  rows.query_start = {0, 3, 3, 5};  // request 1 has no rows
  rows.visible = {20, 21, 22, 40, 7};
  rows.max_pages = 10;
  for (int i = 0; i < 3 * rows.max_pages; ++i) rows.page_table.push_back(static_cast<std::int32_t>(rng() % 5000));
  std::vector<float> scores = testing::random_floats(rng, 5 * cols);
  std::vector<std::int32_t> indices, slots;
  run_topk(scores, cols, rows, epp, k, indices, slots);
  const int request_of[5] = {0, 0, 0, 2, 2};
  for (int t = 0; t < 5; ++t)
    for (int i = 0; i < k; ++i) {
      const std::int32_t s = indices[t * k + i];
      ASSERT_GE(s, 0);
      EXPECT_EQ(slots[t * k + i], rows.page_table[request_of[t] * rows.max_pages + s / epp] * epp + s % epp);
    }
}

TEST(TopkRef, Errors) {
  std::mt19937_64 rng(testing::fresh_seed());
  TopkRows rows = rows_per_request(rng, {10, 4}, 3);
  std::vector<float> scores = testing::random_floats(rng, 2 * 12);
  std::vector<std::int32_t> indices(2 * 4, -99), slots(2 * 4, -99);
  const auto argument_of = [&](auto&& mutate) {
    TopkRows r = rows;
    TensorView s = testing::host_view(scores, DType::F32, {2, 12});
    TensorView i = testing::host_view(indices, DType::I32, {2, 4});
    TensorView sl = testing::host_view(slots, DType::I32, {2, 4});
    int epp = 4;
    IndexerRowsView v = r.view(2);
    mutate(r, v, s, i, sl, epp);
    try {
      indexer_topk(s, v, epp, i, sl);
    } catch (const Error& e) {
      return e.argument();
    }
    return std::string("<none>");
  };
  using V = IndexerRowsView;
  using T = TensorView;
  EXPECT_EQ(argument_of([](TopkRows&, V&, T&, T& i, T&, int&) { i.shape = {2, 0}; }), "indices");
  EXPECT_EQ(argument_of([](TopkRows&, V&, T&, T&, T& sl, int&) { sl.shape = {2, 3}; }), "slots");
  EXPECT_EQ(argument_of([](TopkRows&, V&, T& s, T&, T&, int&) { s.dtype = DType::F64; }), "scores");
  EXPECT_EQ(argument_of([](TopkRows& r, V&, T&, T&, T&, int&) { r.visible[0] = 13; }), "visible");
  EXPECT_EQ(argument_of([](TopkRows& r, V&, T&, T&, T&, int&) { r.page_table[1] = -3; }), "page_table");
  EXPECT_EQ(argument_of([](TopkRows&, V&, T&, T&, T&, int& epp) { epp = 0; }), "entries_per_page");
  EXPECT_EQ(argument_of([](TopkRows&, V&, T&, T&, T&, int& epp) { epp = 2; }), "page_table");  // 10 needs 5 pages
  EXPECT_EQ(argument_of([](TopkRows& r, V&, T&, T&, T&, int&) { r.query_start[2] = 1; }), "query_start");
  // Outputs over what the call reads, or over each other.
  EXPECT_EQ(argument_of([](TopkRows&, V&, T& s, T& i, T&, int&) { i.data = s.data; }), "indices");
  EXPECT_EQ(argument_of([](TopkRows&, V&, T& s, T&, T& sl, int&) { sl.data = static_cast<float*>(s.data) + 4; }), "slots");
  EXPECT_EQ(argument_of([](TopkRows&, V&, T&, T& i, T& sl, int&) { sl.data = i.data; }), "indices");
  for (std::int32_t x : indices) EXPECT_EQ(x, -99) << "output touched on error";
  for (std::int32_t x : slots) EXPECT_EQ(x, -99) << "output touched on error";
  // Without slots the page table is not read, so a wild one is fine.
  TopkRows r = rows;
  for (auto& p : r.page_table) p = -5;
  indexer_topk(testing::host_view(scores, DType::F32, {2, 12}), r.view(2), 4,
               testing::host_view(indices, DType::I32, {2, 4}), TensorView{});
  EXPECT_EQ(indices[4], 0);
}

}  // namespace
}  // namespace dsv4
