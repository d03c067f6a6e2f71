// dsv4/paged_cache.hpp — paged pools of compressed cache entries (SPEC §5), on the CPU or a GPU.
//
// A pool is `num_pages` pages of `entries_per_page` entries (B = P/m for page size P raw tokens
// and ratio m), laid out exactly as cache_format.hpp describes. Page 0 is reserved: its slot 0 is
// the null entry (index −1 in an index list maps to it), so requests only ever own pages ≥ 1.
// Entry s of a request lives in physical slot page_table[s / B]·B + s mod B (cache_format.hpp).
// A fresh pool is all zero bytes; an entry invalidated by a rollback is zeroed again.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dsv4/cache_format.hpp"
#include "dsv4/device.hpp"
#include "dsv4/tensor.hpp"

namespace dsv4 {

// What one entry holds: the 584-byte FP8 attention entry (§5.1) or an indexer key (§5.2).
enum class EntryKind { Attention, IndexerFP8, IndexerFP4 };

// Throws Error(name) for a format outside IndexerKeyFormat (an integer cast to it), which would pick no layout.
void validate_indexer_key_format(IndexerKeyFormat format, const std::string& name);

const char* entry_kind_name(EntryKind kind);  // "attention", "indexer-fp8", "indexer-fp4"

// The byte layout of one entry kind at a given width; every offset comes from cache_format.hpp.
// An entry is always two runs inside its page: `data_bytes()` at data_offset(i), and
// `scale_bytes()` at scale_offset(i, B) (attention: the 576 data bytes and the 8-byte scale record).
struct EntryLayout {
  EntryKind kind = EntryKind::Attention;
  int dim = AttentionEntryFormat::kDim;  // values per entry: 512 (attention) or d_I (indexer)

  // Checks that `dim` fits the kind (attention: exactly 512; indexer FP8: > 0; FP4: a multiple
  // of 32). Throws Error(argument, ...).
  void validate(const std::string& argument = "layout") const;

  int data_bytes() const;
  int scale_bytes() const;
  int entry_bytes() const { return data_bytes() + scale_bytes(); }  // 584 / 132 / 68 at the model widths
  std::int64_t page_bytes(int entries_per_page) const;
  std::int64_t data_offset(int i) const;
  std::int64_t scale_offset(int i, int entries_per_page) const;

  // Encodes `values` [dim] (post-processed, bf16-rounded) into entry i of `page`.
  void encode(const float* values, std::uint8_t* page, int i, int entries_per_page) const;
  // Decodes entry i of `page` into `out` [dim].
  void decode(const std::uint8_t* page, int i, int entries_per_page, float* out) const;
  // Copies entry i's bytes into `out` [entry_bytes()]: data bytes, then scale bytes (the order of
  // shared/vectors/README.md: for attention 448 e4m3 codes, 128 bytes of bf16, 7 scales, 1 zero).
  void gather(const std::uint8_t* page, int i, int entries_per_page, std::uint8_t* out) const;
  // Zeroes entry i's bytes (both runs).
  void clear(std::uint8_t* page, int i, int entries_per_page) const;
};

class PagedCache {
 public:
  PagedCache() = default;
  // A zero-filled pool of `num_pages` pages (page 0 reserved, so num_pages ≥ 2 to hold anything)
  // of `entries_per_page` entries each. Throws Error when the layout is invalid,
  // entries_per_page < 1, num_pages < 1, or num_pages·entries_per_page exceeds int32 slot numbers.
  PagedCache(EntryLayout layout, int entries_per_page, int num_pages, Device device = Device::CPU);

  const EntryLayout& layout() const { return layout_; }
  int entries_per_page() const { return entries_per_page_; }  // B
  int num_pages() const { return num_pages_; }
  std::int64_t num_slots() const { return static_cast<std::int64_t>(num_pages_) * entries_per_page_; }
  std::int64_t page_bytes() const { return layout_.page_bytes(entries_per_page_); }
  std::int64_t total_bytes() const { return page_bytes() * num_pages_; }
  Device device() const { return storage_.device(); }

  // The pool bytes [num_pages, page_bytes] (U8) on device(). Page p starts at p·page_bytes().
  const Tensor& storage() const { return storage_; }
  std::uint8_t* page_data(int page) const;  // device pointer on CUDA

  // Host-side inspection (copies through the host when the pool is on a GPU):
  std::vector<std::uint8_t> host_bytes() const;                      // the whole pool
  std::vector<std::uint8_t> entry_bytes(std::int64_t slot) const;   // one entry, gathered (see EntryLayout::gather)
  std::vector<float> decode_entry(std::int64_t slot) const;         // one entry decoded [dim]
  // Error(argument) unless 0 ≤ slot < num_slots().
  void check_slot(std::int64_t slot, const std::string& argument = "slot") const;

 private:
  EntryLayout layout_;
  int entries_per_page_ = 0;
  int num_pages_ = 0;
  Tensor storage_;  // [num_pages, page_bytes] U8
};

// Physical page of logical page `page` of a request: Error(argument) unless the table has that
// page and it names a page in [1, cache.num_pages()) (page 0 is the reserved null page).
std::int32_t checked_physical_page(const PagedCache& cache, std::span<const std::int32_t> page_table,
                                   std::int64_t page, const std::string& argument = "page_table");

}  // namespace dsv4
