// Indexer reference (SPEC §7): scores against an independent naive formula, visibility and page
// translation, query preparation against RopeTable + Walsh–Hadamard + the key encoders, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "dsv4/config.hpp"
#include "dsv4/indexer.hpp"
#include "dsv4/norms.hpp"
#include "dsv4/rope.hpp"
#include "indexer_testing.hpp"

namespace dsv4 {
namespace {

using testing::IndexerBatch;
using testing::make_indexer_batch;

constexpr float kPoison = 12345.0f;
const float kNegInf = -std::numeric_limits<float>::infinity();

// The key of entry s of request b, decoded with offsets written out by hand (SPEC §5.2), not
// through the layout traits the reference uses.
std::vector<double> naive_key(const IndexerBatch& batch, int b, int s) {
  const int epp = batch.entries_per_page;
  const std::int32_t page = batch.page_table[b * batch.max_pages + s / epp];
  const int i = s % epp;
  const std::uint8_t* base = batch.pages.data() + page * batch.page_bytes();
  std::vector<double> k(128);
  if (batch.format.format == IndexerKeyFormat::FP8) {
    float scale;
    std::memcpy(&scale, base + epp * 128 + i * 4, 4);
    for (int d = 0; d < 128; ++d) k[d] = static_cast<double>(float_from_e4m3(base[i * 128 + d])) * scale;
  } else {
    for (int d = 0; d < 128; ++d) {
      const std::uint8_t byte = base[i * 64 + d / 2];
      const double scale = std::ldexp(1.0, base[epp * 64 + i * 4 + d / 32] - 127);
      k[d] = float_from_e2m1(d % 2 ? byte >> 4 : byte & 15) * scale;
    }
  }
  return k;
}

std::vector<double> naive_query(const IndexerBatch& batch, std::int64_t t, int h) {
  const std::int64_t head = t * batch.heads + h;
  std::vector<double> q(128);
  if (batch.format.format == IndexerKeyFormat::FP8) {
    for (int d = 0; d < 128; ++d)
      q[d] = static_cast<double>(float_from_e4m3(batch.q_codes[head * 128 + d])) * batch.q_scales_f32[head];
  } else {
    for (int d = 0; d < 128; ++d) {
      const std::uint8_t byte = batch.q_codes[head * 64 + d / 2];
      q[d] = float_from_e2m1(d % 2 ? byte >> 4 : byte & 15) * std::ldexp(1.0, batch.q_scales_u8[head * 4 + d / 32] - 127);
    }
  }
  return q;
}

std::vector<float> run_scores(IndexerBatch& batch) {
  std::vector<float> scores(static_cast<std::size_t>(batch.num_rows * batch.num_cols), kPoison);
  indexer_scores(batch.query_view(), batch.key_view(), batch.rows_view(),
                 testing::host_view(scores, DType::F32, {batch.num_rows, batch.num_cols}));
  return scores;
}

class IndexerScoresRef : public ::testing::TestWithParam<IndexerKeyFormat> {};

TEST_P(IndexerScoresRef, MatchesNaiveFormulaWithScatteredPages) {
  std::mt19937_64 rng(testing::fresh_seed());
  // Two decode requests (next_n 3 and 1) and a short prefill, pages of 8 entries.
  const std::vector<std::vector<int>> visible = {{13, 13, 14}, {5}, testing::causal_visible(0, 23, 4)};
  IndexerBatch batch = make_indexer_batch(rng, GetParam(), 16, 8, visible, 17);
  const std::vector<float> scores = run_scores(batch);
  int row = 0, finite = 0, positive = 0, negative = 0;
  for (int b = 0; b < batch.num_requests(); ++b) {
    for (; row < batch.query_start[b + 1]; ++row) {
      for (int s = 0; s < batch.num_cols; ++s) {
        const float got = scores[row * batch.num_cols + s];
        if (s >= batch.visible[row]) {
          EXPECT_EQ(got, kNegInf) << "row " << row << " s " << s;
          continue;
        }
        const auto k = naive_key(batch, b, s);
        double want = 0, magnitude = 0;
        for (int h = 0; h < batch.heads; ++h) {
          const auto q = naive_query(batch, row, h);
          double dot = 0, abs_dot = 0;
          for (int d = 0; d < 128; ++d) {
            dot += q[d] * k[d];
            abs_dot += std::fabs(q[d] * k[d]);
          }
          want += batch.weights[row * batch.heads + h] * (dot > 0 ? dot : 0.0);
          magnitude += std::fabs(batch.weights[row * batch.heads + h]) * abs_dot;
        }
        // The reference holds dequantized values in float32 (one rounding each), this one in double.
        EXPECT_NEAR(got, want, 1e-6 * magnitude) << "row " << row << " s " << s;
        ++finite;
        positive += want > 0;
        negative += want < 0;
      }
    }
  }
  EXPECT_GT(finite, 100);
  EXPECT_GT(positive, 10) << "the data must exercise both signs";
  EXPECT_GT(negative, 10);
}

TEST_P(IndexerScoresRef, VisibilityEdgesAndPageTranslation) {
  std::mt19937_64 rng(testing::fresh_seed());
  // V = 0, V = S, V at and across page boundaries (8 per page).
  const std::vector<std::vector<int>> visible = {{0, 1, 7, 8, 9, 16, 24}};
  IndexerBatch scattered = make_indexer_batch(rng, GetParam(), 8, 8, visible, 24);
  const std::vector<float> a = run_scores(scattered);
  // The same keys, moved to other pages: the scores must not change.
  IndexerBatch moved = scattered;
  const int pages = 3;
  std::vector<std::uint8_t> fresh(moved.pages.size());
  for (auto& x : fresh) x = static_cast<std::uint8_t>(rng());
  for (int p = 0; p < pages; ++p) {
    const std::int32_t from = scattered.page_table[p];
    const std::int32_t to = static_cast<std::int32_t>((from + 1) % scattered.num_pages);
    std::memcpy(fresh.data() + to * moved.page_bytes(), scattered.pages.data() + from * moved.page_bytes(),
                static_cast<std::size_t>(moved.page_bytes()));
    moved.page_table[p] = to;
  }
  moved.pages = fresh;
  const std::vector<float> b = run_scores(moved);
  EXPECT_EQ(a, b);
  for (int t = 0; t < scattered.num_rows; ++t)
    for (int s = 0; s < 24; ++s) {
      const float v = a[t * 24 + s];
      if (s < scattered.visible[t]) EXPECT_TRUE(std::isfinite(v)) << t << " " << s;
      else EXPECT_EQ(v, kNegInf) << t << " " << s;
    }
}

INSTANTIATE_TEST_SUITE_P(Formats, IndexerScoresRef, ::testing::Values(IndexerKeyFormat::FP8, IndexerKeyFormat::FP4),
                         [](const auto& param_info) { return param_info.param == IndexerKeyFormat::FP8 ? "FP8" : "FP4"; });

// Every validation failure names its argument and leaves the output as it was.
TEST(IndexerScoresRef, ErrorsNameTheArgumentAndWriteNothing) {
  std::mt19937_64 rng(testing::fresh_seed());
  const auto fresh = [&] { return make_indexer_batch(rng, IndexerKeyFormat::FP8, 8, 8, {{5, 6}, {9}}, 12); };
  const auto expect_error = [&](IndexerBatch batch, auto&& mutate, const std::string& argument) {
    std::vector<float> scores(static_cast<std::size_t>(batch.num_rows * batch.num_cols), kPoison);
    TensorView out = testing::host_view(scores, DType::F32, {batch.num_rows, batch.num_cols});
    IndexerQueryView q = batch.query_view();
    IndexerKeyCacheView keys = batch.key_view();
    IndexerRowsView rows = batch.rows_view();
    mutate(batch, q, keys, rows, out);
    try {
      indexer_scores(q, keys, rows, out);
      ADD_FAILURE() << "no error for " << argument;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), argument) << e.what();
    }
    for (float v : scores) ASSERT_EQ(v, kPoison) << "output touched on error " << argument;
  };
  using B = IndexerBatch;
  using Q = IndexerQueryView;
  using K = IndexerKeyCacheView;
  using R = IndexerRowsView;
  expect_error(fresh(), [](B&, Q& q, K&, R&, TensorView&) { q.codes.dtype = DType::I8; }, "q.codes");
  expect_error(fresh(), [](B&, Q& q, K&, R&, TensorView&) { q.weights.shape = {2, 8}; }, "q.weights");
  expect_error(fresh(), [](B&, Q& q, K&, R&, TensorView&) { q.scales.dtype = DType::U8; }, "q.scales");
  expect_error(fresh(), [](B&, Q&, K& k, R&, TensorView&) { k.pages.shape[1] -= 4; }, "keys.pages");
  expect_error(fresh(), [](B&, Q&, K& k, R&, TensorView&) { k.entries_per_page = 0; }, "keys.entries_per_page");
  expect_error(fresh(), [](B&, Q&, K& k, R&, TensorView&) { k.format.format = static_cast<IndexerKeyFormat>(7); },
               "keys.format");
  expect_error(fresh(), [](B&, Q&, K&, R&, TensorView& out) { out.shape = {2, 12}; }, "scores");
  expect_error(fresh(), [](B& b, Q&, K&, R&, TensorView&) { b.query_start[0] = 1; }, "query_start");
  expect_error(fresh(), [](B& b, Q&, K&, R&, TensorView&) { b.query_start[1] = 3; b.query_start[2] = 2; },
               "query_start");
  expect_error(fresh(), [](B& b, Q&, K&, R&, TensorView&) { b.query_start[2] = 2; }, "query_start");
  expect_error(fresh(), [](B& b, Q&, K&, R&, TensorView&) { b.visible[1] = 13; }, "visible");
  expect_error(fresh(), [](B& b, Q&, K&, R&, TensorView&) { b.visible[0] = -1; }, "visible");
  expect_error(fresh(), [](B& b, Q&, K&, R&, TensorView&) { b.page_table[b.max_pages + 1] = static_cast<int>(b.num_pages); },
               "page_table");
  expect_error(fresh(), [](B& b, Q&, K&, R&, TensorView&) { b.page_table[0] = -1; }, "page_table");
  expect_error(fresh(), [](B&, Q&, K&, R& r, TensorView&) { r.page_table.shape = {2, 1}; }, "page_table");
  expect_error(fresh(), [](B&, Q&, K&, R& r, TensorView&) { r.visible.dtype = DType::I64; }, "visible");
  expect_error(fresh(), [](B&, Q&, K&, R& r, TensorView&) { r.query_start.device = Device::CUDA; }, "query_start");
  // Scores written over what the call reads (inside the query codes, inside the keys).
  expect_error(fresh(), [](B&, Q& q, K&, R&, TensorView& out) { out.data = q.codes.data; }, "scores");
  expect_error(fresh(), [](B&, Q&, K& k, R&, TensorView& out) { out.data = k.pages.data; }, "scores");
}

