// dsv4/sparse_attention.hpp — sparse multi-query attention over the FP8 caches, with sink (SPEC §8 steps 4–6).
//
// Every query row attends to its own candidates: a list of physical slots in the window (raw token)
// cache and a list in the compressed cache, both pools in the 584-byte entry layout of SPEC §5.1.
// All heads of a row share the candidates; the decoded 512-wide entry is both key and value:
//
//   z_i = q_h · e_i · softmax_scale          over the row's valid candidates e_i
//   M   = max(max_i z_i, sink_h)
//   o_h = Σ_i exp(z_i − M) e_i / (Σ_i exp(z_i − M) + exp(sink_h − M))      → bf16
//   lse = M + log(Σ_i exp(z_i − M) + exp(sink_h − M))                       (natural log, sink included)
//
// then optionally the inverse RoPE of the last 64 dims (SPEC §8 step 6) on the bf16 output.
// Decode (B requests × next_n rows) and prefill (ragged tokens) are the same call: a row is a row.
//
// Backends: the tensors' device picks the CPU reference (double accumulation) or the CUDA kernels
// (sm_90a). The CUDA result of a row never depends on the other rows or on the batch size (see
// SparseAttentionOptions::split_candidates).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "dsv4/tensor.hpp"

namespace dsv4 {

// A paged pool of 584-byte attention entries: `pages` is U8 [num_pages, page_bytes] with
// page_bytes = AttentionEntryFormat::page_bytes(entries_per_page). Slot s lives in page
// s / entries_per_page at index s mod entries_per_page.
struct AttentionPoolView {
  TensorView pages;          // U8 [num_pages, page_bytes]
  int entries_per_page = 0;  // P for the window cache, P/m for a compressed cache
};

// Default chunk size of the CUDA backend: rows of up to 1152 candidates (128 window + 1024) run as one
// chunk, so large batches and prefill split no row (H200, H = 64, 640 candidates: B = 128 in 44 us
// against 63 us with chunks of 384); the price is latency at B = 1: 34 us, against 24 us with 384 and
// 13 us with 64 (10 us a call in a graph of a model's layers), where a row's chunks merge inside a
// thread-block cluster (docs/PERFORMANCE.md; notes-sparse-attention.md §12, §16, §31). A latency-first
// deployment fixes a small split instead; a throughput-first one with longer rows (HCA layers at long
// context) the largest: rows of 2176 candidates at B = 128 then run as one chunk, 20–24% faster (H200,
// H = 128, next_n = 2: 505 -> 385 us), at the price of B = 32 (H = 64: 65 -> 97 us) and B = 1.
inline constexpr int kDefaultSplitCandidates = 1152;
// Largest split_candidates: a row of 128 window + 2048 compressed candidates fits one chunk, so it has
// no partial outputs to write and merge (at large batches and in prefill those cost as much memory
// traffic as the entries themselves).
inline constexpr int kMaxSplitCandidates = 2560;
static_assert(kMaxSplitCandidates % 64 == 0 && kDefaultSplitCandidates % 64 == 0 &&
                  kDefaultSplitCandidates <= kMaxSplitCandidates,
              "splits are whole 64-candidate blocks, the default within the limit");

struct SparseAttentionOptions {
  // Multiplies q·e (SPEC: 1/sqrt(d), d = 512). Must be finite and positive.
  float softmax_scale = 1.0f / std::sqrt(512.0f);
  // Fused inverse RoPE of each head's last 64 dims: F32 [N_q, 32] each, cos and sin of the angle of
  // pair i at the row's position (compute them with RopeTable). Both absent (default) or both given.
  TensorView rope_cos;
  TensorView rope_sin;
  // CUDA only. Candidates [0, W + K) of a row are processed in fixed chunks of this many (a multiple
  // of 64, at most 2560), each chunk by its own thread block, then merged in chunk order. A row's
  // bytes depend on this value and on its own inputs only — keep it fixed for a model to keep batch
  // invariance. Smaller: lower latency at small batches; larger: less merge traffic at large ones.
  int split_candidates = kDefaultSplitCandidates;
  // CUDA only: how many thread blocks share one (row, 64-head tile, chunk), each producing 512 / parts
  // of the output dims. Every part recomputes the same scores and probabilities, so the bytes do not
  // depend on it: 0 (default) splits while the grid would leave SMs idle (small batches), 1, 2 or 4
  // force it. Splitting applies where H is a multiple of 64; other H ignore it.
  int output_parts = 0;
  // CUDA only, optional: scratch of at least sparse_attention_workspace_bytes() bytes (U8, on the GPU),
  // any contents; a call that merges chunks through it clears the few hundred bytes of chunk counters
  // it uses (one memset), so one workspace serves calls of every shape up to its size. Without it,
  // each call of rows of several chunks allocates its own (stream-ordered; in a captured graph an
  // allocation step, which keeps the attention from starting early behind the kernel before it).
  // Early launch (CUDA; DSV4_ATTENTION_EARLY_LAUNCH=0 turns it off): the attention's blocks may take
  // free SMs and read their parameters while the kernel before them in the stream finishes, if that
  // kernel allows it (griddepcontrol.launch_dependents), and wait for it before reading or writing
  // any tensor. The attention itself allows it at its start: a kernel launched after it with
  // programmatic stream serialization must execute griddepcontrol.wait before it reads out, lse or the
  // workspace, or writes any of the attention's inputs (launches without that attribute wait as usual).
  TensorView workspace;
  // CUDA only: the cudaStream_t to run on (nullptr: the default stream).
  void* stream = nullptr;
};

// Runs the attention for N_q query rows.
//   q                  BF16 [N_q, H, 512], any H ≥ 1
//   window_cache       pool of the raw-token (SWA) entries
//   compressed_cache   pool of the compressed entries
//   window_slots       I32 [N_q, W]: physical slots in window_cache, −1 = none (W ≥ 0)
//   compressed_slots   I32 [N_q, K]: physical slots in compressed_cache, −1 = none (K ≥ 0)
//   attn_sink          F32 [H], per head, natural-log units (−inf: no sink; NaN / +inf are errors on the CPU)
//   out                BF16 [N_q, H, 512], written entirely
//   lse                F32 [N_q, H], written entirely (−inf for a row without candidates or sink)
// A row without valid candidates gives a zero output. Slot 0 is the pool's null entry and is read
// like any other. Every tensor must be on the same device; on CUDA, q, out and the pools must be
// 16-byte aligned; out, lse and the workspace share no byte with an input or with each other. Throws
// Error naming the argument for any violation before anything is written;
// on the CPU a slot outside [−1, num_slots) is such an error, on CUDA (where slots stay on the
// device) it is treated as −1.
void sparse_attention(const TensorView& q, const AttentionPoolView& window_cache,
                      const AttentionPoolView& compressed_cache, const TensorView& window_slots,
                      const TensorView& compressed_slots, const TensorView& attn_sink, const TensorView& out,
                      const TensorView& lse, const SparseAttentionOptions& options = {});

// Bytes of the CUDA workspace for N_q rows of H heads over W + K candidates with `split_candidates`
// (0 when no row needs more than one chunk). Throws Error naming the argument for a negative extent
// or an invalid split.
std::size_t sparse_attention_workspace_bytes(std::int64_t num_rows, std::int64_t num_heads,
                                             std::int64_t num_candidates,
                                             int split_candidates = kDefaultSplitCandidates);

}  // namespace dsv4
