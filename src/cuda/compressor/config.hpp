// src/cuda/compressor/config.hpp — thread layouts of the compressor kernels (compile-time traits).
//
// A "unit" computes one work item (params.hpp). Lane l of a unit owns channels [4l, 4l + 4) of the
// c-wide entry, so every global access is one 16-byte vector and every reduction of the
// post-processing (RMSNorm sum, scale-block maxima, Walsh–Hadamard) runs across lanes.
// A two-pass unit may split the candidate rows of an event into kGroups groups of kLanes threads
// (C128: 128 rows per branch are too many for one thread); their partial softmax statistics are
// merged in shared memory in group order, so the result never depends on scheduling. Units
// smaller than 128 threads (c = 128: one warp) are packed 128 / unit per block.
//
// Rows reach a thread through cp.async into its own shared-memory slots ("staging"), not
// registers: a thread copies kBatch candidates (kv, score and, where ape is large, the ape row)
// and reads back only what it copied, so no barrier is needed, registers stay low (more blocks
// per SM) and, with two stages, the next batch is in flight while this one is reduced.
#pragma once

namespace dsv4::cuda::compressor {

template <int kWidth_, int kGroups_>
struct UnitConfig {
  static constexpr int kWidth = kWidth_;                 // c: values per entry
  static constexpr int kGroups = kGroups_;               // candidate-row groups per unit
  static constexpr int kLanes = kWidth / 4;              // one float4 of channels per lane
  static constexpr int kWarpsPerGroup = kLanes / 32;
  static constexpr int kUnitThreads = kLanes * kGroups;
  static constexpr int kUnitsPerBlock = kUnitThreads >= 128 ? 1 : 128 / kUnitThreads;
  static constexpr int kBlockThreads = kUnitThreads * kUnitsPerBlock;
  // A unit of one warp synchronizes with __syncwarp; a larger unit is the whole block.
  static constexpr bool kWarpUnit = kUnitThreads == 32;

