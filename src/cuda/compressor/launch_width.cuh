// src/cuda/compressor/launch_width.cuh — grid computation and launch of the kernels of one entry
// width (instantiated once per width in kernels_c*.cu, so the two widths compile in parallel).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/compressor/config.hpp"
#include "cuda/compressor/kernels.hpp"
#include "cuda/compressor/online.cuh"
#include "cuda/compressor/params.hpp"
#include "cuda/compressor/two_pass.cuh"

namespace dsv4::cuda::compressor {

// Launches `kernel` with `leading_blocks` blocks (split units), then one unit per item
// (num_items + ring_items).
template <class Config, class Kernel>
cudaError_t launch_items(Kernel kernel, const KernelParams& params, cudaStream_t stream,
                         std::int64_t leading_blocks = 0) {
  // The staging needs more than the default 48 KB of dynamic shared memory: opt in once per kernel.
  static const cudaError_t opted_in =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Config::kBytes);
  if (opted_in != cudaSuccess) return opted_in;
  const std::int64_t items = params.num_items + params.ring_items;
  const std::int64_t blocks = leading_blocks + (items + Config::kUnitsPerBlock - 1) / Config::kUnitsPerBlock;
  kernel<<<static_cast<unsigned>(blocks), Config::kBlockThreads, Config::kBytes, stream>>>(params);
  return cudaGetLastError();
}

// Launches the kernel for `params` (num_items ≥ 1; the host has checked the grid fits).
//   online: the online variant; long_window: more than kSingleGroupMaxCandidates candidates per event;
//   params.split_events_count > 0 (long windows only): the split (decode) instantiation.
template <int kWidth>
cudaError_t launch_width(const KernelParams& params, bool online, bool long_window, cudaStream_t stream) {
  if (online) return launch_items<OnlineConfig<kWidth>>(online_kernel<OnlineConfig<kWidth>>, params, stream);
  if (long_window && params.split_events_count > 0) {
    using Config = TwoPassConfig<kWidth, true, true>;
    return launch_items<Config>(two_pass_kernel<Config>, params, stream,
                                static_cast<std::int64_t>(params.split_events_count) * Config::kSplitUnits);
  }
  if (long_window) {
    return launch_items<TwoPassConfig<kWidth, true>>(two_pass_kernel<TwoPassConfig<kWidth, true>>, params, stream);
  }
  return launch_items<TwoPassConfig<kWidth, false>>(two_pass_kernel<TwoPassConfig<kWidth, false>>, params, stream);
}

}  // namespace dsv4::cuda::compressor
