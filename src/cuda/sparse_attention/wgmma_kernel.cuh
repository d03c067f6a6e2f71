// src/cuda/sparse_attention/wgmma_kernel.cuh — the 64-head tile on Hopper warpgroup MMA (sm_90a).
//
// One thread block = one query row × 64 heads × one chunk of split_candidates candidates, walked in
// blocks of 64 candidates; 2 warpgroups (256 threads). Shared memory holds Q [64 heads][512] and two
// K tiles [64 candidates][512], all bf16 in the 128-byte-swizzled K-major layout wgmma reads.
// Per 64-candidate block (K tile `it % 2`):
//   S = Q·Kᵀ    wgmma m64n64k16 (both operands from shared memory), 32 k-steps. Both warpgroups
//               compute the full 64 × 64 scores: the softmax needs no exchange between them and
//               runs the same instructions on the same values in both, so their statistics agree
//               bit for bit.
//   gather      while S runs, every thread loads its share (9 × 16 bytes + the scale record) of the
//               next block's entries into registers (the block after that is prefetched into L2).
//   softmax     running max / sum per head in registers (scores in base 2, invalid candidates −inf),
//               P rounded to bf16 straight into the A fragments of the next MMA.
//   O += P·V    wgmma m64n256k16, A = P from registers, B = the same K tile read N-major (V = K);
//               warpgroup w owns output dims [256w, 256w + 256): 128 f32 accumulators per thread.
//   dequant     while P·V runs, the loaded next block is decoded (dequant.cuh, exact) into the other
//               K tile; one barrier per block hands it over.
// The end of a chunk (normalize, or publish partials and merge in chunk order) is the mma.sync
// kernel's, through the same functions (kernel.cuh), so the batch invariance argument is unchanged;
// the 64-head tile is chosen from H alone (launch.cu), so a row never switches between the two MMA
// paths with the batch.
#pragma once

#include <cstdint>

#include "cuda/common/ptx_sm90.cuh"
#include "cuda/sparse_attention/kernel.cuh"

