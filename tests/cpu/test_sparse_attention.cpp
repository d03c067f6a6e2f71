// Sparse attention with sink, CPU reference (SPEC §8 steps 4–6): against an independent naive
// formula (softmax over the scores with the sink appended, entries decoded byte by byte), sink
// limits, empty and window-only rows, the fused inverse RoPE, and every argument check.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "dsv4/cache_format.hpp"
#include "dsv4/entry_codec.hpp"
#include "dsv4/formats.hpp"
#include "dsv4/sparse_attention.hpp"
#include "testing/attention_pool.hpp"
#include "testing/testing.hpp"

namespace dsv4 {
namespace {

using F = AttentionEntryFormat;
constexpr float kInf = std::numeric_limits<float>::infinity();

// A pool of random entries that can also read its values back without the entry codec.
struct Pool : testing::RandomAttentionPool {
  Pool(std::mt19937_64& rng, int per_page_, int num_pages_) : RandomAttentionPool(rng, per_page_, num_pages_, 5) {}
  AttentionPoolView view() const { return host_view(); }
  // Decodes value k of a slot straight from the bytes, without the entry codec.
  double value(int slot, int k) const {
    const std::uint8_t* page = bytes.data() + (slot / per_page) * F::page_bytes(per_page);
    const int i = slot % per_page;
    if (k < F::kNopeDim) {
      const int scale_byte = page[per_page * 576 + i * 8 + k / 64];
      return float_from_e4m3(page[i * 576 + k]) * std::ldexp(1.0, scale_byte - 127);
    }
    const int r = k - F::kNopeDim;
    return float_from_bf16_bits(static_cast<std::uint16_t>(page[i * 576 + 448 + 2 * r] | (page[i * 576 + 449 + 2 * r] << 8)));
  }
};

// One call's inputs and outputs, host memory.
struct Problem {
  int rows, heads, window_width, compressed_width;
  Pool window, compressed;
  std::vector<std::uint16_t> q;
  std::vector<std::int32_t> window_slots, compressed_slots;
  std::vector<float> sink;
  std::vector<std::uint16_t> out;
  std::vector<float> lse;

  Problem(std::mt19937_64& rng, int rows_, int heads_, int w, int k, double none_fraction = 0.2)
      : rows(rows_), heads(heads_), window_width(w), compressed_width(k), window(rng, 8, 6), compressed(rng, 4, 7) {
    for (float x : testing::random_normal(rng, static_cast<std::size_t>(rows) * heads * F::kDim, 3.0f))
      q.push_back(bf16_bits_from_float(x));
    std::bernoulli_distribution none(none_fraction);
    const auto draw = [&](const Pool& pool, int width, std::vector<std::int32_t>& slots) {
      std::uniform_int_distribution<int> slot(0, static_cast<int>(pool.slots()) - 1);
      for (int i = 0; i < rows * width; ++i) slots.push_back(none(rng) ? -1 : slot(rng));
    };
    draw(window, w, window_slots);
    draw(compressed, k, compressed_slots);
    sink = testing::random_floats(rng, static_cast<std::size_t>(heads), -2.0f, 2.0f);
    out.assign(static_cast<std::size_t>(rows) * heads * F::kDim, 0xFFFF);  // poison: bf16 NaN
    lse.assign(static_cast<std::size_t>(rows) * heads, std::numeric_limits<float>::quiet_NaN());
  }

  TensorView q_view() { return {q.data(), DType::BF16, {rows, heads, F::kDim}}; }
  TensorView window_slots_view() { return {window_slots.data(), DType::I32, {rows, window_width}}; }
  TensorView compressed_slots_view() { return {compressed_slots.data(), DType::I32, {rows, compressed_width}}; }
  TensorView sink_view() { return {sink.data(), DType::F32, {heads}}; }
  TensorView out_view() { return {out.data(), DType::BF16, {rows, heads, F::kDim}}; }
  TensorView lse_view() { return {lse.data(), DType::F32, {rows, heads}}; }

  void run(const SparseAttentionOptions& options = {}) {
    sparse_attention(q_view(), window.view(), compressed.view(), window_slots_view(), compressed_slots_view(),
                     sink_view(), out_view(), lse_view(), options);
  }

