// src/ref/rope.cpp — RoPE frequencies (plain and YaRN) with float32 rounding, and rotation.
#include "dsv4/rope.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "dsv4/error.hpp"

namespace dsv4 {

namespace {

// Frequencies exactly as the float32 serving code builds them: exponent 2i/r in float32,
// base^exponent rounded to float32, then a float32 reciprocal.
std::vector<float> plain_frequencies(double base, int rope_dim) {
  std::vector<float> f(static_cast<std::size_t>(rope_dim / 2));
  const float base_f = static_cast<float>(base);
  for (int i = 0; i < rope_dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(rope_dim);
    const float power = static_cast<float>(std::pow(static_cast<double>(base_f), static_cast<double>(exponent)));
    f[static_cast<std::size_t>(i)] = 1.0f / power;
  }
  return f;
}

// YaRN blend: the ramp bounds are computed in double (they are integers, floor/ceil of logs);
// the ramp and the blend are float32 operations, one rounding per step.
void apply_yarn(std::vector<float>& f, const RopeConfig& c) {
  const double r = c.rope_dim;
  const double two_pi = 2.0 * std::numbers::pi;
  const auto correction_dim = [&](double rotations) {
    return r * std::log(c.original_max_positions / (rotations * two_pi)) / (2.0 * std::log(c.base));
  };
  const double low = std::max(std::floor(correction_dim(c.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(c.beta_slow)), r - 1.0);
  if (low == high) high += 0.001;  // avoids a zero-width ramp (division by zero)
  const float factor = static_cast<float>(c.factor);
  const float width = static_cast<float>(high - low);
  for (std::size_t i = 0; i < f.size(); ++i) {
    const float t = (static_cast<float>(i) - static_cast<float>(low)) / width;
    const float ramp = std::clamp(t, 0.0f, 1.0f);
    const float scaled = f[i] / factor * ramp;
    const float kept = f[i] * (1.0f - ramp);
    f[i] = scaled + kept;
  }
}

}  // namespace

void validate_rope_config(const RopeConfig& config) {
  require(config.rope_dim > 0 && config.rope_dim % 2 == 0, "rope",
          "rope_dim must be a positive even number, got " + std::to_string(config.rope_dim));
  require(std::isfinite(config.base) && config.base > 1.0, "rope", "base must be finite and > 1");
  if (config.yarn) {
    const bool finite = std::isfinite(config.factor) && std::isfinite(config.original_max_positions) &&
                        std::isfinite(config.beta_fast) && std::isfinite(config.beta_slow);
    require(finite && config.factor > 0 && config.original_max_positions > 0 && config.beta_fast > 0 &&
                config.beta_slow > 0,
            "rope", "YaRN factor, original_max_position_embeddings, beta_fast and beta_slow must be finite and positive");
  }
}

RopeTable::RopeTable(const RopeConfig& config) : config_(config) {
  validate_rope_config(config);
  frequencies_ = plain_frequencies(config.base, config.rope_dim);
  if (config.yarn) apply_yarn(frequencies_, config);
}

float RopeTable::angle(std::int64_t position, int i) const {
  if (position < 0) throw Error("position", "must be non-negative, got " + std::to_string(position));
  if (i < 0 || i >= rope_dim() / 2)
    throw Error("i", "pair " + std::to_string(i) + " is outside [0, " + std::to_string(rope_dim() / 2) + ")");
  return static_cast<float>(position) * frequencies_[static_cast<std::size_t>(i)];
}

void RopeTable::cos_sin(std::int64_t position, int i, float& cos_out, float& sin_out) const {
  const double theta = angle(position, i);
  cos_out = static_cast<float>(std::cos(theta));
  sin_out = static_cast<float>(std::sin(theta));
}

void RopeTable::apply(float* x, std::int64_t position, bool inverse) const {
  require(x != nullptr, "x", "null pointer");
  for (int i = 0; i < rope_dim() / 2; ++i) {
    float c, s;
    cos_sin(position, i, c, s);
    const double sin_signed = inverse ? -static_cast<double>(s) : static_cast<double>(s);
    const double a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = static_cast<float>(a * c - b * sin_signed);
    x[2 * i + 1] = static_cast<float>(a * sin_signed + b * c);
  }
}

void apply_rope_to_tail(const RopeTable& table, float* head, int dim, std::int64_t position, bool inverse) {
  require(dim >= table.rope_dim(), "dim",
          "head width " + std::to_string(dim) + " is smaller than rope_dim " + std::to_string(table.rope_dim()));
  require(head != nullptr, "head", "null pointer");
  table.apply(head + (dim - table.rope_dim()), position, inverse);
}

}  // namespace dsv4
