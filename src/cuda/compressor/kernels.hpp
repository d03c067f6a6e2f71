// src/cuda/compressor/kernels.hpp — the launchers of the two entry widths (kernels_c512.cu,
// kernels_c128.cu), for the host code in launch.cu.
#pragma once

#include <cuda_runtime.h>

#include "cuda/compressor/params.hpp"

namespace dsv4::cuda::compressor {

// Launch the kernel of `params` (num_items ≥ 1) on `stream`, early (runtime.hpp's launch_early), and
// return the launch's status (with the runtime's last error, as cudaGetLastError() after it).
//   online: the online variant; long_window: more than kSingleGroupMaxCandidates candidates per event;
//   params.split_events_count > 0: the split-unit (decode) kernel of a long window;
//   short_window: the instantiation of a short-window two-pass step (ignored otherwise).
//   online_stages: the online kernel's staging depth (TwoStages or Deep).
//   evict_first_rows: the lean and split instantiations copy their rows evict-first (config.hpp).
cudaError_t launch_attention_width(const KernelParams& params, bool online, bool long_window,
                                   ShortWindowPrefill short_window, OnlineStages online_stages,
                                   bool evict_first_rows, cudaStream_t stream);  // c = 512
cudaError_t launch_indexer_width(const KernelParams& params, bool online, bool long_window,
                                 ShortWindowPrefill short_window, OnlineStages online_stages,
                                 bool evict_first_rows, cudaStream_t stream);  // c = 128

}  // namespace dsv4::cuda::compressor
