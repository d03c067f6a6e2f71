#include "testing/testing.hpp"

#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <unistd.h>

#include <gtest/gtest.h>

#include "dsv4/error.hpp"

namespace dsv4::testing {

std::string vector_path(const std::string& file_name) {
  return std::string(DSV4_VECTORS_DIR) + "/" + file_name;
}

std::string cli_path() { return DSV4_CLI_PATH; }

std::string temp_dir() {
  static std::atomic<int> counter{0};
  auto dir = std::filesystem::temp_directory_path() /
             ("dsv4-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

std::uint64_t fresh_seed() {
  std::uint64_t seed;
  if (const char* pinned = std::getenv("DSV4_TEST_SEED")) {
    seed = std::strtoull(pinned, nullptr, 10);
  } else {
    std::random_device rd;
    seed = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  }
  std::cout << "[ seed     ] DSV4_TEST_SEED=" << seed << "\n";
  return seed;
}

std::vector<float> random_floats(std::mt19937_64& rng, std::size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

std::vector<float> random_normal(std::mt19937_64& rng, std::size_t n, float stddev) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

int run_command(const std::string& command, std::string* output) {
  std::string full = command + " 2>&1";
  FILE* pipe = ::popen(full.c_str(), "r");
  if (!pipe) return -1;
  std::array<char, 4096> buffer;
  std::string text;
  while (std::fgets(buffer.data(), static_cast<int>(buffer.size()), pipe)) text += buffer.data();
  int status = ::pclose(pipe);
  if (output) *output = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

RopeConfig published_compressed_rope() {
  const ModelConfig flash = preset_config("flash");
  for (int layer = 0; layer < flash.num_layers(); ++layer)
    if (flash.compress_ratios[static_cast<std::size_t>(layer)] > 0) return layer_config(flash, layer).rope;
  throw Error("config", "the flash preset has no compressed layer");
}

double relative_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  if (a.size() != b.size()) return INFINITY;
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

void expect_error(const std::string& argument, const std::function<void()>& call) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one naming " << argument;
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
  }
}

}  // namespace dsv4::testing
