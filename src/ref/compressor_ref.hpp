// src/ref/compressor_ref.hpp — the CPU reference backend of `compress` (SPEC §4–§6).
//
// CompressArgs is the plain parameter block every backend receives from src/ops/compress.cpp after
// validation: the buffers (raw pointers on the backend's device, explicit strides) and the host-side
// spec and plan.
#pragma once

#include <cstdint>

#include "dsv4/compressor.hpp"
#include "dsv4/rope.hpp"
#include "ref/compress_buffers.hpp"

namespace dsv4::ref {

struct CompressArgs : CompressBuffers {
  const CompressorSpec* spec = nullptr;
  const CompressPlan* plan = nullptr;  // host
};

// Runs a validated step on host memory.
void compress(const CompressArgs& args);

// Post-processing of one compressed row (SPEC §4): bf16 → RMSNorm(norm) → bf16 → RoPE at
// `position` on the last r dims → bf16 → (indexer: Walsh–Hadamard → bf16). `values` [c] receives
// the values the entry encodes; it may alias `compressed` [c].
void postprocess_entry(const CompressorSpec& spec, const RopeTable& rope, const float* norm /*[c]*/,
                       const float* compressed /*[c]*/, std::int64_t position, float* values /*[c]*/);

}  // namespace dsv4::ref
