// src/cuda/indexer/query_kernel.cuh — fused query preparation (SPEC §7): RoPE, Walsh–Hadamard,
// quantization like the keys, head weights. One warp per (row, head); lane l holds dims 4l..4l+3.
//
// The arithmetic follows the CPU reference operation for operation (RoPE and the butterflies in
// double, the same butterfly order, bf16 rounding after RoPE and after the transform, the shared
// number-format encoders), so the codes match it bit for bit on ordinary data.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/common/ptx_sm90.cuh"  // wait_for_prerequisite_grids, allow_dependent_launch
#include "cuda/common/spans.cuh"  // a probe build's kernel spans
#include "cuda/indexer/params.hpp"
#include "dsv4/entry_codec.hpp"
#include "dsv4/formats.hpp"

namespace dsv4::cuda::indexer_query {

inline constexpr int kDim = 128;
inline constexpr int kWarps = 8;
inline constexpr int kThreads = 32 * kWarps;
inline constexpr int kPerLane = kDim / 32;  // 4 consecutive dims per lane
static_assert(kPerLane == 4, "a lane holds two RoPE pairs");

template <IndexerKeyFormat kFormat>
__global__ void __launch_bounds__(kThreads) query_kernel(const IndexerQueryPrepParams p) {
  // Launched early (query.cu). The score kernel behind it may take SMs only once this grid runs: its
  // blocks made resident while the kernel before this one still runs take ≈ 3.5 µs longer (spans probe,
  // notes-sparse-attention §33), and this kernel's own ≈ 1 µs covers the score kernel's launch.
  cuda::ptx::wait_for_prerequisite_grids();
  cuda::ptx::allow_dependent_launch();
  spans::stamp(spans::kQuery);
  const std::int64_t head = static_cast<std::int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;  // row·H + h
  if (head >= p.num_rows * p.heads) return;
  const int lane = threadIdx.x % 32;
  const std::int64_t row = head / p.heads;

  const float4 in = *reinterpret_cast<const float4*>(p.q_rows + head * kDim + lane * kPerLane);
  double x[kPerLane] = {in.x, in.y, in.z, in.w};

  // RoPE on the last r dims: interleaved pairs (2i, 2i+1) of the tail.
  const int tail = kDim - 2 * p.rope_pairs;
#pragma unroll
  for (int j = 0; j < kPerLane; j += 2) {
    const int e = lane * kPerLane + j;
    if (e >= tail) {
      const int i = (e - tail) / 2;
      const double c = p.rope_cos[row * p.rope_pairs + i], s = p.rope_sin[row * p.rope_pairs + i];
      const double a = x[j], b = x[j + 1];
      x[j] = static_cast<float>(a * c - b * s);
      x[j + 1] = static_cast<float>(a * s + b * c);
    }
  }
  // bf16 after RoPE, as the keys are (SPEC §4 post-processing; §7 "quantized like the keys").
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) x[j] = round_to_bf16(static_cast<float>(x[j]));

  // Walsh–Hadamard in Sylvester order: butterflies over strides 1, 2 (inside the lane) then 4..64
  // (lane strides 1..16); the element with the stride bit clear keeps a + b, its partner a − b.
  for (int h = 1; h < kPerLane; h *= 2) {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      if ((j & h) == 0) {
        const double a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  for (int lane_stride = 1; lane_stride < 32; lane_stride *= 2) {
    const bool upper = (lane & lane_stride) != 0;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const double partner = __shfl_xor_sync(0xffffffffu, x[j], lane_stride);
      x[j] = upper ? partner - x[j] : x[j] + partner;
    }
  }
  const double norm = 1.0 / sqrt(static_cast<double>(kDim));
  float v[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) v[j] = round_to_bf16(static_cast<float>(x[j] * norm));  // bf16 after WHT

  if constexpr (kFormat == IndexerKeyFormat::FP8) {
    float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
    for (int m = 16; m >= 1; m /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
    const float scale = indexer_fp8_scale(amax);
    std::uint32_t packed = 0;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) packed |= static_cast<std::uint32_t>(e4m3_from(v[j] / scale)) << (8 * j);
    reinterpret_cast<std::uint32_t*>(p.codes + head * kDim)[lane] = packed;
    if (lane == 0) static_cast<float*>(p.scales)[head] = scale;
  } else {
    // A 32-value block is 8 consecutive lanes.
    float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
    for (int m = 4; m >= 1; m /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
    const std::uint8_t e = ue8m0_scale_byte(amax, kE2m1Max, kUe8m0FloorE2m1);
    const float scale = float_from_ue8m0(e);
    std::uint32_t packed = 0;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) packed |= static_cast<std::uint32_t>(e2m1_from(v[j] / scale)) << (4 * j);
    reinterpret_cast<std::uint16_t*>(p.codes + head * (kDim / 2))[lane] = static_cast<std::uint16_t>(packed);
    if (lane % 8 == 0) static_cast<std::uint8_t*>(p.scales)[head * (kDim / 32) + lane / 8] = e;
  }
  if (lane == 0) p.weights[head] = static_cast<float>(static_cast<double>(p.head_logits[head]) * p.weight_scale);
}

}  // namespace dsv4::cuda::indexer_query
