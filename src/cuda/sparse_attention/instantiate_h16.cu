// The sparse attention kernel for head tiles of 16 (see launch_tile.cuh).
#include "cuda/sparse_attention/launch_tile.cuh"

namespace dsv4::cuda::sparse_attention {
template void launch_tile<16>(const SparseAttentionParams&, cudaStream_t);
}  // namespace dsv4::cuda::sparse_attention
