// RoPE tables (SPEC §3): float32 frequencies and angles against shared/vectors/rope_flash_layer*,
// YaRN blend properties, rotation / inverse rotation, argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "dsv4/config.hpp"
#include "dsv4/rope.hpp"
#include "dsv4/safetensors.hpp"
#include "testing/testing.hpp"

namespace dsv4 {
namespace {

RopeTable flash_table(int layer) {
  const ModelConfig model = load_model_config(testing::vector_path("flash_config.json"));
  return RopeTable(layer_config(model, layer).rope);
}

class RopeVectors : public ::testing::TestWithParam<int> {};

// Frequencies, angles, cos and sin bit-exact at positions up to 2^20 − 1 (where the float32 angle
// rounding dominates).
TEST_P(RopeVectors, FrequenciesAnglesCosSinBitExact) {
  const int layer = GetParam();
  const RopeTable table = flash_table(layer);
  const SafetensorsFile file = SafetensorsFile::open(testing::vector_path("rope_flash_layer" + std::to_string(layer) + ".safetensors"));
  const Tensor freqs = file.read_float("freqs", {32});
  const Tensor positions = file.read_raw("positions", DType::I64, {-1});
  const std::int64_t count = positions.shape()[0];
  const Tensor angles = file.read_float("angles", {count, 32});
  const Tensor cos = file.read_float("cos", {count, 32});
  const Tensor sin = file.read_float("sin", {count, 32});
  ASSERT_EQ(table.frequencies().size(), 32u);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(table.frequencies()[static_cast<std::size_t>(i)], freqs.data_as<float>()[i]) << i;
  for (std::int64_t j = 0; j < count; ++j) {
    const std::int64_t p = positions.data_as<std::int64_t>()[j];
    for (int i = 0; i < 32; ++i) {
      float c, s;
      table.cos_sin(p, i, c, s);
      EXPECT_EQ(table.angle(p, i), angles.data_as<float>()[j * 32 + i]) << "p=" << p << " i=" << i;
      EXPECT_EQ(c, cos.data_as<float>()[j * 32 + i]) << "p=" << p << " i=" << i;
      EXPECT_EQ(s, sin.data_as<float>()[j * 32 + i]) << "p=" << p << " i=" << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(FlashLayers, RopeVectors, ::testing::Values(0, 2));

TEST(Rope, YarnKeepsHighFrequenciesAndDividesLowOnesByTheFactor) {
  RopeConfig plain;
  plain.base = 160000.0;
  plain.rope_dim = 64;
  RopeConfig yarn = plain;
  yarn.yarn = true;
  yarn.factor = 16.0;
  yarn.original_max_positions = 65536.0;
  const RopeTable a(plain), b(yarn);
  // Ramp bounds for these parameters (SPEC §3 formulas): low = floor(15.45) = 15,
  // high = ceil(24.71) = 25.
  for (int i = 0; i <= 15; ++i) EXPECT_EQ(b.frequencies()[i], a.frequencies()[i]) << i;
  for (int i = 25; i < 32; ++i) EXPECT_NEAR(b.frequencies()[i], a.frequencies()[i] / 16.0f, 1e-6f * a.frequencies()[i]) << i;
  for (int i = 16; i < 25; ++i) {
    EXPECT_LT(b.frequencies()[i], a.frequencies()[i]);
    EXPECT_GT(b.frequencies()[i], a.frequencies()[i] / 16.0f);
  }
  // Plain frequencies decrease geometrically: f_i = base^(−2i/r).
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(a.frequencies()[i], std::pow(160000.0, -2.0 * i / 64), 1e-6 * std::pow(160000.0, -2.0 * i / 64));
}

TEST(Rope, ApplyRotatesPairsAndInverseUndoesIt) {
  std::mt19937_64 rng(testing::fresh_seed());
  const RopeTable table = flash_table(2);
  std::uniform_int_distribution<std::int64_t> position(0, (1 << 20) - 1);
  for (int trial = 0; trial < 20; ++trial) {
    const std::int64_t p = position(rng);
    const std::vector<float> x = testing::random_normal(rng, 96);  // head of 96 dims, RoPE on the last 64
    std::vector<float> y = x;
    apply_rope_to_tail(table, y.data(), 96, p);
    for (int k = 0; k < 32; ++k) EXPECT_EQ(y[static_cast<std::size_t>(k)], x[static_cast<std::size_t>(k)]) << "dims before the tail are untouched";
    for (int i = 0; i < 32; ++i) {
      float c, s;
      table.cos_sin(p, i, c, s);
      const double a = x[32 + 2 * i], b = x[33 + 2 * i];
      EXPECT_EQ(y[32 + 2 * i], static_cast<float>(a * c - b * s));
      EXPECT_EQ(y[33 + 2 * i], static_cast<float>(a * s + b * c));
      EXPECT_NEAR(std::hypot(y[32 + 2 * i], y[33 + 2 * i]), std::hypot(a, b), 1e-5 * (1 + std::hypot(a, b)));
    }
    apply_rope_to_tail(table, y.data(), 96, p, /*inverse=*/true);
    for (std::size_t k = 0; k < x.size(); ++k) EXPECT_NEAR(y[k], x[k], 1e-5f * (1 + std::fabs(x[k])));
  }
  std::vector<float> z = testing::random_normal(rng, 64);
  const std::vector<float> z0 = z;
  table.apply(z.data(), 0);
  EXPECT_EQ(z, z0) << "position 0 is the identity";
}

TEST(Rope, Errors) {
  RopeConfig odd;
  odd.rope_dim = 63;
  testing::expect_error("rope", [&] { RopeTable{odd}; });
  RopeConfig zero;
  zero.rope_dim = 0;
  testing::expect_error("rope", [&] { RopeTable{zero}; });
  RopeConfig low_base;
  low_base.base = 1.0;
  testing::expect_error("rope", [&] { RopeTable{low_base}; });
  RopeConfig infinite_base;
  infinite_base.base = std::numeric_limits<double>::infinity();  // every frequency but the first would be 0
  testing::expect_error("rope", [&] { RopeTable{infinite_base}; });
  RopeConfig bad_yarn;
  bad_yarn.yarn = true;
  bad_yarn.original_max_positions = 0;
  testing::expect_error("rope", [&] { RopeTable{bad_yarn}; });
  RopeConfig yarn;  // valid but for the one field each case below breaks
  yarn.yarn = true;
  yarn.original_max_positions = 65536;
  EXPECT_NO_THROW(RopeTable{yarn});
  RopeConfig infinite_factor = yarn;
  infinite_factor.factor = std::numeric_limits<double>::infinity();
  testing::expect_error("rope", [&] { RopeTable{infinite_factor}; });
  RopeConfig infinite_original = yarn;  // every frequency came out NaN
  infinite_original.original_max_positions = std::numeric_limits<double>::infinity();
  testing::expect_error("rope", [&] { RopeTable{infinite_original}; });
  const RopeTable table{RopeConfig{}};
  std::vector<float> x(32, 1.0f);
  try {
    apply_rope_to_tail(table, x.data(), 32, 5);
    FAIL() << "a head narrower than rope_dim must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "dim");
  }
  EXPECT_EQ(x, std::vector<float>(32, 1.0f));
  testing::expect_error("head", [&] { apply_rope_to_tail(table, nullptr, 64, 5); });
  testing::expect_error("x", [&] { table.apply(nullptr, 5); });
}

}  // namespace
}  // namespace dsv4
