// Layer weight loading (SPEC §8): checkpoint names and spellings, FP8 block-scale dequantization,
// the random checkpoint writer, and loader errors naming the tensor at fault.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <set>

#include "dsv4/formats.hpp"
#include "dsv4/weights.hpp"
#include "testing/testing.hpp"

namespace dsv4 {
namespace {

ModelConfig small_config() { return load_model_config(testing::vector_path("small_config.json")); }

// One tensor to write into a rewritten file.
struct Rewritten {
  std::string name;
  DType dtype;
  Shape shape;
  std::vector<std::byte> bytes;
};
using Rewrite = std::function<std::optional<Rewritten>(Rewritten)>;

// A copy of `file` with every tensor passed through `rewrite` (nullopt drops it).
SafetensorsFile rewrite_file(const SafetensorsFile& file, const Rewrite& rewrite) {
  SafetensorsWriter writer;
  for (const auto& name : file.names()) {
    const TensorInfo& info = file.info(name);
    Rewritten t{name, info.dtype, info.shape, {info.bytes.begin(), info.bytes.end()}};
    if (auto out = rewrite(std::move(t))) writer.add(out->name, out->dtype, out->shape, out->bytes.data());
  }
  return SafetensorsFile::from_bytes(writer.to_bytes(), "rewritten.safetensors");
}

SafetensorsFile tiny_checkpoint(int layer, std::uint64_t seed) {
  return SafetensorsFile::from_bytes(random_layer_checkpoint(preset_config("tiny"), layer, seed).to_bytes(),
                                     "tiny.safetensors");
}

// Expects load_layer_weights to throw an Error whose argument is `name` and whose message holds `text`.
void expect_load_error(const SafetensorsFile& file, const ModelConfig& model, int layer, const std::string& name,
                       const std::string& text) {
  try {
    load_layer_weights(file, model, layer);
    ADD_FAILURE() << "loading succeeded; expected an error naming " << name;
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), name) << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

std::vector<float> values(const Tensor& t) { return {t.data_as<float>(), t.data_as<float>() + t.numel()}; }

TEST(DequantizeBlockE4m3, KnownAnswersAcrossBlockBoundaries) {
  // 130 × 200: blocks [0,128)×[0,128), [0,128)×[128,200), [128,130)×[0,128), [128,130)×[128,200).
  const std::int64_t rows = 130, cols = 200;
  std::vector<std::uint8_t> codes(rows * cols, 0x38);  // 1.0
  const float scales[4] = {1.0f, 0.125f, 8.0f, 3.0f};    // float32 scales need not be powers of two
  codes[127 * cols + 127] = 0x3c;  // 1.5, block (0,0)
  codes[127 * cols + 128] = 0x40;  // 2.0, block (0,1)
  codes[128 * cols + 127] = 0xb8;  // -1.0, block (1,0)
  codes[129 * cols + 199] = 0x7e;  // 448, block (1,1)
  codes[0] = 0x01;                 // 2^-9, the smallest subnormal
  codes[1] = 0x80;                 // -0
  std::vector<float> out(rows * cols, NAN);
  dequantize_block_e4m3(codes.data(), rows, cols, scales, out.data());
  EXPECT_EQ(out[127 * cols + 127], 1.5f);
  EXPECT_EQ(out[127 * cols + 128], 0.25f);
  EXPECT_EQ(out[128 * cols + 127], -8.0f);
  EXPECT_EQ(out[129 * cols + 199], 1344.0f);
  EXPECT_EQ(out[0], std::ldexp(1.0f, -9));
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_TRUE(std::signbit(out[1]));
  EXPECT_EQ(out[5 * cols + 150], 0.125f);
  EXPECT_EQ(out[128 * cols + 0], 8.0f);
  EXPECT_EQ(out[128 * cols + 128], 3.0f);
}

TEST(DequantizeBlockE4m3, NullPointersAndNegativeExtentsAreNamed) {
  std::vector<std::uint8_t> codes(4 * 3, 0x38);
  const float scale = 2.0f;
  std::vector<float> out(12, NAN);
  testing::expect_error("rows", [&] { dequantize_block_e4m3(codes.data(), -1, 3, &scale, out.data()); });
  testing::expect_error("cols", [&] { dequantize_block_e4m3(codes.data(), 4, -3, &scale, out.data()); });
  testing::expect_error("codes", [&] { dequantize_block_e4m3(nullptr, 4, 3, &scale, out.data()); });
  testing::expect_error("scales", [&] { dequantize_block_e4m3(codes.data(), 4, 3, nullptr, out.data()); });
  testing::expect_error("out", [&] { dequantize_block_e4m3(codes.data(), 4, 3, &scale, nullptr); });
  for (float v : out) EXPECT_TRUE(std::isnan(v)) << "output touched on error";
  dequantize_block_e4m3(nullptr, 0, 3, nullptr, nullptr);  // nothing to read or write
  dequantize_block_e4m3(codes.data(), 4, 3, &scale, out.data());
  EXPECT_EQ(out, std::vector<float>(12, 2.0f));
}

TEST(LoadLayerWeights, Ue8m0AndFloat32ScalesThroughTheLoader) {
  const ModelConfig model = preset_config("tiny");
  const SafetensorsFile file = tiny_checkpoint(0, testing::fresh_seed());
  const LayerWeights w = load_layer_weights(file, model, 0);
  // wq_a [128, 256]: two column blocks. Recompute from the raw bytes: code · 2^(e − 127).
  const TensorInfo& codes = file.info("layers.0.attn.wq_a.weight");
  const TensorInfo& scale = file.info("layers.0.attn.wq_a.scale");
  ASSERT_EQ(scale.dtype, DType::F8_E8M0);
  ASSERT_EQ(scale.shape, (Shape{1, 2}));
  const auto* c = reinterpret_cast<const std::uint8_t*>(codes.bytes.data());
  const auto* e = reinterpret_cast<const std::uint8_t*>(scale.bytes.data());
  for (std::int64_t k : {0L, 127L, 128L, 255L, 128L * 256 - 1}) {
    const float expected = float_from_e4m3(c[k]) * std::ldexp(1.0f, e[k % 256 / 128] - 127);
    EXPECT_EQ(w.wq_a.data_as<float>()[k], expected) << k;
  }
  // The same matrix with float32 scales (as `weight_scale_inv`) loads to the same values.
  const SafetensorsFile f32 = rewrite_file(file, [](Rewritten t) -> std::optional<Rewritten> {
    if (t.name != "layers.0.attn.wq_a.scale") return t;
    std::vector<float> s;
    for (auto b : t.bytes) s.push_back(float_from_ue8m0(static_cast<std::uint8_t>(b)));
    Rewritten out{"layers.0.attn.wq_a.weight_scale_inv", DType::F32, t.shape, std::vector<std::byte>(s.size() * 4)};
    std::memcpy(out.bytes.data(), s.data(), out.bytes.size());
    return out;
  });
  EXPECT_EQ(values(load_layer_weights(f32, model, 0).wq_a), values(w.wq_a));
}

TEST(LoadLayerWeights, KnownAnswerVectorFilesHaveEveryPartOfTheirKind) {
  const ModelConfig model = small_config();
  for (int layer = 0; layer < 3; ++layer) {
    const LayerWeights w =
        load_layer_weights(testing::vector_path("layer_small_" + std::to_string(layer) + ".safetensors"), model, layer);
    EXPECT_EQ(w.layer.ratio, model.compress_ratios[layer]);
    EXPECT_EQ(w.wq_b.shape(), (Shape{16 * 512, 256}));
    EXPECT_EQ(w.wo_a.shape(), (Shape{4 * 256, 4 * 512}));
    EXPECT_EQ(w.compressor.has_value(), layer != 0);
    EXPECT_EQ(w.indexer.has_value(), layer == 1);
    if (layer == 1) {
      EXPECT_EQ(w.indexer->compressor.ape.shape(), (Shape{4, 256}));
    }
    if (layer == 2) {
      EXPECT_EQ(w.compressor->wkv.shape(), (Shape{512, 1024}));
    }
    // Realistic magnitudes: rms of wq_a ≈ 1/sqrt(D).
    double ss = 0;
    for (float v : values(w.wq_a)) ss += static_cast<double>(v) * v;
    EXPECT_NEAR(std::sqrt(ss / static_cast<double>(w.wq_a.numel())), 1.0 / 32, 0.1 / 32);
  }
}

TEST(RandomLayerCheckpoint, SameNamesDtypesAndShapesAsTheKnownAnswerFiles) {
  const ModelConfig model = small_config();
  for (int layer = 0; layer < 3; ++layer) {
    const SafetensorsFile reference =
        SafetensorsFile::open(testing::vector_path("layer_small_" + std::to_string(layer) + ".safetensors"));
    const SafetensorsFile made = SafetensorsFile::from_bytes(random_layer_checkpoint(model, layer, 7).to_bytes());
    std::set<std::string> expected_names;
    for (const auto& name : reference.names())
      if (name.starts_with("layers.")) expected_names.insert(name);
    const auto made_names = made.names();
    EXPECT_EQ(std::set<std::string>(made_names.begin(), made_names.end()), expected_names);
    for (const auto& name : expected_names) {
      if (!made.contains(name)) continue;
      EXPECT_EQ(made.info(name).dtype, reference.info(name).dtype) << name;
      EXPECT_EQ(made.info(name).shape, reference.info(name).shape) << name;
    }
    EXPECT_EQ(made.metadata().at("layer"), std::to_string(layer));
  }
}

TEST(RandomLayerCheckpoint, DeterministicInSeedWithRealisticMagnitudes) {
  const std::uint64_t seed = testing::fresh_seed();
  const ModelConfig model = preset_config("tiny");
  EXPECT_EQ(random_layer_checkpoint(model, 1, seed).to_bytes(), random_layer_checkpoint(model, 1, seed).to_bytes());
  EXPECT_NE(random_layer_checkpoint(model, 1, seed).to_bytes(), random_layer_checkpoint(model, 1, seed + 1).to_bytes());

  const LayerWeights w = load_layer_weights(tiny_checkpoint(1, seed), model, 1);
  const auto rms = [](const Tensor& t) {
    double ss = 0;
    for (std::int64_t i = 0; i < t.numel(); ++i) ss += static_cast<double>(t.data_as<float>()[i]) * t.data_as<float>()[i];
    return std::sqrt(ss / static_cast<double>(t.numel()));
  };
  for (const Tensor* m : {&w.wq_a, &w.wq_b, &w.wkv, &w.wo_a, &w.wo_b, &w.compressor->wkv, &w.indexer->wq_b})
    EXPECT_NEAR(rms(*m) * std::sqrt(static_cast<double>(m->shape()[1])), 1.0, 0.05);
  EXPECT_NEAR(rms(w.compressor->wgate) * std::sqrt(256.0), 2.0, 0.1);
  EXPECT_NEAR(rms(w.q_norm), 1.0, 0.05);
  EXPECT_GT(rms(w.attn_sink), 0.1);
}

TEST(LoadLayerWeights, AcceptsModelPrefixSelfAttnAndWeightScaleInv) {
  const ModelConfig model = preset_config("tiny");
  const SafetensorsFile file = tiny_checkpoint(1, testing::fresh_seed());
  const LayerWeights plain = load_layer_weights(file, model, 1);
  const SafetensorsFile renamed = rewrite_file(file, [](Rewritten t) -> std::optional<Rewritten> {
    t.name = "model." + t.name;
    t.name.replace(t.name.find(".attn."), 6, ".self_attn.");
    if (t.name.ends_with(".scale")) t.name.replace(t.name.size() - 6, 6, ".weight_scale_inv");
    return t;
  });
  ASSERT_TRUE(renamed.contains("model.layers.1.self_attn.wq_b.weight_scale_inv"));
  const LayerWeights w = load_layer_weights(renamed, model, 1);
  EXPECT_EQ(values(w.wq_b), values(plain.wq_b));
  EXPECT_EQ(values(w.indexer->compressor.ape), values(plain.indexer->compressor.ape));
  EXPECT_EQ(values(w.attn_sink), values(plain.attn_sink));
}

TEST(LoadLayerWeights, EveryMissingTensorIsNamed) {
  const ModelConfig model = preset_config("tiny");
  const SafetensorsFile file = tiny_checkpoint(1, testing::fresh_seed());
  for (const auto& spec : layer_weight_specs(model, 1)) {
    const std::string name = checkpoint_weight_name(1, spec);
    const SafetensorsFile without =
        rewrite_file(file, [&](Rewritten t) { return t.name == name ? std::nullopt : std::optional(t); });
    expect_load_error(without, model, 1, name, "missing");
  }
}

TEST(LoadLayerWeights, WrongShapesDtypesAndScalesAreNamed) {
  const ModelConfig model = preset_config("tiny");
  const SafetensorsFile file = tiny_checkpoint(1, testing::fresh_seed());
  const auto with = [&](const std::string& target, const std::function<void(Rewritten&)>& change) {
    return rewrite_file(file, [&](Rewritten t) {
      if (t.name == target) change(t);
      return std::optional(t);
    });
  };
  // A transposed matrix (same bytes).
  expect_load_error(with("layers.1.attn.wkv.weight", [](Rewritten& t) { std::swap(t.shape[0], t.shape[1]); }), model,
                    1, "layers.1.attn.wkv.weight", "expected shape [512, 256]");
  // A norm stored as I16-sized F16 (same byte count, dtype not accepted).
  expect_load_error(with("layers.1.attn.q_norm.weight", [](Rewritten& t) { t.dtype = DType::F16; }), model, 1,
                    "layers.1.attn.q_norm.weight", "got F16");
  // The sink must be float32.
  expect_load_error(with("layers.1.attn.attn_sink",
                         [](Rewritten& t) {
                           t.dtype = DType::I32;
                         }),
                    model, 1, "layers.1.attn.attn_sink", "expected dtype F32");
  // A block scale of the wrong shape or dtype, or absent.
  expect_load_error(with("layers.1.attn.wq_b.scale", [](Rewritten& t) { t.shape = {1, 32}; }), model, 1,
                    "layers.1.attn.wq_b.scale", "expected shape [32, 1]");
  expect_load_error(with("layers.1.attn.wq_b.scale", [](Rewritten& t) { t.dtype = DType::U8; }), model, 1,
                    "layers.1.attn.wq_b.scale", "F8_E8M0 or F32");
  const SafetensorsFile no_scale = rewrite_file(file, [](Rewritten t) {
    return t.name == "layers.1.attn.wo_a.scale" ? std::nullopt : std::optional(t);
  });
  expect_load_error(no_scale, model, 1, "layers.1.attn.wo_a.scale", "block scale");
  // A NaN code (e4m3 0x7f) in a weight.
  expect_load_error(with("layers.1.attn.wo_b.weight", [](Rewritten& t) { t.bytes[17] = std::byte{0x7f}; }), model,
                    1, "layers.1.attn.wo_b.weight", "non-finite");
}

TEST(LoadLayerWeights, WrongLayerNamesTheMissingTensorAndTheLayersPresent) {
  const ModelConfig model = preset_config("tiny");
  const SafetensorsFile file = tiny_checkpoint(1, testing::fresh_seed());
  expect_load_error(file, model, 3, "layers.3.attn.wq_a.weight", "layers: 1");
  try {
    load_layer_weights(file, model, 4);
    ADD_FAILURE() << "layer 4 of a 4-layer model loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "layer");
  }
  // A ratio-0 layer's file lacks the compressor that layer 1 needs.
  const SafetensorsFile swa = rewrite_file(tiny_checkpoint(0, 1), [](Rewritten t) {
    t.name.replace(0, 9, "layers.1.");
    return std::optional(t);
  });
  expect_load_error(swa, model, 1, "layers.1.attn.compressor.wkv.weight", "missing");
}

}  // namespace
}  // namespace dsv4