// ---- query preparation -----------------------------------------------------------------------

class QueryPrepRef : public ::testing::TestWithParam<IndexerKeyFormat> {};

TEST_P(QueryPrepRef, RopeThenHadamardThenKeyQuantization) {
  std::mt19937_64 rng(testing::fresh_seed());
  const IndexerKeyFormat format = GetParam();
  const int rows = 5, heads = 4, dim = 128, rope_dim = 64;
  const RopeConfig rope_config = testing::published_compressed_rope();
  ASSERT_EQ(rope_config.rope_dim, rope_dim);
  const RopeTable rope(rope_config);
  std::vector<std::int64_t> positions = {0, 1, 77, 65539, 1048575};
  std::vector<float> q_rows = testing::random_normal(rng, rows * heads * dim, 2.0f);
  std::vector<float> logits = testing::random_normal(rng, rows * heads, 1.0f);
  std::vector<float> cos(rows * rope_dim / 2), sin(rows * rope_dim / 2);
  for (int t = 0; t < rows; ++t)
    for (int i = 0; i < rope_dim / 2; ++i) rope.cos_sin(positions[t], i, cos[t * 32 + i], sin[t * 32 + i]);
  IndexerQuery out = IndexerQuery::empty(format, rows, heads, dim);
  out.codes.fill_bytes(0xA5);
  out.scales.fill_bytes(0xA5);
  prepare_indexer_queries(testing::host_view(q_rows, DType::F32, {rows, heads * dim}),
                          testing::host_view(logits, DType::F32, {rows, heads}),
                          testing::host_view(cos, DType::F32, {rows, 32}), testing::host_view(sin, DType::F32, {rows, 32}),
                          format, out.view());
  const IndexerEntryFormat fmt{format, dim};
  std::vector<std::uint8_t> codes(fmt.data_bytes());
  std::vector<float> scale_f(1);
  std::vector<std::uint8_t> scale_b(4);
  for (int t = 0; t < rows; ++t)
    for (int h = 0; h < heads; ++h) {
      std::vector<float> x(q_rows.begin() + (t * heads + h) * dim, q_rows.begin() + (t * heads + h + 1) * dim);
      apply_rope_to_tail(rope, x.data(), dim, positions[t]);
      for (auto& v : x) v = round_to_bf16(v);  // bf16 after RoPE and after the transform, like the keys
      walsh_hadamard(x.data(), dim);
      for (auto& v : x) v = round_to_bf16(v);
      void* scales = format == IndexerKeyFormat::FP8 ? static_cast<void*>(scale_f.data()) : scale_b.data();
      testing::quantize_head(fmt, x.data(), codes.data(), scales, 0);
      const std::int64_t head = t * heads + h;
      EXPECT_EQ(0, std::memcmp(codes.data(), out.codes.data_as<std::uint8_t>() + head * fmt.data_bytes(),
                               codes.size()))
          << "row " << t << " head " << h;
      if (format == IndexerKeyFormat::FP8)
        EXPECT_EQ(scale_f[0], out.scales.data_as<float>()[head]);
      else
        EXPECT_EQ(0, std::memcmp(scale_b.data(), out.scales.data_as<std::uint8_t>() + head * 4, 4));
      EXPECT_FLOAT_EQ(out.weights.data_as<float>()[head], logits[head] / std::sqrt(128.0f * 4.0f));
    }
}

