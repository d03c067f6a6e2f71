// src/cuda/sparse_attention/wgmma_kernel.cuh — the 64-head tile on Hopper warpgroup MMA (sm_90a).
//
// One thread block = one query row × 64 heads × one chunk of split_candidates candidates, walked in
// blocks of 64 candidates. Shared memory holds Q [64 heads][512] and two K tiles [64 candidates][512],
// bf16 in the 128-byte-swizzled K-major layout wgmma reads. Three warpgroups, specialized (four in
// the launches in 4 output parts, whose two producers decode one candidate half each: WgmmaRoles):
//   producer (warpgroup 2, few registers): per block, waits until its K tile is free, loads the 64
//     entries (16-byte loads into registers, the block two ahead prefetched into L2), decodes them
//     exactly (dequant.cuh) into the tile and hands it over (named barriers "full" / "empty").
//   consumers (warpgroups 0 and 1, 128 f32 accumulators of O each): per block,
//     S = Q·Kᵀ   wgmma m64n32k16 from shared memory: consumer c scores candidates [32c, 32c + 32)
//                of all 64 heads (32 k-steps over the 512 dims);
//     softmax    the row maxima of both halves meet in shared memory (one barrier), then each
//                consumer rounds its P to bf16 in the A-fragment order of the next MMA and passes
//                it to the other (a second barrier): both then hold the same P for all 64 candidates;
//     O += P·V   wgmma m64n256k16, A = P from registers, B = the K tile read N-major (V = K);
//                consumer c owns output dims [256c, 256c + 256).
//   Dim split (small grids, launch.cu): kDimSplit blocks share one (row, head tile, chunk); each
//   runs the same producer, S and softmax (same instructions on the same data, so the same bits) and
//   the P·V of its own 512 / kDimSplit output dims (m64n128k16 / m64n64k16 per consumer), then
//   finishes or merges that slice. The merge weights, lse and probabilities are computed identically
//   in every part, so the bytes do not depend on kDimSplit.
//   Each consumer sums the probabilities of its own 32 candidates; the two running sums (rescaled
//   identically) are added in a fixed order at the end.
// The default since the sixth session is kAsymmetric (below): consumer 0 alone computes S and P of all
// 64 candidates and hands P to consumer 1 (mbarriers instead of the named barrier "full" and the two
// exchanges); the symmetric division above stays as the A/B variant (DSV4_ATTENTION_ASYMMETRIC=0).
// For 64 < H ≤ 128 (without an output-dim split) the row's two head tiles can also share the decode
// of each K block as a 2-CTA cluster (kPairDecode, the default; DSV4_ATTENTION_PAIR_DECODE=0 turns it off).
// The end of a chunk (normalize, or publish partials and merge in chunk order) uses the mma.sync
// kernel's functions (kernel.cuh), so the batch invariance argument is unchanged; the 64-head tile
// is chosen from H alone (launch.cu), so a row never switches MMA paths with the batch.
#pragma once

#include <cooperative_groups.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/ptx_sm90.cuh"
#include "cuda/sparse_attention/kernel.cuh"
#include "cuda/sparse_attention/timeline.cuh"

namespace dsv4::cuda::sparse_attention {

// Shared-memory plan (bytes from a 1024-byte aligned base) and consumer shape of the wgmma kernel; the
// producer side and the block's thread count are WgmmaRoles (below).
struct WgmmaPlan {
  static constexpr int kHeads = 64;                                  // wgmma M
  static constexpr int kConsumers = 2;                               // consumer warpgroups
  static constexpr int kConsumerThreads = 128 * kConsumers;          // threads 0 .. 255
  static constexpr int kCandidatesPerConsumer = kBlock / kConsumers; // 32 scores per head (wgmma N)
  static constexpr int kConsumerRegisters = 192;                     // per thread after the split (setmaxnreg)
  // Named barriers (0 is __syncthreads).
  static constexpr int kConsumerBarrier = 1;  // the 256 consumer threads
  static constexpr int kProducerBarrier = 6;  // the 128 producer threads (kPairDecode: half tile written)
  static constexpr int kFullBarrier = 2;      // + stage: tile written (producer arrives, consumers wait)
  static constexpr int kEmptyBarrier = 4;     // + stage: tile read (consumers arrive, producer waits)

