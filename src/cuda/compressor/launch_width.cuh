// src/cuda/compressor/launch_width.cuh — grid computation and launch of the kernels of one entry
// width (instantiated once per width in kernels_c*.cu, so the two widths compile in parallel).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/common/runtime.hpp"  // launch_early
#include "cuda/compressor/config.hpp"
#include "cuda/compressor/kernels.hpp"
#include "cuda/compressor/online.cuh"
#include "cuda/compressor/params.hpp"
#include "cuda/compressor/two_pass.cuh"

namespace dsv4::cuda::compressor {

// Prefers the smallest shared-memory configuration (as a percentage of the SM's maximum, rounded up
// by the driver to a supported one) that holds `blocks` blocks of `kernel` with `dynamic_bytes`.
template <class Kernel>
cudaError_t set_carveout_for_min_blocks(Kernel kernel, int blocks, int dynamic_bytes) {
  int device = 0, per_sm = 0, reserved = 0;
  cudaFuncAttributes attributes{};
  cudaError_t status = cudaGetDevice(&device);
  if (status == cudaSuccess) status = cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
  if (status == cudaSuccess) status = cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device);
  if (status == cudaSuccess) status = cudaFuncGetAttributes(&attributes, kernel);
  if (status != cudaSuccess) return status;
  const std::int64_t needed = static_cast<std::int64_t>(blocks) *
                              (dynamic_bytes + reserved + static_cast<std::int64_t>(attributes.sharedSizeBytes));
  const int percent = static_cast<int>(std::min<std::int64_t>(100, (needed * 100 + per_sm - 1) / per_sm));
  return cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, percent);
}

// Launches `kernel` with `leading_blocks` blocks (split units and slice-chain blocks), then one unit
// per item (num_items + ring_items; the split instantiation, `ring_items_only`: its ring items only).
template <class Config, class Kernel>
cudaError_t launch_items(Kernel kernel, const KernelParams& params, cudaStream_t stream,
                         std::int64_t leading_blocks = 0, bool ring_items_only = false) {
  // The staging needs more than the default 48 KB of dynamic shared memory: opt in once per kernel.
  static const cudaError_t opted_in = [&] {
    const cudaError_t status =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Config::kBytes);
    if (status != cudaSuccess || !Config::kCarveoutForMinBlocks) return status;
    return set_carveout_for_min_blocks(kernel, Config::kMinBlocksPerSM, Config::kBytes);
  }();
  if (opted_in != cudaSuccess) return opted_in;
  const std::int64_t items = (ring_items_only ? 0 : params.num_items) + params.ring_items;
  const std::int64_t blocks = leading_blocks + (items + Config::kUnitsPerBlock - 1) / Config::kUnitsPerBlock;
  return launch_early(kernel, dim3(static_cast<unsigned>(blocks)), dim3(Config::kBlockThreads), Config::kBytes, stream,
                      params);
}

// launch_items of the two-pass kernel of Config, or of WithEvictFirstRows<Config> where
// `evict_first_rows`.
template <class Config>
cudaError_t launch_two_pass(const KernelParams& params, bool evict_first_rows, cudaStream_t stream,
                            std::int64_t leading_blocks = 0, bool ring_items_only = false) {
  using EvictFirst = WithEvictFirstRows<Config>;
  if (evict_first_rows) {
    return launch_items<EvictFirst>(two_pass_kernel<EvictFirst>, params, stream, leading_blocks, ring_items_only);
  }
  return launch_items<Config>(two_pass_kernel<Config>, params, stream, leading_blocks, ring_items_only);
}

// Launches the kernel for `params` (num_items ≥ 1; the host has checked the grid fits).
//   online: the online variant (after online_save_kernel where params.online_saved is set);
//   long_window: more than kSingleGroupMaxCandidates candidates per event;
//   params.split_events_count > 0 or params.chain_requests > 0 (long windows only): the split (decode)
//   instantiation;
//   short_window: the instantiation of a short-window step (launch.cu: for decode steps the lean one
//   or FourBlocksPerSM); online_stages: the online kernel's (TwoStages or Deep, launch.cu);
//   evict_first_rows: the split and lean instantiations copy their rows evict-first (config.hpp).
template <int kWidth>
cudaError_t launch_width(const KernelParams& params, bool online, bool long_window, ShortWindowPrefill short_window,
                         OnlineStages online_stages, bool evict_first_rows, cudaStream_t stream) {
  if (online) {
    // A step that saves a head's starting snapshot (params.hpp, online_kept_counts) copies it first.
    if (params.online_saved != nullptr) {
      const dim3 grid(static_cast<unsigned>(params.num_requests));
      const cudaError_t status = launch_early(online_save_kernel<kWidth>, grid, dim3(128), 0, stream, params);
      if (status != cudaSuccess) return status;
    }
    using Deep = OnlineConfig<kWidth, kOnlineDeepStages>;
    if (online_stages == OnlineStages::Deep) return launch_items<Deep>(online_kernel<Deep>, params, stream);
    return launch_items<OnlineConfig<kWidth>>(online_kernel<OnlineConfig<kWidth>>, params, stream);
  }
  if (long_window && (params.split_events_count > 0 || params.chain_requests > 0)) {
    return launch_two_pass<TwoPassConfig<kWidth, true, true>>(
        params, evict_first_rows, stream,
        static_cast<std::int64_t>(params.split_events_count) * params.split_units + params.chain_requests, true);
  }
  if (long_window) {
    return launch_items<TwoPassConfig<kWidth, true>>(two_pass_kernel<TwoPassConfig<kWidth, true>>, params, stream);
  }
  if (short_window == ShortWindowPrefill::FiveBlocksPerSM) {
    using Config = TwoPassFiveBlocksConfig<kWidth>;
    return launch_items<Config>(two_pass_kernel<Config>, params, stream);
  }
  if (short_window == ShortWindowPrefill::FiveBlocksPerSMLean) {
    return launch_two_pass<TwoPassFiveBlocksConfig<kWidth, true>>(params, evict_first_rows, stream);
  }
  return launch_items<TwoPassConfig<kWidth, false>>(two_pass_kernel<TwoPassConfig<kWidth, false>>, params, stream);
}

}  // namespace dsv4::cuda::compressor
