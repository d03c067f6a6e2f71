// tests/testing/testing.hpp — helpers shared by the test suites: random data, poisoning, paths.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "dsv4/config.hpp"

namespace dsv4::testing {

// Path of a known-answer vector file in shared/vectors.
std::string vector_path(const std::string& file_name);

// Path of the built `dsv4` executable (for CLI tests).
std::string cli_path();

// A fresh temporary directory for one test (removed by the OS; names are unique per process).
std::string temp_dir();

// A fresh seed per call (std::random_device), printed to stdout so a failure can be replayed;
// the environment variable DSV4_TEST_SEED pins it.
std::uint64_t fresh_seed();

// Uniform floats in [lo, hi) from `rng`.
std::vector<float> random_floats(std::mt19937_64& rng, std::size_t n, float lo = -1.0f, float hi = 1.0f);

// Normal floats with the given standard deviation.
std::vector<float> random_normal(std::mt19937_64& rng, std::size_t n, float stddev = 1.0f);

// Runs a shell command, returns its exit status; output goes to `output` when not null.
int run_command(const std::string& command, std::string* output = nullptr);

// The RoPE table of the published compressed layers (ratio 4 / 128: base 160000 with YaRN), taken
// from the flash preset so the tests never restate the published values.
RopeConfig published_compressed_rope();

// Runs `call`, which must throw dsv4::Error whose argument() is `argument` (a gtest failure otherwise).
void expect_error(const std::string& argument, const std::function<void()>& call);

// Relative L2 error ‖a − b‖ / ‖b‖ (b is the reference).
double relative_l2(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace dsv4::testing