  static constexpr int kSliceBytes = 64 * 128;                       // 64 rows × one 64-dim swizzle row
  static constexpr int kTileBytes = (kDim / 64) * kSliceBytes;       // [8 slices][64 rows][128 B]
  static constexpr int kQ = 0;                                       // bf16 Q tile (heads)
  static constexpr int kK = kQ + kTileBytes;                         // 2 bf16 K tiles (candidates)
  static constexpr int kSlots = kK + 2 * kTileBytes;                 // i32 [kMaxSplitCandidates]
  static constexpr int kValid = kSlots + kMaxSplitCandidates * 4;    // u32 [kMaxBlocksPerSplit][2]
  static constexpr int kLive = kValid + kMaxBlocksPerSplit * 2 * 4;  // i32 [kMaxBlocksPerSplit] live blocks, count, flag
  static constexpr int kRowMax = kLive + (kMaxBlocksPerSplit + 4) * 4;  // f32 [2 consumers][64 heads]
  static constexpr int kProb = kRowMax + kConsumers * kHeads * 4;   // u32 [2 consumers][8][128]: P fragments
  static constexpr int kInv = kProb + kConsumers * 8 * 128 * 4;     // f32 [64] merge 1/denominators
  static constexpr int kTables = kInv + kHeads * 4;                 // f32 [64 sinks][32 cos][32 sin] for the epilogue
  static constexpr int kTableEntries = kHeads + Entry::kRopeDim;
  // kAsymmetric: u64 mbarriers [2 tiles full][P ready][P read][2 tiles free (kPairDecode)] (racecheck
  // can follow these hand-overs; it counts the bar.sync's a thread passed, and the scorer and the
  // follower pass different numbers)
  static constexpr int kHandOver = kTables + kTableEntries * 4;
  // kClusterMerge: float2 (max, sum) [chunk c][head of this block's merge share], pushed by every chunk
  // before the cluster barrier (merge_in_cluster). C · ⌈64 / C⌉ < 64 + C entries for C ≤ 16 chunks.
  static constexpr int kPushedStats = kHandOver + 6 * 8;
  static constexpr int kPushedStatsEntries = kHeads + 16;
  static constexpr int kEnd = kPushedStats + kPushedStatsEntries * 8;
  static constexpr int kSmemBytes = kEnd + static_cast<int>(ptx::kSwizzleAtomBytes);  // + alignment slack
  // The merge keeps its weights [64][chunks] where the Q and K tiles were.
  static constexpr int kMaxChunks = kSlots / (kHeads * 4);
  static_assert(kMaxChunks >= kMaxChunksPerRow, "the merge weights fit");
  static_assert(kConsumerThreads + 128 >= kTableEntries && kTables % 16 == 0, "one table entry per thread, aligned");
  static_assert(kSmemBytes <= 227 * 1024, "fits the opt-in shared memory of one Hopper block");
  static_assert(kK % 1024 == 0 && kSlots % 16 == 0 && kValid % 16 == 0 && kLive % 16 == 0 && kRowMax % 16 == 0 &&
                    kProb % 16 == 0 && kInv % 16 == 0 && kHandOver % 8 == 0 && kPushedStats % 8 == 0,
                "swizzled tiles on 1024-byte boundaries, every other region 16-byte aligned");
  // The gather: 4 producer threads per candidate, 32 candidates per pass, each thread 9 of the
  // entry's 36 16-byte pieces (7 code pieces sub + 4i, whose scale byte is i; then 2 RoPE pieces).
  static constexpr int kThreadsPerEntry = 4;
  static constexpr int kPasses = kBlock * kThreadsPerEntry / 128;  // 2: candidate halves of a warpgroup each
  static constexpr int kPiecesPerThread = Entry::kDataBytes / 16 / kThreadsPerEntry;
  static constexpr int kCodePiecesPerThread = Entry::kNopeDim / 16 / kThreadsPerEntry;
  static_assert(kPiecesPerThread == 9 && kCodePiecesPerThread == 7 && kPasses == 2, "gather shape");
  static_assert(Entry::kQuantBlock == 16 * kThreadsPerEntry, "code piece sub + 4i uses scale byte i");
  // kPairDecode: CTA rank r of the pair decodes candidates [32r, 32r + 32) of each block (the
  // producer's pass r) into its own tile and the peer's: 32 bf16 rows of 1 KB to the peer.
  static constexpr std::uint32_t kPeerHalfBytes = kBlock / kPasses * kDim * 2;
  // In each 64-dim slice of a tile the half's rows are one contiguous run: one bulk copy per slice.
  static constexpr std::uint32_t kPeerRunBytes = kBlock / kPasses * 128;
  static_assert(kPeerRunBytes * (kDim / 64) == kPeerHalfBytes, "the half tile is kDim / 64 runs");
  static constexpr int kStageFreeArrivals = 2 * kConsumerThreads / 32;  // a consumer warp of either CTA
};

// The block's producer warpgroups and its register split. One producer (threads 256 .. 383) decodes
// both candidate halves of every block, the next half's loads in flight while it decodes one. Two
// producers (threads 256 .. 511) decode one half each, without loads ahead (64 registers a thread):
// measured faster where few blocks share the card (the launches in 4 output parts, ≤ 33 blocks
// before the split: B=1 −2..−6%) and slower where the grid fills it (2 parts, B=32 N=2176 +2%; one
// part, B=128 +4%, prefill +5%), where the loads ahead hide a longer memory latency.
// setmaxnreg only redistributes the block's own registers: the block is launched with
// 65536 / kThreads per thread (168 or 128, multiples of 8), and asking for more than the producers
// released hangs (a first version asked 2·192 + 128).
template <int kProducerGroups>
struct WgmmaRoles : WgmmaPlan {
  static_assert(kProducerGroups == 1 || kProducerGroups == 2, "one or two producer warpgroups");
  static constexpr int kProducers = kProducerGroups;
  static constexpr int kProducerThreads = 128 * kProducers;
  static constexpr int kThreads = kConsumerThreads + kProducerThreads;
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
  static constexpr int kProducerRegisters = kProducers == 1 ? 120 : 64;
  static_assert(kConsumers * kConsumerRegisters + kProducers * kProducerRegisters <= kLaunchRegisters * kThreads / 128,
                "the registers the producers release cover what the consumers ask for");
};
// The launches in 4 output parts (the smallest grids) take two producers, the others one.
template <int kDimSplit>
using WgmmaRolesFor = WgmmaRoles<kDimSplit == 4 ? 2 : 1>;

// Byte offset of bf16 elements [d, d + 8) (d a multiple of 8) of row r of a swizzled [64][512] tile:
// slice d / 64, row r, 16-byte group (d mod 64) / 8 at position group ^ (r mod 8).
__device__ __forceinline__ int tile_offset(int r, int d) {
  return (d / 64) * WgmmaPlan::kSliceBytes + r * 128 + ((((d % 64) / 8) ^ (r % 8)) * 16);
}

// A producer thread's share of one candidate entry, as loaded.
struct EntryShare {
  static constexpr int kRopePieces = WgmmaPlan::kPiecesPerThread - WgmmaPlan::kCodePiecesPerThread;
  const std::uint8_t* data;  // the entry's 576 data bytes, or null for a masked candidate
  uint4 piece[WgmmaPlan::kCodePiecesPerThread];  // 16-byte pieces sub + 4i (e4m3 codes)
  uint2 scales;                                  // the 8-byte scale record
  uint4 rope[kRopePieces];                       // bf16 RoPE pieces sub + 4i (only kRopeAhead)
};

// Loads the code pieces of `share_index` = 4·e + sub (candidate e of block `block`, pieces
// sub + 4i), and with kRopeAhead its RoPE pieces too (one round trip for the share; otherwise
// store_entry_share loads them); zeros for a masked candidate (nothing is read).
template <bool kRopeAhead>
__device__ __forceinline__ void load_entry_codes(const SparseAttentionParams& p, const int* s_slots, int chunk_begin,
                                                 int block, int share_index, EntryShare& share) {
  constexpr int kSplit = WgmmaPlan::kThreadsPerEntry;
  const int e = share_index / kSplit, sub = share_index % kSplit, c = block * kBlock + e;
  const int slot = s_slots[c];
  if (slot < 0) {
#pragma unroll
    for (int i = 0; i < WgmmaPlan::kCodePiecesPerThread; ++i) share.piece[i] = make_uint4(0, 0, 0, 0);
    share.scales = make_uint2(0, 0);
    share.data = nullptr;
    if constexpr (kRopeAhead) {
#pragma unroll
      for (auto& piece : share.rope) piece = make_uint4(0, 0, 0, 0);
    }
    return;
  }
  const EntryAddress a = entry_address(p, chunk_begin, c, slot);
  share.data = a.data;
#pragma unroll
  for (int i = 0; i < WgmmaPlan::kCodePiecesPerThread; ++i)
    share.piece[i] = ptx::load_stream_v4(a.data + (sub + kSplit * i) * 16);
  share.scales = ptx::load_stream_v2(a.scales);
  if constexpr (kRopeAhead) {
#pragma unroll
    for (int i = 0; i < EntryShare::kRopePieces; ++i)
      share.rope[i] = ptx::load_stream_v4(a.data + Entry::kNopeDim + (sub + kSplit * i) * 16);
  }
}

// Decodes a loaded share into K tile `tile` (candidate row e): code piece k = sub + 4i holds dims
// [16k, 16k + 16) with scale byte i. Then copies the RoPE pieces j = sub + 4i' (bf16 dims
// 448 + 8j .. + 8; loaded here unless kRopeAhead); zeros for a masked candidate.
template <bool kRopeAhead, bool kOneFactorPath>
__device__ __forceinline__ void store_entry_share(const EntryShare& share, std::uint8_t* tile, int share_index) {
  constexpr int kSplit = WgmmaPlan::kThreadsPerEntry;
  constexpr int kRopePieces = EntryShare::kRopePieces;
  const int e = share_index / kSplit, sub = share_index % kSplit;
  uint4 rope[kRopePieces];
#pragma unroll
  for (int i = 0; i < kRopePieces; ++i) {
    if constexpr (kRopeAhead) rope[i] = share.rope[i];
    else rope[i] = share.data != nullptr ? ptx::load_stream_v4(share.data + Entry::kNopeDim + (sub + kSplit * i) * 16)
                                         : make_uint4(0, 0, 0, 0);
  }
  // kOneFactorPath: entries whose every block scale keeps 2^(e−7) a normal bf16 (all but extreme ones)
  // take one multiply a code pair; the branch is per entry, so each path stays straight-line code.
  // (Measured, notes §31: −1.5..−3% where one CTA decodes its tiles; +1% in the pair decode, which
  // keeps the single path.)
  const auto decode_codes = [&](auto one_factor) {
#pragma unroll
    for (int i = 0; i < WgmmaPlan::kCodePiecesPerThread; ++i) {
      uint4 lo, hi;
      dequantize_e4m3x16<decltype(one_factor)::value>(share.piece[i], scale_byte(share.scales, i), lo, hi);
      const int d = 16 * (sub + kSplit * i);
      *reinterpret_cast<uint4*>(tile + tile_offset(e, d)) = lo;
      *reinterpret_cast<uint4*>(tile + tile_offset(e, d + 8)) = hi;
    }
  };
  if (kOneFactorPath && scales_take_one_factor(share.scales, WgmmaPlan::kCodePiecesPerThread))
    decode_codes(std::true_type{});
  else
    decode_codes(std::false_type{});
#pragma unroll
  for (int i = 0; i < kRopePieces; ++i)
    *reinterpret_cast<uint4*>(tile + tile_offset(e, Entry::kNopeDim + 8 * (sub + kSplit * i))) = rope[i];
}

// How the producer(s) and the consumers pass the two K tiles back and forth.
//   kNamed (symmetric kernel): named barriers "full" + stage (both consumers wait) and "empty" + stage.
//   kLocal (asymmetric): "full" is the mbarrier full[stage] (the producer's 128 arrivals; only the
//     scorer waits: phase it / 2 completes with block it); "empty" stays named.
//   kPair (asymmetric, 2-CTA pair decode): each CTA's producer decodes half of every block into both
//     CTAs' tiles (its own by stores, the peer's by bulk copies of the copy engine); full[stage] also
//     counts the peer producer's expect_tx arrival and its 32 KB; "empty" is the mbarrier
//     free[stage], one arrival per consumer warp of both CTAs.
enum class TileSync { kNamed, kLocal, kPair };

template <TileSync kSync, int kThreads>
struct TileHandOver {
  std::uint64_t* full = nullptr;  // [2] (kLocal, kPair)
  std::uint64_t* free = nullptr;  // [2] (kPair)
  std::uint32_t rank = 0;         // kPair: this CTA's rank in the pair = its head tile
  std::uint32_t peer_k = 0;       // kPair: the peer's K tiles (shared::cluster)
  std::uint32_t peer_full = 0;    // kPair: the peer's full[0] (shared::cluster; + 8 per stage)