namespace dsv4::cuda::sparse_attention {

// Shared-memory plan (bytes from a 1024-byte aligned base) and thread shape of the wgmma kernel.
struct WgmmaPlan {
  static constexpr int kHeads = 64;                                  // wgmma M
  static constexpr int kWarpgroups = 2;
  static constexpr int kThreads = 128 * kWarpgroups;
  static constexpr int kDimsPerWarpgroup = kDim / kWarpgroups;       // 256 output dims (wgmma N)
  static constexpr int kSliceBytes = 64 * 128;                       // 64 rows × one 64-dim swizzle row
  static constexpr int kTileBytes = (kDim / 64) * kSliceBytes;       // [8 slices][64 rows][128 B]
  static constexpr int kQ = 0;                                       // bf16 Q tile (heads)
  static constexpr int kK = kQ + kTileBytes;                         // 2 bf16 K tiles (candidates)
  static constexpr int kSlots = kK + 2 * kTileBytes;                 // i32 [512]
  static constexpr int kValid = kSlots + kMaxSplitCandidates * 4;    // u32 [8][2]
  static constexpr int kLive = kValid + kMaxBlocksPerSplit * 2 * 4;  // i32 [8] live blocks, count, flag
  static constexpr int kInv = kLive + (kMaxBlocksPerSplit + 4) * 4;  // f32 [64] merge 1/denominators
  static constexpr int kEnd = kInv + kHeads * 4;
  static constexpr int kSmemBytes = kEnd + static_cast<int>(ptx::kSwizzleAtomBytes);  // + alignment slack
  // The merge keeps its weights [64][chunks] where the Q and K tiles were.
  static constexpr int kMaxChunks = kSlots / (kHeads * 4);
  static_assert(kMaxChunks >= kMaxChunksPerRow, "the merge weights fit");
  static_assert(kSmemBytes <= 227 * 1024, "fits the opt-in shared memory of one Hopper block");
  // The gather: 4 threads per candidate, each 9 of the entry's 36 16-byte pieces (7 code pieces,
  // pieces sub + 4i, whose scale byte is i; then 2 RoPE pieces).
  static constexpr int kThreadsPerEntry = kThreads / kBlock;
  static constexpr int kPiecesPerThread = Entry::kDataBytes / 16 / kThreadsPerEntry;
  static constexpr int kCodePiecesPerThread = Entry::kNopeDim / 16 / kThreadsPerEntry;
  static_assert(kThreadsPerEntry == 4 && kPiecesPerThread == 9 && kCodePiecesPerThread == 7, "gather shape");
  static_assert(Entry::kQuantBlock == 16 * kThreadsPerEntry, "code piece sub + 4i uses scale byte i");
};

// Byte offset of bf16 elements [d, d + 8) (d a multiple of 8) of row r of a swizzled [64][512] tile:
// slice d / 64, row r, 16-byte group (d mod 64) / 8 at position group ^ (r mod 8).
__device__ __forceinline__ int tile_offset(int r, int d) {
  return (d / 64) * WgmmaPlan::kSliceBytes + r * 128 + ((((d % 64) / 8) ^ (r % 8)) * 16);
}

// A thread's share of one candidate entry of a block, as loaded: code pieces first (they travel
// during S = Q·Kᵀ and the softmax), the two RoPE pieces separately (loaded late: fewer registers
// live across the softmax).
struct EntryShare {
  const std::uint8_t* data;  // the entry's 576 data bytes, or null for a masked candidate
  uint4 piece[WgmmaPlan::kCodePiecesPerThread];  // 16-byte pieces sub + 4i (e4m3 codes)
  uint2 scales;                                  // the 8-byte scale record
};

// Loads this thread's code pieces of block `block` of the chunk (candidate tid / 4, pieces
// tid % 4 + 4i); zeros for a masked candidate (nothing is read).
__device__ __forceinline__ void load_entry_codes(const SparseAttentionParams& p, const int* s_slots, int chunk_begin,
                                                 int block, int tid, EntryShare& share) {
  constexpr int kSplit = WgmmaPlan::kThreadsPerEntry;
  const int e = tid / kSplit, sub = tid % kSplit, c = block * kBlock + e;
  const int slot = s_slots[c];
  if (slot < 0) {
#pragma unroll
    for (int i = 0; i < WgmmaPlan::kCodePiecesPerThread; ++i) share.piece[i] = make_uint4(0, 0, 0, 0);
    share.scales = make_uint2(0, 0);
    share.data = nullptr;
    return;
  }
  const EntryAddress a = entry_address(p, chunk_begin, c, slot);
  share.data = a.data;
#pragma unroll
  for (int i = 0; i < WgmmaPlan::kCodePiecesPerThread; ++i)
    share.piece[i] = ptx::load_stream_v4(a.data + (sub + kSplit * i) * 16);
  share.scales = ptx::load_stream_v2(a.scales);
}

// Decodes the loaded share into K tile `tile` (candidate row tid / 4): code piece k = sub + 4i holds
// dims [16k, 16k + 16) with scale byte i. Then loads and copies the RoPE pieces j = sub + 4i' (bf16
// dims 448 + 8j .. + 8); zeros for a masked candidate.
__device__ __forceinline__ void store_entry_share(const EntryShare& share, std::uint8_t* tile, int tid) {
  constexpr int kSplit = WgmmaPlan::kThreadsPerEntry;
  constexpr int kRopePieces = WgmmaPlan::kPiecesPerThread - WgmmaPlan::kCodePiecesPerThread;
  const int e = tid / kSplit, sub = tid % kSplit;
  uint4 rope[kRopePieces];
#pragma unroll
  for (int i = 0; i < kRopePieces; ++i)
    rope[i] = share.data != nullptr
                  ? ptx::load_stream_v4(share.data + Entry::kNopeDim + (sub + kSplit * i) * 16)
                  : make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int i = 0; i < WgmmaPlan::kCodePiecesPerThread; ++i) {
    const std::uint32_t scale = ((i < 4 ? share.scales.x : share.scales.y) >> (8 * (i % 4))) & 0xffu;
    uint4 lo, hi;
    dequantize_e4m3x16(share.piece[i], scale, lo, hi);
    const int d = 16 * (sub + kSplit * i);
    *reinterpret_cast<uint4*>(tile + tile_offset(e, d)) = lo;
    *reinterpret_cast<uint4*>(tile + tile_offset(e, d + 8)) = hi;
  }
#pragma unroll
  for (int i = 0; i < kRopePieces; ++i)
    *reinterpret_cast<uint4*>(tile + tile_offset(e, Entry::kNopeDim + 8 * (sub + kSplit * i))) = rope[i];
}

