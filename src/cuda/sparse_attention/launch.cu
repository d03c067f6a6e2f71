// src/cuda/sparse_attention/launch.cu — picks the head tile and launches (params.hpp).
//
// Batch invariance: a row's bytes must not depend on the batch. The 16- and 32-head tiles (mma.sync)
// share one arithmetic (the 4-wide column split of their warps is the same), so between them the
// tile may follow the batch size; the 64-head tile (wgmma) accumulates in another order, so it is
// chosen from H alone: every H ≥ 64 (padded where H is not a multiple of 64) takes it at every
// batch size, every H < 64 never does.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "cuda/common/runtime.hpp"
#include "cuda/sparse_attention/launch_tile.cuh"
#include "cuda/sparse_attention/params.hpp"
#include "dsv4/error.hpp"

namespace dsv4::cuda {

namespace {
// A process-wide kernel-variant switch: the value `set` gave, else the environment variable's —
// "0" → 0, "1" → `one`, unset → `unset` (a valid value is read once; another one throws Error naming
// the variable, `expected` saying what it takes, and is read again next time); `last` records
// whether the last launch ran the variant.
struct EnvironmentSwitch {
  const char* variable;
  const char* expected;
  int one;
  int unset;
  std::atomic<int> override_value{-1};  // −1: from the environment
  std::atomic<int> environment{-1};     // −1: not read yet
  std::atomic<bool> last{false};

