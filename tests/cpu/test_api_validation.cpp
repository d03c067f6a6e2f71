// Argument validation of the public entry points beyond the per-operation error suites
// (test_compressor_errors, the Errors tests of topk / indexer / sparse attention / layer / rope):
// views whose own extents are negative or overflow int64, weights handed to AttentionLayer
// directly (not through the loader), option and spec values that would overflow int ring sizes,
// RoPE pair indices and positions, forks outside what the source state holds, and outputs the
// safetensors writer must not replace. Each call has exactly one bad argument on otherwise valid,
// fresh random inputs; it must throw dsv4::Error naming that argument and leave every output,
// state and cache byte-for-byte as it was.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "compressor_testing.hpp"
#include "dsv4/layer.hpp"
#include "dsv4/rope.hpp"
#include "dsv4/safetensors.hpp"
#include "dsv4/sparse_attention.hpp"
#include "dsv4/topk.hpp"
#include "dsv4/weights.hpp"
#include "testing/attention_pool.hpp"
#include "testing/testing.hpp"

namespace dsv4 {
namespace {

constexpr std::int64_t kHuge = std::int64_t{1} << 40;  // two of these overflow int64 as a product

using testing::expect_error;

template <class T> std::vector<std::uint8_t> bytes_of(const std::vector<T>& v) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(v.data());
  return std::vector<std::uint8_t>(p, p + v.size() * sizeof(T));
}

// ---- views whose own extents are invalid -----------------------------------------------------------
// check_tensor lets −1 in the expected shape match any extent, so a view's negative or overflowing
// extent used to pass wherever the expectation was a wildcard (a row count taken from the view).

TEST(ApiValidation, TensorsWithNegativeOrOverflowingExtentsAreRefused) {
  for (const Shape& bad : {Shape{-1, 4}, Shape{kHuge, kHuge}, Shape{std::int64_t{1} << 62, 4}}) {
    expect_error("shape", [&] { Tensor::empty(DType::F32, bad); });
  }
  std::vector<float> data(8, 1.5f);
  for (const Shape& bad : {Shape{-2, -4}, Shape{kHuge, kHuge}}) {
    expect_error("t", [&] { check_tensor(TensorView{data.data(), DType::F32, bad}, "t", DType::F32, {-1, -1}, Device::CPU); });
  }
  Tensor empty = Tensor::empty(DType::F32, {0, kHuge});  // zero elements: nothing to overflow
  EXPECT_EQ(empty.nbytes(), 0u);
  // An integer cast to DType has no size: 4 elements would have had 0 bytes of storage.
  expect_error("dtype", [&] { Tensor::empty(static_cast<DType>(99), {4}); });
  expect_error("dtype", [&] { Tensor::from_host(static_cast<DType>(99), {2}, data.data()); });
}

TEST(ApiValidation, TensorCopiesRefuseNullAndNegativeSources) {
  std::mt19937_64 rng(testing::fresh_seed());
  std::vector<float> data = testing::random_normal(rng, 2);
  expect_error("bytes", [&] { Tensor::from_host(DType::F32, {2}, nullptr); });
  EXPECT_EQ(Tensor::from_host(DType::F32, {0, 3}, nullptr).numel(), 0);  // nothing to copy
  Tensor t = Tensor::from_host(DType::F32, {2}, data.data());
  const auto before = bytes_of(std::vector<float>(t.data_as<float>(), t.data_as<float>() + 2));
  expect_error("src", [&] { t.copy_from(TensorView{nullptr, DType::F32, {2}}); });
  // {−1, −2} has "2 elements" as a product: the copy used to read 8 bytes through it.
  expect_error("src", [&] { t.copy_from(TensorView{data.data(), DType::F32, {-1, -2}}); });
  EXPECT_EQ(bytes_of(std::vector<float>(t.data_as<float>(), t.data_as<float>() + 2)), before);
  // A default-constructed Tensor has one element's shape and no storage: it used to be read or
  // written through a null pointer.
  Tensor none;
  expect_error("tensor", [&] { none.to(Device::CPU); });
  expect_error("tensor", [&] { none.fill_bytes(0); });
  expect_error("tensor", [&] { none.copy_from(TensorView{data.data(), DType::F32, {}}); });
  Tensor scalar = Tensor::empty(DType::F32, {});
  scalar.copy_from(TensorView{data.data(), DType::F32, {}});  // a scalar with storage is fine
  EXPECT_EQ(scalar.to(Device::CPU).data_as<float>()[0], data[0]);
}

TEST(ApiValidation, SparseAttentionRefusesANegativeRowCount) {
  using F = AttentionEntryFormat;
  std::mt19937_64 rng(testing::fresh_seed());
  const int rows = 2, heads = 2, W = 3, K = 4;
  const testing::RandomAttentionPool window(rng, 8, 3, 4), compressed(rng, 4, 3, 4);
  std::vector<std::uint16_t> q;
  for (float x : testing::random_normal(rng, static_cast<std::size_t>(rows * heads * F::kDim))) q.push_back(bf16_bits_from_float(x));
  std::uniform_int_distribution<int> window_slot(-1, static_cast<int>(window.slots()) - 1);
  std::uniform_int_distribution<int> compressed_slot(-1, static_cast<int>(compressed.slots()) - 1);
  std::vector<std::int32_t> ws, cs;
  for (int i = 0; i < rows * W; ++i) ws.push_back(window_slot(rng));
  for (int i = 0; i < rows * K; ++i) cs.push_back(compressed_slot(rng));
  std::vector<float> sink = testing::random_floats(rng, heads, -2.0f, 2.0f);
  std::vector<std::uint16_t> out(static_cast<std::size_t>(rows * heads * F::kDim), 0xFFFF);  // poison
  std::vector<float> lse(static_cast<std::size_t>(rows * heads), std::numeric_limits<float>::quiet_NaN());
  const auto before_out = out;
  const auto before_lse = bytes_of(lse);
  const auto call = [&](std::int64_t q_rows) {
    sparse_attention(TensorView{q.data(), DType::BF16, {q_rows, heads, F::kDim}}, window.host_view(), compressed.host_view(),
                     TensorView{ws.data(), DType::I32, {rows, W}}, TensorView{cs.data(), DType::I32, {rows, K}},
                     TensorView{sink.data(), DType::F32, {heads}}, TensorView{out.data(), DType::BF16, {rows, heads, F::kDim}},
                     TensorView{lse.data(), DType::F32, {rows, heads}});
  };
  // Before the fix, −2 rows made every other row count a wildcard: no error and nothing written.
  expect_error("q", [&] { call(-2); });
  EXPECT_EQ(out, before_out);
  EXPECT_EQ(bytes_of(lse), before_lse);
  call(rows);  // the same inputs are valid
  EXPECT_NE(out, before_out);
}

TEST(ApiValidation, TopkRefusesNegativeAndOverflowingScoreShapes) {
  std::mt19937_64 rng(testing::fresh_seed());
  std::vector<float> scores = testing::random_normal(rng, 2 * 12);
  std::vector<std::int32_t> query_start{0, 2}, visible{5, 12}, page_table{1, 2, 3};
  std::vector<std::int32_t> indices(2 * 4, -77), slots(2 * 4, -77);
  const auto before = indices;
  const IndexerRowsView rows{TensorView{query_start.data(), DType::I32, {2}}, TensorView{visible.data(), DType::I32, {2}},
                             TensorView{page_table.data(), DType::I32, {1, 3}}};
  const auto call = [&](Shape score_shape, Shape index_shape) {
    indexer_topk(TensorView{scores.data(), DType::F32, std::move(score_shape)}, rows, 4,
                 TensorView{indices.data(), DType::I32, index_shape}, TensorView{slots.data(), DType::I32, index_shape});
  };
  expect_error("scores", [&] { call({-2, 12}, {2, 4}); });
  expect_error("scores", [&] { call({kHuge, kHuge}, {2, 4}); });
  expect_error("indices", [&] { call({2, 12}, {2, -4}); });
  EXPECT_EQ(indices, before);
  EXPECT_EQ(slots, before);
  call({2, 12}, {2, 4});
  EXPECT_NE(indices, before);
}

// ---- AttentionLayer: weights handed in directly ---------------------------------------------------

ModelConfig tiny() { return preset_config("tiny"); }
constexpr int kCsa = 1, kHca = 2;  // layers of the tiny preset

LayerWeights random_weights(int layer, std::uint64_t seed) {
  const auto image = random_layer_checkpoint(tiny(), layer, seed).to_bytes();
  return load_layer_weights(SafetensorsFile::from_bytes(image), tiny(), layer);
}

// A ModelConfig built in code (not parsed) reaches the layer and the weight table unvalidated: a
// page_size or o_groups of 0 used to end in a division by zero (SIGFPE) instead of an Error.
TEST(ApiValidation, UnvalidatedModelConfigsAreRefusedNamingTheKey) {
  std::mt19937_64 rng(testing::fresh_seed());
  const LayerWeights w = random_weights(kHca, rng());
  ModelConfig no_pages = tiny();
  no_pages.page_size = 0;
  expect_error("page_size", [&] { AttentionLayer(no_pages, w); });
  ModelConfig no_groups = tiny();
  no_groups.o_groups = 0;
  expect_error("o_groups", [&] { layer_weight_specs(no_groups, kCsa); });
  expect_error("o_groups", [&] { random_layer_checkpoint(no_groups, kCsa, 1); });
  const auto image = random_layer_checkpoint(tiny(), kCsa, rng()).to_bytes();
  const SafetensorsFile file = SafetensorsFile::from_bytes(image);
  expect_error("o_groups", [&] { load_layer_weights(file, no_groups, kCsa); });
  expect_error("o_groups", [&] { AttentionLayer(no_groups, w); });
  EXPECT_EQ(layer_weight_specs(tiny(), kCsa).size(), 18u);  // 8 attention + 4 compressor + 2 indexer + 4
}

TEST(ApiValidation, AttentionLayerChecksEveryWeightTensor) {
  std::mt19937_64 rng(testing::fresh_seed());
  const LayerWeights good = random_weights(kCsa, rng());
  AttentionLayer{tiny(), good};  // valid as loaded

  LayerWeights w = good;
  w.wq_a = Tensor::zeros(DType::F32, {good.wq_a.shape()[0], good.wq_a.shape()[1] + 1});
  expect_error("layers.1.attn.wq_a.weight", [&] { AttentionLayer{tiny(), w}; });
  w = good;
  w.kv_norm = Tensor::zeros(DType::BF16, good.kv_norm.shape());
  expect_error("layers.1.attn.kv_norm.weight", [&] { AttentionLayer{tiny(), w}; });
  w = good;
  w.compressor->ape = Tensor::zeros(DType::F32, {good.compressor->ape.shape()[0] - 1, good.compressor->ape.shape()[1]});
  expect_error("layers.1.attn.compressor.ape", [&] { AttentionLayer{tiny(), w}; });
  w = good;
  w.indexer->weights_proj = Tensor{};
  expect_error("layers.1.attn.indexer.weights_proj.weight", [&] { AttentionLayer{tiny(), w}; });
  // A sink that sparse_attention refuses would otherwise surface mid-step, after the compressors ran.
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    w = good;
    w.attn_sink = good.attn_sink.to(Device::CPU);  // a copy: Tensor copies share storage
    w.attn_sink.data_as<float>()[std::uniform_int_distribution<int>(0, tiny().num_heads - 1)(rng)] = bad;
    expect_error("layers.1.attn.attn_sink", [&] { AttentionLayer{tiny(), w}; });
  }
  w = good;
  w.indexer.reset();  // a CSA layer would silently run as HCA
  expect_error("weights", [&] { AttentionLayer{tiny(), w}; });
  LayerWeights hca = random_weights(kHca, rng());
  hca.indexer = good.indexer;  // an HCA layer would select top-k
  expect_error("weights", [&] { AttentionLayer{tiny(), hca}; });
}

