// `dsv4 compress --device cuda` follows the same contract as --device cpu (issue 4, item 5): same
// tensors, compressed rows within 1e-5, ≥ 99.9% of entry bytes equal, identical positions.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "dsv4/safetensors.hpp"
#include "testing/testing.hpp"

namespace dsv4 {
namespace {

struct Case {
  const char* vector_file;
  const char* flags;
};

class CliCompressCuda : public ::testing::TestWithParam<Case> {};

TEST_P(CliCompressCuda, MatchesTheCpuBackend) {
  const Case c = GetParam();
  const std::string dir = testing::temp_dir();
  const std::string in = testing::vector_path(c.vector_file);
  const SafetensorsFile vector_file = SafetensorsFile::open(in);
  const std::string config = testing::vector_path(vector_file.metadata().at("config"));
  const std::string layer = vector_file.metadata().at("layer");
  // Uneven chunks, single tokens included, summing to the vector's rows (every vector has > 27).
  const std::int64_t rows = vector_file.info("kv").shape[0];
  ASSERT_GT(rows, 27);
  const std::string chunks = "5,1,1,20," + std::to_string(rows - 27);
  std::string outputs[2];
  const char* devices[2] = {"cpu", "cuda"};
  for (int i = 0; i < 2; ++i) {
    outputs[i] = dir + "/out_" + devices[i] + ".safetensors";
    const std::string command = testing::cli_path() + " compress --config " + config + " --layer " + layer + " " +
                                c.flags + " --chunks " + chunks + " --in " + in + " --out " + outputs[i] +
                                " --device " + devices[i];
    std::string log;
    ASSERT_EQ(testing::run_command(command, &log), 0) << command << "\n" << log;
  }
  const SafetensorsFile cpu = SafetensorsFile::open(outputs[0]), gpu = SafetensorsFile::open(outputs[1]);
  const Tensor cc = cpu.read_float("compressed"), gc = gpu.read_float("compressed");
  ASSERT_EQ(cc.shape(), gc.shape());
  ASSERT_GT(cc.numel(), 0);
  for (std::int64_t i = 0; i < cc.numel(); ++i) {
    const float a = cc.data_as<float>()[i], b = gc.data_as<float>()[i];
    ASSERT_FALSE(std::isnan(b));
    EXPECT_LE(std::fabs(a - b), 1e-5f * std::fmax(1.0f, std::fabs(a))) << i;
  }
  const Tensor ce = cpu.read_raw("entries", DType::U8), ge = gpu.read_raw("entries", DType::U8);
  ASSERT_EQ(ce.shape(), ge.shape());
  std::int64_t equal = 0;
  for (std::int64_t i = 0; i < ce.numel(); ++i) equal += ce.data_as<std::uint8_t>()[i] == ge.data_as<std::uint8_t>()[i];
  EXPECT_GE(static_cast<double>(equal), 0.999 * static_cast<double>(ce.numel()));
  const Tensor cp = cpu.read_int32("positions"), gp = gpu.read_int32("positions");
  ASSERT_EQ(cp.shape(), gp.shape());
  for (std::int64_t i = 0; i < cp.numel(); ++i) EXPECT_EQ(cp.data_as<std::int32_t>()[i], gp.data_as<std::int32_t>()[i]);
}

INSTANTIATE_TEST_SUITE_P(Vectors, CliCompressCuda,
                         ::testing::Values(Case{"compress_c4_attention.safetensors", ""},
                                           Case{"compress_c4_indexer_fp8.safetensors", "--indexer"},
                                           Case{"compress_c4_indexer_fp4.safetensors", "--indexer --indexer-format fp4"},
                                           Case{"compress_c128.safetensors", ""},
                                           Case{"compress_c128_online.safetensors", "--online"}));

}  // namespace
}  // namespace dsv4
