// The sparse attention kernel for head tiles of 64 (see launch_tile.cuh).
#include "cuda/sparse_attention/launch_tile.cuh"

namespace dsv4::cuda::sparse_attention {
template void launch_tile<64>(const SparseAttentionParams&, cudaStream_t);
}  // namespace dsv4::cuda::sparse_attention

namespace dsv4::cuda {
// Here, beside the kernels it asks about (each unit compiles its own copy of a kernel template).
int attention_clusters_at_once(int size, int output_parts) {
  switch (output_parts) {
    case 4: return sparse_attention::wgmma_clusters_at_once<4>(size);
    case 2: return sparse_attention::wgmma_clusters_at_once<2>(size);
    default: return sparse_attention::wgmma_clusters_at_once<1>(size);
  }
}
}  // namespace dsv4::cuda

namespace dsv4::cuda::sparse_attention {

#ifdef DSV4_ATTENTION_TIMELINE
// Here, next to the kernel's instantiation: this unit's g_buffer is the one the kernel reads.
void timeline::set_timeline_buffer(std::uint64_t* records, int capacity) {
  const Buffer buffer{records, capacity};
  check_cuda(cudaMemcpyToSymbol(g_buffer, &buffer, sizeof buffer), "sparse attention timeline buffer");
  // A copy from pageable memory may return before it lands; launches on other streams must see it.
  check_cuda(cudaDeviceSynchronize(), "sparse attention timeline buffer");
}
#endif
}  // namespace dsv4::cuda::sparse_attention
