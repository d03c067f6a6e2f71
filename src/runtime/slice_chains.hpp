// src/runtime/slice_chains.hpp — the host's rule for a pool's slice chains (plain C++).
//
// Two-pass long windows without overlap (C128) on CUDA keep, per slot, the running softmax
// statistics of the open block's complete 8-row slices, left-folded per candidate group in slice
// order ("chains", cuda/compressor/two_pass.cuh, keep_slice_chains). A decode step then folds only the slice
// it completes into them, and the block's event merges them with its last slice: the same
// operations, in the same order, as folding the whole window, so the same bytes. The host tracks per
// slot whether the chains hold exactly the complete slices of the open block ("complete"); only then
// does a step use them (launch.cu), and a step that does not keep them leaves them incomplete until
// the next block starts. A rollback that drops the last folded slice keeps them, through an undo record.
#pragma once

#include <cstdint>

namespace dsv4 {

inline constexpr int kChainSliceRows = 8;  // rows of a slice (cuda/compressor/config.hpp kSliceCandidates)

// A step from `prefix` to `end` tokens completes a slice (ratios are multiples of a slice).
constexpr bool completes_slice(std::int64_t prefix, std::int64_t end) {
  return end / kChainSliceRows > prefix / kChainSliceRows;
}

// No slice of the open block is complete at `tokens`: chains with nothing folded are complete.
constexpr bool chains_trivially_complete(std::int64_t tokens, int ratio) { return tokens % ratio < kChainSliceRows; }

// What the host knows of a slot's chains. `undo`: complete but for the group of the next slice to
// fold, whose chain is the slot's undo record instead — a rollback dropped the last folded slice,
// and each fold keeps, as the undo record, its group's chain from before it.
struct ChainState {
  bool complete = true;
  bool undo = false;
};
inline constexpr ChainState kChainsLost{false, false};

// After a step from `prefix` to `end` tokens whose kernel folded every slice it completed into the
// chains (`kept`) or not: complete if they were and the step kept them or completed no slice.
constexpr ChainState chains_after_step(ChainState before, std::int64_t prefix, std::int64_t end, int ratio,
                                       bool kept) {
  if (chains_trivially_complete(end, ratio)) return {};
  if (!before.complete) return kChainsLost;
  if (!completes_slice(prefix, end)) return before;
  return kept ? ChainState{} : kChainsLost;
}

// After a rollback from `tokens` to `rolled_to`: unchanged if no folded slice was dropped; with the
// undo record standing for its group's chain if exactly the last folded one was (max_rollback ≤ 8
// drops at most one, and never a second before the first is folded again); lost otherwise.
constexpr ChainState chains_after_rollback(ChainState before, std::int64_t tokens, std::int64_t rolled_to,
                                           int ratio) {
  if (chains_trivially_complete(rolled_to, ratio)) return {};
  if (!before.complete || rolled_to / ratio != tokens / ratio) return kChainsLost;
  const std::int64_t dropped = tokens / kChainSliceRows - rolled_to / kChainSliceRows;
  if (dropped == 0) return before;
  return dropped == 1 && !before.undo ? ChainState{true, true} : kChainsLost;
}

}  // namespace dsv4
