// src/cuda/compressor/kernels_c512.cu — the compressor kernels at attention width (c = 512).
#include "cuda/compressor/launch_width.cuh"

namespace dsv4::cuda::compressor {

cudaError_t launch_attention_width(const KernelParams& params, bool online, bool long_window,
                                   ShortWindowPrefill short_window, OnlineStages online_stages, bool evict_first_rows,
                                   cudaStream_t stream) {
  return launch_width<512>(params, online, long_window, short_window, online_stages, evict_first_rows, stream);
}

}  // namespace dsv4::cuda::compressor
