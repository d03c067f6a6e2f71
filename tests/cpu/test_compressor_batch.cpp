// Ragged batches (SPEC §6): several requests with different prefixes and chunk sizes in one step,
// through a fused [kv | score] buffer, give exactly the bytes of each request run alone; the
// optional outputs describe every event; pages nobody owns stay zero.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "compressor_testing.hpp"

namespace dsv4 {
namespace {

using namespace compressor_testing;

struct BatchCase {
  const char* name;
  int ratio;
  bool overlap;
  EntryKind output;
  bool online;
};

class CompressorBatch : public ::testing::TestWithParam<BatchCase> {};

struct Request {
  Stream stream;                      // this request's rows (weights shared with every request)
  std::vector<std::int32_t> pages;    // its page table
  std::int64_t sent = 0;              // tokens already given to compress
  int slot = 0;
  RunResult alone;                    // the same request run by itself
};

TEST_P(CompressorBatch, MixedBatchesEqualEachRequestAlone) {
  const BatchCase& bc = GetParam();
  const CompressorSpec spec = make_spec(bc.ratio, bc.overlap, bc.output, bc.online);
  const int m = spec.ratio, c = spec.width, w = spec.row_width();
  const int page_size = 2 * m;  // two entries per page: requests cross many pages
  std::mt19937_64 rng(testing::fresh_seed());
  const Stream weights = random_stream(rng, spec, 0);

  const int num_requests = 6;
  std::uniform_int_distribution<std::int64_t> length(0, 5 * m + 7);
  CompressorStatePool pool(spec, num_requests + 3);
  std::vector<Request> requests(static_cast<std::size_t>(num_requests));
  std::int64_t total_pages = 0;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    Request& r = requests[i];
    r.stream = random_stream(rng, spec, i == 0 ? 3 * m + 1 : length(rng));  // request 0 surely crosses blocks
    r.stream.ape = weights.ape;
    r.stream.norm = weights.norm;
    total_pages += (r.stream.tokens / m + 1) / 2;
    r.alone = run_chunks(spec, r.stream, {r.stream.tokens}, page_size);
  }

  // Physical pages handed out in random order (page 0 is the null page), with spare pages.
  PagedCache cache = make_compressed_cache(spec, page_size, static_cast<int>(total_pages) + 4);
  std::vector<std::int32_t> free_pages(static_cast<std::size_t>(cache.num_pages() - 1));
  std::iota(free_pages.begin(), free_pages.end(), 1);
  std::shuffle(free_pages.begin(), free_pages.end(), rng);
  for (Request& r : requests) {
    r.slot = pool.allocate();
    for (std::int64_t p = 0; p < (r.stream.tokens / m + 1) / 2; ++p) {
      r.pages.push_back(free_pages.back());
      free_pages.pop_back();
    }
  }

  std::uniform_int_distribution<int> pick(0, 5);
  int steps = 0;
  const auto remaining = [&] {
    return std::any_of(requests.begin(), requests.end(), [](const Request& r) { return r.sent < r.stream.tokens; });
  };
  while (remaining()) {
    ++steps;
    // A random subset in random order, each with 0, 1, a few (drafts) or many (prefill) tokens,
    // plus sometimes a padding request on the null slot.
    std::vector<Request*> order;
    for (Request& r : requests)
      if (pick(rng) != 0) order.push_back(&r);
    std::shuffle(order.begin(), order.end(), rng);
    CompressBatch batch;
    std::vector<Request*> in_batch;
    for (Request* r : order) {
      const std::int64_t left = r->stream.tokens - r->sent;
      const int kind = pick(rng);
      const std::int64_t n = std::min<std::int64_t>(left, kind == 0 ? 0 : kind <= 2 ? 1 : kind == 3 ? 4 : 3 * m + 2);
      batch.push_back(CompressRequest{r->slot, r->sent, n, r->pages});
      in_batch.push_back(r);
      if (pick(rng) == 0) {
        batch.push_back(CompressRequest{0, 0, 0, {}});
        in_batch.push_back(nullptr);
      }
    }
    // The fused projection output [T, 2w]: kv in columns [0, w), score in [w, 2w).
    std::vector<float> fused;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      if (!in_batch[i]) continue;
      const Stream& s = in_batch[i]->stream;
      for (std::int64_t p = batch[i].prefix_len; p < batch[i].prefix_len + batch[i].new_tokens; ++p) {
        fused.insert(fused.end(), s.kv.begin() + p * w, s.kv.begin() + (p + 1) * w);
        fused.insert(fused.end(), s.score.begin() + p * w, s.score.begin() + (p + 1) * w);
      }
    }
    const std::int64_t rows = static_cast<std::int64_t>(fused.size()) / (2 * w);
    const TensorView fused_view{fused.data(), DType::F32, {rows, 2 * w}, Device::CPU};
    const MatrixF32View all = MatrixF32View::of(fused_view, "fused");
    const std::int64_t events = count_compress_events(spec, batch);
    Tensor compressed = Tensor::empty(DType::F32, {events, c});
    Tensor entry_ids = Tensor::empty(DType::I32, {events});
    Tensor positions = Tensor::empty(DType::I32, {events});
    Tensor cache_slots = Tensor::empty(DType::I32, {events});
    for (Tensor* t : {&compressed, &entry_ids, &positions, &cache_slots}) t->fill_bytes(0xff);  // poison
    compress(spec, {weights.ape_view(), weights.norm_view()}, batch, all.columns(0, w), all.columns(w, w), pool, cache,
             {compressed.view(), entry_ids.view(), positions.view(), cache_slots.view()});