TEST(ApiValidation, LayerOptionsThatWouldOverflowRingSizesAreRefused) {
  std::mt19937_64 rng(testing::fresh_seed());
  const LayerWeights w = random_weights(kHca, rng());
  const int big = std::numeric_limits<int>::max();
  LayerOptions options;
  options.max_rollback = big;
  expect_error("max_rollback", [&] { AttentionLayer(tiny(), w, options); });
  options = {};
  options.window_step = big;
  expect_error("window_step", [&] { AttentionLayer(tiny(), w, options); });
  options = {};
  options.max_requests = big;
  expect_error("max_requests", [&] { AttentionLayer(tiny(), w, options); });
  ModelConfig wide = tiny();
  wide.window = big;  // a config.json's sliding_window: valid for the config, too wide for the ring
  LayerWeights for_wide = w;
  for_wide.layer = layer_config(wide, kHca);
  expect_error("sliding_window", [&] { AttentionLayer(wide, for_wide); });
}

// A refused forward must leave the layer exactly as it was: continuing gives the bytes of a layer
// that never saw the bad call.
TEST(ApiValidation, RefusedLayerStepsLeaveOutputsAndStateUntouched) {
  std::mt19937_64 rng(testing::fresh_seed());
  const LayerWeights w = random_weights(kCsa, rng());
  const int D = tiny().hidden_size;
  const std::int64_t T = 12;
  std::vector<float> x = testing::random_normal(rng, static_cast<std::size_t>(T * D));
  const auto run = [&](AttentionLayer& layer, int r, std::int64_t from, std::int64_t n) {
    std::vector<float> y(static_cast<std::size_t>(n * D));
    layer.forward(r, TensorView{x.data() + from * D, DType::F32, {n, D}}, {TensorView{y.data(), DType::F32, {n, D}}});
    return y;
  };
  AttentionLayer clean(tiny(), w), probed(tiny(), w);
  const int a = clean.open_request(), b = probed.open_request();
  const auto y_clean = run(clean, a, 0, T);
  run(probed, b, 0, 5);
  std::vector<float> y(static_cast<std::size_t>(7 * D), std::numeric_limits<float>::quiet_NaN());
  const auto poisoned = bytes_of(y);
  // x viewed with a negative row count: new_tokens = −7.
  expect_error("batch[0]", [&] {
    probed.forward(b, TensorView{x.data() + 5 * D, DType::F32, {-7, D}}, {TensorView{y.data(), DType::F32, {7, D}}});
  });
  const LayerStepRequest negative_x[1] = {{b, 0}};
  expect_error("x", [&] {
    probed.forward(negative_x, TensorView{x.data() + 5 * D, DType::F32, {0, -D}}, {TensorView{y.data(), DType::F32, {0, D}}});
  });
  EXPECT_EQ(bytes_of(y), poisoned);
  EXPECT_EQ(probed.tokens(b), 5);
  const auto y_rest = run(probed, b, 5, 7);
  EXPECT_EQ(bytes_of(y_rest), bytes_of(std::vector<float>(y_clean.begin() + 5 * D, y_clean.end())));
}