  // Producer: the stage of block it is free again (every consumer released block it − 2).
  __device__ void wait_free(int it) const {
    if constexpr (kSync == TileSync::kPair) ptx::mbarrier_wait(free + it % 2, (it / 2 - 1) & 1);
    else ptx::barrier_sync(WgmmaPlan::kEmptyBarrier + it % 2, kThreads);
  }
  // Producer: this thread's part of tile `stage` is written and fenced for the tensor cores.
  __device__ void arrive_full(int stage) const {
    if constexpr (kSync == TileSync::kNamed) ptx::barrier_arrive(WgmmaPlan::kFullBarrier + stage, kThreads);
    else ptx::mbarrier_arrive(full + stage);
  }
  // Consumer: the tile of block it is complete. (kPair: the proxy fence puts the peer's copied
  // bytes before this warpgroup's wgmma reads.)
  __device__ void wait_full(int it) const {
    if constexpr (kSync == TileSync::kNamed) {
      ptx::barrier_sync(WgmmaPlan::kFullBarrier + it % 2, kThreads);
    } else {
      ptx::mbarrier_wait(full + it % 2, (it / 2) & 1);
      if constexpr (kSync == TileSync::kPair) ptx::fence_proxy_async_shared();
    }
  }
  // Consumer: this warp's MMAs on tile `stage` are complete (waited); its producer(s) may rewrite it.
  __device__ void release(int stage, int lane) const {
    if constexpr (kSync == TileSync::kPair) {
      if (lane == 0) {
        const std::uint32_t own = ptx::smem_address(free + stage);
        ptx::mbarrier_arrive_cluster(ptx::map_to_rank(own, 0));
        ptx::mbarrier_arrive_cluster(ptx::map_to_rank(own, 1));
      }
    } else {
      ptx::barrier_arrive(WgmmaPlan::kEmptyBarrier + stage, kThreads);
    }
  }
};

// The candidate a producer thread asks L2 for (prefetch_block: none at ≥ kBlock): one each, or with
// the pair decode only this CTA's half.
// `pass` is the candidate half this producer warpgroup decodes where it decodes one (the pair's rank,
// or the warpgroup with two producers; −1: none, an idle warpgroup).
template <TileSync kSync, int kProducers>
__device__ __forceinline__ int prefetch_index(int ptid, int pass) {
  if constexpr (kSync != TileSync::kPair && kProducers == 1) return ptid;
  return (kProducers == 1 || pass >= 0) && ptid < kBlock / 2 ? pass * (kBlock / 2) + ptid : kBlock;
}

// The candidate half producer warpgroup `producer` decodes: with one producer, both (−2 = all); the
// pair's rank; with two producers, its own; the pair with two producers leaves the second idle (−1).
template <TileSync kSync, int kProducers>
__device__ __forceinline__ int producer_pass(int producer, std::uint32_t rank) {
  if constexpr (kSync == TileSync::kPair) return kProducers == 1 || producer == 0 ? static_cast<int>(rank) : -1;
  if constexpr (kProducers == 2) return producer;
  return -2;
}

// The producer warpgroup's loop: block it goes to tile it % 2 once the consumers released the block
// that used it before (it − 2). A thread's work is a sequence of units, one share (one of its kUnits
// candidate passes) each: while unit u is decoded, the loads of unit u + 1 (codes, scales and, where
// registers allow, RoPE pieces) are in flight. The loop is not unrolled: one copy of the load and
// decode code serves every pass. Measured against the unrolled loop that loaded both passes, then
// decoded both, with the RoPE pieces loaded at decode time (notes §22): B=128 H=64 N=640 −4%,
// prefill H=64 −6%, H=128 (pair) −0.3..−2.5%; the gain is latency hiding (the producer's
// long-scoreboard stalls fell, its issuing share rose), not instruction fetch, which halving the
// code did not reduce. kPair: this CTA's producer decodes its pass (= rank) only, into both CTAs' tiles.
// Two producer warpgroups (WgmmaRoles): each decodes its pass; the pair leaves the second idle.
template <TileSync kSync, class R>
__device__ __forceinline__ void produce_tiles(const SparseAttentionParams& p, const ChunkWork& work, const int* s_slots,
                                              const int* s_live, int num_live, std::uint8_t* s_k,
                                              const TileHandOver<kSync, R::kThreads>& hand_over) {
  using W = R;
  constexpr bool kPair = kSync == TileSync::kPair;
  constexpr bool kOnePass = kPair || W::kProducers == 2;  // this warpgroup decodes one candidate half
  constexpr int kUnits = kOnePass ? 1 : W::kPasses;     // units per block
  // The RoPE pieces with the codes (one round trip for the unit) where registers allow: not in the
  // pair kernel, whose producer would spill.
  constexpr bool kRopeAhead = !kPair;
  // The next unit's loads in flight while this one is decoded, where registers allow: not with two
  // producer warpgroups (64 registers a thread), which overlap each other's loads instead.
  constexpr bool kLoadAhead = W::kProducers == 1;
  const int producer_tid = static_cast<int>(threadIdx.x) - W::kConsumerThreads;
  const int ptid = W::kProducers == 1 ? producer_tid : producer_tid % 128;  // 0 .. 127 in its warpgroup
  const int pass_owned = producer_pass<kSync, W::kProducers>(producer_tid / 128, hand_over.rank);
  const int first_share = kOnePass ? pass_owned * 128 : 0;
  const int prefetcher = prefetch_index<kSync, W::kProducers>(ptid, pass_owned);
  const int num_units = W::kProducers == 2 && pass_owned == -1 ? 0 : num_live * kUnits;
  // (Timeline builds: one warpgroup stamps the producer's words; with two, the first — its pass is
  // the first candidate half, and "half stored" then means that warpgroup's half.)
  DSV4_TIMELINE(const bool stamps = W::kProducers == 1 || pass_owned == 0);
  auto share_index = [&](int unit) {
    int index = first_share + unit % kUnits * 128 + ptid;
    // With 64 registers the compiler would hoist this thread's (then loop-invariant) load and store
    // addresses out of the loop and spill them; opaque in each iteration, they are recomputed.
    if constexpr (!kLoadAhead) asm volatile("" : "+r"(index));
    return index;
  };
  EntryShare current, next;
  if (kLoadAhead && num_units > 0)
    load_entry_codes<kRopeAhead>(p, s_slots, work.chunk_begin, s_live[0], share_index(0), current);
#pragma unroll 1
  for (int unit = 0; unit < num_units; ++unit) {
    const int it = unit / kUnits, pass = unit % kUnits, stage = it % 2;
    std::uint8_t* tile = s_k + stage * W::kTileBytes;
    if constexpr (kLoadAhead) {
      if (unit + 1 < num_units)
        load_entry_codes<kRopeAhead>(p, s_slots, work.chunk_begin, s_live[(unit + 1) / kUnits], share_index(unit + 1), next);
    } else {
      load_entry_codes<kRopeAhead>(p, s_slots, work.chunk_begin, s_live[it], share_index(unit), current);
    }
    if (pass == 0) {
      DSV4_TIMELINE(if (stamps) timeline::mark(timeline::producer_word(it, timeline::kLoadsIssued)));
      if (it >= 2) {
        hand_over.wait_free(it);
        ptx::fence_proxy_async_shared();  // the tensor cores' reads of the tile come before these writes
      }
      DSV4_TIMELINE(if (stamps) timeline::mark(timeline::producer_word(it, timeline::kEmptyDone)));
    }
    store_entry_share<kRopeAhead, !kPair>(current, tile, share_index(unit));
    if constexpr (kLoadAhead) current = next;
    DSV4_TIMELINE(if (stamps && pass == 0) timeline::mark(timeline::producer_word(it, timeline::kHalfStored)));
    if (pass + 1 < kUnits) continue;
    ptx::fence_proxy_async_shared();  // these stores before the copy engine's and the tensor cores' reads
    if constexpr (kPair) {
      // This CTA's half is in its own tile; once all 128 threads wrote theirs, one thread has the copy
      // engine move it to the peer's tile (8 runs of 4 KB), completing the peer's phase it / 2 of
      // full[stage] together with its expect_tx arrival.
      ptx::barrier_sync(W::kProducerBarrier, 128);  // the decoding warpgroup
      if (ptid == 0) {
        const std::uint32_t peer_full = hand_over.peer_full + 8 * stage;
        ptx::mbarrier_arrive_expect_tx_cluster(peer_full, W::kPeerHalfBytes);
        const std::uint32_t half = hand_over.rank * W::kPeerRunBytes;
        for (int slice = 0; slice < kDim / 64; ++slice) {
          const std::uint32_t offset = slice * W::kSliceBytes + half;
          ptx::bulk_copy_to_peer(hand_over.peer_k + stage * W::kTileBytes + offset, ptx::smem_address(tile + offset),
                                 W::kPeerRunBytes, peer_full);
        }
      }
    }
    DSV4_TIMELINE(if (stamps) timeline::mark(timeline::producer_word(it, timeline::kTileReady)));
    hand_over.arrive_full(stage);
    // The L2 prefetch of block it + 2 after the tile is handed over, off the path from this block's
    // loads to its tile (measured: −1 µs at B=128, −3 µs at B=1; without it, +1 and +4 µs).
    if (it + 2 < num_live) prefetch_block(p, s_slots, work.chunk_begin, s_live[it + 2], prefetcher);
  }
}

// A consumer's output tile on its way to global memory: [64 heads][kRowBytes] in shared memory.
// A fragment store puts one kPieceBytes piece in each of 8 head rows × 4 quads at once: straight to
// global memory every such instruction touches 8 lines (measured: the epilogue took 7.6 µs of a 50 µs
// thread block at B=128). Staged, each copy-out instruction writes whole runs of a head row. The pad
// of 4 pieces per row puts the 8 rows of a fragment store on distinct banks (per half-warp for
// 8-byte pieces).
template <int kRowBytes, int kPieceBytes>
struct StagedRows {
  static constexpr int kPitch = kRowBytes + 4 * kPieceBytes;
  std::uint8_t* base;
  __device__ std::uint8_t* row(int local_head) const { return base + local_head * kPitch; }
  // Rows [0, rows) to dest(r) (16-byte aligned), 16 bytes per thread and step; after a barrier of
  // the writers.
  template <class Dest>
  __device__ void copy_out(int thread, int threads, int rows, Dest dest) const {
    constexpr int kPieces = kRowBytes / 16;
    for (int i = thread; i < rows * kPieces; i += threads) {
      const int r = i / kPieces, piece = i % kPieces;
      *reinterpret_cast<uint4*>(dest(r) + piece * 16) = *reinterpret_cast<const uint4*>(row(r) + piece * 16);
    }
  }
};

// Cluster sizes of the merge: 2..16 chunks (launch.cu).
constexpr int kMaxClusterChunks = 16;
static_assert(WgmmaPlan::kPushedStatsEntries >= WgmmaPlan::kHeads + kMaxClusterChunks - 1,
              "C · ⌈64 / C⌉ pushed statistics fit for every cluster size C");

// Part of merge_in_cluster: Σ_c w_c·O_c in chunk order for elements (float4 of a head row) [0, total),
// element i at byte `offset(i)` of every chunk block's staged rows, then `finish(i, acc)`. kBatch
// elements per thread at a time, their remote reads for kGroup chunks in flight together. Every
// thread runs the same rounds (reads and stores guarded), and calls `before_sum()` once, after the
// first round's first reads are issued and before any weight is read: the weights are made while
// those reads are in flight.
template <int kBatch, int kGroup, class Offset, class Weight, class Finish, class BeforeSum>
__device__ __forceinline__ void sum_chunks(const cooperative_groups::cluster_group& cluster, std::uint8_t* smem,
                                           int chunks, int total, int thread, int threads, Offset offset,
                                           Weight weight, Finish finish, BeforeSum before_sum) {
  const int rounds = max(1, (total + kBatch * threads - 1) / (kBatch * threads));
  for (int round = 0; round < rounds; ++round) {
    const int first = thread + round * kBatch * threads;
    float4 acc[kBatch];
    int element[kBatch], staged_offset[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      element[b] = max(0, min(first + b * threads, total - 1));
      staged_offset[b] = offset(element[b]);
      acc[b] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    for (int c0 = 0; c0 < chunks; c0 += kGroup) {
      float4 o[kGroup][kBatch];
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        const std::uint8_t* theirs = cluster.map_shared_rank(smem, min(c0 + g, chunks - 1));
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          if (c0 + g < chunks && first + b * threads < total)  // no read past the ends (not even repeated ones)
            o[g][b] = *reinterpret_cast<const float4*>(theirs + staged_offset[b]);
        }
      }
      if (round == 0 && c0 == 0) before_sum();
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        if (c0 + g >= chunks) break;
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const float w = weight(element[b], c0 + g);
          acc[b].x = accumulate_chunk(acc[b].x, o[g][b].x, w);
          acc[b].y = accumulate_chunk(acc[b].y, o[g][b].y, w);
          acc[b].z = accumulate_chunk(acc[b].z, o[g][b].z, w);
          acc[b].w = accumulate_chunk(acc[b].w, o[g][b].w, w);
        }
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
      if (first + b * threads < total) finish(first + b * threads, acc[b]);
  }
}

