// Cache entry codecs (SPEC §5): byte positions, scale rounding, decode(encode(x)) error bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "dsv4/entry_codec.hpp"
#include "testing/testing.hpp"

namespace dsv4 {
namespace {

std::vector<float> bf16_values(std::mt19937_64& rng, int n) {
  std::vector<float> v = testing::random_normal(rng, static_cast<std::size_t>(n), 1.0f);
  // Spread magnitudes over several binades so blocks get different scales.
  for (int i = 0; i < n; ++i) v[i] = round_to_bf16(v[i] * std::ldexp(1.0f, (i / 64) % 5 - 2));
  return v;
}

TEST(AttentionEntry, PageLayoutOffsets) {
  using F = AttentionEntryFormat;
  EXPECT_EQ(F::page_bytes(64), 64 * 584 + (576 - (64 * 584) % 576) % 576);
  EXPECT_EQ(F::page_bytes(64) % 576, 0);
  EXPECT_EQ(F::page_bytes(2) % 576, 0);
  EXPECT_GE(F::page_bytes(2), 2 * 584);
  EXPECT_EQ(F::scale_offset(0, 64), 64 * 576);
  EXPECT_EQ(F::scale_offset(3, 2), 2 * 576 + 24);
  EXPECT_EQ(F::rope_offset(1), 576 + 448);
}

TEST(AttentionEntry, RoundTripWithinOneE4m3StepAndExactRope) {
  std::mt19937_64 rng(testing::fresh_seed());
  const int per_page = 2;
  std::vector<std::uint8_t> page(static_cast<std::size_t>(AttentionEntryFormat::page_bytes(per_page)), 0xAB);
  for (int trial = 0; trial < 50; ++trial) {
    const int i = trial % per_page;
    auto values = bf16_values(rng, 512);
    encode_attention_entry(values.data(), page.data(), i, per_page);
    std::vector<float> out(512, NAN);
    decode_attention_entry(page.data(), i, per_page, out.data());
    for (int b = 0; b < 7; ++b) {
      float amax = 0;
      for (int k = 0; k < 64; ++k) amax = std::fmax(amax, std::fabs(values[b * 64 + k]));
      const float scale = float_from_ue8m0(page[AttentionEntryFormat::scale_offset(i, per_page) + b]);
      EXPECT_LE(amax / scale, 448.0f);
      EXPECT_GT(amax / scale, 224.0f) << "scale must be the smallest power of two that fits";
      for (int k = 0; k < 64; ++k) {
        const float v = values[b * 64 + k], d = out[b * 64 + k];
        // e4m3 has 3 mantissa bits: relative error ≤ 2^-4 for normals, absolute ≤ 2^-10·scale below.
        EXPECT_LE(std::fabs(d - v), std::fmax(std::fabs(v) * 0.0625f, scale * std::ldexp(1.0f, -10)));
      }
    }
    for (int k = 448; k < 512; ++k) EXPECT_EQ(out[k], values[k]);
    EXPECT_EQ(page[AttentionEntryFormat::scale_offset(i, per_page) + 7], 0);
  }
}

class IndexerEntryTest : public ::testing::TestWithParam<IndexerKeyFormat> {};

TEST_P(IndexerEntryTest, RoundTripErrorBound) {
  std::mt19937_64 rng(testing::fresh_seed());
  const IndexerEntryFormat fmt{GetParam(), 128};
  const int per_page = 64;
  std::vector<std::uint8_t> page(static_cast<std::size_t>(fmt.page_bytes(per_page)), 0xCD);
  for (int i = 0; i < per_page; ++i) {
    auto values = bf16_values(rng, 128);
    encode_indexer_entry(fmt, values.data(), page.data(), i, per_page);
    std::vector<float> out(128, NAN);
    decode_indexer_entry(fmt, page.data(), i, per_page, out.data());
    float amax = 0;
    for (float v : values) amax = std::fmax(amax, std::fabs(v));
    for (int k = 0; k < 128; ++k) {
      ASSERT_FALSE(std::isnan(out[k]));
      // FP8: 3 mantissa bits; FP4: grid step ≤ 2 in units of the block scale (amax ≤ 6·scale).
      const float bound = fmt.format == IndexerKeyFormat::FP8 ? std::fmax(std::fabs(values[k]) * 0.0625f, amax * 1e-3f)
                                                             : amax / 3.0f * 1.0f + 1e-30f;
      EXPECT_LE(std::fabs(out[k] - values[k]), bound) << k;
    }
  }
  EXPECT_EQ(fmt.page_bytes(per_page), per_page * (fmt.format == IndexerKeyFormat::FP8 ? 132 : 68));
}

TEST(IndexerEntry, Fp4NibbleOrderAndScaleBytes) {
  const IndexerEntryFormat fmt{IndexerKeyFormat::FP4, 128};
  std::vector<float> values(128);
  for (int k = 0; k < 128; ++k) values[k] = (k % 2 == 0) ? 0.5f : -6.0f;  // codes 1 and 0xF
  values[40] = 24.0f;  // block 1: amax 24 → 24 / 6 = 4 → scale 2^2
  std::vector<std::uint8_t> page(static_cast<std::size_t>(fmt.page_bytes(1)));
  encode_indexer_entry(fmt, values.data(), page.data(), 0, 1);
  EXPECT_EQ(page[0], 0xF1);  // low nibble = value 0
  EXPECT_EQ(page[64 + 0], 127);  // amax 6 → scale 1
  EXPECT_EQ(page[64 + 1], 129);  // amax 24 → scale 4
}

INSTANTIATE_TEST_SUITE_P(Formats, IndexerEntryTest, ::testing::Values(IndexerKeyFormat::FP8, IndexerKeyFormat::FP4));

}  // namespace
}  // namespace dsv4