// A template only so that the three instantiation units can include it (one definition each).
template <int kHeadTile>
__global__ void __launch_bounds__(WgmmaPlan::kThreads, 1)
    sparse_attention_wgmma_kernel(const __grid_constant__ SparseAttentionParams p) {
  static_assert(kHeadTile == WgmmaPlan::kHeads, "the wgmma kernel is the 64-head tile");
  using W = WgmmaPlan;
  constexpr int kThreads = W::kThreads;
  extern __shared__ __align__(16) std::uint8_t smem_unaligned[];
  const std::uint32_t misalignment = ptx::smem_address(smem_unaligned) % ptx::kSwizzleAtomBytes;
  std::uint8_t* smem = smem_unaligned + (ptx::kSwizzleAtomBytes - misalignment) % ptx::kSwizzleAtomBytes;
  std::uint8_t* s_q = smem + W::kQ;                                    // bf16 [64 heads][512], swizzled
  std::uint8_t* s_k = smem + W::kK;                                    // 2 × bf16 [64 candidates][512], swizzled
  auto* s_slots = reinterpret_cast<int*>(smem + W::kSlots);            // [512]
  auto* s_valid = reinterpret_cast<std::uint32_t*>(smem + W::kValid);  // [8][2]
  auto* s_live = reinterpret_cast<int*>(smem + W::kLive);              // [8] + count + flag
  int& s_is_last = s_live[kMaxBlocksPerSplit + 1];

  const int tid = threadIdx.x, lane = tid % 32;
  const int warpgroup = tid / 128, wg_warp = (tid % 128) / 32;
  const int quad = lane % 4;
  const int frag_row = 16 * wg_warp + lane / 4;  // this thread's heads: frag_row and frag_row + 8

  const ChunkWork work = chunk_of_block(p, kHeadTile);
  const int head0 = work.head0;
  const std::int64_t row = work.row;

  // Q tile (heads past num_heads zero-filled), the chunk's plan, the first block decoded.
  for (int i = tid; i < kHeadTile * (kDim / 8); i += kThreads) {
    const int h = i / (kDim / 8), d = (i % (kDim / 8)) * 8;
    const bool valid = head0 + h < p.num_heads;
    const std::uint16_t* src = valid ? p.q + ((row * p.num_heads + head0 + h) * kDim + d) : p.q;
    ptx::cp_async_16(s_q + tile_offset(h, d), src, valid);
  }
  ptx::cp_async_commit();
  const int num_live = plan_chunk<kThreads>(p, work, s_slots, s_valid, s_live);
  if (num_live > 1) prefetch_block(p, s_slots, work.chunk_begin, s_live[1], tid);
  if (num_live > 0) {
    EntryShare first;
    load_entry_codes(p, s_slots, work.chunk_begin, s_live[0], tid, first);
    store_entry_share(first, s_k, tid);
  }
  ptx::cp_async_wait_all();
  ptx::fence_proxy_async_shared();
  __syncthreads();

  float run_max[2] = {-INFINITY, -INFINITY}, run_sum[2] = {0.0f, 0.0f};  // heads frag_row, frag_row + 8
  float acc_o[W::kDimsPerWarpgroup / 2];  // d[4j+i]: head frag_row + 8·(i/2), dim 256·warpgroup + 8j + 2·quad + i%2
#pragma unroll
  for (int i = 0; i < W::kDimsPerWarpgroup / 2; ++i) acc_o[i] = 0.0f;
  const std::uint64_t q_descriptor = ptx::sw128_descriptor(s_q);

  for (int it = 0; it < num_live; ++it) {
    const int block = s_live[it];
    std::uint8_t* tile = s_k + (it % 2) * W::kTileBytes;
    std::uint8_t* next_tile = s_k + ((it + 1) % 2) * W::kTileBytes;

    // S = Q·Kᵀ over the 512 dims: k-step kk is slice kk / 4, byte offset 32·(kk mod 4) in its rows.
    float acc_s[32];  // d[4j+i]: head frag_row + 8·(i/2), candidate 8j + 2·quad + i%2
#pragma unroll
    for (int i = 0; i < 32; ++i) acc_s[i] = 0.0f;
    const std::uint64_t k_descriptor = ptx::sw128_descriptor(tile);
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kDim / 16; ++kk) {
      const std::uint64_t step = static_cast<std::uint64_t>(((kk / 4) * W::kSliceBytes + (kk % 4) * 32) >> 4);
      ptx::wgmma_m64n64k16_bf16_ss(acc_s, q_descriptor + step, k_descriptor + step, kk > 0);
    }
    ptx::wgmma_commit();

    // The next block's bytes travel while the tensor cores work.
    const bool has_next = it + 1 < num_live;
    EntryShare next;
    if (has_next) load_entry_codes(p, s_slots, work.chunk_begin, s_live[it + 1], tid, next);
    if (it + 2 < num_live) prefetch_block(p, s_slots, work.chunk_begin, s_live[it + 2], tid);

    ptx::wgmma_wait_all();
#pragma unroll
    for (int i = 0; i < 32; ++i) ptx::fence_operand(acc_s[i]);

    // Scores in base 2, masked; block maximum per head over the quad (a head's 64 candidates).
    const std::uint32_t valid_lo = s_valid[2 * block], valid_hi = s_valid[2 * block + 1];
    float block_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int cand = 8 * j + 2 * quad + i % 2;
        const std::uint32_t bits = j < 4 ? valid_lo : valid_hi;
        float& s = acc_s[4 * j + i];
        s = (bits >> (cand % 32)) & 1u ? __fmul_rn(s, p.score_scale_log2) : -INFINITY;
        block_max[i / 2] = fmaxf(block_max[i / 2], s);
      }
    }
    float max_safe[2], rescale[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float m = block_max[half];
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      const float new_max = fmaxf(run_max[half], m);
      max_safe[half] = new_max == -INFINITY ? 0.0f : new_max;
      rescale[half] = ptx::exp2_approx(__fsub_rn(run_max[half], max_safe[half]));
      run_max[half] = new_max;
    }
    // P in bf16, placed as the A fragments of the four k16 steps of P·V: step kk takes score n-tiles
    // 2kk (a0: head frag_row, a1: + 8) and 2kk + 1 (a2, a3). The sums use the rounded values.
    std::uint32_t prob[16];
    float block_sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const std::uint32_t pr =
            ptx::pack_bf16x2(ptx::exp2_approx(__fsub_rn(acc_s[4 * j + 2 * half], max_safe[half])),
                             ptx::exp2_approx(__fsub_rn(acc_s[4 * j + 2 * half + 1], max_safe[half])));
        prob[4 * (j / 2) + 2 * (j % 2) + half] = pr;
        block_sum[half] = __fadd_rn(block_sum[half], __uint_as_float(pr << 16));
        block_sum[half] = __fadd_rn(block_sum[half], __uint_as_float(pr & 0xffff0000u));
      }
    }
    bool any_rescale = false;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float sum = block_sum[half];
      sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 1));
      sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 2));
      run_sum[half] = __fmaf_rn(run_sum[half], rescale[half], sum);
      any_rescale |= rescale[half] != 1.0f;
    }
    if (__any_sync(0xffffffffu, any_rescale)) {  // x·1 = x exactly: skipping changes no bit
#pragma unroll
      for (int i = 0; i < W::kDimsPerWarpgroup / 2; ++i) acc_o[i] = __fmul_rn(acc_o[i], rescale[(i % 4) / 2]);
    }

    // O += P·V: B = this warpgroup's 4 slices of the K tile, N-major: 64 dims per 128-byte row (next
    // 64 dims one slice further: leading offset), 8 candidates per atom (next 8: stride offset).
    const std::uint64_t v_descriptor =
        ptx::sw128_descriptor(tile + warpgroup * (W::kDimsPerWarpgroup / 64) * W::kSliceBytes, W::kSliceBytes,
                              ptx::kSwizzleAtomBytes);
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlock / 16; ++kk) {
      const std::uint64_t step = static_cast<std::uint64_t>((kk * 16 * 128) >> 4);  // 16 candidate rows
      ptx::wgmma_m64n256k16_bf16_rs_bt(acc_o, prob[4 * kk], prob[4 * kk + 1], prob[4 * kk + 2], prob[4 * kk + 3],
                                       v_descriptor + step, true);
    }
    ptx::wgmma_commit();
    // The other K tile was last read by the previous block's P·V, finished before the last barrier.
    if (has_next) store_entry_share(next, next_tile, tid);
    ptx::wgmma_wait_all();