// The consumers' end of a block launched in a cluster of the row's chunks (kClusterMerge): each block
// stages its float32 O in its own shared memory and pushes its (max, sum) of each head into the
// shared memory of the block that merges that head; after a cluster barrier, block (chunk) r merges
// heads [r·n/C, (r+1)·n/C) of the tile for this part's dims: it issues its reads of every chunk's
// values through distributed shared memory, makes the weights from the pushed statistics (local: no
// remote round trip) while they are in flight, then sums in chunk order with merge_chunks' arithmetic
// (the same bytes as the merge through global memory); a second barrier keeps every block's shared
// memory alive until the others have read it. `column0` is this thread's first staged column (dims,
// in the consumer's slice). The kernel's start arrived on a cluster barrier that is waited here
// before the first remote store (every block of the cluster has started).
template <int kHeadTile, int kConsumerDims>
__device__ __forceinline__ void merge_in_cluster(const SparseAttentionParams& p, const ChunkWork& work, int dim_begin,
                                                 int dims, std::uint8_t* smem, const float* s_tables,
                                                 const float (&acc_o)[kConsumerDims / 2], const float (&run_max)[2],
                                                 const float (&row_sum)[2], int frag_row, int quad, int consumer,
                                                 int ctid, int column0, bool write_lse) {
  using W = WgmmaPlan;
  using Staged = StagedRows<kConsumerDims * 4, 8>;
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  const int tile_heads = min(kHeadTile, p.num_heads - work.head0);
  const int chunks = static_cast<int>(cluster.num_blocks()), rank = static_cast<int>(cluster.block_rank());
  // Block r merges heads [head_begin(r), head_begin(r + 1)); its pushed statistics are
  // [chunk][head − head_begin(r)] with `share` heads a chunk (the most any block merges).
  const auto head_begin = [&](int r) { return r * tile_heads / chunks; };
  const int share = (tile_heads + chunks - 1) / chunks;
  auto* s_pushed = reinterpret_cast<float2*>(smem + W::kPushedStats);
  const Staged own{smem + W::kQ + consumer * kHeadTile * Staged::kPitch};
  ptx::fence_proxy_async_shared();  // the tensor cores' reads of the tiles come before these writes
  ptx::cluster_wait();              // the kernel start's arrival: every block of the cluster has started
  // The statistics first: their remote stores complete (the barrier's release waits for them) while
  // the values are staged.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int local_head = frag_row + 8 * half;
    if (consumer == 0 && quad == 0 && local_head < tile_heads) {
      const int merger = ((local_head + 1) * chunks - 1) / tile_heads;  // the r with head_begin(r) ≤ head < head_begin(r + 1)
      cluster.map_shared_rank(s_pushed, merger)[rank * share + local_head - head_begin(merger)] =
          make_float2(run_max[half], row_sum[half]);
    }
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int local_head = frag_row + 8 * half;
    if (local_head >= tile_heads) continue;
#pragma unroll
    for (int j = 0; j < kConsumerDims / 8; ++j)
      *reinterpret_cast<float2*>(own.row(local_head) + (column0 + 8 * j) * 4) =
          make_float2(acc_o[4 * j + 2 * half], acc_o[4 * j + 2 * half + 1]);
  }
  cluster.barrier_wait(cluster.barrier_arrive());  // every chunk's values and statistics are in place
  DSV4_TIMELINE(if (consumer == 0) timeline::mark(timeline::kMergeValuesPlaced));

  const int my_begin = head_begin(rank), my_heads = head_begin(rank + 1) - my_begin;
  const int thread = ctid + consumer * 128;
  // Weights [my_heads][chunks] after the staged rows (free), 1/denominators in the merge's slot.
  auto* s_weights = reinterpret_cast<float*>(smem + W::kQ + 2 * kHeadTile * Staged::kPitch);
  auto* s_inv = reinterpret_cast<float*>(smem + W::kInv);
  static_assert(W::kQ + 2 * kHeadTile * Staged::kPitch + kHeadTile * kMaxClusterChunks * 4 <= W::kSlots,
                "the merge's weights fit where the Q and K tiles were");
  // The weights: one half-warp per head, lane c taking chunk c's statistics (the consumers cover
  // my_heads half-warps in rounds of 16); then the consumers' barrier before any is read.
  const auto make_weights = [&] {
    for (int base = 0; base < my_heads * kMaxClusterChunks; base += W::kConsumerThreads) {
      const int i = (base + thread) / kMaxClusterChunks, c = (base + thread) % kMaxClusterChunks;
      const int pushed = min(i, my_heads - 1);
      const float2 mine = c < chunks ? s_pushed[c * share + pushed] : make_float2(0.0f, 0.0f);
      float weight;
      const RowNormalizer n =
          merge_weights_half_warp(chunks, mine, c, __fmul_rn(s_tables[my_begin + pushed], kLog2e), weight);
      if (i < my_heads) {
        if (c < chunks) s_weights[i * chunks + c] = weight;
        if (c == 0) {
          s_inv[i] = n.inv_denom;
          if (write_lse) p.lse[work.row * p.num_heads + work.head0 + my_begin + i] = n.lse;
        }
      }
    }
    ptx::barrier_sync(W::kConsumerBarrier, W::kConsumerThreads);
    DSV4_TIMELINE(if (consumer == 0) timeline::mark(timeline::kMergeWeightsDone));
  };

  const bool has_rope = p.rope_cos != nullptr;
  const float* rope_cos = s_tables + kHeadTile;
  const float* rope_sin = rope_cos + Entry::kRopeDim / 2;
  const int quads = dims / 4;  // float4 per head row of this part
  const int total = my_heads * quads;
  const auto offset = [&](int i) {  // element i's byte offset in every block's staged rows
    const int local_head = my_begin + i / quads, column = (i % quads) * 4;
    return static_cast<int>(W::kQ) + (column / kConsumerDims) * kHeadTile * Staged::kPitch +
           local_head * Staged::kPitch + (column % kConsumerDims) * 4;
  };
  const auto weight = [&](int i, int c) { return s_weights[(i / quads) * chunks + c]; };
  const auto finish = [&](int i, const float4& acc) {
    const int local = i / quads, local_head = my_begin + local, d = dim_begin + (i % quads) * 4;
    const bool rotate = has_rope && d >= Entry::kNopeDim;
    const int pair = rotate ? rope_pair(d) : 0;
    *reinterpret_cast<uint2*>(p.out + (work.row * p.num_heads + work.head0 + local_head) * kDim + d) =
        make_uint2(finish_pair(acc.x, acc.y, s_inv[local], rotate, rotate ? rope_cos[pair] : 1.0f,
                               rotate ? rope_sin[pair] : 0.0f),
                   finish_pair(acc.z, acc.w, s_inv[local], rotate, rotate ? rope_cos[pair + 1] : 1.0f,
                               rotate ? rope_sin[pair + 1] : 0.0f));
  };
  // A small merge (one element a thread, as a one-row decode's) reads every chunk at once; a large one
  // 4 elements × 4 chunks at a time.
  if (total <= W::kConsumerThreads)
    sum_chunks<1, kMaxClusterChunks>(cluster, smem, chunks, total, thread, W::kConsumerThreads, offset, weight, finish,
                                     make_weights);
  else
    sum_chunks<4, 4>(cluster, smem, chunks, total, thread, W::kConsumerThreads, offset, weight, finish, make_weights);
  DSV4_TIMELINE(if (consumer == 0) timeline::mark(timeline::kMergeStored));
  // Nobody reads this block's shared memory any more. Relaxed: what the others must not outlive is
  // their reads of it, whose values they have used by now; a release would first wait for this
  // block's output stores to complete.
  ptx::cluster_arrive_relaxed();
  ptx::cluster_wait();
  DSV4_TIMELINE(if (consumer == 0) timeline::mark(timeline::kMergeReleased));
}

