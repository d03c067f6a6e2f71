// src/runtime/slice_chains.hpp — the host's rule for a pool's slice chains (plain C++).
//
// Two-pass long windows without overlap (C128) on CUDA keep, per slot, the running softmax
// statistics of the open block's complete 8-row slices, left-folded per candidate group in slice
// order ("chains", cuda/compressor/two_pass.cuh, keep_slice_chains). A decode step then folds only the slice
// it completes into them, and the block's event merges them with its last slice: the same
// operations, in the same order, as folding the whole window, so the same bytes. The host tracks per
// slot whether the chains hold exactly the complete slices of the open block ("complete"); only then
// does a step use them (launch.cu), and a step that does not keep them leaves them incomplete until
// the next block starts. Each group keeps its chains through its last two slices (by parity), so a
// rollback that drops the last folded slice keeps them, and a repeated fold writes the same values.
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

// After a step from `prefix` to `end` tokens whose kernel folded every slice it completed into the
// chains (`kept`) or not: complete if they were and the step kept them or completed no slice.
constexpr bool chains_complete_after_step(bool before, std::int64_t prefix, std::int64_t end, int ratio, bool kept) {
  return chains_trivially_complete(end, ratio) || (before && (kept || !completes_slice(prefix, end)));
}

// A rollback goes at most max_rollback below the highest count a slot reached, so while that is at
// most one slice's rows, rollbacks drop at most the last folded slice before it is folded again. With
// more, two rollbacks in a row can drop two slices, and the refold of the first reads the other buffer,
// which still holds the second (a review's host model: stale chains from max_rollback = 9 on; the CPU
// test runs it). Pools keep chains only for specs within it (cuda::slice_chain_floats).
constexpr bool rollbacks_keep_chains_exact(int max_rollback) { return max_rollback <= kChainSliceRows; }

// After a rollback from `tokens` to `rolled_to`: complete if they were and at most the last folded
// slice was dropped (its group's chain through the slice before it is the other of its two buffers;
// rollbacks_keep_chains_exact: no other slice can have been dropped since it was folded), in the same
// block.
constexpr bool chains_complete_after_rollback(bool before, std::int64_t tokens, std::int64_t rolled_to, int ratio) {
  return chains_trivially_complete(rolled_to, ratio) ||
         (before && rolled_to / ratio == tokens / ratio &&
          tokens / kChainSliceRows - rolled_to / kChainSliceRows <= 1);
}

}  // namespace dsv4
