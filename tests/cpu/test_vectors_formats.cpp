// Known-answer vectors of shared/vectors/formats.safetensors (an independent float64
// implementation of SPEC §3) against include/dsv4/formats.hpp. The inputs are read as stored
// (F64 inputs stay double, so the encoders see exactly the generator's values).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <sstream>
#include <vector>

#include "dsv4/formats.hpp"
#include "dsv4/safetensors.hpp"
#include "testing/testing.hpp"

namespace dsv4 {
namespace {

class FormatVectors : public ::testing::Test {
 protected:
  FormatVectors() : file_(SafetensorsFile::open(testing::vector_path("formats.safetensors"))) {}

  // The tensor `name` as stored, one element per entry.
  template <class T>
  std::vector<T> read(const std::string& name, DType dtype) const {
    const Tensor t = file_.read_raw(name, dtype, {-1});
    std::vector<T> out(static_cast<std::size_t>(t.numel()));
    std::memcpy(out.data(), t.data(), t.nbytes());
    return out;
  }

  SafetensorsFile file_;
};

std::string hex(unsigned v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

TEST_F(FormatVectors, E4m3Codes) {
  const auto inputs = read<double>("e4m3_in", DType::F64);
  const auto codes = read<std::uint8_t>("e4m3_code", DType::U8);
  ASSERT_EQ(inputs.size(), codes.size());
  ASSERT_GT(inputs.size(), 0u);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_EQ(hex(e4m3_from(inputs[i])), hex(codes[i])) << "e4m3_in[" << i << "] = " << inputs[i];
  }
}

TEST_F(FormatVectors, Ue8m0ScaleBytes) {
  const auto amax = read<float>("ue8m0_amax", DType::F32);
  const auto for_e4m3 = read<std::uint8_t>("ue8m0_e4m3_byte", DType::U8);
  const auto for_e2m1 = read<std::uint8_t>("ue8m0_e2m1_byte", DType::U8);
  ASSERT_EQ(amax.size(), for_e4m3.size());
  ASSERT_EQ(amax.size(), for_e2m1.size());
  ASSERT_GT(amax.size(), 0u);
  for (std::size_t i = 0; i < amax.size(); ++i) {
    EXPECT_EQ(ue8m0_scale_byte(amax[i], kE4m3Max, kUe8m0FloorE4m3), for_e4m3[i]) << "F = 448, amax " << amax[i];
    EXPECT_EQ(ue8m0_scale_byte(amax[i], kE2m1Max, kUe8m0FloorE2m1), for_e2m1[i]) << "F = 6, amax " << amax[i];
  }
}

// Every e2m1 code exactly, including zeros: a value that rounds to zero is +0 (code 0x0) even when
// negative (e.g. -0.25), as the published reference writes it.
TEST_F(FormatVectors, E2m1Codes) {
  const auto inputs = read<double>("e2m1_in", DType::F64);
  const auto codes = read<std::uint8_t>("e2m1_code", DType::U8);
  ASSERT_EQ(inputs.size(), codes.size());
  ASSERT_GT(inputs.size(), 0u);
  int zeros = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if ((codes[i] & 0x7) == 0) ++zeros;
    EXPECT_EQ(hex(e2m1_from(inputs[i])), hex(codes[i])) << "e2m1_in[" << i << "] = " << inputs[i];
  }
  EXPECT_LT(zeros, static_cast<int>(inputs.size()) / 2) << "the vectors must mostly test non-zero codes";
}

TEST_F(FormatVectors, Bf16BitsLittleEndian) {
  const auto inputs = read<float>("bf16_in", DType::F32);
  const auto bytes = read<std::uint8_t>("bf16_bits", DType::U8);
  ASSERT_EQ(bytes.size(), 2 * inputs.size());
  ASSERT_GT(inputs.size(), 0u);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const unsigned expected = bytes[2 * i] | (static_cast<unsigned>(bytes[2 * i + 1]) << 8);
    EXPECT_EQ(hex(bf16_bits_from_float(inputs[i])), hex(expected)) << "bf16_in[" << i << "] = " << inputs[i];
  }
}

}  // namespace
}  // namespace dsv4
