// src/ref/norms.cpp — RMSNorm and Walsh–Hadamard with double accumulation.
#include "dsv4/norms.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "dsv4/error.hpp"

namespace dsv4 {

void rms_norm(const float* x, const float* weight, int n, double eps, float* y) {
  require(n > 0, "n", "RMSNorm width must be positive, got " + std::to_string(n));
  require(eps >= 0, "eps", "RMSNorm eps must be non-negative");
  require(x != nullptr, "x", "null pointer");
  require(y != nullptr, "y", "null pointer");
  double sum_squares = 0.0;
  for (int k = 0; k < n; ++k) sum_squares += static_cast<double>(x[k]) * x[k];
  const double inv_rms = 1.0 / std::sqrt(sum_squares / n + eps);
  for (int k = 0; k < n; ++k) {
    const double w = weight ? static_cast<double>(weight[k]) : 1.0;
    y[k] = static_cast<float>(w * (static_cast<double>(x[k]) * inv_rms));
  }
}

void walsh_hadamard(float* x, int n) {
  require(n > 0 && (n & (n - 1)) == 0, "n", "Walsh–Hadamard size must be a power of two, got " + std::to_string(n));
  require(x != nullptr, "x", "null pointer");
  std::vector<double> v(x, x + n);
  // Butterflies over strides 1, 2, 4, ...: pairs (i, i + h) → (a + b, a − b) give Sylvester order.
  for (int h = 1; h < n; h *= 2) {
    for (int i = 0; i < n; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const double a = v[static_cast<std::size_t>(j)], b = v[static_cast<std::size_t>(j + h)];
        v[static_cast<std::size_t>(j)] = a + b;
        v[static_cast<std::size_t>(j + h)] = a - b;
      }
    }
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(n));
  for (int k = 0; k < n; ++k) x[k] = static_cast<float>(v[static_cast<std::size_t>(k)] * scale);
}

}  // namespace dsv4
