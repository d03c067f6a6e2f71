// RMSNorm and Walsh–Hadamard (SPEC §3) against straightforward long-double formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "dsv4/error.hpp"
#include "dsv4/norms.hpp"
#include "testing/testing.hpp"

namespace dsv4 {
namespace {

TEST(RmsNorm, MatchesFormulaWithAndWithoutWeight) {
  std::mt19937_64 rng(testing::fresh_seed());
  for (int n : {1, 7, 128, 512}) {
    const std::vector<float> x = testing::random_normal(rng, static_cast<std::size_t>(n), 3.0f);
    const std::vector<float> w = testing::random_floats(rng, static_cast<std::size_t>(n), 0.5f, 1.5f);
    const double eps = 1e-6;
    long double ss = 0;
    for (float v : x) ss += static_cast<long double>(v) * v;
    const long double inv = 1.0L / std::sqrt(ss / n + eps);
    std::vector<float> y(static_cast<std::size_t>(n), NAN), y_plain(static_cast<std::size_t>(n), NAN);
    rms_norm(x.data(), w.data(), n, eps, y.data());
    rms_norm(x.data(), nullptr, n, eps, y_plain.data());
    for (int k = 0; k < n; ++k) {
      const auto i = static_cast<std::size_t>(k);
      EXPECT_NEAR(y[i], static_cast<double>(w[i] * x[i] * inv), 1e-6 * std::fabs(static_cast<double>(w[i] * x[i] * inv)) + 1e-30);
      EXPECT_NEAR(y_plain[i], static_cast<double>(x[i] * inv), 1e-6 * std::fabs(static_cast<double>(x[i] * inv)) + 1e-30);
    }
    // The unweighted output's RMS is sqrt(ms / (ms + eps)) with ms the mean square of x: 1 but for eps,
    // which is not negligible when a short row happens to be small (n = 1, |x| ≈ 0.1: 1 − 5e-5).
    double rms = 0;
    for (float v : y_plain) rms += static_cast<double>(v) * v;
    const long double mean_square = ss / n;
    EXPECT_NEAR(std::sqrt(rms / n), static_cast<double>(std::sqrt(mean_square / (mean_square + eps))), 1e-5);
    // In place gives the same result.
    std::vector<float> z = x;
    rms_norm(z.data(), w.data(), n, eps, z.data());
    EXPECT_EQ(z, y);
  }
}

TEST(RmsNorm, EpsDominatesTinyInputs) {
  std::mt19937_64 rng(testing::fresh_seed());
  const std::vector<float> x = testing::random_normal(rng, 64, 1e-6f);
  std::vector<float> y(64);
  rms_norm(x.data(), nullptr, 64, 1.0, y.data());
  for (std::size_t k = 0; k < 64; ++k) EXPECT_NEAR(y[k], x[k], 1e-12);  // /sqrt(≈0 + 1)
}

TEST(RmsNorm, Errors) {
  std::vector<float> x(4, 1.0f), y(4, -7.0f);
  testing::expect_error("n", [&] { rms_norm(x.data(), nullptr, 0, 1e-6, y.data()); });
  testing::expect_error("eps", [&] { rms_norm(x.data(), nullptr, 4, -1.0, y.data()); });
  testing::expect_error("eps", [&] { rms_norm(x.data(), nullptr, 4, std::nan(""), y.data()); });
  testing::expect_error("x", [&] { rms_norm(nullptr, nullptr, 4, 1e-6, y.data()); });
  testing::expect_error("y", [&] { rms_norm(x.data(), nullptr, 4, 1e-6, nullptr); });
  EXPECT_EQ(y, std::vector<float>(4, -7.0f));
}

// The Sylvester matrix built literally by its recursion, to check the ordering.
std::vector<std::vector<int>> sylvester(int n) {
  std::vector<std::vector<int>> h{{1}};
  for (int k = 1; k < n; k *= 2) {
    std::vector<std::vector<int>> next(static_cast<std::size_t>(2 * k), std::vector<int>(static_cast<std::size_t>(2 * k)));
    for (int i = 0; i < k; ++i)
      for (int j = 0; j < k; ++j) {
        const int v = h[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)];
        next[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)] = v;
        next[static_cast<std::size_t>(i)][static_cast<std::size_t>(j + k)] = v;
        next[static_cast<std::size_t>(i + k)][static_cast<std::size_t>(j)] = v;
        next[static_cast<std::size_t>(i + k)][static_cast<std::size_t>(j + k)] = -v;
      }
    h = next;
  }
  return h;
}

TEST(WalshHadamard, MatchesSylvesterMatrixAndIsAnInvolution) {
  std::mt19937_64 rng(testing::fresh_seed());
  for (int n : {1, 2, 4, 8, 64, 128}) {
    const auto h = sylvester(n);
    const std::vector<float> x = testing::random_normal(rng, static_cast<std::size_t>(n));
    std::vector<float> y = x;
    walsh_hadamard(y.data(), n);
    for (int i = 0; i < n; ++i) {
      long double acc = 0;
      for (int j = 0; j < n; ++j) acc += h[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)] * static_cast<long double>(x[static_cast<std::size_t>(j)]);
      const double want = static_cast<double>(acc / std::sqrt(static_cast<long double>(n)));
      EXPECT_NEAR(y[static_cast<std::size_t>(i)], want, 1e-6 * (1 + std::fabs(want))) << "n=" << n << " i=" << i;
    }
    walsh_hadamard(y.data(), n);  // H/sqrt(n) is orthogonal and symmetric
    for (std::size_t k = 0; k < x.size(); ++k) EXPECT_NEAR(y[k], x[k], 1e-5 * (1 + std::fabs(x[k])));
  }
}

TEST(WalshHadamard, RejectsSizesThatAreNotPowersOfTwo) {
  std::vector<float> x(12, 1.0f);
  for (int n : {0, 3, 12, -4}) testing::expect_error("n", [&] { walsh_hadamard(x.data(), n); });
  EXPECT_EQ(x, std::vector<float>(12, 1.0f));
  testing::expect_error("x", [] { walsh_hadamard(nullptr, 4); });
}

}  // namespace
}  // namespace dsv4
