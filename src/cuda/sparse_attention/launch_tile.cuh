// src/cuda/sparse_attention/launch_tile.cuh — launches the kernel for one head tile.
//
// Included by one small .cu per head tile (instantiate_h*.cu), so the three instantiations compile
// in parallel and a change to one does not rebuild the others.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "cuda/sparse_attention/kernel.cuh"
#include "cuda/sparse_attention/wgmma_kernel.cuh"
#include "cuda/common/runtime.hpp"
#include "dsv4/error.hpp"

namespace dsv4::cuda::sparse_attention {

// Launches `kernel` (one instantiation, shared memory configured once per process) over `blocks`,
// in clusters of `cluster_size` consecutive blocks when it is above 1 (`merged_in_cluster`: clusters
// of a row's chunks, which merge without the workspace; the pair decode's pairs merge through it).
// With early_launch() (the default) the launch may start before the kernel ahead of it in the stream
// has finished, once that kernel allows it (ptx::allow_dependent_launch): the blocks take free SMs and
// read their parameters, and wait (ptx::wait_for_prerequisite_grids) before reading any input. After
// a kernel that does not allow it, or a copy or memset, it starts as any launch does. `early_allowed`
// false: never (the plain launches in 2 or 4 output parts: measured 1.7–2.7% slower a call in a graph
// of 8 layers' calls with it, notes-sparse-attention §31).
template <class Kernel>
void launch_blocks(Kernel kernel, int threads, int smem_bytes, long long blocks, const SparseAttentionParams& params,
                   cudaStream_t stream, int cluster_size = 1, bool merged_in_cluster = false,
                   bool early_allowed = true) {
  if (blocks > 0x7fffffffLL) throw Error("q", "too many rows × heads × chunks for one launch");
  if (params.num_splits > 1 && !merged_in_cluster) {
    // A merge through the workspace: only its arrival counters must start at zero (every partial is
    // written before it is read). The kernels leave them zeroed, but where they sit depends on the
    // shape — after a call of another shape they may overlay that call's partial sums — so they are
    // cleared (a few hundred bytes), and one caller workspace serves every shape up to its size.
    // Cluster-merged launches skip it: no memset stands between them and the kernel before them.
    const WorkspaceLayout layout = workspace_layout(params.num_rows, params.num_heads, params.num_splits);
    check_cuda(cudaMemsetAsync(params.arrivals, 0, layout.total - layout.arrivals, stream),
               "cannot clear the sparse attention workspace's counters");
  }
  cudaLaunchAttribute attributes[2];  // the cluster's (where cluster_size > 1), the early launch's
  unsigned count = 0;
  if (cluster_size > 1) attributes[count++] = cluster_attribute(cluster_size);
  const bool early = early_allowed && early_launch();
  if (early) attributes[count++] = early_launch_attribute();
  const cudaLaunchConfig_t config = launch_config(dim3(static_cast<unsigned>(blocks)), dim3(static_cast<unsigned>(threads)),
                                                  static_cast<std::size_t>(smem_bytes), stream, attributes, count);
  check_cuda(consumed_launch_status(cudaLaunchKernelEx(&config, kernel, params)), "sparse attention launch failed");
  note_early_launch(early);
}

// The opt-in shared memory size is a per-function attribute: set once per instantiation.
template <class Kernel>
void reserve_shared_memory(Kernel kernel, int smem_bytes) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes),
             "cannot reserve shared memory for sparse attention");
}

// A cluster kernel's one-time setup: its dynamic shared memory, and cluster sizes above 8
// (non-portable) allowed. Returns whether the latter took; every kernel that is queried for or
// launched in clusters goes through it once.
template <class Kernel>
bool prepare_cluster_kernel(Kernel kernel, int smem_bytes) {
  reserve_shared_memory(kernel, smem_bytes);
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) return true;
  cudaGetLastError();  // a refusal limits the sizes; it is not an error of the caller's
  return false;
}

// How many clusters of `size` blocks of `kernel` (dynamic shared memory `smem_bytes`, prepared by
// prepare_cluster_kernel) the device runs at once, 0 if it cannot schedule that size. `known` holds
// the answers so far, indexed by size (−1: not asked yet); a failed query is not kept (asked again
// next time) and clears only its own error.
template <class Kernel>
int active_clusters(Kernel kernel, int threads, int smem_bytes, int size, std::atomic<int> (&known)[17]) {
  const int answered = known[size].load();
  if (answered >= 0) return answered;
  cudaLaunchAttribute attribute = cluster_attribute(size);
  const cudaLaunchConfig_t config = launch_config(dim3(static_cast<unsigned>(size)), dim3(static_cast<unsigned>(threads)),
                                                  static_cast<std::size_t>(smem_bytes), nullptr, &attribute, 1);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
    cudaGetLastError();  // a refusal is an answer for this launch, not an error
    return 0;
  }
  known[size].store(clusters);
  return clusters;
}

// The cluster kernel's answer for `size`, for the instantiation of kDimSplit (attention_clusters_at_once).
template <int kDimSplit>
int wgmma_clusters_at_once(int size) {
  if (size < 2 || size > 16) return 0;
  const auto kernel = sparse_attention_wgmma_kernel<WgmmaPlan::kHeads, kDimSplit, true>;
  static const bool non_portable = prepare_cluster_kernel(kernel, WgmmaPlan::kSmemBytes);
  if (size > 8 && !non_portable) return 0;
  static std::atomic<int> known[17] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
  return active_clusters(kernel, WgmmaRolesFor<kDimSplit>::kThreads, WgmmaPlan::kSmemBytes, size, known);
}

