// dsv4/rope.hpp — rotary position embedding tables (SPEC §3), as the checkpoints were served.
//
// The published models were served with float32 tables, so the table reproduces float32 rounding
// at every step: the frequencies are built with float32 operations, the angle is the float32
// product float32(p)·f_i, and cos/sin of that float32 angle are computed exactly (in double) and
// rounded once to float32. At large positions this matters: the angle itself carries the error.
#pragma once

#include <cstdint>
#include <vector>

#include "dsv4/config.hpp"

namespace dsv4 {

// Throws Error("rope") unless rope_dim is positive and even, the base finite and > 1, and (with YaRN)
// the factor, original_max_position_embeddings and betas finite and positive. RopeTable checks it.
void validate_rope_config(const RopeConfig& config);

class RopeTable {
 public:
  // Builds the r/2 frequencies of `config` (YaRN when config.yarn). Throws Error("rope", ...) when
  // rope_dim is not a positive even number, base ≤ 1, or the YaRN parameters are not positive.
  explicit RopeTable(const RopeConfig& config);

  const RopeConfig& config() const { return config_; }
  int rope_dim() const { return config_.rope_dim; }  // r
  // f_i, i = 0..r/2−1, float32.
  const std::vector<float>& frequencies() const { return frequencies_; }

  // θ(p, i) = float32(p) · f_i, rounded to float32 (radians).
  float angle(std::int64_t position, int i) const;
  // cos and sin of angle(position, i), exact to float32.
  void cos_sin(std::int64_t position, int i, float& cos_out, float& sin_out) const;

  // Rotates the interleaved pairs (x[2i], x[2i+1]) of `x` [r] — the LAST r dims of a head or
  // entry, i.e. pass `head + dim − r` — by θ(position, i), or by −θ when `inverse`. The rotation
  // is computed in double from the float32 cos/sin and rounded to float32. In place.
  void apply(float* x /*[r]*/, std::int64_t position, bool inverse = false) const;

 private:
  RopeConfig config_;
  std::vector<float> frequencies_;  // [r/2]
};

// Applies `table` to the last table.rope_dim() dims of `head` [dim]; Error("dim") when dim < r,
// Error("head") for a null pointer (apply: Error("x")).
void apply_rope_to_tail(const RopeTable& table, float* head /*[dim]*/, int dim, std::int64_t position,
                        bool inverse = false);

}  // namespace dsv4