#pragma unroll
    for (int i = 0; i < W::kDimsPerWarpgroup / 2; ++i) ptx::fence_operand(acc_o[i]);
    ptx::fence_proxy_async_shared();
    __syncthreads();  // the next tile is complete; this one is free
  }

  const std::int64_t out_row = row * p.num_heads;
  const float* rope_cos = p.rope_cos != nullptr ? p.rope_cos + row * (Entry::kRopeDim / 2) : nullptr;
  const float* rope_sin = p.rope_sin != nullptr ? p.rope_sin + row * (Entry::kRopeDim / 2) : nullptr;
  const int dim0 = warpgroup * W::kDimsPerWarpgroup + 2 * quad;  // + 8j: this thread's output dim pairs

  if (p.num_splits == 1) {  // the whole row in this block: normalize from registers
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int h = head0 + frag_row + 8 * half;
      if (h >= p.num_heads) continue;
      const float m = run_max[half], l = run_sum[half];
      const RowNormalizer n = merge_weights(1, [&](int) { return make_float2(m, l); }, __fmul_rn(p.attn_sink[h], kLog2e));
      const float weight = chunk_weight(m, n.max_safe);
      if (warpgroup == 0 && quad == 0) p.lse[out_row + h] = n.lse;
      std::uint16_t* out = p.out + (out_row + h) * kDim;
#pragma unroll
      for (int j = 0; j < W::kDimsPerWarpgroup / 8; ++j) {
        const int d = dim0 + 8 * j;
        const bool rotate = rope_cos != nullptr && d >= Entry::kNopeDim;
        const int pair = rotate ? rope_pair(d) : 0;
        *reinterpret_cast<std::uint32_t*>(out + d) =
            finish_pair(accumulate_chunk(0.0f, acc_o[4 * j + 2 * half], weight),
                        accumulate_chunk(0.0f, acc_o[4 * j + 2 * half + 1], weight), n.inv_denom, rotate,
                        rotate ? rope_cos[pair] : 1.0f, rotate ? rope_sin[pair] : 0.0f);
      }
    }
    return;
  }

  // Several chunks: publish this one, then the last to arrive merges all of them in order.
  const std::int64_t chunk_base = row * p.num_splits;  // [row][chunk][head]
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int h = head0 + frag_row + 8 * half;
    if (h >= p.num_heads) continue;
    const std::int64_t slot = (chunk_base + work.chunk) * p.num_heads + h;
    float* out = p.partial_out + slot * kDim;
#pragma unroll
    for (int j = 0; j < W::kDimsPerWarpgroup / 8; ++j)
      *reinterpret_cast<float2*>(out + dim0 + 8 * j) = make_float2(acc_o[4 * j + 2 * half], acc_o[4 * j + 2 * half + 1]);
    if (warpgroup == 0 && quad == 0)
      *reinterpret_cast<float2*>(p.partial_stats + slot * 2) = make_float2(run_max[half], run_sum[half]);
  }
  if (!last_to_arrive(p, row, head0, s_is_last)) return;
  merge_chunks<kHeadTile, kThreads>(p, row, head0, reinterpret_cast<float*>(smem),
                                    reinterpret_cast<float*>(smem + W::kInv));
  reset_arrivals(p, row, head0);
}

}  // namespace dsv4::cuda::sparse_attention