  int get() {
    const int set = override_value.load(std::memory_order_relaxed);
    if (set >= 0) return set;
    int value = environment.load(std::memory_order_relaxed);
    if (value < 0) {
      const char* text = std::getenv(variable);
      if (text == nullptr) value = unset;
      else if (std::strcmp(text, "0") == 0) value = 0;
      else if (std::strcmp(text, "1") == 0) value = one;
      else throw Error(variable, std::string("must be ") + expected + "; got '" + text + "'");
      environment.store(value, std::memory_order_relaxed);
    }
    return value;
  }
  int set(int value) {
    const int before = get();
    override_value.store(value, std::memory_order_relaxed);
    return before;
  }
};
EnvironmentSwitch cluster_merge_switch{"DSV4_ATTENTION_CLUSTER_MERGE", "0 (off) or 1 (forced), or unset (automatic)",
                                       static_cast<int>(ClusterMerge::forced), static_cast<int>(ClusterMerge::automatic)};
EnvironmentSwitch asymmetric_switch{"DSV4_ATTENTION_ASYMMETRIC", "0 or 1", 1, 1};
EnvironmentSwitch pair_decode_switch{"DSV4_ATTENTION_PAIR_DECODE", "0 or 1", 1, 1};
EnvironmentSwitch early_launch_switch{"DSV4_ATTENTION_EARLY_LAUNCH", "0 or 1", 1, 1};
static_assert(static_cast<int>(ClusterMerge::off) == 0, "\"0\" is off");
}  // namespace

ClusterMerge cluster_merge() { return static_cast<ClusterMerge>(cluster_merge_switch.get()); }
ClusterMerge set_cluster_merge(ClusterMerge mode) {
  return static_cast<ClusterMerge>(cluster_merge_switch.set(static_cast<int>(mode)));
}
bool last_launch_merged_in_cluster() { return cluster_merge_switch.last.load(std::memory_order_relaxed); }
void note_cluster_merge_launch(bool merged_in_cluster) {
  cluster_merge_switch.last.store(merged_in_cluster, std::memory_order_relaxed);
}

bool asymmetric_consumers() { return asymmetric_switch.get() != 0; }
bool set_asymmetric_consumers(bool on) { return asymmetric_switch.set(on ? 1 : 0) != 0; }
bool last_launch_asymmetric() { return asymmetric_switch.last.load(std::memory_order_relaxed); }
void note_asymmetric_launch(bool asymmetric) { asymmetric_switch.last.store(asymmetric, std::memory_order_relaxed); }

bool pair_decode() { return pair_decode_switch.get() != 0; }
bool set_pair_decode(bool on) { return pair_decode_switch.set(on ? 1 : 0) != 0; }
bool last_launch_pair_decode() { return pair_decode_switch.last.load(std::memory_order_relaxed); }
void note_pair_decode_launch(bool paired) { pair_decode_switch.last.store(paired, std::memory_order_relaxed); }

bool early_launch() { return early_launch_switch.get() != 0; }
bool set_early_launch(bool on) { return early_launch_switch.set(on ? 1 : 0) != 0; }
bool last_launch_early() { return early_launch_switch.last.load(std::memory_order_relaxed); }
void note_early_launch(bool early) { early_launch_switch.last.store(early, std::memory_order_relaxed); }

void launch_sparse_attention(const SparseAttentionParams& request, void* stream_handle) {
  auto stream = static_cast<cudaStream_t>(stream_handle);
  SparseAttentionParams params = request;
  // The producer finds a slot's page with the pool's divisor: a wrong one would read out of bounds.
  for (const auto& [pool, name] : {std::pair{&params.window, "window"}, std::pair{&params.compressed, "compressed"}})
    if (pool->page_divisor.divisor != static_cast<std::uint32_t>(pool->entries_per_page))
      throw Error(name, "the pool's page_divisor does not match its entries_per_page (make_fast_divisor)");
  static const int sms = multiprocessor_count();
  const auto blocks_with = [&](int tile) {
    return static_cast<long long>(params.num_rows) * ((params.num_heads + tile - 1) / tile) * params.num_splits;
  };
  // H < 64: the largest small tile that divides the heads (no padded heads) and still fills the SMs.
  int tile = 16;
  if (params.num_heads >= 64) {
    tile = 64;
  } else if (params.num_heads % 32 == 0 && blocks_with(32) >= sms) {
    tile = 32;
  }
  // Grid order. A row's last chunk is usually the shortest (W + K is rarely a multiple of the
  // split). In a grid of a few waves, row-major order puts long chunks into the last wave, where
  // they start late; chunk-major order runs the long ones first and lets the short ones fill the
  // tail (B=128, H=64, 640 candidates: 121 → 110 µs on H200), in groups of 64 pairs (≤ 16 MB of
  // partials per group at two chunks of 64 heads). Measured on H200 (notes §8), it pays between
  // 1.5 and 4 waves. Over more waves the tail is noise and row-major keeps a row's chunk partials in
  // L2 until its merge (chunk-major cost 2–5 %); at ≤ 1.5 waves chunk-major piles every row's merge
  // into the tail (3–5 % slower at 192 blocks).
  const long long blocks = blocks_with(tile);
  constexpr int kOrderGroup = 64;
  params.order_group = 2 * blocks > 3LL * sms && blocks <= 4LL * sms ? kOrderGroup : 1;
  // Small grids (B = 1 decode): the 64-head tile's output dims in 2 or 4 parts, one block each, as
  // long as the grid still fits on the SMs (every part repeats the gather, S and softmax, so it only
  // pays on idle SMs). Bytes are the same at every split (wgmma_kernel.cuh), so the choice may follow
  // the grid. The parts count their chunks on the tile's 4 arrival counters: H a multiple of 64.
  // SparseAttentionOptions::output_parts (params.dim_split ≠ 0 on entry) forces it.
  const int requested = params.dim_split;
  params.dim_split = 1;
  if (tile == 64 && params.num_heads % 64 == 0) {
    if (requested != 0) params.dim_split = requested;
    else if (4 * blocks <= sms) params.dim_split = 4;
    else if (2 * blocks <= sms) params.dim_split = 2;
  }
  // The cluster merge (params.hpp: ClusterMerge); launch_wgmma decides per launch and takes row-major
  // grid order when it clusters.
  note_cluster_merge_launch(false);  // launch_wgmma records a cluster launch
  const ClusterMerge mode = cluster_merge();
  params.cluster_merge = 0;
  if (tile == 64 && params.num_splits >= 2 && params.num_splits <= 16 && mode != ClusterMerge::off)
    params.cluster_merge = mode == ClusterMerge::forced ? 2 : 1;
  params.asymmetric = tile == 64 && asymmetric_consumers() ? 1 : 0;
  note_asymmetric_launch(false);  // launch_wgmma records an asymmetric launch
  // The pair decode (two head tiles share the decode of every K block): 64 < H ≤ 128 on the
  // asymmetric kernel without a dim split, where no cluster merge is asked for (one chunk per row, or
  // the merge off). Rows of several chunks keep the cluster merge: measured on H200 at N = 2176, the
  // pair with the workspace merge won at B = 128 nn1 (259 against 263 µs) and B = 32 nn2 (134 / 137)
  // but lost at B = 32 nn1 (75 / 72) and B = 128 nn2 (516 / 511).
  params.pair_decode = 0;
  if (params.asymmetric && params.num_heads > 64 && params.num_heads <= 128 && params.dim_split == 1 &&
      params.cluster_merge == 0 && pair_decode())
    params.pair_decode = 1;
  note_pair_decode_launch(false);  // launch_tile records a pair launch
  switch (tile) {
    case 64: sparse_attention::launch_tile<64>(params, stream); break;
    case 32: sparse_attention::launch_tile<32>(params, stream); break;
    default: sparse_attention::launch_tile<16>(params, stream); break;
  }
}

}  // namespace dsv4::cuda