    // Events in request order, ascending entry; each row equals the request's own run.
    std::int64_t e = 0;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      if (!in_batch[i]) continue;
      Request& r = *in_batch[i];
      for (std::int64_t n = batch[i].prefix_len / m; n < (batch[i].prefix_len + batch[i].new_tokens) / m; ++n, ++e) {
        ASSERT_LT(e, events);
        EXPECT_EQ(entry_ids.data_as<std::int32_t>()[e], n);
        EXPECT_EQ(positions.data_as<std::int32_t>()[e], n * m);
        EXPECT_EQ(cache_slots.data_as<std::int32_t>()[e], physical_slot(r.pages.data(), n, cache.entries_per_page()));
        EXPECT_EQ(0, std::memcmp(compressed.data_as<float>() + e * c, r.alone.compressed.data() + n * c,
                                 sizeof(float) * static_cast<std::size_t>(c)))
            << "request slot " << r.slot << " entry " << n;
      }
      r.sent += batch[i].new_tokens;
      EXPECT_EQ(pool.tokens(r.slot), r.sent);
    }
    EXPECT_EQ(e, events);
  }
  EXPECT_GT(steps, 1);

  // Cache bytes: every request's entries as alone; pages nobody owns (and the null page) are zero.
  std::vector<bool> owned(static_cast<std::size_t>(cache.num_pages()), false);
  for (const Request& r : requests) {
    for (std::int32_t p : r.pages) owned[static_cast<std::size_t>(p)] = true;
    for (std::int64_t n = 0; n < r.stream.tokens / m; ++n) {
      EXPECT_EQ(cache.entry_bytes(physical_slot(r.pages.data(), n, cache.entries_per_page())),
                r.alone.entries[static_cast<std::size_t>(n)])
          << "slot " << r.slot << " entry " << n;
    }
  }
  const std::vector<std::uint8_t> bytes = cache.host_bytes();
  for (int p = 0; p < cache.num_pages(); ++p) {
    if (owned[static_cast<std::size_t>(p)]) continue;
    const auto begin = bytes.begin() + p * cache.page_bytes();
    EXPECT_TRUE(std::all_of(begin, begin + cache.page_bytes(), [](std::uint8_t b) { return b == 0; })) << "page " << p;
  }
}

INSTANTIATE_TEST_SUITE_P(Specs, CompressorBatch,
                         ::testing::Values(BatchCase{"C4Attention", 4, true, EntryKind::Attention, false},
                                           BatchCase{"C4IndexerFP4", 4, true, EntryKind::IndexerFP4, false},
                                           BatchCase{"C16", 16, false, EntryKind::IndexerFP8, false},
                                           BatchCase{"C16Online", 16, false, EntryKind::Attention, true}),
                         [](const ::testing::TestParamInfo<BatchCase>& param) { return std::string(param.param.name); });

}  // namespace
}  // namespace dsv4
