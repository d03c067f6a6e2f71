// dsv4/cache_format.hpp — byte layouts of the compressed caches (SPEC §5).
//
// One traits type per format holds every byte offset; the CPU reference, the CUDA kernels and the
// tests all address cache bytes through these, never through their own arithmetic.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DSV4_HDC __host__ __device__ constexpr
#else
#define DSV4_HDC constexpr
#endif

namespace dsv4 {

DSV4_HDC std::int64_t round_up(std::int64_t x, std::int64_t multiple) {
  return (x + multiple - 1) / multiple * multiple;
}

// FP8 attention entry, 584 bytes (the FlashMLA "MODEL1" sparse-decode layout).
//
//   page of B entries:
//   [ B × 576 : entry i at i·576 = 448 e4m3 "nope" codes | 64 bf16 RoPE values (128 B) ]
//   [ B × 8   : entry i at B·576 + i·8 = 7 ue8m0 scale bytes (one per 64 nope dims) | 1 zero byte ]
//   [ zero padding up to a multiple of 576 bytes ]
struct AttentionEntryFormat {
  static constexpr int kDim = 512;                      // d: KV latent width
  static constexpr int kRopeDim = 64;                   // r: RoPE dims, stored as bf16
  static constexpr int kNopeDim = kDim - kRopeDim;      // 448, stored as e4m3
  static constexpr int kQuantBlock = 64;                // dims sharing one ue8m0 scale
  static constexpr int kNumScales = kNopeDim / kQuantBlock;     // 7
  static constexpr int kDataBytes = kNopeDim + 2 * kRopeDim;    // 576
  static constexpr int kScaleBytes = 8;                         // 7 scales + 1 pad byte
  static constexpr int kEntryBytes = kDataBytes + kScaleBytes;  // 584
  static_assert(kNopeDim % kQuantBlock == 0, "nope dims must be whole scale blocks");
  static_assert(kNumScales < kScaleBytes, "scale record holds every scale plus padding");
  static_assert(kEntryBytes == 584 && kDataBytes == 576, "published layout");

  // Bytes of one page holding `entries_per_page` entries.
  static DSV4_HDC std::int64_t page_bytes(int entries_per_page) {
    return round_up(static_cast<std::int64_t>(entries_per_page) * kEntryBytes, kDataBytes);
  }
  // Offset, inside its page, of entry i's 576 data bytes.
  static DSV4_HDC std::int64_t data_offset(int i) { return static_cast<std::int64_t>(i) * kDataBytes; }
  // Offset of entry i's RoPE part (bf16) inside its page.
  static DSV4_HDC std::int64_t rope_offset(int i) { return data_offset(i) + kNopeDim; }
  // Offset of entry i's 8-byte scale record inside a page of B entries.
  static DSV4_HDC std::int64_t scale_offset(int i, int entries_per_page) {
    return static_cast<std::int64_t>(entries_per_page) * kDataBytes + static_cast<std::int64_t>(i) * kScaleBytes;
  }
};

// Indexer key entry (SPEC §5.2), FP8 (132 B at d_I = 128) or FP4 (68 B at d_I = 128).
//
//   FP8 page of B entries: [ B × d_I e4m3 codes ][ B × 4 : float32 scale = max(amax,1e-4)/448 ]
//   FP4 page of B entries: [ B × d_I/2 bytes, e2m1 pairs, low nibble first ][ B × d_I/32 ue8m0 ]
enum class IndexerKeyFormat { FP8, FP4 };

struct IndexerEntryFormat {
  IndexerKeyFormat format = IndexerKeyFormat::FP8;
  int dim = 128;  // d_I
  static constexpr int kFp4Block = 32;  // values sharing one ue8m0 scale in FP4

  DSV4_HDC int data_bytes() const { return format == IndexerKeyFormat::FP8 ? dim : dim / 2; }
  DSV4_HDC int scale_bytes() const { return format == IndexerKeyFormat::FP8 ? 4 : dim / kFp4Block; }
  DSV4_HDC int entry_bytes() const { return data_bytes() + scale_bytes(); }
  DSV4_HDC std::int64_t page_bytes(int entries_per_page) const {
    return static_cast<std::int64_t>(entries_per_page) * entry_bytes();
  }
  DSV4_HDC std::int64_t data_offset(int i) const { return static_cast<std::int64_t>(i) * data_bytes(); }
  DSV4_HDC std::int64_t scale_offset(int i, int entries_per_page) const {
    return static_cast<std::int64_t>(entries_per_page) * data_bytes() +
           static_cast<std::int64_t>(i) * scale_bytes();
  }
};
static_assert(IndexerEntryFormat{IndexerKeyFormat::FP8, 128}.entry_bytes() == 132, "SPEC §5.2");
static_assert(IndexerEntryFormat{IndexerKeyFormat::FP4, 128}.entry_bytes() == 68, "SPEC §5.2");

// Physical slot of entry `s` of a request through its page table (SPEC §7): entries_per_page = P/m.
DSV4_HDC std::int64_t physical_slot(const std::int32_t* page_table, std::int64_t s, int entries_per_page) {
  return static_cast<std::int64_t>(page_table[s / entries_per_page]) * entries_per_page + s % entries_per_page;
}

}  // namespace dsv4