  // The naive formula for (row, head): weights = softmax over [z_1..z_n, sink] (the sink's weight
  // dropped; no sink term at all when `with_sink` is false), o = Σ weight_i e_i, and the magnitude
  // Σ weight_i |e_i| the float32 sums round against. Long double.
  void naive(int row, int head, bool with_sink, std::vector<double>& o, std::vector<double>& magnitude,
             double& lse_out) const {
    std::vector<std::pair<const Pool*, int>> candidates;
    for (int j = 0; j < window_width; ++j)
      if (int s = window_slots[row * window_width + j]; s >= 0) candidates.push_back({&window, s});
    for (int j = 0; j < compressed_width; ++j)
      if (int s = compressed_slots[row * compressed_width + j]; s >= 0) candidates.push_back({&compressed, s});
    std::vector<long double> logits;
    for (auto [pool, slot] : candidates) {
      long double dot = 0;
      for (int k = 0; k < F::kDim; ++k)
        dot += static_cast<long double>(float_from_bf16_bits(q[(static_cast<std::size_t>(row) * heads + head) * F::kDim + k])) *
               pool->value(slot, k);
      logits.push_back(dot / std::sqrt(512.0L));
    }
    if (with_sink) logits.push_back(sink[head]);
    long double top = -INFINITY;
    for (auto z : logits) top = std::max(top, z);
    long double total = 0;
    for (auto z : logits) total += std::exp(z - top);
    o.assign(F::kDim, 0.0);
    magnitude.assign(F::kDim, 0.0);
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      const long double weight = std::exp(logits[i] - top) / total;
      for (int k = 0; k < F::kDim; ++k) {
        const long double value = candidates[i].first->value(candidates[i].second, k);
        o[k] += static_cast<double>(weight * value);
        magnitude[k] += static_cast<double>(weight * std::fabs(value));
      }
    }
    lse_out = logits.empty() ? -INFINITY : static_cast<double>(top + std::log(total));
  }

