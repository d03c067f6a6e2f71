// src/runtime/paged_cache.cpp — entry layouts (dispatch to cache_format.hpp / entry_codec.hpp)
// and the paged pool of compressed entries.
#include "dsv4/paged_cache.hpp"

#include <cstring>
#include <limits>

#include "dsv4/entry_codec.hpp"
#include "dsv4/error.hpp"

namespace dsv4 {

const char* entry_kind_name(EntryKind kind) {
  switch (kind) {
    case EntryKind::Attention: return "attention";
    case EntryKind::IndexerFP8: return "indexer-fp8";
    case EntryKind::IndexerFP4: return "indexer-fp4";
  }
  return "?";
}

namespace {
IndexerEntryFormat indexer_format(const EntryLayout& layout) {
  return IndexerEntryFormat{layout.kind == EntryKind::IndexerFP4 ? IndexerKeyFormat::FP4 : IndexerKeyFormat::FP8,
                            layout.dim};
}
}  // namespace

void validate_indexer_key_format(IndexerKeyFormat format, const std::string& name) {
  require(format == IndexerKeyFormat::FP8 || format == IndexerKeyFormat::FP4, name,
          "unknown indexer key format " + std::to_string(static_cast<int>(format)));
}

void EntryLayout::validate(const std::string& argument) const {
  switch (kind) {
    case EntryKind::Attention:
      require(dim == AttentionEntryFormat::kDim, argument,
              "an attention entry holds exactly " + std::to_string(AttentionEntryFormat::kDim) + " values, got width " +
                  std::to_string(dim));
      return;
    case EntryKind::IndexerFP8:
      require(dim > 0, argument, "indexer entry width must be positive, got " + std::to_string(dim));
      return;
    case EntryKind::IndexerFP4:
      require(dim > 0 && dim % IndexerEntryFormat::kFp4Block == 0, argument,
              "an FP4 indexer entry width must be a positive multiple of " +
                  std::to_string(IndexerEntryFormat::kFp4Block) + ", got " + std::to_string(dim));
      return;
  }
  throw Error(argument, "unknown entry kind");
}

int EntryLayout::data_bytes() const {
  return kind == EntryKind::Attention ? AttentionEntryFormat::kDataBytes : indexer_format(*this).data_bytes();
}

int EntryLayout::scale_bytes() const {
  return kind == EntryKind::Attention ? AttentionEntryFormat::kScaleBytes : indexer_format(*this).scale_bytes();
}

std::int64_t EntryLayout::page_bytes(int entries_per_page) const {
  return kind == EntryKind::Attention ? AttentionEntryFormat::page_bytes(entries_per_page)
                                      : indexer_format(*this).page_bytes(entries_per_page);
}

std::int64_t EntryLayout::data_offset(int i) const {
  return kind == EntryKind::Attention ? AttentionEntryFormat::data_offset(i) : indexer_format(*this).data_offset(i);
}

std::int64_t EntryLayout::scale_offset(int i, int entries_per_page) const {
  return kind == EntryKind::Attention ? AttentionEntryFormat::scale_offset(i, entries_per_page)
                                      : indexer_format(*this).scale_offset(i, entries_per_page);
}

void EntryLayout::encode(const float* values, std::uint8_t* page, int i, int entries_per_page) const {
  if (kind == EntryKind::Attention) {
    encode_attention_entry(values, page, i, entries_per_page);
  } else {
    encode_indexer_entry(indexer_format(*this), values, page, i, entries_per_page);
  }
}

void EntryLayout::decode(const std::uint8_t* page, int i, int entries_per_page, float* out) const {
  if (kind == EntryKind::Attention) {
    decode_attention_entry(page, i, entries_per_page, out);
  } else {
    decode_indexer_entry(indexer_format(*this), page, i, entries_per_page, out);
  }
}

void EntryLayout::gather(const std::uint8_t* page, int i, int entries_per_page, std::uint8_t* out) const {
  std::memcpy(out, page + data_offset(i), static_cast<std::size_t>(data_bytes()));
  std::memcpy(out + data_bytes(), page + scale_offset(i, entries_per_page), static_cast<std::size_t>(scale_bytes()));
}

void EntryLayout::clear(std::uint8_t* page, int i, int entries_per_page) const {
  std::memset(page + data_offset(i), 0, static_cast<std::size_t>(data_bytes()));
  std::memset(page + scale_offset(i, entries_per_page), 0, static_cast<std::size_t>(scale_bytes()));
}

PagedCache::PagedCache(EntryLayout layout, int entries_per_page, int num_pages, Device device)
    : layout_(layout), entries_per_page_(entries_per_page), num_pages_(num_pages) {
  layout.validate("layout");
  require(entries_per_page >= 1, "entries_per_page", "must be at least 1, got " + std::to_string(entries_per_page));
  require(num_pages >= 1, "num_pages", "must be at least 1 (page 0 is the reserved null page)");
  // Slots are int32 in index lists (SPEC §7, FlashMLA), so the pool must number them in int32.
  require(static_cast<std::int64_t>(num_pages) * entries_per_page <= std::numeric_limits<std::int32_t>::max(),
          "num_pages", "num_pages × entries_per_page exceeds the int32 slot range");
  storage_ = Tensor::zeros(DType::U8, {num_pages, layout.page_bytes(entries_per_page)}, device);
}

std::uint8_t* PagedCache::page_data(int page) const {
  require(page >= 0 && page < num_pages_, "page",
          std::to_string(page) + " is outside the pool of " + std::to_string(num_pages_) + " pages");
  return storage_.data_as<std::uint8_t>() + static_cast<std::int64_t>(page) * page_bytes();
}

std::vector<std::uint8_t> PagedCache::host_bytes() const {
  const Tensor host = device() == Device::CPU ? storage_ : storage_.to(Device::CPU);
  const auto* p = host.data_as<const std::uint8_t>();
  return std::vector<std::uint8_t>(p, p + host.nbytes());
}

void PagedCache::check_slot(std::int64_t slot, const std::string& argument) const {
  require(slot >= 0 && slot < num_slots(), argument,
          "slot " + std::to_string(slot) + " is outside the pool of " + std::to_string(num_slots()) + " entries");
}

namespace {
// The pool bytes readable on the host: the storage itself on the CPU, else a host copy in `keep`.
const std::uint8_t* host_pool_bytes(const Tensor& storage, Tensor& keep) {
  if (storage.device() == Device::CPU) return storage.data_as<const std::uint8_t>();
  keep = storage.to(Device::CPU);
  return keep.data_as<const std::uint8_t>();
}
}  // namespace

std::vector<std::uint8_t> PagedCache::entry_bytes(std::int64_t slot) const {
  check_slot(slot);
  Tensor keep;
  const std::uint8_t* bytes = host_pool_bytes(storage_, keep);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(layout_.entry_bytes()));
  layout_.gather(bytes + slot / entries_per_page_ * page_bytes(), static_cast<int>(slot % entries_per_page_),
                 entries_per_page_, out.data());
  return out;
}

std::vector<float> PagedCache::decode_entry(std::int64_t slot) const {
  check_slot(slot);
  Tensor keep;
  const std::uint8_t* bytes = host_pool_bytes(storage_, keep);
  std::vector<float> out(static_cast<std::size_t>(layout_.dim));
  layout_.decode(bytes + slot / entries_per_page_ * page_bytes(), static_cast<int>(slot % entries_per_page_),
                 entries_per_page_, out.data());
  return out;
}

std::int32_t checked_physical_page(const PagedCache& cache, std::span<const std::int32_t> page_table,
                                   std::int64_t page, const std::string& argument) {
  require(page >= 0 && page < static_cast<std::int64_t>(page_table.size()), argument,
          "has " + std::to_string(page_table.size()) + " pages but logical page " + std::to_string(page) +
              " is needed");
  const std::int32_t physical = page_table[static_cast<std::size_t>(page)];
  require(physical >= 1 && physical < cache.num_pages(), argument,
          "logical page " + std::to_string(page) + " maps to physical page " + std::to_string(physical) +
              ", outside [1, " + std::to_string(cache.num_pages()) + ") (page 0 is the reserved null page)");
  return physical;
}

}  // namespace dsv4
