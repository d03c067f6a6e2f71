// src/ref/compressor_ref.hpp — the CPU reference backend of `compress` (SPEC §4–§6).
//
// CompressArgs is the plain parameter block every backend receives from src/ops/compress.cpp after
// validation: raw pointers on the backend's device, explicit strides, and the host-side plan.
#pragma once

#include <cstdint>

#include "dsv4/compressor.hpp"
#include "dsv4/rope.hpp"

namespace dsv4::ref {

struct CompressArgs {
  const CompressorSpec* spec = nullptr;
  const CompressPlan* plan = nullptr;      // host
  const float* kv = nullptr;               // [T, coff·c], row stride kv_stride floats
  std::int64_t kv_stride = 0;
  const float* score = nullptr;            // [T, coff·c] WITHOUT ape, row stride score_stride floats
  std::int64_t score_stride = 0;
  const float* ape = nullptr;              // [m, coff·c]
  const float* norm = nullptr;             // [c]
  float* state = nullptr;                  // [num_slots, records_per_slot, record_floats]
  int records_per_slot = 0;                // two-pass: ring rows R; online: snapshots
  int record_floats = 0;                   // two-pass: 2·coff·c (kv | score+ape); online: 3·c (M | S | V)
  std::uint8_t* cache = nullptr;           // [num_pages, page_bytes]
  std::int64_t page_bytes = 0;
  int entries_per_page = 0;                // B = P/m
  float* out_compressed = nullptr;         // [E, c] or null
  std::int32_t* out_entry_ids = nullptr;   // [E] or null
  std::int32_t* out_positions = nullptr;   // [E] or null
  std::int32_t* out_cache_slots = nullptr; // [E] or null
};

// Runs a validated step on host memory.
void compress(const CompressArgs& args);

// Post-processing of one compressed row (SPEC §4): bf16 → RMSNorm(norm) → bf16 → RoPE at
// `position` on the last r dims → bf16 → (indexer: Walsh–Hadamard → bf16). `values` [c] receives
// the values the entry encodes; it may alias `compressed` [c].
void postprocess_entry(const CompressorSpec& spec, const RopeTable& rope, const float* norm /*[c]*/,
                       const float* compressed /*[c]*/, std::int64_t position, float* values /*[c]*/);

}  // namespace dsv4::ref