// setmaxnreg only redistributes the block's own registers: if the compiler allocated fewer than the
// plan assumes, the consumers' increase would wait forever. Refuse instead of hanging (`registers`:
// the instantiation's count, asked once by the caller; `needed`: its roles' launch registers).
inline void check_register_split(int registers, int needed) {
  if (registers < needed)
    throw Error("device", "the wgmma attention kernel was built with " + std::to_string(registers) +
                              " registers per thread, its register split needs at least " + std::to_string(needed));
}
template <class Kernel>
int kernel_registers(Kernel kernel) {
  cudaFuncAttributes attributes{};
  check_cuda(cudaFuncGetAttributes(&attributes, kernel), "sparse attention kernel attributes");
  return attributes.numRegs;
}

// The 64-head tile on warpgroup MMA (wgmma_kernel.cuh), each (row, head tile, chunk) in kDimSplit
// output-dim parts; with kClusterMerge the chunks of each (row, tile, part) form one cluster; with
// kPairDecode the two 64-head tiles of each (row, chunk) form one 2-CTA cluster sharing the decode
// (`blocks` = rows × 2 tiles × chunks, in that cluster order).
template <int kDimSplit, bool kClusterMerge, bool kAsymmetric, bool kPairDecode = false>
void launch_wgmma(const SparseAttentionParams& params, long long blocks, cudaStream_t stream) {
  const auto kernel =
      sparse_attention_wgmma_kernel<WgmmaPlan::kHeads, kDimSplit, kClusterMerge, kAsymmetric, kPairDecode>;
  // Cluster instantiations also allow sizes above 8 (each instantiation needs the attribute itself).
  static const bool non_portable = kClusterMerge || kPairDecode
                                       ? prepare_cluster_kernel(kernel, WgmmaPlan::kSmemBytes)
                                       : (reserve_shared_memory(kernel, WgmmaPlan::kSmemBytes), false);
  (void)non_portable;
  using Roles = WgmmaRolesFor<kDimSplit>;
  static const int registers = kernel_registers(kernel);
  check_register_split(registers, Roles::kLaunchRegisters);
  if constexpr (kPairDecode) {
    launch_blocks(kernel, Roles::kThreads, WgmmaPlan::kSmemBytes, blocks, params, stream, 2);
    note_pair_decode_launch(true);
  } else if constexpr (kClusterMerge) {
    const int size = params.num_splits;
    static const int sms = multiprocessor_count();
    const int at_once = wgmma_clusters_at_once<kDimSplit>(size);
    const bool take = at_once > 0 && (params.cluster_merge == 2 ||
                                      clusters_keep_waves(blocks * kDimSplit, blocks * kDimSplit / size, at_once, sms));
    if (!take) {
      SparseAttentionParams through_workspace = params;  // the same bytes through global partials
      through_workspace.cluster_merge = 0;
      launch_wgmma<kDimSplit, false, kAsymmetric>(through_workspace, blocks, stream);
      return;
    }
    if (size > 8 && !non_portable) throw Error("device", "cannot allow non-portable cluster sizes for sparse attention");
    // A cluster holds one (row, tile, part)'s chunks as consecutive blocks: row-major grid order.
    SparseAttentionParams clustered = params;
    clustered.order_group = 1;
    launch_blocks(kernel, Roles::kThreads, WgmmaPlan::kSmemBytes, blocks * kDimSplit, clustered, stream, size, true);
    note_cluster_merge_launch(true);
  } else {
    launch_blocks(kernel, Roles::kThreads, WgmmaPlan::kSmemBytes, blocks * kDimSplit, params, stream, 1, false,
                  kDimSplit == 1);
  }
  if constexpr (kAsymmetric) note_asymmetric_launch(true);
}

template <int kHeadTile>
void launch_tile(const SparseAttentionParams& params, cudaStream_t stream) {
  const long long head_tiles = (params.num_heads + kHeadTile - 1) / kHeadTile;
  const long long blocks = static_cast<long long>(params.num_rows) * head_tiles * params.num_splits;
  if constexpr (kHeadTile == WgmmaPlan::kHeads) {
    const auto launch = [&]<bool kCluster, bool kAsymmetric>() {
      switch (params.dim_split) {
        case 4: launch_wgmma<4, kCluster, kAsymmetric>(params, blocks, stream); break;
        case 2: launch_wgmma<2, kCluster, kAsymmetric>(params, blocks, stream); break;
        default: launch_wgmma<1, kCluster, kAsymmetric>(params, blocks, stream); break;
      }
    };
    if (params.pair_decode) {
      launch_wgmma<1, false, true, true>(params, blocks, stream);
    } else if (params.asymmetric) {
      if (params.cluster_merge) launch.template operator()<true, true>();
      else launch.template operator()<false, true>();
    } else {
      if (params.cluster_merge) launch.template operator()<true, false>();
      else launch.template operator()<false, false>();
    }
  } else {  // 16 and 32 on mma.sync (kernel.cuh)
    using T = Traits<kHeadTile>;
    static const bool reserved = (reserve_shared_memory(sparse_attention_kernel<kHeadTile>, T::kSmemBytes), true);
    (void)reserved;
    launch_blocks(sparse_attention_kernel<kHeadTile>, T::kThreads, T::kSmemBytes, blocks, params, stream);
  }
}

// One explicit instantiation per head tile lives in instantiate_h{16,32,64}.cu.
extern template void launch_tile<16>(const SparseAttentionParams&, cudaStream_t);
extern template void launch_tile<32>(const SparseAttentionParams&, cudaStream_t);
extern template void launch_tile<64>(const SparseAttentionParams&, cudaStream_t);

}  // namespace dsv4::cuda::sparse_attention
