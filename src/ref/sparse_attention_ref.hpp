// src/ref/sparse_attention_ref.hpp — the CPU reference of sparse_attention (the oracle of SPEC §9).
#pragma once

#include <cstdint>

namespace dsv4::ref {

// One paged pool of 584-byte entries on the host.
struct HostAttentionPool {
  const std::uint8_t* pages = nullptr;  // [num_pages, page_bytes]
  std::int64_t page_bytes = 0;
  int entries_per_page = 0;
};

// Host pointers of an already validated call (dsv4::sparse_attention checks every argument and
// every slot first): shapes as in dsv4/sparse_attention.hpp.
struct SparseAttentionCall {
  const std::uint16_t* q = nullptr;  // bf16 [num_rows, num_heads, 512]
  HostAttentionPool window, compressed;
  const std::int32_t* window_slots = nullptr;      // [num_rows, window_width], −1 = none
  const std::int32_t* compressed_slots = nullptr;  // [num_rows, compressed_width]
  const float* attn_sink = nullptr;                // [num_heads]
  const float* rope_cos = nullptr;                 // [num_rows, 32] or null
  const float* rope_sin = nullptr;                 // [num_rows, 32] or null
  std::uint16_t* out = nullptr;                    // bf16 [num_rows, num_heads, 512]
  float* lse = nullptr;                            // [num_rows, num_heads]
  std::int64_t num_rows = 0;
  int num_heads = 0, window_width = 0, compressed_width = 0;
  double softmax_scale = 0;
};

// Decodes each valid candidate with decode_attention_entry and evaluates SPEC §8.5 in double;
// the output is rounded to bf16, then (with rope tables) inverse-rotated in double and rounded again.
void sparse_attention(const SparseAttentionCall& call);

}  // namespace dsv4::ref
