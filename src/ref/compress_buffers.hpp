// src/ref/compress_buffers.hpp — the memory a `compress` step reads and writes, as raw pointers and
// strides on the backend's device. CompressArgs (compressor_ref.hpp) adds the host-side spec and
// plan; the CUDA kernels' parameter block (cuda/compressor/params.hpp) adds the step's device
// metadata. Both derive from this one struct, so the pointers are copied in one assignment.
#pragma once

#include <cstdint>

namespace dsv4::ref {

struct CompressBuffers {
  const float* kv = nullptr;               // [T, coff·c], row stride kv_stride floats (CUDA: multiple of 4, 16-B aligned)
  std::int64_t kv_stride = 0;
  const float* score = nullptr;            // [T, coff·c] WITHOUT ape, row stride score_stride floats
  std::int64_t score_stride = 0;
  const float* ape = nullptr;              // [m, coff·c]
  const float* norm = nullptr;             // [c]
  float* state = nullptr;                  // [num_slots, records_per_slot, record_floats]
  std::int32_t records_per_slot = 0;       // two-pass: ring rows R; online: snapshots (max_rollback + 1)
  std::int32_t record_floats = 0;          // two-pass: 2·coff·c (kv | score + ape); online: 3·c (M | S | V)
  std::uint8_t* cache = nullptr;           // the paged cache [num_pages, page_bytes]
  std::int64_t page_bytes = 0;
  std::int32_t entries_per_page = 0;       // B = P / m
  // Optional outputs, one row per event (null when not asked for).
  float* out_compressed = nullptr;         // [E, c]
  std::int32_t* out_entry_ids = nullptr;   // [E]
  std::int32_t* out_positions = nullptr;   // [E]
  std::int32_t* out_cache_slots = nullptr; // [E]
  // CUDA two-pass long windows without overlap: the pool's slice chains (runtime/slice_chains.hpp),
  // [num_slots, cuda::slice_chain_floats(spec)]; null elsewhere (the CPU reference folds the ring).
  float* chains = nullptr;
};

}  // namespace dsv4::ref