// O[64 × kN] += P[64 × 16] · V[16 × kN]: the P·V wgmma of one consumer's output dims.
template <int kN>
__device__ __forceinline__ void wgmma_pv(float (&acc)[kN / 2], const std::uint32_t* a, std::uint64_t v_descriptor) {
  if constexpr (kN == 256) ptx::wgmma_m64n256k16_bf16_rs_bt(acc, a[0], a[1], a[2], a[3], v_descriptor, true);
  else if constexpr (kN == 128) ptx::wgmma_m64n128k16_bf16_rs_bt(acc, a[0], a[1], a[2], a[3], v_descriptor, true);
  else ptx::wgmma_m64n64k16_bf16_rs_bt(acc, a[0], a[1], a[2], a[3], v_descriptor, true);
}

// Two neighbouring candidates' probabilities exp2(s − max) of one head as a bf16x2 A-fragment word;
// adds what P·V will use (the bf16-rounded values) to `sum`, low half first.
__device__ __forceinline__ std::uint32_t probability_pair(float s0, float s1, float max_safe, float& sum) {
  const std::uint32_t pr =
      ptx::pack_bf16x2(ptx::exp2_approx(__fsub_rn(s0, max_safe)), ptx::exp2_approx(__fsub_rn(s1, max_safe)));
  sum = __fadd_rn(sum, __uint_as_float(pr << 16));
  sum = __fadd_rn(sum, __uint_as_float(pr & 0xffff0000u));
  return pr;
}

// Scores of kN candidates into base 2, invalid ones to −∞ (`valid_words`: the block's validity bits
// from this thread's first candidate word on, 32 candidates a word), and their maximum per row half
// over the quad (the four lanes that hold a row). The thread's candidates of n-tile j are bits
// 8j + 2·quad + {0, 1}: shifted by 2·quad once, each is a bit at a fixed place (a test against an
// immediate). Measured: with the shift per element the compiler also re-loaded the scale from the
// constant bank under each element's predicate (32 LDC + 32 predicated FMUL a block).
template <int kN>
__device__ __forceinline__ void mask_scores(float (&acc)[kN / 2], const std::uint32_t* valid_words, int quad,
                                            float scale_log2, float (&row_max)[2]) {
  std::uint32_t mine[kN / 32];
#pragma unroll
  for (int w = 0; w < kN / 32; ++w) mine[w] = valid_words[w] >> (2 * quad);
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float& s = acc[4 * j + i];
      const float scaled = __fmul_rn(s, scale_log2);
      s = (mine[j / 4] >> (8 * (j % 4) + i % 2)) & 1u ? scaled : -INFINITY;
    }
  }
  // The maxima by pairwise levels (exact in any order; the last step against −∞ keeps a row whose
  // scores are all NaN at −∞, as a running maximum from −∞ would): a chain of log2(kN / 4) + 1 steps.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float level[kN / 8];
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) level[j] = fmaxf(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
#pragma unroll
    for (int width = kN / 16; width >= 1; width /= 2) {
#pragma unroll
      for (int j = 0; j < width; ++j) level[j] = fmaxf(level[j], level[j + width]);
    }
    row_max[half] = fmaxf(level[0], -INFINITY);
  }
}

// The quad's (the four lanes holding a row) maximum and sum.
__device__ __forceinline__ float quad_max(float m) {
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
  return fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
}
__device__ __forceinline__ float quad_sum(float s) {
  s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 1));
  return __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 2));
}

// The running maximum of a row after a block whose maximum is `block_max`: the exponent offset of
// this block's probabilities (`max_safe`, 0 while nothing is valid) and the factor the running O
// and sums take.
__device__ __forceinline__ void advance_max(float& run_max, float block_max, float& max_safe, float& rescale) {
  const float new_max = fmaxf(run_max, block_max);
  max_safe = new_max == -INFINITY ? 0.0f : new_max;
  rescale = ptx::exp2_approx(__fsub_rn(run_max, max_safe));
  run_max = new_max;
}

// O ·= rescale per row half, skipped when the whole warp's factors are 1 (x·1 = x exactly: no bit
// changes).
template <int kValues>
__device__ __forceinline__ void rescale_output(float (&acc_o)[kValues], const float (&rescale)[2]) {
  bool any_rescale = false;
#pragma unroll
  for (int half = 0; half < 2; ++half) any_rescale |= rescale[half] != 1.0f;
  if (__any_sync(0xffffffffu, any_rescale)) {
#pragma unroll
    for (int i = 0; i < kValues; ++i) acc_o[i] = __fmul_rn(acc_o[i], rescale[(i % 4) / 2]);
  }
}

// S = Q·Kᵀ of kN candidates (the K tile rows `k_descriptor` starts at) over the 512 dims: 32 wgmma
// k-steps from shared memory, waited. acc[4j+i]: head frag_row + 8·(i/2), candidate 8j + 2·quad + i%2.
template <int kN>
__device__ __forceinline__ void scores(float (&acc)[kN / 2], std::uint64_t q_descriptor, std::uint64_t k_descriptor) {
  static_assert(kN == 32 || kN == 64, "the two S shapes: half a block per consumer, or the whole block");
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) acc[i] = 0.0f;
  ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kDim / 16; ++kk) {
    const std::uint64_t step =
        static_cast<std::uint64_t>(((kk / 4) * WgmmaPlan::kSliceBytes + (kk % 4) * 32) >> 4);  // 16 dims
    if constexpr (kN == 64) ptx::wgmma_m64n64k16_bf16_ss(acc, q_descriptor + step, k_descriptor + step, kk > 0);
    else ptx::wgmma_m64n32k16_bf16_ss(acc, q_descriptor + step, k_descriptor + step, kk > 0);
  }
  ptx::wgmma_commit();
  ptx::wgmma_wait_all();
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) ptx::fence_operand(acc[i]);
}