INSTANTIATE_TEST_SUITE_P(Formats, QueryPrepRef, ::testing::Values(IndexerKeyFormat::FP8, IndexerKeyFormat::FP4),
                         [](const auto& param_info) { return param_info.param == IndexerKeyFormat::FP8 ? "FP8" : "FP4"; });

TEST(QueryPrepRef, Errors) {
  std::vector<float> q(2 * 4 * 128, 0.5f), logits(8, 1.0f), cs(2 * 32, 1.0f);
  IndexerQuery out = IndexerQuery::empty(IndexerKeyFormat::FP8, 2, 4, 128);
  const auto call = [&](Shape q_shape, Shape cos_shape, IndexerKeyFormat format, const IndexerQuery& o) {
    prepare_indexer_queries(testing::host_view(q, DType::F32, q_shape), testing::host_view(logits, DType::F32, {2, 4}),
                            testing::host_view(cs, DType::F32, cos_shape), testing::host_view(cs, DType::F32, {2, 32}),
                            format, o.view());
  };
  const auto argument_of = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.argument();
    }
    return std::string("<none>");
  };
  EXPECT_EQ(argument_of([&] { call({2, 500}, {2, 32}, IndexerKeyFormat::FP8, out); }), "q_rows");
  EXPECT_EQ(argument_of([&] { call({2, 4 * 96}, {2, 32}, IndexerKeyFormat::FP8, out); }), "q_rows");
  EXPECT_EQ(argument_of([&] { call({2, 512}, {2, 16}, IndexerKeyFormat::FP8, out); }), "rope_sin");
  EXPECT_EQ(argument_of([&] { call({2, 512}, {3, 32}, IndexerKeyFormat::FP8, out); }), "rope_cos");
  EXPECT_EQ(argument_of([&] { call({2, 512}, {2, 32}, IndexerKeyFormat::FP4, out); }), "out.codes");
  EXPECT_EQ(argument_of([&] { IndexerQuery::empty(IndexerKeyFormat::FP4, 2, 4, 48); }), "dim");
  EXPECT_EQ(argument_of([&] { IndexerQuery::empty(IndexerKeyFormat::FP8, -1, 4, 128); }), "rows");
  EXPECT_EQ(argument_of([&] { IndexerQuery::empty(IndexerKeyFormat::FP8, 2, 0, 128); }), "heads");
  const auto unknown = static_cast<IndexerKeyFormat>(7);  // an integer cast to the enum
  EXPECT_EQ(argument_of([&] { IndexerQuery::empty(unknown, 2, 4, 128); }), "format");
  EXPECT_EQ(argument_of([&] { call({2, 512}, {2, 32}, unknown, out); }), "format");
}

