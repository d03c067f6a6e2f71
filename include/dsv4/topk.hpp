// dsv4/topk.hpp — exact top-k selection of the indexer (SPEC §7), with page translation.
//
// For each query row t with V_t visible entries: if V_t ≤ K, all of 0..V_t−1; otherwise exactly
// the K entries with the largest scores, ties broken toward the lower entry number. Scores are
// ranked as floats with −0 equal to +0 and NaN below every number. A row is written in ascending
// entry order (the SPEC leaves the order free; ascending is also the "sorted" output), unused slots
// hold −1. The result is deterministic: it depends only on the row's scores and V_t.
#pragma once

#include <cstdint>
#include <cstring>

#include "dsv4/formats.hpp"
#include "dsv4/indexer.hpp"

namespace dsv4 {

// Selects the top-K of each row.
//   scores   F32 [N_q, S], row t's candidates are scores[t, 0:V_t)
//   rows     query_start / visible (V_t ≤ S) / page_table (only read when `slots` is given)
//   entries_per_page   P / m, for the page translation
//   indices  I32 [N_q, K], K ≥ 1: entry numbers, ascending, then −1
//   slots    I32 [N_q, K] or empty: physical slots page_table[b][s / P·m] · (P/m) + s mod (P/m), −1 padding
// On CUDA, S ≤ 262144 (1M tokens at m = 4). indices and slots share no byte with an input or with each
// other. Throws Error naming the argument for any violation.
void indexer_topk(const TensorView& scores, const IndexerRowsView& rows, int entries_per_page,
                  const TensorView& indices, const TensorView& slots, const IndexerOptions& options = {});

// The largest row width the CUDA top-k accepts.
inline constexpr std::int64_t kTopkMaxCandidates = 262144;

// Order-preserving 32-bit key of a score: a > b as floats ⇔ key(a) > key(b), with −0 mapped to +0
// and every NaN to 0 (below −inf). Shared by the CPU reference and the kernels so both rank alike.
DSV4_HD std::uint32_t topk_order_key(float score) {
  std::uint32_t bits = detail::float_bits(score);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0u;  // NaN
  if (bits == 0x80000000u) bits = 0u;                 // −0 ranks as +0
  // Negative scores flip every bit (a larger magnitude ranks lower), the others only the sign bit.
  return bits ^ (static_cast<std::uint32_t>(static_cast<std::int32_t>(bits) >> 31) | 0x80000000u);
}

// The float a key came from (the canonical one: +0 for ±0; NaN for key 0).
DSV4_HD float topk_key_value(std::uint32_t key) {
  return detail::bits_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

}  // namespace dsv4
