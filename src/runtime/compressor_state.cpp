// src/runtime/compressor_state.cpp — the compressor spec, per-request state pools and the cache
// factory (host side; the math is in src/ref, the dispatch in src/ops).
#include <cmath>
#include <limits>
#include <string>

#include "dsv4/compressor.hpp"
#include "dsv4/error.hpp"
#include "dsv4/rope.hpp"
#include "runtime/compressor_state_access.hpp"
#include "runtime/ring_limits.hpp"

#if defined(DSV4_WITH_CUDA)
#include "cuda/compressor/launch.hpp"
#endif

namespace dsv4 {

CompressorSpec CompressorSpec::for_layer(const ModelConfig& model, int layer, bool indexer,
                                         IndexerKeyFormat indexer_format, bool online) {
  const LayerConfig lc = layer_config(model, layer);
  require(lc.ratio > 0, "layer",
          "layer " + std::to_string(layer) + " has compress_ratio 0 (sliding window only): it has no compressor");
  require(!(online && lc.overlap), "online",
          "layer " + std::to_string(layer) + " (ratio " + std::to_string(lc.ratio) +
              ") uses overlapping blocks; the online variant needs a compressor without overlap");
  if (indexer) validate_indexer_key_format(indexer_format, "indexer_format");
  CompressorSpec spec;
  spec.ratio = lc.ratio;
  spec.overlap = lc.overlap;
  spec.online = online;
  spec.width = indexer ? model.index_head_dim : model.head_dim;
  spec.output = !indexer ? EntryKind::Attention
                         : (indexer_format == IndexerKeyFormat::FP4 ? EntryKind::IndexerFP4 : EntryKind::IndexerFP8);
  spec.rope = lc.rope;
  spec.eps = model.rms_eps;
  spec.max_positions = model.max_positions;
  validate_compressor_spec(spec);
  return spec;
}

void validate_compressor_spec(const CompressorSpec& spec) {
  require(spec.ratio >= 1, "ratio", "compress ratio must be at least 1, got " + std::to_string(spec.ratio));
  require(spec.width >= 1, "width", "compressor width must be positive, got " + std::to_string(spec.width));
  require(!(spec.online && spec.overlap), "online", "the online variant needs a compressor without overlap");
  const int r = spec.rope.rope_dim;
  require(r > 0 && r % 2 == 0 && r <= spec.width, "rope",
          "rope_dim must be even and within the width " + std::to_string(spec.width) + ", got " + std::to_string(r));
  spec.layout().validate("width");
  if (spec.output == EntryKind::Attention) {
    require(r == AttentionEntryFormat::kRopeDim, "rope",
            "the 584-byte attention entry stores exactly " + std::to_string(AttentionEntryFormat::kRopeDim) +
                " RoPE dims, got rope_dim " + std::to_string(r));
  } else {
    require((spec.width & (spec.width - 1)) == 0, "width",
            "the indexer's Walsh–Hadamard transform needs a power-of-two width, got " + std::to_string(spec.width));
  }
  require(std::isfinite(spec.eps) && spec.eps >= 0, "eps", "RMSNorm eps must be finite and non-negative");
  validate_rope_config(spec.rope);  // its base and YaRN fields, before any state or cache is made or written
  // Positions are reported as int32 (CompressOutputs::positions).
  require(spec.max_positions > 0 && spec.max_positions - 1 <= std::numeric_limits<std::int32_t>::max(),
          "max_positions", "must be in [1, 2^31], got " + std::to_string(spec.max_positions));
  // Ring sizes (coff·m + max_rollback) and record widths (up to 4c floats) are int.
  require(spec.ratio <= kMaxRingExtent, "ratio", "must be at most " + std::to_string(kMaxRingExtent));
  require(spec.width <= kMaxRingExtent, "width", "must be at most " + std::to_string(kMaxRingExtent));
  require(spec.max_rollback >= 0 && spec.max_rollback <= kMaxRingExtent, "max_rollback",
          "must be in [0, " + std::to_string(kMaxRingExtent) + "], got " + std::to_string(spec.max_rollback));
}

CompressorStatePool::CompressorStatePool(const CompressorSpec& spec, int num_slots, Device device) : spec_(spec) {
  validate_compressor_spec(spec);
  require(num_slots >= 2, "num_slots", "a pool needs the null slot 0 and at least one request slot");
  if (spec.online) {
    records_per_slot_ = spec.max_rollback + 1;  // states after L−max_rollback .. L tokens
    record_floats_ = 3 * spec.width;            // M | S | V
  } else {
    // Rows still needed after a rollback of max_rollback tokens: the open block and, with overlap,
    // the block before it — at most coff·m − 1 rows behind the new count (docs/compressor.md).
    records_per_slot_ = spec.coff() * spec.ratio + spec.max_rollback;
    record_floats_ = 2 * spec.row_width();  // kv | score + ape
  }
  storage_ = Tensor::zeros(DType::F32, {num_slots, records_per_slot_, record_floats_}, device);
#if defined(DSV4_WITH_CUDA)
  if (device == Device::CUDA) {
    if (const int chain_floats = cuda::slice_chain_floats(spec); chain_floats > 0) {
      chains_ = Tensor::zeros(DType::F32, {num_slots, chain_floats}, device);
    }
  }
#endif
  chains_complete_.assign(static_cast<std::size_t>(num_slots), true);
  tokens_.assign(static_cast<std::size_t>(num_slots), 0);
  rollback_floor_.assign(static_cast<std::size_t>(num_slots), 0);
  allocated_.assign(static_cast<std::size_t>(num_slots), false);
}

int CompressorStatePool::allocate() {
  for (int s = 1; s < num_slots(); ++s) {
    const auto i = static_cast<std::size_t>(s);
    if (!allocated_[i]) {
      allocated_[i] = true;
      tokens_[i] = 0;
      rollback_floor_[i] = 0;
      chains_complete_[i] = true;  // nothing to fold yet
      return s;
    }
  }
  throw Error("pool", "all " + std::to_string(num_slots() - 1) + " request slots are in use");
}

void CompressorStatePool::check_allocated(int slot, const std::string& argument) const {
  require(slot >= 1 && slot < num_slots(), argument,
          "state slot " + std::to_string(slot) + " is outside [1, " + std::to_string(num_slots()) + ")");
  require(allocated_[static_cast<std::size_t>(slot)], argument,
          "state slot " + std::to_string(slot) + " is not allocated");
}

void CompressorStatePool::release(int slot) {
  check_allocated(slot);
  allocated_[static_cast<std::size_t>(slot)] = false;
}

bool CompressorStatePool::in_use(int slot) const {
  return slot >= 1 && slot < num_slots() && allocated_[static_cast<std::size_t>(slot)];
}

std::int64_t CompressorStatePool::tokens(int slot) const {
  require(slot >= 0 && slot < num_slots(), "slot", "state slot " + std::to_string(slot) + " is outside the pool");
  return tokens_[static_cast<std::size_t>(slot)];
}

std::int64_t CompressorStatePool::rollback_floor(int slot) const {
  require(slot >= 0 && slot < num_slots(), "slot", "state slot " + std::to_string(slot) + " is outside the pool");
  return rollback_floor_[static_cast<std::size_t>(slot)];
}

PagedCache make_compressed_cache(const CompressorSpec& spec, int page_size, int num_pages, Device device) {
  validate_compressor_spec(spec);
  require(page_size > 0 && page_size % spec.ratio == 0, "page_size",
          "the page size (" + std::to_string(page_size) + " raw tokens) must be a positive multiple of the ratio " +
              std::to_string(spec.ratio));
  return PagedCache(spec.layout(), page_size / spec.ratio, num_pages, device);
}

}  // namespace dsv4