// ---- compressor specs, forks ---------------------------------------------------------------------

TEST(ApiValidation, CompressorSpecsThatWouldOverflowRingSizesAreRefused) {
  using namespace compressor_testing;
  CompressorSpec spec = make_spec(4, true, EntryKind::Attention);
  spec.max_rollback = std::numeric_limits<int>::max();  // ring = coff·m + max_rollback
  expect_error("max_rollback", [&] { CompressorStatePool(spec, 2); });
  spec = make_spec(4, true, EntryKind::IndexerFP8);
  spec.width = 1 << 30;  // a power of two, but 2·coff·c floats per row overflow int
  expect_error("width", [&] { validate_compressor_spec(spec); });
  spec = make_spec(128, false, EntryKind::Attention);
  spec.ratio = 1 << 30;
  expect_error("ratio", [&] { validate_compressor_spec(spec); });
}

TEST(ApiValidation, ForkOutsideWhatTheSourceHoldsIsRefused) {
  using namespace compressor_testing;
  std::mt19937_64 rng(testing::fresh_seed());
  CompressorSpec spec = make_spec(4, true, EntryKind::Attention);
  spec.max_rollback = 2;
  const Stream s = random_stream(rng, spec, 20);
  CompressorStatePool pool(spec, 4);
  PagedCache cache = make_compressed_cache(spec, 8, 8);  // pages of 8 tokens
  const int src = pool.allocate(), dst = pool.allocate();
  const std::vector<std::int32_t> pages{1, 2, 3};
  compress(spec, {s.ape_view(), s.norm_view()}, {{src, 0, 20, pages}}, MatrixF32View::of(s.kv_rows(0, 20), "kv"),
           MatrixF32View::of(s.score_rows(0, 20), "score"), pool, cache);
  ASSERT_EQ(pool.rollback_floor(src), 18);
  const Snapshot before = Snapshot::of(pool, cache);
  expect_error("prefix_tokens", [&] { fork_prefix(pool, src, dst, 24, cache); });  // page boundary past its 20 tokens
  expect_error("prefix_tokens", [&] { fork_prefix(pool, src, dst, 16, cache); });  // below its rollback floor 18
  expect_error("prefix_tokens", [&] { fork_prefix(pool, src, dst, -8, cache); });
  EXPECT_TRUE(Snapshot::of(pool, cache) == before);
}