// kDimSplit (1, 2 or 4): blocks per (row, head tile, chunk), each owning 512 / kDimSplit output dims.
// kClusterMerge: launched in clusters of num_splits (2..16) blocks, the chunks of one (row, head tile,
// part); they merge through distributed shared memory (merge_in_cluster) instead of float32 partials
// in global memory, with the same arithmetic in the same order: the same bytes.
// kAsymmetric (the default; DSV4_ATTENTION_ASYMMETRIC=0 turns it off): consumer 0, the scorer, computes S of all 64
// candidates of a block (m64n64k16: K read once, not by both consumers), the row maxima by shuffles
// alone and P, and hands P and the rescale to consumer 1, the follower, through shared memory (one
// way: the scorer's S of block it + 1 overlaps the follower's P·V of block it); each still does the P·V
// of its half of the dims. The scorer keeps the two candidate halves' sums apart, in the symmetric
// kernel's order, so the bytes are the symmetric kernel's.
// kPairDecode (64 < H ≤ 128, asymmetric, no dim split, no cluster merge; switch DSV4_ATTENTION_PAIR_DECODE):
// launched in clusters of 2, blockIdx.x = 2 · unit + rank, rank = head tile; the pair shares the
// decode of every K block (TileSync::kPair). The tiles hold the same bytes, so the output is the
// unpaired kernel's.
template <int kHeadTile, int kDimSplit, bool kClusterMerge = false, bool kAsymmetric = false, bool kPairDecode = false>
__global__ void __launch_bounds__(WgmmaRolesFor<kDimSplit>::kThreads, 1)
    sparse_attention_wgmma_kernel(const __grid_constant__ SparseAttentionParams p) {
  static_assert(kHeadTile == WgmmaPlan::kHeads, "the wgmma kernel is the 64-head tile");
  static_assert(kDimSplit == 1 || kDimSplit == 2 || kDimSplit == 4, "output dims split in 1, 2 or 4");
  static_assert(!kPairDecode || (kAsymmetric && !kClusterMerge && kDimSplit == 1), "the pair decode's variant");
  constexpr TileSync kSync = kPairDecode ? TileSync::kPair : kAsymmetric ? TileSync::kLocal : TileSync::kNamed;
  using W = WgmmaRolesFor<kDimSplit>;
  constexpr int kPartDims = kDim / kDimSplit;                    // output dims of this block
  constexpr int kConsumerDims = kPartDims / W::kConsumers;       // of each consumer (wgmma N: 256, 128, 64)
  // ptxas must fit each single instruction in the launch's registers, whatever setmaxnreg gives the
  // code around it: an m64n256 P·V (128 accumulators) does not fit the 128 of a 512-thread block
  // ("Insufficient registers (128) to compile instruction").
  static_assert(W::kLaunchRegisters >= 160 || kConsumerDims <= 128, "the P·V wgmma fits the launch's registers");
  using ConsumerSync = GroupSync<W::kConsumerThreads, W::kConsumerBarrier>;
  // The epilogue stages each consumer's rows (bf16 output, or float32 partials) where Q and the K tiles were.
  static_assert(W::kConsumers * kHeadTile * StagedRows<kConsumerDims * 4, 8>::kPitch <= W::kSlots - W::kQ,
                "staged rows fit in the Q and K tiles");
  ptx::allow_dependent_launch();  // the next kernel may take free SMs now (it waits for this one's end)
  extern __shared__ __align__(16) std::uint8_t smem_unaligned[];
  const std::uint32_t misalignment = ptx::smem_address(smem_unaligned) % ptx::kSwizzleAtomBytes;
  std::uint8_t* smem = smem_unaligned + (ptx::kSwizzleAtomBytes - misalignment) % ptx::kSwizzleAtomBytes;
  std::uint8_t* s_q = smem + W::kQ;                                     // bf16 [64 heads][512], swizzled
  std::uint8_t* s_k = smem + W::kK;                                     // 2 × bf16 [64 candidates][512], swizzled
  auto* s_slots = reinterpret_cast<int*>(smem + W::kSlots);             // [kMaxSplitCandidates]
  auto* s_valid = reinterpret_cast<std::uint32_t*>(smem + W::kValid);   // [kMaxBlocksPerSplit][2]
  auto* s_live = reinterpret_cast<int*>(smem + W::kLive);               // [kMaxBlocksPerSplit] + count + flag
  auto* s_row_max = reinterpret_cast<float*>(smem + W::kRowMax);        // [2][64]: block maxima, then sums
  auto* s_prob = reinterpret_cast<std::uint32_t*>(smem + W::kProb);     // [2][8][128] bf16x2 P fragments
  auto* s_tables = reinterpret_cast<float*>(smem + W::kTables);         // the tile's sinks, then the row's cos, sin
  int& s_is_last = s_live[kMaxBlocksPerSplit + 1];
  auto* s_hand_over = reinterpret_cast<std::uint64_t*>(smem + W::kHandOver);  // kAsymmetric: mbarriers
  std::uint64_t* s_prob_ready = s_hand_over + 2;
  std::uint64_t* s_prob_read = s_hand_over + 3;
  TileHandOver<kSync, W::kThreads> hand_over;
  hand_over.full = s_hand_over;
  hand_over.free = s_hand_over + 4;
  if constexpr (kPairDecode) {
    hand_over.rank = ptx::cluster_rank();
    hand_over.peer_k = ptx::map_to_rank(ptx::smem_address(s_k), hand_over.rank ^ 1u);
    hand_over.peer_full = ptx::map_to_rank(ptx::smem_address(s_hand_over), hand_over.rank ^ 1u);
  }

  const int tid = threadIdx.x;
  // This block's slice of the output dims and its (row, head tile, chunk). In clusters the chunks of a
  // (row, tile, part) are consecutive blocks (order_group 1 keeps a row's chunks consecutive units);
  // a pair is one unit of two head tiles.
  const unsigned chunks = static_cast<unsigned>(p.num_splits);
  const int part = static_cast<int>(kClusterMerge ? blockIdx.x / chunks % kDimSplit : blockIdx.x % kDimSplit);
  const unsigned unit = kPairDecode     ? blockIdx.x / 2
                        : kClusterMerge ? blockIdx.x / chunks / kDimSplit * chunks + blockIdx.x % chunks
                                        : blockIdx.x / kDimSplit;
  ChunkWork work = chunk_of_block(p, kPairDecode ? 2 * kHeadTile : kHeadTile, unit);
  if constexpr (kPairDecode) work.head0 = static_cast<int>(hand_over.rank) * kHeadTile;
  const int head0 = work.head0;
  const std::int64_t row = work.row;
  // Launched early (programmatic dependent launch, launch_tile.cuh), the block has come this far — its
  // parameters read — while the kernels before it finish; every input is read, and every global
  // store made (the timeline's too), after this wait.
  ptx::wait_for_prerequisite_grids();
  spans::stamp(spans::kAttention);
  DSV4_TIMELINE(timeline::mark_start());

  // The chunk's plan, and the Q tile (heads past num_heads zero-filled) once the slot loads are out;
  // by all threads. The epilogue's sinks and RoPE tables come in the same round trip (read at the
  // end they cost a cold memory latency there: measured ≈ 2 µs of the epilogue).
  float table_value = 0.0f;
  const int table_index = tid;
  const int rope_pairs = Entry::kRopeDim / 2;
  const int num_live = plan_chunk<W::kThreads>(p, work, s_slots, s_valid, s_live, [&] {
    if (table_index < kHeadTile) {
      if (head0 + table_index < p.num_heads) table_value = p.attn_sink[head0 + table_index];
    } else if (table_index < W::kTableEntries && p.rope_cos != nullptr) {
      const int pair = (table_index - kHeadTile) % rope_pairs;
      const float* table = table_index < kHeadTile + rope_pairs ? p.rope_cos : p.rope_sin;
      table_value = table[row * rope_pairs + pair];
    }
    for (int i = tid; i < kHeadTile * (kDim / 8); i += W::kThreads) {
      const int h = i / (kDim / 8), d = (i % (kDim / 8)) * 8;
      const bool valid = head0 + h < p.num_heads;
      const std::uint16_t* src = valid ? p.q + ((row * p.num_heads + head0 + h) * kDim + d) : p.q;
      ptx::cp_async_16(s_q + tile_offset(h, d), src, valid);
    }
    ptx::cp_async_commit();
  });
  DSV4_TIMELINE(if (tid == 0) timeline::mark(timeline::kPlanDone));
  if (table_index < W::kTableEntries) s_tables[table_index] = table_value;  // read after the barrier below
  if constexpr (kAsymmetric) {
    // One arrival per producer thread on full (+ the peer producer's, kPairDecode), per scorer /
    // follower thread on P ready / read, per consumer warp of the pair on free (kPairDecode).
    if (tid == 0) {
      for (int stage = 0; stage < 2; ++stage)
        ptx::mbarrier_init(hand_over.full + stage, kPairDecode ? 128 + 1 : W::kProducerThreads);
      ptx::mbarrier_init(s_prob_ready, 128);
      ptx::mbarrier_init(s_prob_read, 128);
      if constexpr (kPairDecode) {
        for (int stage = 0; stage < 2; ++stage) ptx::mbarrier_init(hand_over.free + stage, W::kStageFreeArrivals);
        ptx::fence_mbarrier_init_cluster();
      }
    }
  }
  // kPairDecode: waited below (both CTAs' barriers exist); kClusterMerge: waited before the merge's
  // first remote store (merge_in_cluster) or, by the producers, before its first barrier.
  if constexpr (kPairDecode || kClusterMerge) ptx::cluster_arrive_relaxed();
  if (tid >= W::kConsumerThreads) {
    const int producer_tid = tid - W::kConsumerThreads;
    const int prefetcher = prefetch_index<kSync, W::kProducers>(
        W::kProducers == 1 ? producer_tid : producer_tid % 128, producer_pass<kSync, W::kProducers>(producer_tid / 128, hand_over.rank));
    if (num_live > 0) prefetch_block(p, s_slots, work.chunk_begin, s_live[0], prefetcher);
    if (num_live > 1) prefetch_block(p, s_slots, work.chunk_begin, s_live[1], prefetcher);
  }
  ptx::cp_async_wait_all();
  ptx::fence_proxy_async_shared();
  __syncthreads();  // Q is in place; from here on the warpgroups part
  if constexpr (kPairDecode) ptx::cluster_wait();
  DSV4_TIMELINE(timeline::mark_ready(num_live));

  if (tid >= W::kConsumerThreads) {
    ptx::registers_decrease<W::kProducerRegisters>();
    produce_tiles<kSync, W>(p, work, s_slots, s_live, num_live, s_k, hand_over);
    DSV4_TIMELINE(if (W::kProducers == 1 || tid < W::kConsumerThreads + 128) timeline::mark(timeline::kProducerEnd));
    // Its last bulk copy to the peer is issued (the peer waits for those bytes itself): the producer
    // only counts itself in for the pair's exit barrier.
    if constexpr (kPairDecode) ptx::cluster_arrive();
    if constexpr (kClusterMerge) {  // every thread of the cluster takes part in the merge's cluster barriers
      ptx::cluster_wait();            // the kernel start's arrival
      cooperative_groups::this_cluster().barrier_wait(cooperative_groups::this_cluster().barrier_arrive());
      ptx::cluster_arrive_relaxed();  // the merge's last barrier (merge_in_cluster)
    }
    return;
  }
  ptx::registers_increase<W::kConsumerRegisters>();

  const int lane = tid % 32, consumer = tid / 128, ctid = tid % 128;
  const int quad = lane % 4;
  const int frag_row = 16 * (ctid / 32) + lane / 4;  // this thread's heads: frag_row and frag_row + 8

  float run_max[2] = {-INFINITY, -INFINITY};  // heads frag_row, frag_row + 8 (the same in both consumers)
  float run_sum[2] = {0.0f, 0.0f};            // Σ P over this consumer's candidates only
  float scorer_sum[2][2] = {};                // kAsymmetric scorer: run_sum of each candidate half [half][row]
  // d[4j+i]: head frag_row + 8·(i/2), dim dim_first + 8j + 2·quad + i%2
  float acc_o[kConsumerDims / 2];
#pragma unroll
  for (int i = 0; i < kConsumerDims / 2; ++i) acc_o[i] = 0.0f;
  const int dim_first = part * kPartDims + consumer * kConsumerDims;  // this consumer's first output dim
  const std::uint64_t q_descriptor = ptx::sw128_descriptor(s_q);

  for (int it = 0; it < num_live; ++it) {
    const int stage = it % 2, block = s_live[it];
    const std::uint8_t* tile = s_k + stage * W::kTileBytes;
    // kAsymmetric: only the scorer waits for the tile; the follower learns of it from the scorer's
    // hand-over (s_prob_ready), so the scorer may start block it + 1 while the follower is still in the
    // P·V of block it.
    if (!kAsymmetric || consumer == 0) hand_over.wait_full(it);
    DSV4_TIMELINE(timeline::mark(timeline::consumer_word(it, consumer, timeline::kFullDone)));

    // The A fragments of P·V's four k16 steps (candidates 16kk .. 16kk + 15), in candidate order.
    std::uint32_t a[16];
    if constexpr (kAsymmetric) {
      float rescale[2];
      if (consumer == 0) {
        // The scorer: S = Q·Kᵀ for all 64 candidates. d[4j+i]: head frag_row + 8·(i/2), candidate
        // 8j + 2·quad + i%2.
        float acc_s[32];
        scores<64>(acc_s, q_descriptor, ptx::sw128_descriptor(tile));
        DSV4_TIMELINE(timeline::mark(timeline::consumer_word(it, consumer, timeline::kScoresDone)));
        // Scores in base 2, masked; the block maximum per head over the quad (whole rows: no exchange).
        float block_max[2];
        mask_scores<64>(acc_s, s_valid + 2 * block, quad, p.score_scale_log2, block_max);
        float max_safe[2];
#pragma unroll
        for (int half = 0; half < 2; ++half)
          advance_max(run_max[half], quad_max(block_max[half]), max_safe[half], rescale[half]);
        DSV4_TIMELINE(timeline::mark(timeline::consumer_word(it, consumer, timeline::kMaxDone)));
        // P in bf16 (fragment 4·(j/2) + 2·(j%2) + half from score n-tile j); each candidate half's sum
        // in the symmetric kernel's order.
        float block_sum[2][2] = {};  // [candidate half][row]
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            a[4 * (j / 2) + 2 * (j % 2) + half] =
                probability_pair(acc_s[4 * j + 2 * half], acc_s[4 * j + 2 * half + 1], max_safe[half],
                                 block_sum[j / 4][half]);
          }
        }
#pragma unroll
        for (int c = 0; c < 2; ++c) {
#pragma unroll
          for (int half = 0; half < 2; ++half)
            scorer_sum[c][half] = __fmaf_rn(scorer_sum[c][half], rescale[half], quad_sum(block_sum[c][half]));
        }
        // Hand P and the rescale over once the follower has read the previous block's.
        if (it > 0) ptx::mbarrier_wait(s_prob_read, (it - 1) & 1);
#pragma unroll
        for (int f = 0; f < 16; ++f) s_prob[f * 128 + ctid] = a[f];
        if (quad == 0) {
#pragma unroll
          for (int half = 0; half < 2; ++half) s_row_max[frag_row + 8 * half] = rescale[half];
        }
        ptx::mbarrier_arrive(s_prob_ready);
        DSV4_TIMELINE(timeline::mark(timeline::consumer_word(it, consumer, timeline::kRescaleDone)));
      } else {
        // (The follower's phase stamps: "scores" and "max" = the hand-over received, "rescale" = read.)
        ptx::mbarrier_wait(s_prob_ready, it & 1);
        if constexpr (kPairDecode) ptx::fence_proxy_async_shared();  // the peer's half of the tile (wait_full)
        DSV4_TIMELINE(timeline::mark(timeline::consumer_word(it, consumer, timeline::kScoresDone)));
        DSV4_TIMELINE(timeline::mark(timeline::consumer_word(it, consumer, timeline::kMaxDone)));
#pragma unroll
        for (int f = 0; f < 16; ++f) a[f] = s_prob[f * 128 + ctid];
#pragma unroll
        for (int half = 0; half < 2; ++half) rescale[half] = s_row_max[frag_row + 8 * half];
        ptx::mbarrier_arrive(s_prob_read);  // (after the last block nobody waits: harmless)
        DSV4_TIMELINE(timeline::mark(timeline::consumer_word(it, consumer, timeline::kRescaleDone)));
      }
      rescale_output(acc_o, rescale);
#pragma unroll
      for (int f = 0; f < 16; ++f) ptx::fence_operand(a[f]);
      DSV4_TIMELINE(timeline::mark(timeline::consumer_word(it, consumer, timeline::kSoftmaxDone)));
    } else {
      // S = Q·Kᵀ for this consumer's 32 candidates (tile rows 32c .. 32c + 31, four swizzle atoms in).
      // k-step kk is slice kk / 4, byte offset 32·(kk mod 4) of its rows.
      float acc_s[16];  // d[4j+i]: head frag_row + 8·(i/2), candidate 32c + 8j + 2·quad + i%2
      scores<32>(acc_s, q_descriptor, ptx::sw128_descriptor(tile + consumer * W::kCandidatesPerConsumer * 128));
      DSV4_TIMELINE(timeline::mark(timeline::consumer_word(it, consumer, timeline::kScoresDone)));

      // Scores in base 2, masked; this half's maximum per head (over the quad), then both halves'.
      float half_max[2];
      mask_scores<32>(acc_s, s_valid + 2 * block + consumer, quad, p.score_scale_log2, half_max);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float m = quad_max(half_max[half]);
        if (quad == 0) s_row_max[consumer * kHeadTile + frag_row + 8 * half] = m;
      }
      ConsumerSync{}();
      DSV4_TIMELINE(timeline::mark(timeline::consumer_word(it, consumer, timeline::kMaxDone)));
      float max_safe[2], rescale[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = frag_row + 8 * half;
        advance_max(run_max[half], fmaxf(s_row_max[r], s_row_max[kHeadTile + r]), max_safe[half], rescale[half]);
      }
      // P in bf16 as the A fragments of P·V: this consumer's candidates are k16 steps 2c and 2c + 1;
      // fragment 4·(j/2) + 2·(j%2) + half of them comes from score n-tile j, head frag_row + 8·half.
      std::uint32_t own[8], other[8];
      float block_sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          own[4 * (j / 2) + 2 * (j % 2) + half] =
              probability_pair(acc_s[4 * j + 2 * half], acc_s[4 * j + 2 * half + 1], max_safe[half], block_sum[half]);
        }
      }
      // The other consumer's thread ctid needs exactly these fragments (same heads, same lanes).