  static_assert(kWidth % 128 == 0, "a group is whole warps: c must be a multiple of 128");
  static_assert(kWarpUnit || kUnitsPerBlock == 1, "multi-warp units own their block");
};

// Staging of one kernel: kStages × kBatch candidates (rows) × kVectors 16-byte vectors per thread.
template <int kBatch_, int kStages_, bool kStageApe_, int kBlockThreads>
struct StagingConfig {
  static constexpr int kBatch = kBatch_;        // rows copied before any math on them
  static constexpr int kStages = kStages_;      // 2: the next batch is in flight during this one's math
  static constexpr bool kStageApe = kStageApe_; // copy the ape row too (large ape: C128); else __ldg (L1-hot)
  static constexpr int kVectors = kStageApe ? 3 : 2;
  static constexpr int kBytes = kStages * kBatch * kVectors * 16 * kBlockThreads;  // dynamic shared memory
  // Host only: ask for a shared-memory carveout that holds kMinBlocksPerSM blocks (where that needs
  // a larger configuration than the driver might pick; the rest of the SM's memory stays L1).
  static constexpr bool kCarveoutForMinBlocks = false;
};

constexpr int two_pass_groups(int width, bool long_window) { return !long_window ? 1 : width >= 512 ? 2 : 4; }

// Long windows (C128) fold an event's K candidates in slices of kSliceCandidates consecutive
// candidates (slice s = [8s, min(8s + 8, K)), ceil(K/8) of them), each folded from scratch; group g
// of G owns slices [g·S/G, (g+1)·S/G) (S = ceil(K/8)) and merges them into its chain by a left fold
// in slice order, then the groups merge in group order (two_pass.cuh). That shape alone defines the
// bytes, so the threads that run it do not matter: a prefill unit folds all slices itself (a group
// streams its slices back to back through the staging), while a decode step may spread them over
// kSplitUnits blocks whose partials the last of them merges (identical results).
inline constexpr int kSliceCandidates = 8;
// Slices the split path covers (K ≤ 16 · 8 = 128 candidates: every C128 window); longer windows
// always run in one unit.
inline constexpr int kMaxSplitSlices = 16;

// Two-pass (softmax over the stored rows of the window). Batches of 4 candidates in two stages:
//   short windows (C4: 8 candidates = both stages, copied together): ape from L1 (16 KB for C4);
//     32 KB of staging per 128 threads, 4 blocks per SM (≤ 128 registers; 5 would spill);
//   long windows (C128): the slices split over 2 (c = 512) or 4 (c = 128) groups, ape staged;
//     96 KB per 256-thread block (2 per SM) or 48 KB per 128 (4 per SM). The group's chain of merged
//     slices lives in registers (no more shared memory than the unsliced kernel had).
// kSplit: the decode instantiation of a long window (launch.cu chooses it per step): split units
// first in the grid, ring rows' ape not copied (it is never read: the ring holds score + ape).
template <int kWidth, bool kLongWindow, bool kSplit_ = false>
struct TwoPassConfig : UnitConfig<kWidth, two_pass_groups(kWidth, kLongWindow)>,
                       StagingConfig<4, 2, kLongWindow,
                                     UnitConfig<kWidth, two_pass_groups(kWidth, kLongWindow)>::kBlockThreads> {
  using Unit = UnitConfig<kWidth, two_pass_groups(kWidth, kLongWindow)>;
  static constexpr int kMinBlocksPerSM = kLongWindow ? 512 / Unit::kBlockThreads : 4;
  static constexpr bool kSlicedFold = kLongWindow;  // fold in slices (above); short windows: one running fold
  static constexpr int kSliceBatches = kSliceCandidates / 4;  // batches per slice (kBatch = 4)
  static constexpr bool kSplit = kSplit_;
  // Events take their divisions and window addresses once per event (two_pass.cuh, WindowOffsets):
  // only the lean instantiation, TwoPassFiveBlocksConfig<c, true>.
  static constexpr bool kHoistedWindow = false;
  // Ape from L1 (short windows): a batch's ape vectors are loaded before the wait for its copies
  // (two_pass.cuh, pool_candidates), 16 more registers live across the wait.
  static constexpr bool kApeBeforeWait = !kLongWindow;
  // The candidates' kv and score rows copied with an L2 evict-first policy: WithEvictFirstRows.
  static constexpr bool kEvictFirstRows = false;
  // A split event takes at most kSplitUnits blocks (one slice a group); a step may run it on
  // kSplitUnits / 2^k blocks instead, each group folding 2^k slices (params.hpp, split_units).
  static constexpr int kSplitUnits = kMaxSplitSlices / Unit::kGroups;
  static_assert(!kSplit || kLongWindow, "only long windows are split");
  static_assert(!kLongWindow || Unit::kUnitsPerBlock == 1, "a split unit is one block");
  static_assert(kMaxSplitSlices % Unit::kGroups == 0, "every split unit folds one slice per group");
};

// Short-window prefill with 5 blocks per SM (ShortWindowPrefill::FiveBlocksPerSM, params.hpp): the
// same kernel source and staging as TwoPassConfig<kWidth, false>, only __launch_bounds__ asks for 5
// blocks of 128 threads, capping registers at 96 (ptxas: 96, no spill; 118 / 112 at 4 blocks). A
// C4 event is a long dependent chain (copies → fold → RMSNorm → RoPE → encode → store) of ~7000
// warp instructions; 20 instead of 16 warps per SM keep 25% more windows in flight and give the
// schedulers more independent chains. 5 × (32 KB + 1 KB) of shared memory needs the 196 KB
// configuration (the 4-block kernel ran in 164 KB), asked for at the first launch.
// The arithmetic is the PTX's (explicitly rounded operations), so the bytes are the 4-block kernel's.
// kLean (ShortWindowPrefill::FiveBlocksPerSMLean): fewer instructions per event, same bytes — each
// event's integer work (the divisions by m, R and the entries per page: FastDivisor,
// cuda/common/fast_divisor.hpp; the candidates' addresses: 32-bit offsets from per-event bases) is
// done once per event. The floating-point operations of the fold and the post-processing are unchanged.
template <int kWidth, bool kLean = false>
struct TwoPassFiveBlocksConfig : TwoPassConfig<kWidth, false> {
  static constexpr int kMinBlocksPerSM = 5;
  static constexpr bool kCarveoutForMinBlocks = true;
  static constexpr bool kHoistedWindow = kLean;
  // The non-lean kernel spills 8 bytes at 96 registers with the early ape loads; it keeps them after the wait.
  static constexpr bool kApeBeforeWait = kLean;
};

// A two-pass instantiation whose window rows (kv and score vectors) are copied with an L2 evict-first
// policy. Each row (each half row where windows overlap) is read by one event of a step; the ring items
// re-read a request's last R rows. Measured, not explained: the read-heavy prefills lose 4–7% to the
// modified lines a bench's flush leaves in the L2 (notes-indexer, twentieth session), and with
// evict-first copies the short ones get part of it back — the guess being that the flush's lines (or
// in a layer, the rows a projection has just written) stay longer. launch.cu (plan_compress_step:
// CompressStepLayout::long_requests) takes it for steps that bring some request more than
// kRingPiecesMinTokens tokens, with the lean short-window kernel and the split long-window one. H200,
// against default copies in every step (three rounds, medians): C4-512 T = 8K −9%, 256K +0.9%, 8K
// chunks on a 64K prefix −11..−12%; C4-128 8K −3%, 64K −8%, 256K −1.5%, chunks +1..2%; C128 (split
// units) 8K −8%, chunks −4..−7%. Not taken: decode steps (C4 B = 1024 −4..−6% with default copies,
// C128 B = 256 n = 8 +4% with the policy), the long-window prefill kernel (C128 256K +3.7%), the online
// kernel (64K +3.6%, 256K +6.1%).
template <class Config>
struct WithEvictFirstRows : Config {
  static constexpr bool kEvictFirstRows = true;
};

// Online (running max / sum / mean per channel, one row after another): batches of 4 rows, ape staged
// (m·c floats is large for C128). Two stages: 48 KB per 128 threads, 4 blocks per SM. A block's rows
// are a chain of batches, each waiting for its copies with kStages − 1 batches in flight.
// kOnlineDeepStages stages for steps with bodies and at most one block a SM (launch.cu): 7 batches
// in flight, 192 KB; a T = 8K prefill (64 blocks) 27.3 → 22.1 µs on the H200, once the rows of a
// batch no longer ran one after another (online.cuh). The stages do not change the arithmetic: same
// bytes.
inline constexpr int kOnlineDeepStages = 8;
template <int kWidth, int kStages = 2>
struct OnlineConfig : UnitConfig<kWidth, 1>, StagingConfig<4, kStages, true, UnitConfig<kWidth, 1>::kBlockThreads> {
  static constexpr int kMinBlocksPerSM = kStages == 2 ? 4 : 1;
};

// Vectors a thread loads into registers before its first store in a ring write (two_pass.cuh,
// write_ring_direct): one round of the write.
inline constexpr int kRingVectorsInRegisters = 8;

// A prefill's ring write (up to R rows, R = coff·m + max_rollback) is a chain of dependent rounds;
// run by one unit it outlasted every event of the step: per-unit spans on the H200 (fresh T = 8K)
// put the ring item at 19.6 µs of a C4-128 kernel whose events each took ≤ 7.4 µs, and at 31 µs of
// a C4-512 one whose events ended by 22.4 µs. Steps that bring a request more than
// kRingPiecesMinTokens tokens spread each request's write over ring_write_pieces(...) ring items, one
// round each up to kMaxRingPieces (past it, every kMaxRingPieces-th round: a long max_rollback);
// the step's largest write sets the count for every request. Decode steps keep one ring item a
// request (and its staged path, two_pass.cuh).
// (kRingPiecesMinTokens also marks the steps whose rows are copied evict-first: WithEvictFirstRows.)
inline constexpr int kRingPiecesMinTokens = 8;
inline constexpr int kMaxRingPieces = 32;

// Ring items a request's write takes: its `rows` rows of record_floats floats (kv row + score row)
// in rounds of kRingVectorsInRegisters float4 vectors a thread of a `unit_threads`-thread unit.
constexpr int ring_write_pieces(int rows, int record_floats, int unit_threads) {
  const int vectors = rows * (record_floats / 4);
  const int round = kRingVectorsInRegisters * unit_threads;
  const int pieces = (vectors + round - 1) / round;
  return pieces < 1 ? 1 : pieces > kMaxRingPieces ? kMaxRingPieces : pieces;
}

// Candidates per event above which the two-pass kernel splits an event's rows over groups.
inline constexpr int kSingleGroupMaxCandidates = 16;

}  // namespace dsv4::cuda::compressor