  float out_at(int row, int head, int k) const {
    return float_from_bf16_bits(out[(static_cast<std::size_t>(row) * heads + head) * F::kDim + k]);
  }
};

// |bf16 result − exact| within one bf16 ulp (2^-8 relative) plus the float32 rounding of the weighted
// sum, which is relative to Σ weight·|value|, not to a small result of cancellation (seed
// 6688694057630465901: −2.2054e-6 against −2.1948e-6 with magnitude ≈ 1).
void expect_matches_naive(const Problem& p, bool with_sink) {
  std::vector<double> o, magnitude;
  double lse = 0;
  for (int r = 0; r < p.rows; ++r) {
    for (int h = 0; h < p.heads; ++h) {
      p.naive(r, h, with_sink, o, magnitude, lse);
      for (int k = 0; k < F::kDim; ++k)
        ASSERT_NEAR(p.out_at(r, h, k), o[k], std::fabs(o[k]) * 0.00391 + 1e-6 * magnitude[k] + 1e-30)
            << "row " << r << " head " << h << " dim " << k;
      if (std::isinf(lse)) {
        EXPECT_EQ(p.lse[r * p.heads + h], -kInf);
      } else {
        EXPECT_NEAR(p.lse[r * p.heads + h], lse, 1e-5 * std::max(1.0, std::fabs(lse)));
      }
    }
  }
}

TEST(SparseAttentionReference, MatchesNaiveFormula) {
  std::mt19937_64 rng(testing::fresh_seed());
  Problem p(rng, 5, 3, 7, 11);
  p.window_slots[0] = p.window_slots[1] = 0;  // slot 0 (the null entry) is read like any other, twice here
  p.run();
  expect_matches_naive(p, true);
}

TEST(SparseAttentionReference, SinkMinusInfinityIsPlainSoftmax) {
  std::mt19937_64 rng(testing::fresh_seed());
  Problem p(rng, 3, 2, 6, 9);
  for (float& s : p.sink) s = -kInf;
  p.run();
  expect_matches_naive(p, false);
}

TEST(SparseAttentionReference, HugeSinkGivesZeroOutput) {
  std::mt19937_64 rng(testing::fresh_seed());
  Problem p(rng, 2, 4, 5, 5, 0.0);
  for (float& s : p.sink) s = 1e4f;
  p.run();
  for (std::uint16_t bits : p.out) EXPECT_EQ(float_from_bf16_bits(bits), 0.0f);
  for (float l : p.lse) EXPECT_NEAR(l, 1e4f, 1e-2f);
}

TEST(SparseAttentionReference, RowsWithoutCandidates) {
  std::mt19937_64 rng(testing::fresh_seed());
  Problem p(rng, 3, 2, 4, 4, 1.0);  // every slot −1
  p.sink[1] = -kInf;
  p.run();
  for (std::uint16_t bits : p.out) EXPECT_EQ(float_from_bf16_bits(bits), 0.0f);
  for (int r = 0; r < 3; ++r) {
    EXPECT_FLOAT_EQ(p.lse[r * 2], p.sink[0]);  // log(exp(sink))
    EXPECT_EQ(p.lse[r * 2 + 1], -kInf);        // neither candidates nor sink
  }
}

TEST(SparseAttentionReference, WindowOnlyAndCompressedOnly) {
  std::mt19937_64 rng(testing::fresh_seed());
  Problem window_only(rng, 3, 2, 9, 0);
  window_only.run();
  expect_matches_naive(window_only, true);
  Problem compressed_only(rng, 3, 2, 0, 9);
  compressed_only.run();
  expect_matches_naive(compressed_only, true);
}

TEST(SparseAttentionReference, FusedInverseRopeRotatesTheBf16Output) {
  std::mt19937_64 rng(testing::fresh_seed());
  Problem p(rng, 3, 2, 6, 6);
  p.run();
  const std::vector<std::uint16_t> plain = p.out;
  std::vector<float> cos_table, sin_table;
  for (float angle : testing::random_floats(rng, 3 * 32, -3.0f, 3.0f)) {
    cos_table.push_back(std::cos(angle));
    sin_table.push_back(std::sin(angle));
  }
  SparseAttentionOptions options;
  options.rope_cos = TensorView{cos_table.data(), DType::F32, {3, 32}};
  options.rope_sin = TensorView{sin_table.data(), DType::F32, {3, 32}};
  p.run(options);
  for (int r = 0; r < 3; ++r) {
    for (int h = 0; h < 2; ++h) {
      const std::size_t base = (static_cast<std::size_t>(r) * 2 + h) * F::kDim;
      for (int k = 0; k < F::kNopeDim; ++k) EXPECT_EQ(p.out[base + k], plain[base + k]);
      for (int i = 0; i < 32; ++i) {
        const double a = float_from_bf16_bits(plain[base + 448 + 2 * i]), b = float_from_bf16_bits(plain[base + 449 + 2 * i]);
        const double c = cos_table[r * 32 + i], s = sin_table[r * 32 + i];
        EXPECT_EQ(p.out[base + 448 + 2 * i], bf16_bits_from_float(static_cast<float>(a * c + b * s)));
        EXPECT_EQ(p.out[base + 449 + 2 * i], bf16_bits_from_float(static_cast<float>(b * c - a * s)));
      }
    }
  }
}

TEST(SparseAttentionReference, SoftmaxScaleOption) {
  std::mt19937_64 rng(testing::fresh_seed());
  Problem p(rng, 2, 2, 5, 5);
  // Doubling the scale equals doubling q (exact in bf16).
  SparseAttentionOptions options;
  options.softmax_scale = 2.0f / std::sqrt(512.0f);
  p.run(options);
  const auto doubled_scale = p.out;
  for (auto& bits : p.q) bits = bf16_bits_from_float(2.0f * float_from_bf16_bits(bits));
  p.run();
  EXPECT_EQ(p.out, doubled_scale);
}

// Every check throws Error naming the argument and writes nothing.
TEST(SparseAttentionReference, ArgumentErrorsNameTheArgumentAndWriteNothing) {
  std::mt19937_64 rng(testing::fresh_seed());
  Problem p(rng, 2, 2, 3, 4);
  const auto poisoned_out = p.out;
  const auto expect_error = [&](const std::string& argument, auto&& call) {
    p.out = poisoned_out;
    try {
      call();
      ADD_FAILURE() << "no error for " << argument;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), argument) << e.what();
    }
    EXPECT_EQ(p.out, poisoned_out) << argument;
    for (float l : p.lse) EXPECT_TRUE(std::isnan(l)) << argument;
  };
  const auto call_with = [&](TensorView q, AttentionPoolView w, AttentionPoolView c, TensorView ws, TensorView cs,
                             TensorView sink, TensorView out, TensorView lse, SparseAttentionOptions o = {}) {
    return [=] { sparse_attention(q, w, c, ws, cs, sink, out, lse, o); };
  };
  const auto q = p.q_view();
  const auto w = p.window.view(), c = p.compressed.view();
  const auto ws = p.window_slots_view(), cs = p.compressed_slots_view();
  const auto sink = p.sink_view(), out = p.out_view(), lse = p.lse_view();

  TensorView q_f32 = q; q_f32.dtype = DType::F32;
  expect_error("q", call_with(q_f32, w, c, ws, cs, sink, out, lse));
  TensorView q_width = q; q_width.shape = {2, 4, 256};
  expect_error("q", call_with(q_width, w, c, ws, cs, sink, out, lse));
  AttentionPoolView w_bad_page = w; w_bad_page.entries_per_page = 9;
  expect_error("window_cache", call_with(q, w_bad_page, c, ws, cs, sink, out, lse));
  AttentionPoolView c_zero = c; c_zero.entries_per_page = 0;
  expect_error("compressed_cache", call_with(q, w, c_zero, ws, cs, sink, out, lse));
  TensorView ws_rows = ws; ws_rows.shape = {3, 1};
  expect_error("window_slots", call_with(q, w, c, ws_rows, cs, sink, out, lse));
  TensorView cs_i64 = cs; cs_i64.dtype = DType::I64;
  expect_error("compressed_slots", call_with(q, w, c, ws, cs_i64, sink, out, lse));
  TensorView sink_short = sink; sink_short.shape = {1};
  expect_error("attn_sink", call_with(q, w, c, ws, cs, sink_short, out, lse));
  TensorView out_f32 = out; out_f32.dtype = DType::F32;
  expect_error("out", call_with(q, w, c, ws, cs, sink, out_f32, lse));
  TensorView lse_shape = lse; lse_shape.shape = {2, 3};
  expect_error("lse", call_with(q, w, c, ws, cs, sink, out, lse_shape));
  TensorView on_gpu = ws; on_gpu.device = Device::CUDA;
  expect_error("window_slots", call_with(q, w, c, on_gpu, cs, sink, out, lse));
  // Outputs sharing bytes with what the call reads (in-place attention over q), or with each other.
  {
    const std::vector<std::uint16_t> q_before(q.as<const std::uint16_t>(), q.as<const std::uint16_t>() + q.numel());
    TensorView out_on_q = out; out_on_q.data = q.data;
    expect_error("out", call_with(q, w, c, ws, cs, sink, out_on_q, lse));
    EXPECT_TRUE(std::equal(q_before.begin(), q_before.end(), q.as<const std::uint16_t>())) << "q written on error";
  }
  TensorView lse_on_q = lse; lse_on_q.data = q.data;  // inside q's bytes
  expect_error("lse", call_with(q, w, c, ws, cs, sink, out, lse_on_q));
  TensorView workspace_wrong{out.data, DType::F32, {4}};
  SparseAttentionOptions bad_workspace;
  bad_workspace.workspace = workspace_wrong;  // checked (U8) before its overlap with out is
  expect_error("workspace", call_with(q, w, c, ws, cs, sink, out, lse, bad_workspace));
  TensorView lse_in_out = lse; lse_in_out.data = out.data;
  expect_error("out", call_with(q, w, c, ws, cs, sink, out, lse_in_out));
  SparseAttentionOptions workspace_on_out;
  workspace_on_out.workspace = TensorView{out.data, DType::U8, {16}};
  expect_error("out", call_with(q, w, c, ws, cs, sink, out, lse, workspace_on_out));

  SparseAttentionOptions bad_scale; bad_scale.softmax_scale = 0.0f;
  expect_error("options", call_with(q, w, c, ws, cs, sink, out, lse, bad_scale));
  std::vector<float> table(64, 0.5f);
  SparseAttentionOptions cos_only; cos_only.rope_cos = TensorView{table.data(), DType::F32, {2, 32}};
  expect_error("options", call_with(q, w, c, ws, cs, sink, out, lse, cos_only));
  SparseAttentionOptions short_table = cos_only; short_table.rope_sin = TensorView{table.data(), DType::F32, {2, 16}};
  expect_error("rope_sin", call_with(q, w, c, ws, cs, sink, out, lse, short_table));
  for (const int bad : {96, 0, -64, kMaxSplitCandidates + 64}) {
    SparseAttentionOptions bad_split;
    bad_split.split_candidates = bad;
    expect_error("options", call_with(q, w, c, ws, cs, sink, out, lse, bad_split));
  }
  for (const int bad_parts : {-1, 3, 8}) {
    SparseAttentionOptions bad_output_parts;
    bad_output_parts.output_parts = bad_parts;
    expect_error("options", call_with(q, w, c, ws, cs, sink, out, lse, bad_output_parts));
  }

  // Slot contents (adversarial indices) and sink contents.
  for (std::int32_t bad : {-2, static_cast<std::int32_t>(p.window.slots()), std::numeric_limits<std::int32_t>::max(),
                           std::numeric_limits<std::int32_t>::min()}) {
    const std::int32_t saved = p.window_slots[3];
    p.window_slots[3] = bad;
    expect_error("window_slots", call_with(q, w, c, ws, cs, sink, out, lse));
    p.window_slots[3] = saved;
  }
  const std::int32_t saved = p.compressed_slots[5];
  p.compressed_slots[5] = static_cast<std::int32_t>(p.compressed.slots());
  expect_error("compressed_slots", call_with(q, w, c, ws, cs, sink, out, lse));
  p.compressed_slots[5] = saved;
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), kInf}) {
    p.sink[1] = bad;
    expect_error("attn_sink", call_with(q, w, c, ws, cs, sink, out, lse));
  }
  // The largest split is accepted (last: a successful call writes the outputs).
  p.sink[1] = 0.5f;
  SparseAttentionOptions largest_split;
  largest_split.split_candidates = kMaxSplitCandidates;
  EXPECT_NO_THROW(call_with(q, w, c, ws, cs, sink, out, lse, largest_split)());
}