#pragma unroll
      for (int f = 0; f < 8; ++f) s_prob[(consumer * 8 + f) * 128 + ctid] = own[f];
#pragma unroll
      for (int half = 0; half < 2; ++half)
        run_sum[half] = __fmaf_rn(run_sum[half], rescale[half], quad_sum(block_sum[half]));
      rescale_output(acc_o, rescale);
      DSV4_TIMELINE(timeline::mark(timeline::consumer_word(it, consumer, timeline::kRescaleDone)));
      ConsumerSync{}();
#pragma unroll
      for (int f = 0; f < 8; ++f) other[f] = s_prob[((1 - consumer) * 8 + f) * 128 + ctid];
      // The A fragments of the four k16 steps, in candidate order (chosen before the MMAs start, so no
      // instruction touches their registers while the warpgroup's MMAs are in flight).
#pragma unroll
      for (int f = 0; f < 16; ++f) {
        a[f] = f / 8 == consumer ? own[f % 8] : other[f % 8];
        ptx::fence_operand(a[f]);
      }
      DSV4_TIMELINE(timeline::mark(timeline::consumer_word(it, consumer, timeline::kSoftmaxDone)));

    }

    // O += P·V: B = this consumer's slices of the K tile, N-major: 64 dims per 128-byte row (the
    // next 64 dims one slice further: leading offset), 8 candidates per atom (stride offset).
    const std::uint64_t v_descriptor = ptx::sw128_descriptor(tile + (dim_first / 64) * W::kSliceBytes,
                                                             W::kSliceBytes, ptx::kSwizzleAtomBytes);
    // The rescale above writes the accumulators: keep those writes before the fence (nothing else
    // orders them against it).