// ---- RoPE ------------------------------------------------------------------------------------------

TEST(ApiValidation, RopePairIndexAndPositionAreChecked) {
  const RopeTable table(testing::published_compressed_rope());
  const int pairs = table.rope_dim() / 2;
  float c = 0, s = 0;
  expect_error("i", [&] { table.cos_sin(5, pairs, c, s); });
  expect_error("i", [&] { table.cos_sin(5, -1, c, s); });
  expect_error("position", [&] { table.angle(-1, 0); });
  std::mt19937_64 rng(testing::fresh_seed());
  std::vector<float> head = testing::random_normal(rng, 128);
  const auto before = bytes_of(head);
  expect_error("position", [&] { apply_rope_to_tail(table, head.data(), 128, -3); });
  EXPECT_EQ(bytes_of(head), before);
  table.cos_sin(5, pairs - 1, c, s);
  EXPECT_NEAR(c * c + s * s, 1.0f, 1e-6f);
}

// ---- the safetensors writer ------------------------------------------------------------------------

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

TEST(ApiValidation, WriterDoesNotReplaceReadOnlyFilesOrDirectories) {
  std::mt19937_64 rng(testing::fresh_seed());
  const std::vector<float> values = testing::random_normal(rng, 6);
  SafetensorsWriter writer;
  writer.add("v", DType::F32, {2, 3}, values.data());
  const std::string dir = testing::temp_dir();
  const std::string read_only = dir + "/read_only.safetensors";
  std::ofstream(read_only) << "keep me";
  ASSERT_EQ(::chmod(read_only.c_str(), 0444), 0);
  expect_error(read_only, [&] { writer.write(read_only); });
  EXPECT_EQ(file_bytes(read_only), "keep me");
  const std::string subdir = dir + "/a_directory";
  std::filesystem::create_directory(subdir);
  expect_error(subdir, [&] { writer.write(subdir); });
  EXPECT_TRUE(std::filesystem::is_directory(subdir));
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 2u) << "no temporary file left behind";
  // A writable existing file is replaced.
  const std::string writable = dir + "/writable.safetensors";
  std::ofstream(writable) << "old";
  writer.write(writable);
  EXPECT_EQ(SafetensorsFile::open(writable).read_float("v").numel(), 6);
}

}  // namespace
}  // namespace dsv4