// The remaining arguments of the query preparation, each alone on valid inputs; the prepared
// queries must keep their poison.
TEST(QueryPrepRef, ErrorsWriteNothing) {
  std::mt19937_64 rng(testing::fresh_seed());
  const int rows = 2, heads = 4, dim = 128;
  std::vector<float> q = testing::random_normal(rng, rows * heads * dim), logits = testing::random_normal(rng, rows * heads);
  std::vector<float> cs = testing::random_floats(rng, rows * 32);
  IndexerQuery out = IndexerQuery::empty(IndexerKeyFormat::FP8, rows, heads, dim);
  for (Tensor* t : {&out.codes, &out.scales, &out.weights}) t->fill_bytes(0xA5);
  const auto bytes = [&] {
    std::vector<std::uint8_t> all;
    for (const Tensor* t : {&out.codes, &out.scales, &out.weights})
      all.insert(all.end(), t->data_as<std::uint8_t>(), t->data_as<std::uint8_t>() + t->nbytes());
    return all;
  };
  const auto poisoned = bytes();
  const TensorView q_view = testing::host_view(q, DType::F32, {rows, heads * dim});
  const TensorView logits_view = testing::host_view(logits, DType::F32, {rows, heads});
  const TensorView cos_view = testing::host_view(cs, DType::F32, {rows, 32});
  const auto call = [&](TensorView qv, TensorView lv, TensorView cv, IndexerQueryView o) {
    return [=] { prepare_indexer_queries(qv, lv, cv, cv, IndexerKeyFormat::FP8, o); };
  };
  TensorView bad = logits_view;
  bad.shape = {rows + 1, heads};
  testing::expect_error("head_logits", call(q_view, bad, cos_view, out.view()));
  bad.shape = {rows, 0};
  testing::expect_error("head_logits", call(q_view, bad, cos_view, out.view()));
  bad = q_view;
  bad.device = Device::CUDA;  // the other tensors are on the host
  testing::expect_error("head_logits", call(bad, logits_view, cos_view, out.view()));
  bad = q_view;
  bad.dtype = DType::BF16;
  testing::expect_error("q_rows", call(bad, logits_view, cos_view, out.view()));
  bad = cos_view;
  bad.shape = {rows, 65};  // r = 130 > d_I
  testing::expect_error("rope_cos", call(q_view, logits_view, bad, out.view()));
  IndexerQueryView o = out.view();
  o.scales.shape = {rows, heads, 1};
  testing::expect_error("out.scales", call(q_view, logits_view, cos_view, o));
  o = out.view();
  o.weights.dtype = DType::BF16;
  testing::expect_error("out.weights", call(q_view, logits_view, cos_view, o));
  // Outputs over the inputs (weights over the logits: in place) or over each other.
  std::vector<float> logits_copy = logits;
  o = out.view();
  o.weights.data = logits_copy.data();
  const TensorView logits_copy_view = testing::host_view(logits_copy, DType::F32, {rows, heads});
  testing::expect_error("out.weights", call(q_view, logits_copy_view, cos_view, o));
  EXPECT_EQ(logits_copy, logits);
  o = out.view();
  o.scales.data = o.codes.data;
  testing::expect_error("out.codes", call(q_view, logits_view, cos_view, o));
  EXPECT_EQ(bytes(), poisoned);
  call(q_view, logits_view, cos_view, out.view())();
  EXPECT_NE(bytes(), poisoned);
}

}  // namespace
}  // namespace dsv4