TEST(SparseAttentionReference, WorkspaceSize) {
  EXPECT_EQ(sparse_attention_workspace_bytes(4, 64, 512, 512), 0u);  // one chunk: no scratch
  testing::expect_error("split_candidates", [] { sparse_attention_workspace_bytes(4, 64, 640, 100); });
  testing::expect_error("split_candidates", [] { sparse_attention_workspace_bytes(4, 64, 640, kMaxSplitCandidates + 64); });
  testing::expect_error("num_rows", [] { sparse_attention_workspace_bytes(-1, 64, 640); });
  testing::expect_error("num_heads", [] { sparse_attention_workspace_bytes(4, -64, 640); });
  testing::expect_error("num_candidates", [] { sparse_attention_workspace_bytes(4, 64, -640); });
  EXPECT_EQ(sparse_attention_workspace_bytes(4, 64, kDefaultSplitCandidates), 0u);  // the default: one chunk
  if (cuda_backend_built()) {
    EXPECT_GT(sparse_attention_workspace_bytes(4, 64, kDefaultSplitCandidates + 1), 0u);
  }
  if (cuda_backend_built()) {
    // Two chunks of 512 candidates: O (512 floats) and (max, sum) per row, chunk and head, plus counters.
    EXPECT_GE(sparse_attention_workspace_bytes(4, 64, 640, 512), 4u * 2 * 64 * (512 + 2) * 4 + 4 * 4 * 4);
  }
}

}  // namespace
}  // namespace dsv4
