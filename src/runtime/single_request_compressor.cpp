// src/runtime/single_request_compressor.cpp — one request with its own pool, cache and weights,
// on top of the batch API (for the CLI and tests).
#include <limits>
#include <string>

#include "dsv4/compressor.hpp"
#include "dsv4/error.hpp"

namespace dsv4 {

SingleRequestCompressor::SingleRequestCompressor(const CompressorSpec& spec, const TensorView& ape,
                                                 const TensorView& norm, std::int64_t capacity_tokens, int page_size,
                                                 Device device)
    : spec_(spec), capacity_tokens_(capacity_tokens) {
  validate_compressor_spec(spec);
  check_tensor(ape, "ape", DType::F32, {spec.ratio, spec.row_width()}, Device::CPU);
  check_tensor(norm, "norm", DType::F32, {spec.width}, Device::CPU);
  require(capacity_tokens >= 0 && capacity_tokens <= spec.max_positions, "capacity_tokens",
          "must be in [0, max_positions = " + std::to_string(spec.max_positions) + "], got " +
              std::to_string(capacity_tokens));
  ape_ = Tensor::from_host(DType::F32, ape.shape, ape.data, device);
  norm_ = Tensor::from_host(DType::F32, norm.shape, norm.data, device);
  pool_ = CompressorStatePool(spec, 2, device);
  slot_ = pool_.allocate();
  // Pages 1, 2, ... hold logical pages 0, 1, ... (page 0 is the reserved null page).
  require(page_size > 0 && page_size % spec.ratio == 0, "page_size",
          "must be a positive multiple of the ratio " + std::to_string(spec.ratio));
  const std::int64_t per_page = page_size / spec.ratio;
  const std::int64_t pages = (capacity_tokens / spec.ratio + per_page - 1) / per_page;
  require((pages + 1) * per_page <= std::numeric_limits<std::int32_t>::max(), "capacity_tokens",
          "needs more cache slots than int32 slot numbers allow");
  cache_ = make_compressed_cache(spec, page_size, static_cast<int>(pages) + 1, device);
  for (std::int64_t p = 0; p < pages; ++p) page_table_.push_back(static_cast<std::int32_t>(p + 1));
}

SingleRequestCompressor::Appended SingleRequestCompressor::append(const TensorView& kv, const TensorView& score) {
  check_tensor(kv, "kv", DType::F32, {-1, spec_.row_width()}, Device::CPU);
  check_tensor(score, "score", DType::F32, {kv.dim(0), spec_.row_width()}, Device::CPU);
  const std::int64_t rows = kv.dim(0);
  require(rows <= capacity_tokens_ - tokens(), "kv",
          std::to_string(rows) + " more rows exceed the capacity of " + std::to_string(capacity_tokens_) +
              " tokens (" + std::to_string(tokens()) + " already seen)");
  const Device device = pool_.device();
  // Inputs on the pool's device (copies only when that is a GPU).
  Tensor kv_dev, score_dev;
  TensorView kv_view = kv, score_view = score;
  if (device != Device::CPU) {
    kv_dev = Tensor::from_host(DType::F32, kv.shape, kv.data, device);
    score_dev = Tensor::from_host(DType::F32, score.shape, score.data, device);
    kv_view = kv_dev.view();
    score_view = score_dev.view();
  }
  const CompressBatch batch{CompressRequest{slot_, tokens(), rows, page_table_}};
  const std::int64_t events = count_compress_events(spec_, batch);
  Tensor compressed = Tensor::empty(DType::F32, {events, spec_.width}, device);
  const std::int64_t first_entry = tokens() / spec_.ratio;
  compress(spec_, CompressorWeights{ape_.view(), norm_.view()}, batch, MatrixF32View::of(kv_view, "kv"),
           MatrixF32View::of(score_view, "score"), pool_, cache_, CompressOutputs{compressed.view(), {}, {}, {}});
  Appended out;
  out.compressed = device == Device::CPU ? compressed : compressed.to(Device::CPU);
  for (std::int64_t e = 0; e < events; ++e) {
    out.entry_ids.push_back(first_entry + e);
    out.positions.push_back((first_entry + e) * spec_.ratio);
  }
  return out;
}

void SingleRequestCompressor::rollback(std::int64_t n) { dsv4::rollback(pool_, slot_, n, cache_, page_table_); }

std::int64_t SingleRequestCompressor::cache_slot(std::int64_t entry) const {
  require(entry >= 0 && entry < num_entries(), "entry",
          std::to_string(entry) + " is outside the " + std::to_string(num_entries()) + " completed entries");
  return physical_slot(page_table_.data(), entry, cache_.entries_per_page());
}

std::vector<std::uint8_t> SingleRequestCompressor::entry_bytes(std::int64_t entry) const {
  return cache_.entry_bytes(cache_slot(entry));
}

std::vector<float> SingleRequestCompressor::decoded_entry(std::int64_t entry) const {
  return cache_.decode_entry(cache_slot(entry));
}

}  // namespace dsv4
