// Number formats (SPEC §3): exhaustive e4m3/e2m1 round trips, ties, saturation, subnormals,
// ue8m0 rounding up, bf16 rounding. The known-answer vectors are checked in test_vectors_formats.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "dsv4/formats.hpp"
#include "testing/testing.hpp"

namespace dsv4 {
namespace {

TEST(E4m3, EveryCodeDecodesAndReencodesToItself) {
  int finite = 0;
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    const float v = float_from_e4m3(code);
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v)) << c;
      continue;
    }
    ++finite;
    EXPECT_EQ(e4m3_from(v), code) << "code " << c << " value " << v;
    EXPECT_EQ(e4m3_from(static_cast<double>(v)), code) << "code " << c;
  }
  EXPECT_EQ(finite, 254);
  EXPECT_EQ(float_from_e4m3(0x7e), 448.0f);
  EXPECT_EQ(float_from_e4m3(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(float_from_e4m3(0x08), std::ldexp(1.0f, -6));  // smallest normal
}

TEST(E4m3, TiesRoundToEvenBetweenEveryPairOfNeighbours) {
  for (int c = 0; c < 0x7e; ++c) {
    const double lo = float_from_e4m3(static_cast<std::uint8_t>(c));
    const double hi = float_from_e4m3(static_cast<std::uint8_t>(c + 1));
    const double mid = (lo + hi) / 2;
    const int even = (c % 2 == 0) ? c : c + 1;
    EXPECT_EQ(e4m3_from(mid), even) << "tie between codes " << c << " and " << c + 1;
    EXPECT_EQ(e4m3_from(-mid), 0x80 | even);
    EXPECT_EQ(e4m3_from(std::nextafter(mid, lo)), c);
    EXPECT_EQ(e4m3_from(std::nextafter(mid, hi)), c + 1);
  }
}

TEST(E4m3, SaturatesAndKeepsNaN) {
  EXPECT_EQ(e4m3_from(449.0f), 0x7e);
  EXPECT_EQ(e4m3_from(1e30f), 0x7e);
  EXPECT_EQ(e4m3_from(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(e4m3_from(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(e4m3_from(-1000.0), 0xfe);
  EXPECT_EQ(e4m3_from(std::nanf("")) & 0x7f, 0x7f);
  EXPECT_EQ(e4m3_from(std::ldexp(1.0f, -11)), 0x00);  // below half the smallest subnormal
  EXPECT_EQ(e4m3_from(-0.0f), 0x80);
}

TEST(E2m1, GridRoundTripsTiesAndSaturation) {
  for (int c = 0; c < 16; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    // −0 (code 0x8) decodes to zero, which is stored as +0 (code 0).
    EXPECT_EQ(e2m1_from(float_from_e2m1(code)), c == 0x8 ? 0 : code) << c;
  }
  EXPECT_EQ(e2m1_from(-0.2f), 0);  // a negative value rounding to zero is +0
  EXPECT_EQ(e2m1_from(0.25f), 0);  // tie 0 | 0.5 → even code 0
  EXPECT_EQ(e2m1_from(0.75f), 2);  // tie 0.5 | 1 → code 2
  EXPECT_EQ(e2m1_from(1.25f), 2);
  EXPECT_EQ(e2m1_from(1.75f), 4);
  EXPECT_EQ(e2m1_from(2.5f), 4);
  EXPECT_EQ(e2m1_from(3.5f), 6);
  EXPECT_EQ(e2m1_from(5.0f), 6);
  EXPECT_EQ(e2m1_from(5.01f), 7);
  EXPECT_EQ(e2m1_from(100.0f), 7);
  EXPECT_EQ(e2m1_from(-3.4f), 0x8 | 5);
}

TEST(Ue8m0, ScaleRoundsUpSoNoValueOverflows) {
  std::mt19937_64 rng(testing::fresh_seed());
  std::uniform_real_distribution<float> exponent(-20.0f, 20.0f);
  for (int i = 0; i < 100000; ++i) {
    const float amax = std::exp2(exponent(rng));
    for (auto [fmax, floor_value] : {std::pair{kE4m3Max, kUe8m0FloorE4m3}, std::pair{kE2m1Max, kUe8m0FloorE2m1}}) {
      const std::uint8_t e = ue8m0_scale_byte(amax, fmax, floor_value);
      const float scale = float_from_ue8m0(e);
      const float clamped = std::max(amax, floor_value);
      EXPECT_LE(clamped / scale, fmax) << amax;           // fits
      EXPECT_GT(clamped / (scale * 0.5f), fmax) << amax;  // and the next smaller scale would not
    }
  }
  EXPECT_EQ(ue8m0_scale_byte(448.0f, 448.0f, kUe8m0FloorE4m3), 127);  // exactly representable: no round up
  EXPECT_EQ(ue8m0_scale_byte(449.0f, 448.0f, kUe8m0FloorE4m3), 128);
  EXPECT_EQ(ue8m0_scale_byte(0.0f, 448.0f, kUe8m0FloorE4m3), ue8m0_scale_byte(1e-4f, 448.0f, kUe8m0FloorE4m3));
  EXPECT_EQ(float_from_ue8m0(127), 1.0f);
  EXPECT_EQ(float_from_ue8m0(130), 8.0f);
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(bf16_bits_from_float(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly half-way between 1 and 1 + 2^-7: even (1.0) wins.
  EXPECT_EQ(bf16_bits_from_float(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(bf16_bits_from_float(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(bf16_bits_from_float(-2.0f), 0xc000);
  EXPECT_TRUE(std::isnan(round_to_bf16(std::nanf(""))));
  std::mt19937_64 rng(testing::fresh_seed());
  for (float x : testing::random_normal(rng, 10000, 100.0f)) {
    const float r = round_to_bf16(x);
    EXPECT_LE(std::fabs(r - x), std::fabs(x) * std::ldexp(1.0f, -8));
    EXPECT_EQ(round_to_bf16(r), r);
  }
}

}  // namespace
}  // namespace dsv4
