// The whole attention layer (SPEC §7–§8, §10) on the tiny preset (D 256, H 8, W 16, K 16, ratios
// 0 / 4 / 128): chunk and batch invariance, window edges, HCA visibility, the CSA selection around
// V_t = K and under ties, sink limits, rollback, and errors that leave the state untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>

#include "dsv4/compressor.hpp"
#include "dsv4/formats.hpp"
#include "dsv4/layer.hpp"
#include "testing/testing.hpp"

namespace dsv4 {
namespace {

constexpr int kSwa = 0, kCsa = 1, kHca = 2;  // the tiny preset's layers 0, 1, 2

const ModelConfig& tiny() {
  static const ModelConfig model = preset_config("tiny");
  return model;
}

LayerWeights tiny_weights(int layer, std::uint64_t seed) {
  const auto image = random_layer_checkpoint(tiny(), layer, seed).to_bytes();
  return load_layer_weights(SafetensorsFile::from_bytes(image), tiny(), layer);
}

// Inputs like a normalized residual stream: N(0, 1) rows [T, D].
std::vector<float> random_rows(std::mt19937_64& rng, std::int64_t rows) {
  return testing::random_normal(rng, static_cast<std::size_t>(rows * tiny().hidden_size));
}

struct Outputs {
  std::vector<float> y, attn;
  std::vector<std::int32_t> topk;
};

TensorView f32(std::vector<float>& v, Shape shape) { return TensorView{v.data(), DType::F32, std::move(shape), Device::CPU}; }

// Feeds rows [0, Σ chunks) of x to `request` chunk by chunk; outputs poisoned first.
Outputs run_chunks(AttentionLayer& layer, int request, const std::vector<float>& x, const std::vector<std::int64_t>& chunks) {
  const ModelConfig& m = layer.model();
  const std::int64_t T = std::accumulate(chunks.begin(), chunks.end(), std::int64_t{0});
  const bool csa = layer_has_indexer(layer.layer());
  Outputs out;
  out.y.assign(static_cast<std::size_t>(T * m.hidden_size), NAN);
  out.attn.assign(static_cast<std::size_t>(T * m.num_heads * m.head_dim), NAN);
  out.topk.assign(csa ? static_cast<std::size_t>(T * m.index_topk) : 0, -7);
  std::int64_t at = 0;
  for (const std::int64_t n : chunks) {
    std::vector<float> xs(x.begin() + at * m.hidden_size, x.begin() + (at + n) * m.hidden_size);
    LayerOutputs o(TensorView{out.y.data() + at * m.hidden_size, DType::F32, {n, m.hidden_size}, Device::CPU},
                   TensorView{out.attn.data() + at * m.num_heads * m.head_dim, DType::F32,
                              {n, m.num_heads, m.head_dim}, Device::CPU});
    if (csa) o.topk = TensorView{out.topk.data() + at * m.index_topk, DType::I32, {n, m.index_topk}, Device::CPU};
    layer.forward(request, f32(xs, {n, m.hidden_size}), o);
    at += n;
  }
  return out;
}

Outputs run_once(const LayerWeights& weights, const std::vector<float>& x, const std::vector<std::int64_t>& chunks,
                 LayerOptions options = {}) {
  AttentionLayer layer(tiny(), weights, options);
  return run_chunks(layer, layer.open_request(), x, chunks);
}

// Random chunk sizes summing to T, with runs of single-token steps.
std::vector<std::int64_t> random_chunks(std::mt19937_64& rng, std::int64_t T) {
  std::vector<std::int64_t> chunks;
  std::uniform_int_distribution<int> kind(0, 3), big(2, 70);
  for (std::int64_t left = T; left > 0;) {
    const std::int64_t n = std::min<std::int64_t>(left, kind(rng) == 0 ? big(rng) : 1 + kind(rng) % 3);
    chunks.push_back(n);
    left -= n;
  }
  return chunks;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Row t of a [T, width] vector.
std::vector<float> row(const std::vector<float>& v, std::int64_t t, std::int64_t width) {
  return {v.begin() + t * width, v.begin() + (t + 1) * width};
}

// ---- chunk and batch invariance --------------------------------------------------------------

class LayerKinds : public ::testing::TestWithParam<int> {};

TEST_P(LayerKinds, BitIdenticalForAnyChunking) {
  const int layer = GetParam();
  std::mt19937_64 rng(testing::fresh_seed());
  const LayerWeights w = tiny_weights(layer, rng());
  const std::int64_t T = 300;  // past two HCA blocks and 4·K for CSA
  const std::vector<float> x = random_rows(rng, T);
  const Outputs whole = run_once(w, x, {T});
  for (float v : whole.y) ASSERT_TRUE(std::isfinite(v));
  for (float v : whole.attn) ASSERT_TRUE(std::isfinite(v));
  for (auto chunks : {std::vector<std::int64_t>(static_cast<std::size_t>(T), 1), random_chunks(rng, T)}) {
    LayerOptions options;
    options.window_step = 5;  // many window sub-steps inside the large chunks
    options.threads = 2;
    const Outputs parts = run_once(w, x, chunks, options);
    EXPECT_TRUE(same_bits(parts.y, whole.y));
    EXPECT_TRUE(same_bits(parts.attn, whole.attn));
    EXPECT_EQ(parts.topk, whole.topk);
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, LayerKinds, ::testing::Values(kSwa, kCsa, kHca));

TEST(Layer, Fp4IndexerKeysAreChunkInvariantToo) {
  std::mt19937_64 rng(testing::fresh_seed());
  const LayerWeights w = tiny_weights(kCsa, rng());
  const std::vector<float> x = random_rows(rng, 120);
  LayerOptions options;
  options.indexer_format = IndexerKeyFormat::FP4;
  const Outputs whole = run_once(w, x, {120}, options);
  const Outputs parts = run_once(w, x, random_chunks(rng, 120), options);
  EXPECT_TRUE(same_bits(parts.y, whole.y));
  EXPECT_EQ(parts.topk, whole.topk);
  AttentionLayer layer(tiny(), w, options);
  const int r = layer.open_request();
  run_chunks(layer, r, x, {120});
  EXPECT_EQ(layer.usage(r).indexer_bytes, 30 * 68);
}

TEST(Layer, BatchedRequestsEqualSeparateRuns) {
  std::mt19937_64 rng(testing::fresh_seed());
  for (int kind : {kCsa, kHca}) {
    const LayerWeights w = tiny_weights(kind, rng());
    const std::int64_t lengths[3] = {150, 7, 133};
    std::vector<std::vector<float>> xs;
    std::vector<Outputs> alone;
    for (auto n : lengths) {
      xs.push_back(random_rows(rng, n));
      alone.push_back(run_once(w, xs.back(), {n}));
    }
    // Mixed steps: every request brings a different number of rows (0 included) each step.
    LayerOptions options;
    options.max_requests = 3;
    options.max_tokens = 160;
    AttentionLayer layer(tiny(), w, options);
    std::vector<int> ids = {layer.open_request(), layer.open_request(), layer.open_request()};
    const int D = tiny().hidden_size, HD = tiny().num_heads * tiny().head_dim, K = tiny().index_topk;
    std::vector<Outputs> batched(3);
    for (int i = 0; i < 3; ++i) {
      batched[i].y.assign(static_cast<std::size_t>(lengths[i] * D), NAN);
      batched[i].attn.assign(static_cast<std::size_t>(lengths[i] * HD), NAN);
      batched[i].topk.assign(static_cast<std::size_t>(lengths[i] * K), -7);
    }
    std::int64_t done[3] = {0, 0, 0};
    std::uniform_int_distribution<int> step(0, 40);
    while (done[0] < lengths[0] || done[1] < lengths[1] || done[2] < lengths[2]) {
      std::vector<LayerStepRequest> batch;
      std::vector<float> x;
      for (int i : {2, 0, 1}) {  // not in request order
        const std::int64_t n = std::min<std::int64_t>(lengths[i] - done[i], step(rng) % 3 == 0 ? 1 : step(rng));
        batch.push_back({ids[i], n});
        x.insert(x.end(), xs[i].begin() + done[i] * D, xs[i].begin() + (done[i] + n) * D);
      }
      const std::int64_t T = static_cast<std::int64_t>(x.size()) / D;
      std::vector<float> y(static_cast<std::size_t>(T * D)), attn(static_cast<std::size_t>(T * HD));
      std::vector<std::int32_t> topk(static_cast<std::size_t>(T * K));
      const bool csa = kind == kCsa;
      layer.forward(batch, f32(x, {T, D}),
                    {f32(y, {T, D}), f32(attn, {T, tiny().num_heads, tiny().head_dim}),
                     csa ? TensorView{topk.data(), DType::I32, {T, K}, Device::CPU} : TensorView{}});
      std::int64_t at = 0;
      for (const auto& b : batch) {
        const int i = static_cast<int>(std::find(ids.begin(), ids.end(), b.request) - ids.begin());
        std::copy_n(y.begin() + at * D, b.new_tokens * D, batched[i].y.begin() + done[i] * D);
        std::copy_n(attn.begin() + at * HD, b.new_tokens * HD, batched[i].attn.begin() + done[i] * HD);
        if (csa) std::copy_n(topk.begin() + at * K, b.new_tokens * K, batched[i].topk.begin() + done[i] * K);
        done[i] += b.new_tokens;
        at += b.new_tokens;
      }
    }
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(same_bits(batched[i].y, alone[i].y)) << "kind " << kind << " request " << i;
      EXPECT_TRUE(same_bits(batched[i].attn, alone[i].attn)) << "kind " << kind << " request " << i;
      if (kind == kCsa) {
        EXPECT_EQ(batched[i].topk, alone[i].topk) << "request " << i;
      }
    }
  }
}

TEST(Layer, Bf16InputEqualsTheSameValuesInFloat32) {
  std::mt19937_64 rng(testing::fresh_seed());
  const LayerWeights w = tiny_weights(kHca, rng());
  std::vector<float> x = random_rows(rng, 40);
  std::vector<std::uint16_t> bits(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    bits[i] = bf16_bits_from_float(x[i]);
    x[i] = float_from_bf16_bits(bits[i]);
  }
  const Outputs from_f32 = run_once(w, x, {40});
  AttentionLayer layer(tiny(), w);
  std::vector<float> y(from_f32.y.size(), NAN);
  layer.forward(layer.open_request(), TensorView{bits.data(), DType::BF16, {40, tiny().hidden_size}, Device::CPU},
                {f32(y, {40, tiny().hidden_size})});
  EXPECT_TRUE(same_bits(y, from_f32.y));
}

// ---- what a query sees -------------------------------------------------------------------------

// Outputs of rows [0, T) when token `changed` of x gets a different value.
Outputs run_with_token_changed(const LayerWeights& w, std::vector<float> x, std::int64_t changed, std::mt19937_64& rng) {
  const int D = tiny().hidden_size;
  const auto fresh = testing::random_normal(rng, static_cast<std::size_t>(D));
  std::copy(fresh.begin(), fresh.end(), x.begin() + changed * D);
  return run_once(w, x, {static_cast<std::int64_t>(x.size()) / D});
}

TEST(Layer, WindowCoversExactlyTheLastWTokens) {
  std::mt19937_64 rng(testing::fresh_seed());
  const LayerWeights w = tiny_weights(kSwa, rng());
  const int W = tiny().window, D = tiny().hidden_size;
  const std::int64_t T = 3 * W + 5, changed = W + 3;
  const std::vector<float> x = random_rows(rng, T);
  const Outputs base = run_once(w, x, {T});
  const Outputs other = run_with_token_changed(w, x, changed, rng);
  for (std::int64_t t = 0; t < T; ++t) {
    const bool sees = t >= changed && t <= changed + W - 1;  // window max(0, t−W+1)..t
    EXPECT_EQ(same_bits(row(base.y, t, D), row(other.y, t, D)), !sees) << "t=" << t;
  }
}

TEST(Layer, HcaEntryZeroIsVisibleFromToken127) {
  std::mt19937_64 rng(testing::fresh_seed());
  const LayerWeights w = tiny_weights(kHca, rng());
  const int D = tiny().hidden_size;
  ASSERT_EQ(w.layer.ratio, 128);
  const std::int64_t T = 130, changed = 5;  // in block 0, outside every window from t = 21 on
  const std::vector<float> x = random_rows(rng, T);
  const Outputs base = run_once(w, x, {T});
  const Outputs other = run_with_token_changed(w, x, changed, rng);
  EXPECT_TRUE(same_bits(row(base.y, 126, D), row(other.y, 126, D))) << "127 tokens: no entry yet";
  for (std::int64_t t : {127, 128, 129})
    EXPECT_FALSE(same_bits(row(base.y, t, D), row(other.y, t, D))) << "t=" << t << " sees entry 0";

  AttentionLayer layer(tiny(), w);
  const int r = layer.open_request();
  const std::int64_t entries_after[3] = {0, 1, 1};  // after 127, 128, 129 tokens
  run_chunks(layer, r, x, {127});
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(layer.usage(r).compressed_entries, entries_after[i]) << layer.tokens(r) << " tokens";
    EXPECT_EQ(layer.usage(r).compressed_bytes, entries_after[i] * 584);
    if (i < 2) run_chunks(layer, r, std::vector<float>(x.begin() + (127 + i) * D, x.end()), {1});
  }
}

TEST(Layer, CsaSelectsAllVisibleEntriesUpToKThenExactlyK) {
  std::mt19937_64 rng(testing::fresh_seed());
  const LayerWeights w = tiny_weights(kCsa, rng());
  const int K = tiny().index_topk, m = 4;
  const std::int64_t T = m * (K + 3);  // V_t runs up to K + 3
  const Outputs out = run_once(w, random_rows(rng, T), {T});
  std::set<std::int64_t> seen_visible;
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int64_t visible = (t + 1) / m;
    const std::int32_t* sel = out.topk.data() + t * K;
    const std::int64_t count = std::min<std::int64_t>(visible, K);
    for (int k = 0; k < K; ++k) {
      if (k >= count) {
        EXPECT_EQ(sel[k], -1) << "t=" << t;
      } else if (visible <= K) {
        EXPECT_EQ(sel[k], k) << "t=" << t << ": V_t ≤ K takes every entry";
      } else {
        EXPECT_TRUE(sel[k] >= 0 && sel[k] < visible && (k == 0 || sel[k - 1] < sel[k])) << "t=" << t;
      }
    }
    seen_visible.insert(visible);
  }
  for (std::int64_t v : {K - 1, K, K + 1}) EXPECT_TRUE(seen_visible.count(v)) << "V_t = " << v;
}

TEST(Layer, TopkTiesGoToTheLowerEntryNumbers) {
  std::mt19937_64 rng(testing::fresh_seed());
  LayerWeights w = tiny_weights(kCsa, rng());
  // Indexer keys without a RoPE part and a periodic input: every entry n ≥ 1 sees the same rows
  // (blocks n−1 and n are equal), so their keys, and their scores, are bit-identical.
  const int dI = tiny().index_head_dim, r = tiny().rope_dim, D = tiny().hidden_size, K = tiny().index_topk;
  Tensor wkv = Tensor::from_host(DType::F32, w.indexer->compressor.wkv.shape(), w.indexer->compressor.wkv.data());
  for (int branch = 0; branch < 2; ++branch)
    std::fill_n(wkv.data_as<float>() + static_cast<std::int64_t>(branch * dI + dI - r) * D, r * D, 0.0f);
  w.indexer->compressor.wkv = wkv;
  const std::int64_t T = 4 * (K + 6);
  const std::vector<float> block = random_rows(rng, 4);
  std::vector<float> x;
  for (std::int64_t t = 0; t < T; ++t) x.insert(x.end(), block.begin() + (t % 4) * D, block.begin() + (t % 4 + 1) * D);
  const Outputs out = run_once(w, x, {T});
  std::vector<std::int32_t> low(static_cast<std::size_t>(K)), shifted(static_cast<std::size_t>(K));
  std::iota(low.begin(), low.end(), 0);      // entry 0 scores above the tie
  std::iota(shifted.begin(), shifted.end(), 1);  // entry 0 scores below the tie
  for (std::int64_t t = 4 * (K + 1) - 1; t < T; ++t) {
    const std::vector<std::int32_t> sel(out.topk.begin() + t * K, out.topk.begin() + (t + 1) * K);
    EXPECT_TRUE(sel == low || sel == shifted) << "t=" << t << " (V_t = " << (t + 1) / 4 << ")";
  }
}

// ---- the sink ----------------------------------------------------------------------------------

std::vector<float> with_sink(LayerWeights& w, float sink) {
  std::vector<float> values(static_cast<std::size_t>(tiny().num_heads), sink);
  w.attn_sink = Tensor::from_host(DType::F32, {tiny().num_heads}, values.data());
  return values;
}

TEST(Layer, SinkLimits) {
  std::mt19937_64 rng(testing::fresh_seed());
  LayerWeights w = tiny_weights(kSwa, rng());
  const int H = tiny().num_heads, d = tiny().head_dim;
  const std::int64_t T = 40;
  const std::vector<float> x = random_rows(rng, T);

  // Sink → −∞: plain softmax. At t = 0 the only candidate gets weight 1, so every head outputs
  // the same vector (the decoded kv of token 0).
  with_sink(w, -std::numeric_limits<float>::infinity());
  const Outputs plain = run_once(w, x, {T});
  for (int h = 1; h < H; ++h)
    EXPECT_TRUE(std::equal(plain.attn.begin(), plain.attn.begin() + d, plain.attn.begin() + h * d)) << "head " << h;

  // A finite sink s scales each (t, h) output by Z / (Z + e^s) ∈ (0, 1), Z = Σ exp(z_i): the same
  // factor for every dim, smaller for a larger sink.
  double previous_factor[2] = {1.0, 1.0};
  for (float sink : {-1.0f, 1.5f}) {
    with_sink(w, sink);
    const Outputs s = run_once(w, x, {T});
    for (std::int64_t t : {std::int64_t{0}, std::int64_t{7}, T - 1}) {
      for (int h : {0, H - 1}) {
        const float* a = s.attn.data() + (t * H + h) * d;
        const float* b = plain.attn.data() + (t * H + h) * d;
        double ab = 0, bb = 0;
        for (int k = 0; k < d; ++k) ab += static_cast<double>(a[k]) * b[k], bb += static_cast<double>(b[k]) * b[k];
        const double factor = ab / bb;
        EXPECT_GT(factor, 0.0);
        EXPECT_LT(factor, 1.0);
        double err = 0;
        for (int k = 0; k < d; ++k) err += std::pow(a[k] - factor * b[k], 2);
        EXPECT_LE(std::sqrt(err / bb), 0.01 * factor) << "t=" << t << " h=" << h;
        if (t == 0) {
          EXPECT_LT(factor, previous_factor[h == 0 ? 0 : 1]);
          previous_factor[h == 0 ? 0 : 1] = factor;
        }
      }
    }
  }

  // A huge sink takes all the weight: the output is exactly zero.
  with_sink(w, 1e4f);
  const Outputs muted = run_once(w, x, {T});
  EXPECT_TRUE(std::all_of(muted.attn.begin(), muted.attn.end(), [](float v) { return v == 0.0f; }));
  EXPECT_TRUE(std::all_of(muted.y.begin(), muted.y.end(), [](float v) { return v == 0.0f; }));
}

// ---- rollback ------------------------------------------------------------------------------------

TEST(Layer, RollbackContinuesAsIfTheDraftNeverArrived) {
  std::mt19937_64 rng(testing::fresh_seed());
  for (int kind : {kSwa, kCsa, kHca}) {
    const LayerWeights w = tiny_weights(kind, rng());
    const int D = tiny().hidden_size;
    // After 126 tokens, 5 draft tokens (126..130) cross the block boundaries at 128 (both ratios);
    // they are dropped and a different continuation follows.
    const std::int64_t prefix = 126, draft = 5, tail = 12;
    const std::vector<float> x = random_rows(rng, prefix + tail);
    const std::vector<float> draft_x = random_rows(rng, draft);
    const Outputs reference = run_once(w, x, {prefix + tail});

    AttentionLayer layer(tiny(), w);
    const int r = layer.open_request();
    run_chunks(layer, r, x, {prefix});
    run_chunks(layer, r, draft_x, {2, 1, 2});
    layer.rollback(r, draft);
    EXPECT_EQ(layer.tokens(r), prefix);
    const Outputs after = run_chunks(layer, r, std::vector<float>(x.begin() + prefix * D, x.end()), {1, 3, 8});
    EXPECT_TRUE(same_bits(after.y, std::vector<float>(reference.y.begin() + prefix * D, reference.y.end())))
        << "layer kind " << kind;
  }
}

TEST(Layer, RollbackBeyondItsLimitIsRefused) {
  std::mt19937_64 rng(testing::fresh_seed());
  const LayerWeights w = tiny_weights(kCsa, rng());
  LayerOptions options;
  options.max_rollback = 3;
  AttentionLayer layer(tiny(), w, options);
  const int r = layer.open_request();
  run_chunks(layer, r, random_rows(rng, 20), {20});
  const LayerRequestUsage before = layer.usage(r);
  testing::expect_error("n", [&] { layer.rollback(r, 4); });
  testing::expect_error("n", [&] { layer.rollback(r, -1); });
  testing::expect_error("request", [&] { layer.rollback(r + 1, 1); });  // not open
  EXPECT_EQ(layer.tokens(r), 20);
  EXPECT_EQ(layer.usage(r).compressed_entries, before.compressed_entries);
  EXPECT_EQ(layer.usage(r).indexer_entries, before.indexer_entries);
  layer.rollback(r, 3);
  EXPECT_EQ(layer.tokens(r), 17);
  testing::expect_error("n", [&] { layer.rollback(r, 1); });  // already 3 below the most tokens reached
  EXPECT_EQ(layer.tokens(r), 17);
}

// ---- errors --------------------------------------------------------------------------------------

using testing::expect_error;

TEST(Layer, InvalidStepsAreRefusedAndLeaveTheStateUntouched) {
  std::mt19937_64 rng(testing::fresh_seed());
  const LayerWeights w = tiny_weights(kCsa, rng());
  const int D = tiny().hidden_size, H = tiny().num_heads, d = tiny().head_dim, K = tiny().index_topk;
  const std::int64_t T = 90;
  const std::vector<float> x = random_rows(rng, T);
  const Outputs reference = run_once(w, x, {T});

  LayerOptions options;
  options.max_tokens = T;
  options.max_requests = 2;
  AttentionLayer layer(tiny(), w, options);
  const int r = layer.open_request();
  const Outputs first = run_chunks(layer, r, x, {50});
  std::vector<float> xs(x.begin() + 50 * D, x.begin() + 60 * D), y(10 * D), attn(10 * H * d), bad(10 * (D + 1));
  std::vector<std::int32_t> topk(10 * K), ints(10 * D);
  const TensorView xv = f32(xs, {10, D}), yv = f32(y, {10, D});

  expect_error("x", [&] { layer.forward(r, f32(bad, {10, D + 1}), {yv}); });
  expect_error("x", [&] { layer.forward(r, TensorView{ints.data(), DType::I32, {10, D}, Device::CPU}, {yv}); });
  expect_error("y", [&] { layer.forward(r, xv, {f32(bad, {10, D + 1})}); });
  expect_error("attn", [&] { layer.forward(r, xv, {yv, f32(attn, {10, H, d - 1})}); });
  expect_error("topk",
               [&] { layer.forward(r, xv, {yv, {}, TensorView{topk.data(), DType::I32, {9, K}, Device::CPU}}); });
  expect_error("x", [&] { layer.forward(r, TensorView{xs.data(), DType::F32, {10, D}, Device::CUDA}, {yv}); });
  expect_error("batch[0]", [&] { layer.forward(r + 1, xv, {yv}); });
  const LayerStepRequest twice[2] = {{r, 5}, {r, 5}};
  expect_error("batch[1]", [&] { layer.forward(twice, xv, {yv}); });
  const LayerStepRequest negative[2] = {{r, 11}, {r + 1, -1}};
  const int r2 = layer.open_request();
  expect_error("batch[1]", [&] { layer.forward(negative, xv, {yv}); });
  layer.close_request(r2);
  std::vector<float> long_x(static_cast<std::size_t>((T - 49) * D)), long_y(long_x.size());
  expect_error("batch[0]", [&] { layer.forward(r, f32(long_x, {T - 49, D}), {f32(long_y, {T - 49, D})}); });
  EXPECT_EQ(layer.tokens(r), 50);

  const Outputs rest = run_chunks(layer, r, std::vector<float>(x.begin() + 50 * D, x.end()), {1, 39});
  std::vector<float> y_all = first.y;
  y_all.insert(y_all.end(), rest.y.begin(), rest.y.end());
  EXPECT_TRUE(same_bits(y_all, reference.y));
}

TEST(Layer, ConstructionChecksWeightsAndOptions) {
  std::mt19937_64 rng(testing::fresh_seed());
  const LayerWeights w = tiny_weights(kHca, rng());
  ModelConfig other = tiny();
  other.compress_rope_theta *= 2;  // the weights' layer config no longer matches
  expect_error("weights", [&] { AttentionLayer{other, w}; });
  LayerOptions options;
  options.max_requests = 0;
  expect_error("max_requests", [&] { AttentionLayer{tiny(), w, options}; });
  options = {};
  options.max_tokens = tiny().max_positions + 1;
  expect_error("max_tokens", [&] { AttentionLayer{tiny(), w, options}; });
  options = {};
  options.threads = 0;
  expect_error("threads", [&] { AttentionLayer{tiny(), w, options}; });
  options = {};
  options.indexer_format = static_cast<IndexerKeyFormat>(7);  // refused here, not in the middle of a step
  expect_error("indexer_format", [&] { AttentionLayer{tiny(), w, options}; });
  expect_error("indexer_format", [&] { CompressorSpec::for_layer(tiny(), 1, true, static_cast<IndexerKeyFormat>(7)); });

  AttentionLayer layer(tiny(), w);
  const int r = layer.open_request();
  expect_error("max_requests", [&] { layer.open_request(); });
  layer.close_request(r);
  expect_error("request", [&] { layer.close_request(r); });
  expect_error("request", [&] { layer.tokens(r); });
  expect_error("request", [&] { layer.usage(r); });
  expect_error("request", [&] { layer.close_request(-1); });
  EXPECT_EQ(layer.open_request(), r);
}

}  // namespace
}  // namespace dsv4
