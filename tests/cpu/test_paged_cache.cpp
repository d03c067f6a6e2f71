// Paged compressed caches (SPEC §5): page geometry and byte offsets per entry kind, gather order of
// shared/vectors/README.md, decode(encode(x)) bounds through the pool, clearing, null page and
// page-table checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "dsv4/formats.hpp"
#include "dsv4/paged_cache.hpp"
#include "testing/testing.hpp"

namespace dsv4 {
namespace {

std::vector<float> bf16_values(std::mt19937_64& rng, int n) {
  std::vector<float> v = testing::random_normal(rng, static_cast<std::size_t>(n), 2.0f);
  for (float& x : v) x = round_to_bf16(x);
  return v;
}

TEST(EntryLayout, SizesAndOffsets) {
  const EntryLayout attention{EntryKind::Attention, 512};
  EXPECT_EQ(attention.entry_bytes(), 584);
  EXPECT_EQ(attention.data_bytes(), 576);
  EXPECT_EQ(attention.page_bytes(64), 64 * 584 + 576 - (64 * 584) % 576);
  EXPECT_EQ(attention.page_bytes(2), 3 * 576);  // 1168 bytes padded to a multiple of 576
  EXPECT_EQ(attention.data_offset(5), 5 * 576);
  EXPECT_EQ(attention.scale_offset(5, 64), 64 * 576 + 5 * 8);

  const EntryLayout fp8{EntryKind::IndexerFP8, 128};
  EXPECT_EQ(fp8.entry_bytes(), 132);
  EXPECT_EQ(fp8.page_bytes(64), 64 * 132);
  EXPECT_EQ(fp8.data_offset(3), 3 * 128);
  EXPECT_EQ(fp8.scale_offset(3, 64), 64 * 128 + 3 * 4);

  const EntryLayout fp4{EntryKind::IndexerFP4, 128};
  EXPECT_EQ(fp4.entry_bytes(), 68);
  EXPECT_EQ(fp4.page_bytes(64), 64 * 68);
  EXPECT_EQ(fp4.data_offset(3), 3 * 64);
  EXPECT_EQ(fp4.scale_offset(3, 64), 64 * 64 + 3 * 4);

  testing::expect_error("layout", [] { EntryLayout{EntryKind::Attention, 256}.validate(); });
  testing::expect_error("layout", [] { EntryLayout{EntryKind::IndexerFP4, 48}.validate(); });
  testing::expect_error("keys", [] { EntryLayout{EntryKind::IndexerFP8, 0}.validate("keys"); });
  EXPECT_NO_THROW((EntryLayout{EntryKind::IndexerFP8, 64}.validate()));
}

class PagedCacheKinds : public ::testing::TestWithParam<EntryKind> {};

// Encoding entry i of page p touches exactly its two byte runs; gather returns data bytes then
// scale bytes; decode is within one code step of the input; clear zeroes both runs only.
TEST_P(PagedCacheKinds, EntriesLiveAtTheirOffsetsAndRoundTrip) {
  const EntryKind kind = GetParam();
  const EntryLayout layout{kind, kind == EntryKind::Attention ? 512 : 128};
  std::mt19937_64 rng(testing::fresh_seed());
  const int per_page = 4, pages = 3;
  PagedCache cache(layout, per_page, pages);
  EXPECT_EQ(cache.num_slots(), per_page * pages);
  EXPECT_EQ(cache.total_bytes(), pages * layout.page_bytes(per_page));
  const std::vector<std::uint8_t> zero = cache.host_bytes();
  EXPECT_TRUE(std::all_of(zero.begin(), zero.end(), [](std::uint8_t b) { return b == 0; }));

  const int page = 2, i = 1;
  const std::vector<float> values = bf16_values(rng, layout.dim);
  layout.encode(values.data(), cache.page_data(page), i, per_page);
  const std::vector<std::uint8_t> bytes = cache.host_bytes();
  const std::int64_t base = page * cache.page_bytes();
  const std::int64_t data = base + layout.data_offset(i), scales = base + layout.scale_offset(i, per_page);
  for (std::int64_t k = 0; k < static_cast<std::int64_t>(bytes.size()); ++k) {
    const bool inside = (k >= data && k < data + layout.data_bytes()) || (k >= scales && k < scales + layout.scale_bytes());
    if (!inside) {
      ASSERT_EQ(bytes[static_cast<std::size_t>(k)], 0) << "byte " << k << " outside entry (page 2, 1)";
    }
  }
  const std::int64_t slot = page * per_page + i;
  const std::vector<std::uint8_t> gathered = cache.entry_bytes(slot);
  ASSERT_EQ(gathered.size(), static_cast<std::size_t>(layout.entry_bytes()));
  EXPECT_EQ(0, std::memcmp(gathered.data(), bytes.data() + data, static_cast<std::size_t>(layout.data_bytes())));
  EXPECT_EQ(0, std::memcmp(gathered.data() + layout.data_bytes(), bytes.data() + scales, static_cast<std::size_t>(layout.scale_bytes())));

  const std::vector<float> decoded = cache.decode_entry(slot);
  float amax = 0;
  for (float v : values) amax = std::max(amax, std::fabs(v));
  for (int k = 0; k < layout.dim; ++k) {
    const float v = values[static_cast<std::size_t>(k)], d = decoded[static_cast<std::size_t>(k)];
    ASSERT_FALSE(std::isnan(d));
    if (kind == EntryKind::Attention && k >= 448) {
      EXPECT_EQ(d, v) << "RoPE dims are stored as bf16";
    } else if (kind == EntryKind::IndexerFP4) {
      // Half of the widest grid gap (4 → 6) at a block scale below amax/3.
      EXPECT_LE(std::fabs(d - v), amax / 3.0f) << k;
    } else {
      // 3 mantissa bits: ≤ 2^-4 relative for normals; subnormals ≤ 2^-10 of the block scale.
      EXPECT_LE(std::fabs(d - v), std::fmax(std::fabs(v) / 16.0f, amax / 448.0f / 512.0f * 2.0f)) << k;
    }
  }
  layout.clear(cache.page_data(page), i, per_page);
  EXPECT_EQ(cache.host_bytes(), zero);
}

INSTANTIATE_TEST_SUITE_P(Kinds, PagedCacheKinds,
                         ::testing::Values(EntryKind::Attention, EntryKind::IndexerFP8, EntryKind::IndexerFP4),
                         [](const ::testing::TestParamInfo<EntryKind>& param) {
                           return std::string(param.param == EntryKind::Attention    ? "Attention"
                                              : param.param == EntryKind::IndexerFP8 ? "IndexerFP8"
                                                                                      : "IndexerFP4");
                         });

TEST(PagedCache, PageTableTranslationAndChecks) {
  PagedCache cache(EntryLayout{EntryKind::IndexerFP8, 128}, 64, 10);
  const std::vector<std::int32_t> table{4, 9, 1};
  EXPECT_EQ(checked_physical_page(cache, table, 1), 9);
  EXPECT_EQ(physical_slot(table.data(), 64 + 5, 64), 9 * 64 + 5);
  testing::expect_error("page_table", [&] { checked_physical_page(cache, table, 3); });  // past the table
  testing::expect_error("page_table", [&] { checked_physical_page(cache, table, -1); });
  for (std::int32_t bad : {0, -1, 10, 1 << 30}) {
    const std::vector<std::int32_t> t{bad};
    try {
      checked_physical_page(cache, t, 0, "pages");
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "pages");
    }
  }
  testing::expect_error("slot", [&] { cache.check_slot(cache.num_slots()); });
  testing::expect_error("slot", [&] { cache.entry_bytes(-1); });
  testing::expect_error("slot", [&] { cache.decode_entry(cache.num_slots()); });
  testing::expect_error("page", [&] { cache.page_data(10); });
  testing::expect_error("page", [&] { cache.page_data(-1); });
  const EntryLayout fp8{EntryKind::IndexerFP8, 128};
  testing::expect_error("num_pages", [&] { PagedCache(fp8, 1 << 16, 1 << 16); });  // int32 slot range
  testing::expect_error("num_pages", [&] { PagedCache(fp8, 4, 0); });
  testing::expect_error("entries_per_page", [&] { PagedCache(fp8, 0, 4); });
  testing::expect_error("layout", [&] { PagedCache(EntryLayout{EntryKind::Attention, 128}, 4, 4); });
}

}  // namespace
}  // namespace dsv4