#pragma unroll
    for (int i = 0; i < kConsumerDims / 2; ++i) ptx::fence_operand(acc_o[i]);
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlock / 16; ++kk) {
      const std::uint64_t step = static_cast<std::uint64_t>((kk * 16 * 128) >> 4);  // 16 candidate rows
      wgmma_pv<kConsumerDims>(acc_o, a + 4 * kk, v_descriptor + step);
    }
    ptx::wgmma_commit();
    ptx::wgmma_wait_all();
#pragma unroll
    for (int i = 0; i < kConsumerDims / 2; ++i) ptx::fence_operand(acc_o[i]);
    DSV4_TIMELINE(timeline::mark(timeline::consumer_word(it, consumer, timeline::kPvDone)));
    if (it + 2 < num_live) hand_over.release(stage, lane);  // a producer waits for it (never for a later one)
  }
  // kPairDecode: nothing of this CTA reaches the peer any more; count in for the pair's barrier,
  // which the consumers wait on before the epilogue reuses the K tiles (below).
  if constexpr (kPairDecode) ptx::cluster_arrive();

  DSV4_TIMELINE(timeline::mark(timeline::kEpilogueStart + consumer));
  // Both candidate halves' sums, added in a fixed order (the same bits in both consumers).
  float row_sum[2];
  if constexpr (kAsymmetric) {
    // The follower takes the scorer's maxima and sums (after it read the last block's rescale).
    ConsumerSync{}();
    if (consumer == 0 && quad == 0) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        s_row_max[frag_row + 8 * half] = run_max[half];
        s_row_max[kHeadTile + frag_row + 8 * half] = __fadd_rn(scorer_sum[0][half], scorer_sum[1][half]);
      }
    }
    ConsumerSync{}();
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      run_max[half] = s_row_max[frag_row + 8 * half];
      row_sum[half] = s_row_max[kHeadTile + frag_row + 8 * half];
    }
  } else {
#pragma unroll
    for (int half = 0; half < 2; ++half)
      if (quad == 0) s_row_max[consumer * kHeadTile + frag_row + 8 * half] = run_sum[half];
    ConsumerSync{}();
#pragma unroll
    for (int half = 0; half < 2; ++half)
      row_sum[half] = __fadd_rn(s_row_max[frag_row + 8 * half], s_row_max[kHeadTile + frag_row + 8 * half]);
  }

  const std::int64_t out_row = row * p.num_heads;
  const bool has_rope = p.rope_cos != nullptr;
  const float* rope_cos = s_tables + kHeadTile;  // this row's tables (when has_rope), read in the prologue
  const float* rope_sin = rope_cos + Entry::kRopeDim / 2;
  const int dim0 = dim_first + 2 * quad;  // + 8j: this thread's output dim pairs (RoPE pairs stay in a thread)
  const bool writes_lse = part == 0 && consumer == 0 && quad == 0;
  const int valid_heads = min(kHeadTile, p.num_heads - head0);

  if constexpr (kClusterMerge) {
    merge_in_cluster<kHeadTile, kConsumerDims>(p, work, part * kPartDims, kPartDims, smem, s_tables, acc_o, run_max,
                                               row_sum, frag_row, quad, consumer, ctid, dim0 - dim_first,
                                               part == 0);
    DSV4_TIMELINE(timeline::mark_end(consumer));
    return;
  }
  // kPairDecode: this CTA's last bulk copies may still be reading its K tiles (their completion is
  // counted on the peer's barrier only); the peer's consumers arrive after their last tile wait, which
  // needed those copies, so once the pair's barrier opens the tiles are free for the staging below
  // (and the peer's shared memory outlives every access of ours). Found by review (notes §21); run
  // on the H200 in the seventh session (notes §22).
  if constexpr (kPairDecode) ptx::cluster_wait();
  if (p.num_splits == 1) {  // the whole row in this block: normalize from registers
    // Through shared memory (StagedRows): the Q and K tiles are free, both consumers passed their last
    // P·V wait before the barrier above.
    const StagedRows<kConsumerDims * 2, 4> staged{smem + W::kQ + consumer * kHeadTile * StagedRows<kConsumerDims * 2, 4>::kPitch};
    ptx::fence_proxy_async_shared();  // the tensor cores' reads of the tiles come before these writes
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int local_head = frag_row + 8 * half, h = head0 + local_head;
      if (h >= p.num_heads) continue;
      const float m = run_max[half], l = row_sum[half];
      const RowNormalizer n =
          merge_weights(1, [&](int) { return make_float2(m, l); }, __fmul_rn(s_tables[local_head], kLog2e));
      const float weight = chunk_weight(m, n.max_safe);
      if (writes_lse) p.lse[out_row + h] = n.lse;
#pragma unroll
      for (int j = 0; j < kConsumerDims / 8; ++j) {
        const int d = dim0 + 8 * j;
        const bool rotate = has_rope && d >= Entry::kNopeDim;
        const int pair = rotate ? rope_pair(d) : 0;
        *reinterpret_cast<std::uint32_t*>(staged.row(local_head) + (d - dim_first) * 2) =
            finish_pair(accumulate_chunk(0.0f, acc_o[4 * j + 2 * half], weight),
                        accumulate_chunk(0.0f, acc_o[4 * j + 2 * half + 1], weight), n.inv_denom, rotate,
                        rotate ? rope_cos[pair] : 1.0f, rotate ? rope_sin[pair] : 0.0f);
      }
    }
    ConsumerSync{}();
    staged.copy_out(ctid, W::kConsumerThreads / W::kConsumers, valid_heads, [&](int r) {
      return reinterpret_cast<std::uint8_t*>(p.out + (out_row + head0 + r) * kDim + dim_first);
    });
    DSV4_TIMELINE(timeline::mark_end(consumer));
    return;
  }

  // Several chunks: publish this one, then the last to arrive merges all of them in order (the
  // consumers only: the producer has left). The parts of a dim split count and merge their slices
  // apart; each writes the (identical) chunk statistics, so its merge never waits for another part.
  const std::int64_t chunk_base = row * p.num_splits;  // [row][chunk][head]
  const StagedRows<kConsumerDims * 4, 8> staged{smem + W::kQ + consumer * kHeadTile * StagedRows<kConsumerDims * 4, 8>::kPitch};
  ptx::fence_proxy_async_shared();  // the tensor cores' reads of the tiles come before these writes
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int local_head = frag_row + 8 * half, h = head0 + local_head;
    if (h >= p.num_heads) continue;
#pragma unroll
    for (int j = 0; j < kConsumerDims / 8; ++j)
      *reinterpret_cast<float2*>(staged.row(local_head) + (dim0 + 8 * j - dim_first) * 4) =
          make_float2(acc_o[4 * j + 2 * half], acc_o[4 * j + 2 * half + 1]);
    // With an output-dim split every part writes these same (max, sum) bits: another part's merge may
    // read the slot while it is rewritten with identical values, so no part ever waits for another.
    if (consumer == 0 && quad == 0)
      *reinterpret_cast<float2*>(p.partial_stats + ((chunk_base + work.chunk) * p.num_heads + h) * 2) =
          make_float2(run_max[half], row_sum[half]);
  }
  ConsumerSync{}();
  staged.copy_out(ctid, W::kConsumerThreads / W::kConsumers, valid_heads, [&](int r) {
    return reinterpret_cast<std::uint8_t*>(p.partial_out + ((chunk_base + work.chunk) * p.num_heads + head0 + r) * kDim + dim_first);
  });
  if (!last_to_arrive(p, row, head0, s_is_last, ConsumerSync{}, part)) {
    DSV4_TIMELINE(timeline::mark_end(consumer));
    return;
  }
  merge_chunks<kHeadTile, W::kConsumerThreads>(p, row, head0, reinterpret_cast<float*>(smem),
                                               reinterpret_cast<float*>(smem + W::kInv), ConsumerSync{},
                                               part * kPartDims, kPartDims, part == 0);
  reset_arrivals(p, row, head0, part);
  DSV4_TIMELINE(timeline::mark_end(consumer));
}

}  // namespace dsv4::cuda::sparse_attention
