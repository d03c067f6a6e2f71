// src/ops/sparse_attention.cpp — argument validation and backend dispatch of sparse_attention.
//
// Everything is checked here, before any output byte is written; the CPU reference and the CUDA
// launcher then trust their inputs (the kernels still mask slots they cannot check from the host).
#include "dsv4/sparse_attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "dsv4/cache_format.hpp"
#include "dsv4/error.hpp"
#include "ref/sparse_attention_ref.hpp"

#if defined(DSV4_WITH_CUDA)
#include <cuda_runtime.h>

#include "cuda/sparse_attention/params.hpp"
#endif

namespace dsv4 {
namespace {

using F = AttentionEntryFormat;
constexpr int kRopePairs = F::kRopeDim / 2;

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// Shape, dtype and device of a pool; returns its number of slots.
std::int64_t check_pool(const AttentionPoolView& pool, const std::string& name, Device device) {
  require(pool.entries_per_page >= 1, name, "entries_per_page must be at least 1, got " +
                                              std::to_string(pool.entries_per_page));
  check_tensor(pool.pages, name, DType::U8, {-1, F::page_bytes(pool.entries_per_page)}, device);
  const std::int64_t slots = pool.pages.dim(0) * pool.entries_per_page;
  require(slots <= std::numeric_limits<std::int32_t>::max(), name, "more slots than int32 slot numbers reach");
  require(device == Device::CPU || aligned16(pool.pages.data), name, "pool bytes must be 16-byte aligned");
  return slots;
}

// CPU only (the slots are host memory): every slot is −1 or inside the pool.
void check_slots(const TensorView& slots, const std::string& name, std::int64_t num_slots) {
  const std::int32_t* s = slots.as<const std::int32_t>();
  for (std::int64_t i = 0; i < slots.numel(); ++i) {
    require(s[i] == -1 || (s[i] >= 0 && s[i] < num_slots), name,
            "slot " + std::to_string(s[i]) + " at position " + std::to_string(i) + " is neither −1 nor in [0, " +
                std::to_string(num_slots) + ")");
  }
}

// `argument`: "options" (SparseAttentionOptions::split_candidates) or the parameter's own name.
int check_split(int split_candidates, const std::string& argument) {
  require(split_candidates >= 64 && split_candidates <= kMaxSplitCandidates && split_candidates % 64 == 0,
          argument,
          "split_candidates must be a multiple of 64 in [64, " + std::to_string(kMaxSplitCandidates) +
              "], got " + std::to_string(split_candidates));
  return split_candidates;
}

#if defined(DSV4_WITH_CUDA)
std::int64_t num_splits(std::int64_t num_candidates, int split_candidates) {
  return std::max<std::int64_t>(1, (num_candidates + split_candidates - 1) / split_candidates);
}

void run_cuda(const TensorView& q, const AttentionPoolView& window, const AttentionPoolView& compressed,
              std::int64_t window_slots_total, std::int64_t compressed_slots_total, const TensorView& window_slots,
              const TensorView& compressed_slots, const TensorView& attn_sink, const TensorView& out,
              const TensorView& lse, const SparseAttentionOptions& options) {
  cuda::SparseAttentionParams p;
  p.q = q.as<const std::uint16_t>();
  const auto device_pool = [](const AttentionPoolView& pool, std::int64_t num_slots) {
    return cuda::AttentionPool{pool.pages.as<const std::uint8_t>(), pool.pages.shape[1], pool.entries_per_page, num_slots,
                               cuda::make_fast_divisor(static_cast<std::uint32_t>(pool.entries_per_page))};
  };
  p.window = device_pool(window, window_slots_total);
  p.compressed = device_pool(compressed, compressed_slots_total);
  p.window_slots = window_slots.as<const std::int32_t>();
  p.compressed_slots = compressed_slots.as<const std::int32_t>();
  p.attn_sink = attn_sink.as<const float>();
  p.rope_cos = options.rope_cos.given() ? options.rope_cos.as<const float>() : nullptr;
  p.rope_sin = options.rope_sin.given() ? options.rope_sin.as<const float>() : nullptr;
  p.out = out.as<std::uint16_t>();
  p.lse = lse.as<float>();
  p.num_rows = static_cast<std::int32_t>(q.dim(0));
  p.num_heads = static_cast<std::int32_t>(q.dim(1));
  p.window_width = static_cast<std::int32_t>(window_slots.dim(1));
  p.compressed_width = static_cast<std::int32_t>(compressed_slots.dim(1));
  p.score_scale_log2 = static_cast<float>(static_cast<double>(options.softmax_scale) * 1.4426950408889634);
  p.split_candidates = options.split_candidates;
  p.num_splits = static_cast<std::int32_t>(num_splits(p.window_width + p.compressed_width, p.split_candidates));
  p.dim_split = options.output_parts;  // 0: launch_sparse_attention picks

  const auto layout = cuda::workspace_layout(p.num_rows, p.num_heads, p.num_splits);
  auto stream = static_cast<cudaStream_t>(options.stream);
  void* scratch = nullptr;
  bool owned = false;
  if (layout.total > 0) {
    if (options.workspace.given()) {
      scratch = options.workspace.data;
    } else {
      require(cudaMallocAsync(&scratch, layout.total, stream) == cudaSuccess, "device", "cudaMallocAsync failed");
      owned = true;
    }
    auto* base = static_cast<std::uint8_t*>(scratch);
    p.partial_out = reinterpret_cast<float*>(base + layout.partial_out);
    p.partial_stats = reinterpret_cast<float*>(base + layout.partial_stats);
    p.arrivals = reinterpret_cast<std::int32_t*>(base + layout.arrivals);
    // The launcher clears the arrival counters before a launch that merges through this workspace
    // (launch_tile.cuh: launch_blocks); a cluster-merged launch does not touch it.
  }
  try {
    cuda::launch_sparse_attention(p, options.stream);
  } catch (...) {
    if (owned) cudaFreeAsync(scratch, stream);
    throw;
  }
  if (owned) require(cudaFreeAsync(scratch, stream) == cudaSuccess, "device", "cudaFreeAsync failed");
}
#endif

}  // namespace

std::size_t sparse_attention_workspace_bytes(std::int64_t num_rows, std::int64_t num_heads,
                                             std::int64_t num_candidates, int split_candidates) {
  for (const auto& [extent, name] : {std::pair{num_rows, "num_rows"}, {num_heads, "num_heads"},
                                     {num_candidates, "num_candidates"}})
    require(extent >= 0, name, "must be non-negative, got " + std::to_string(extent));
#if defined(DSV4_WITH_CUDA)
  return cuda::workspace_layout(num_rows, num_heads,
                                num_splits(num_candidates, check_split(split_candidates, "split_candidates")))
      .total;
#else
  check_split(split_candidates, "split_candidates");
  return 0;
#endif
}

void sparse_attention(const TensorView& q, const AttentionPoolView& window_cache,
                      const AttentionPoolView& compressed_cache, const TensorView& window_slots,
                      const TensorView& compressed_slots, const TensorView& attn_sink, const TensorView& out,
                      const TensorView& lse, const SparseAttentionOptions& options) {
  // ---- shapes, dtypes, devices ----
  const Device device = q.device;
  check_tensor(q, "q", DType::BF16, {-1, -1, F::kDim}, device);
  const std::int64_t rows = q.dim(0), heads = q.dim(1);
  require(heads >= 1, "q", "needs at least one head");
  require(rows <= std::numeric_limits<std::int32_t>::max() / 2, "q", "too many rows");
  const std::int64_t window_total = check_pool(window_cache, "window_cache", device);
  const std::int64_t compressed_total = check_pool(compressed_cache, "compressed_cache", device);
  check_tensor(window_slots, "window_slots", DType::I32, {rows, -1}, device);
  check_tensor(compressed_slots, "compressed_slots", DType::I32, {rows, -1}, device);
  require(window_slots.dim(1) + compressed_slots.dim(1) <= std::numeric_limits<std::int32_t>::max() / 2,
          "compressed_slots", "too many candidates per row");
  check_tensor(attn_sink, "attn_sink", DType::F32, {heads}, device);
  check_tensor(out, "out", DType::BF16, {rows, heads, F::kDim}, device);
  check_tensor(lse, "lse", DType::F32, {rows, heads}, device);
  require(std::isfinite(options.softmax_scale) && options.softmax_scale > 0, "options",
          "softmax_scale must be finite and positive");
  require(options.rope_cos.given() == options.rope_sin.given(), "options",
          "rope_cos and rope_sin must be given together");
  if (options.rope_cos.given()) {
    check_tensor(options.rope_cos, "rope_cos", DType::F32, {rows, kRopePairs}, device);
    check_tensor(options.rope_sin, "rope_sin", DType::F32, {rows, kRopePairs}, device);
  }
  check_split(options.split_candidates, "options");
  require(options.output_parts == 0 || options.output_parts == 1 || options.output_parts == 2 ||
              options.output_parts == 4,
          "options", "output_parts must be 0 (automatic), 1, 2 or 4, got " + std::to_string(options.output_parts));
  if (options.workspace.given()) check_tensor(options.workspace, "workspace", DType::U8, {-1}, device);
  check_disjoint({{out, "out"}, {lse, "lse"}, {options.workspace, "workspace"}},
                 {{q, "q"},
                  {window_cache.pages, "window_cache"},
                  {compressed_cache.pages, "compressed_cache"},
                  {window_slots, "window_slots"},
                  {compressed_slots, "compressed_slots"},
                  {attn_sink, "attn_sink"},
                  {options.rope_cos, "rope_cos"},
                  {options.rope_sin, "rope_sin"}});

  if (device == Device::CPU) {
    // ---- contents (host memory): slots and sink ----
    check_slots(window_slots, "window_slots", window_total);
    check_slots(compressed_slots, "compressed_slots", compressed_total);
    for (std::int64_t h = 0; h < heads; ++h) {
      const float s = attn_sink.as<const float>()[h];
      require(!std::isnan(s) && s != std::numeric_limits<float>::infinity(), "attn_sink",
              "head " + std::to_string(h) + " has a NaN or +inf sink");
    }
    if (rows == 0) return;
    ref::SparseAttentionCall call;
    call.q = q.as<const std::uint16_t>();
    call.window = {window_cache.pages.as<const std::uint8_t>(), window_cache.pages.shape[1],
                   window_cache.entries_per_page};
    call.compressed = {compressed_cache.pages.as<const std::uint8_t>(), compressed_cache.pages.shape[1],
                       compressed_cache.entries_per_page};
    call.window_slots = window_slots.as<const std::int32_t>();
    call.compressed_slots = compressed_slots.as<const std::int32_t>();
    call.attn_sink = attn_sink.as<const float>();
    call.rope_cos = options.rope_cos.given() ? options.rope_cos.as<const float>() : nullptr;
    call.rope_sin = options.rope_sin.given() ? options.rope_sin.as<const float>() : nullptr;
    call.out = out.as<std::uint16_t>();
    call.lse = lse.as<float>();
    call.num_rows = rows;
    call.num_heads = static_cast<int>(heads);
    call.window_width = static_cast<int>(window_slots.dim(1));
    call.compressed_width = static_cast<int>(compressed_slots.dim(1));
    call.softmax_scale = options.softmax_scale;
    ref::sparse_attention(call);
    return;
  }

#if defined(DSV4_WITH_CUDA)
  require(aligned16(q.data), "q", "must be 16-byte aligned on CUDA");
  require(aligned16(out.data), "out", "must be 16-byte aligned on CUDA");
  require(heads <= 4096, "q", "at most 4096 heads on CUDA");
  if (options.workspace.given()) {
    const std::size_t needed = sparse_attention_workspace_bytes(
        rows, heads, window_slots.dim(1) + compressed_slots.dim(1), options.split_candidates);
    require(options.workspace.nbytes() >= needed, "workspace",
            "holds " + std::to_string(options.workspace.nbytes()) + " bytes, the call needs " + std::to_string(needed));
    require(aligned16(options.workspace.data), "workspace", "must be 16-byte aligned on CUDA (16-byte partial stores)");
  }
  require(num_splits(window_slots.dim(1) + compressed_slots.dim(1), options.split_candidates) <= cuda::kMaxChunksPerRow,
          "compressed_slots",
          "more than " + std::to_string(cuda::kMaxChunksPerRow) + " chunks of split_candidates per row on CUDA");
  if (rows == 0) return;
  run_cuda(q, window_cache, compressed_cache, window_total, compressed_total, window_slots, compressed_slots,
           attn_sink, out, lse, options);
#else
  throw Error("device", "this build of dsv4 has no CUDA backend");
#endif
}

}  // namespace dsv4
