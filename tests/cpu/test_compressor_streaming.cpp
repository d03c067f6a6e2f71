// Speculative decoding and prefix reuse (SPEC §6): rollback across block and page boundaries
// leaves state and cache exactly as if the dropped tokens never arrived; a fork at a page boundary
// equals a run from scratch; forks mid-block / mid-page and rollbacks past the kept history are
// refused without changing anything.
#include <gtest/gtest.h>

#include <map>
#include <numeric>

#include "compressor_testing.hpp"

namespace dsv4 {
namespace {

using namespace compressor_testing;

const SpecCase kCases[] = {
    {"C4Attention", 4, true, EntryKind::Attention, false},
    {"C4IndexerFP8", 4, true, EntryKind::IndexerFP8, false},
    {"C128", 128, false, EntryKind::Attention, false},
    {"C128Online", 128, false, EntryKind::Attention, true},
    {"C2OverlapFP4", 2, true, EntryKind::IndexerFP4, false},
    {"C8Online", 8, false, EntryKind::IndexerFP8, true},
};

class CompressorStreaming : public ::testing::TestWithParam<SpecCase> {
 protected:
  CompressorSpec spec() const { return spec_of(GetParam()); }
};

// Junk rows standing in for rejected draft tokens.
Stream junk_rows(std::mt19937_64& rng, const CompressorSpec& spec, std::int64_t n) {
  return random_stream(rng, spec, n);
}

// Drafts of up to max_rollback tokens on top of the true stream: the accepted ones are the true
// next tokens, the rejected ones junk, rolled back. At the end every compressed row, every entry
// and the whole cache equal one run of the true stream.
TEST_P(CompressorStreaming, RandomDraftsAndRollbacksEqualTheTrueStream) {
  const CompressorSpec spec = this->spec();
  const int m = spec.ratio, page_size = 2 * m;
  std::mt19937_64 rng(testing::fresh_seed());
  const Stream truth = random_stream(rng, spec, 4 * m + 3);
  const RunResult want = run_chunks(spec, truth, {truth.tokens}, page_size);

  SingleRequestCompressor comp(spec, truth.ape_view(), truth.norm_view(), truth.tokens + spec.max_rollback, page_size);
  std::map<std::int64_t, std::vector<float>> rows;  // latest compressed row of each entry
  const auto keep = [&](const SingleRequestCompressor::Appended& a) {
    for (std::size_t i = 0; i < a.entry_ids.size(); ++i) {
      const float* p = a.compressed.data_as<const float>() + i * static_cast<std::size_t>(spec.width);
      rows[a.entry_ids[i]] = std::vector<float>(p, p + spec.width);
    }
  };
  std::uniform_int_distribution<std::int64_t> drafts(1, spec.max_rollback);
  while (comp.tokens() < truth.tokens) {
    const std::int64_t at = comp.tokens();
    const std::int64_t d = drafts(rng);
    const std::int64_t accepted = std::min(std::uniform_int_distribution<std::int64_t>(0, d)(rng), truth.tokens - at);
    keep(comp.append(truth.kv_rows(at, accepted), truth.score_rows(at, accepted)));
    const Stream junk = junk_rows(rng, spec, d - accepted);
    keep(comp.append(junk.kv_rows(0, d - accepted), junk.score_rows(0, d - accepted)));
    comp.rollback(d - accepted);
    ASSERT_EQ(comp.tokens(), at + accepted);
    rows.erase(rows.lower_bound(comp.num_entries()), rows.end());  // entries of dropped tokens are gone
  }
  ASSERT_EQ(rows.size(), want.entries.size());
  for (const auto& [n, row] : rows) {
    EXPECT_EQ(0, std::memcmp(row.data(), want.compressed.data() + n * spec.width, sizeof(float) * row.size())) << n;
    EXPECT_EQ(comp.entry_bytes(n), want.entries[static_cast<std::size_t>(n)]) << n;
  }
  // The same capacity gives the same page table, so the whole pool must match (zeroed leftovers).
  const RunResult same_pool = [&] {
    SingleRequestCompressor fresh(spec, truth.ape_view(), truth.norm_view(), truth.tokens + spec.max_rollback, page_size);
    fresh.append(truth.kv_rows(0, truth.tokens), truth.score_rows(0, truth.tokens));
    RunResult r;
    r.cache = fresh.cache().host_bytes();
    return r;
  }();
  EXPECT_EQ(comp.cache().host_bytes(), same_pool.cache);
}

// Deterministic boundary cases: the dropped drafts complete an entry (block boundary) and the first
// entry of a new page (page boundary); after the rollback the cache equals a fresh run's, and the
// continuation is bit-identical.
TEST_P(CompressorStreaming, RollbackAcrossBlockAndPageBoundaries) {
  const CompressorSpec spec = this->spec();
  const int m = spec.ratio, page_size = 2 * m;  // entries 0,1 on page 0; 2,3 on page 1; ...
  std::mt19937_64 rng(testing::fresh_seed());
  const Stream truth = random_stream(rng, spec, 6 * m + 5);
  const std::int64_t capacity = truth.tokens + spec.max_rollback;
  // Counts one token before a block boundary (the junk completes entry 1, on page 0), one before a
  // page boundary (the junk completes entry 2, the first of page 1), and one just past a boundary.
  const std::int64_t block_edge = 2 * m - 1, page_edge = 3 * m - 1, after_edge = 4 * m + 1;
  for (const std::int64_t at : {block_edge, page_edge, after_edge}) {
    for (const std::int64_t dropped : {std::int64_t{1}, std::int64_t{spec.max_rollback}}) {
      SingleRequestCompressor comp(spec, truth.ape_view(), truth.norm_view(), capacity, page_size);
      comp.append(truth.kv_rows(0, at), truth.score_rows(0, at));
      const Stream junk = junk_rows(rng, spec, dropped);
      const auto appended = comp.append(junk.kv_rows(0, dropped), junk.score_rows(0, dropped));
      const bool crossed = (at + dropped) / m > at / m;
      EXPECT_EQ(appended.entry_ids.empty(), !crossed);
      comp.rollback(dropped);
      SingleRequestCompressor fresh(spec, truth.ape_view(), truth.norm_view(), capacity, page_size);
      fresh.append(truth.kv_rows(0, at), truth.score_rows(0, at));
      EXPECT_EQ(comp.cache().host_bytes(), fresh.cache().host_bytes()) << "at " << at << " dropped " << dropped;
      // Continue both with the true tokens, in different chunkings.
      const auto a = comp.append(truth.kv_rows(at, truth.tokens - at), truth.score_rows(at, truth.tokens - at));
      fresh.append(truth.kv_rows(at, 1), truth.score_rows(at, 1));
      fresh.append(truth.kv_rows(at + 1, truth.tokens - at - 1), truth.score_rows(at + 1, truth.tokens - at - 1));
      EXPECT_EQ(comp.cache().host_bytes(), fresh.cache().host_bytes()) << "at " << at << " dropped " << dropped;
      EXPECT_FALSE(a.entry_ids.empty());
    }
  }
  // A rollback that also drops accepted tokens across a block boundary (count 2m+1 → 2m−3 style).
  SingleRequestCompressor comp(spec, truth.ape_view(), truth.norm_view(), capacity, page_size);
  const std::int64_t at = 2 * m + 1;
  comp.append(truth.kv_rows(0, at), truth.score_rows(0, at));
  const std::int64_t back = std::min<std::int64_t>(spec.max_rollback, at);
  comp.rollback(back);
  SingleRequestCompressor fresh(spec, truth.ape_view(), truth.norm_view(), capacity, page_size);
  fresh.append(truth.kv_rows(0, at - back), truth.score_rows(0, at - back));
  EXPECT_EQ(comp.cache().host_bytes(), fresh.cache().host_bytes());
  comp.append(truth.kv_rows(at - back, truth.tokens - (at - back)), truth.score_rows(at - back, truth.tokens - (at - back)));
  fresh.append(truth.kv_rows(at - back, truth.tokens - (at - back)), truth.score_rows(at - back, truth.tokens - (at - back)));
  EXPECT_EQ(comp.cache().host_bytes(), fresh.cache().host_bytes());
}

TEST_P(CompressorStreaming, RollbackPastTheKeptHistoryIsRefused) {
  const CompressorSpec spec = this->spec();
  const int m = spec.ratio;
  std::mt19937_64 rng(testing::fresh_seed());
  const Stream s = random_stream(rng, spec, 3 * m + 20);
  SingleRequestCompressor comp(spec, s.ape_view(), s.norm_view(), s.tokens, 2 * m);
  comp.append(s.kv_rows(0, s.tokens), s.score_rows(0, s.tokens));
  const auto before = Snapshot::of(comp.pool(), comp.cache());
  EXPECT_THROW(comp.rollback(spec.max_rollback + 1), Error);
  EXPECT_THROW(comp.rollback(-1), Error);
  EXPECT_TRUE(Snapshot::of(comp.pool(), comp.cache()) == before);
  comp.rollback(3);
  EXPECT_THROW(comp.rollback(spec.max_rollback - 2), Error) << "the floor is the highest count minus max_rollback";
  comp.rollback(spec.max_rollback - 3);
  EXPECT_EQ(comp.tokens(), s.tokens - spec.max_rollback);
}

// Prefix reuse: B forks from A at a page boundary and continues with its own tokens; its entries
// (shared prefix pages + its own pages) equal a from-scratch run of A's prefix + B's tokens, and A
// is unaffected.
TEST_P(CompressorStreaming, ForkAtAPageBoundaryEqualsFromScratch) {
  const CompressorSpec spec = this->spec();
  const int m = spec.ratio, page_size = 2 * m, per_page = 2;
  std::mt19937_64 rng(testing::fresh_seed());
  const std::int64_t t = 2 * page_size;  // the fork point: 4 entries, 2 pages
  const Stream a_rows = random_stream(rng, spec, t + 5);
  Stream b_rows = random_stream(rng, spec, 3 * m + 2);
  b_rows.ape = a_rows.ape;
  b_rows.norm = a_rows.norm;
  // What B should be: A's first t tokens, then B's own.
  Stream scratch = a_rows;
  scratch.tokens = t + b_rows.tokens;
  scratch.kv.resize(static_cast<std::size_t>(t * spec.row_width()));
  scratch.score.resize(scratch.kv.size());
  scratch.kv.insert(scratch.kv.end(), b_rows.kv.begin(), b_rows.kv.end());
  scratch.score.insert(scratch.score.end(), b_rows.score.begin(), b_rows.score.end());
  const RunResult want_b = run_chunks(spec, scratch, {scratch.tokens}, page_size);
  const RunResult want_a = run_chunks(spec, a_rows, {a_rows.tokens}, page_size);

  CompressorStatePool pool(spec, 4);
  PagedCache cache = make_compressed_cache(spec, page_size, 12);
  const int a = pool.allocate(), b = pool.allocate();
  const std::vector<std::int32_t> a_pages = {7, 3, 9, 5};
  const std::vector<std::int32_t> b_pages = {7, 3, 2, 11, 4};  // shares A's first two pages
  const CompressorWeights weights{a_rows.ape_view(), a_rows.norm_view()};
  const auto step = [&](int slot, const Stream& s, std::int64_t from, std::int64_t n, std::int64_t prefix,
                        const std::vector<std::int32_t>& pages) {
    compress(spec, weights, {CompressRequest{slot, prefix, n, pages}}, MatrixF32View::of(s.kv_rows(from, n), "kv"),
             MatrixF32View::of(s.score_rows(from, n), "score"), pool, cache);
  };
  step(a, a_rows, 0, t + 3, 0, a_pages);  // A is 3 tokens past the boundary when B forks

  const auto before = Snapshot::of(pool, cache);
  try {
    fork_prefix(pool, a, b, t - 1, cache);  // m ≥ 2 in every case: t − 1 is inside a block
    ADD_FAILURE() << "a fork mid-block must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "prefix_tokens");
    EXPECT_NE(std::string(e.what()).find("mid-block"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fork_prefix(pool, a, b, t - m, cache), Error) << "block boundary but mid-page";
  EXPECT_THROW(fork_prefix(pool, a, b, t + page_size, cache), Error) << "past A's tokens";
  EXPECT_THROW(fork_prefix(pool, a, a, t, cache), Error) << "onto itself";
  EXPECT_TRUE(Snapshot::of(pool, cache) == before);

  fork_prefix(pool, a, b, t, cache);
  EXPECT_EQ(pool.tokens(b), t);
  // B continues in two chunks in one batch with A's continuation.
  const std::int64_t first = 1;
  std::vector<float> kv, score;
  const auto append_rows = [&](const Stream& s, std::int64_t from, std::int64_t n) {
    kv.insert(kv.end(), s.kv.begin() + from * spec.row_width(), s.kv.begin() + (from + n) * spec.row_width());
    score.insert(score.end(), s.score.begin() + from * spec.row_width(), s.score.begin() + (from + n) * spec.row_width());
  };
  append_rows(b_rows, 0, first);
  append_rows(a_rows, t + 3, 2);
  const TensorView kv_view{kv.data(), DType::F32, {first + 2, spec.row_width()}, Device::CPU};
  const TensorView score_view{score.data(), DType::F32, {first + 2, spec.row_width()}, Device::CPU};
  compress(spec, weights, {CompressRequest{b, t, first, b_pages}, CompressRequest{a, t + 3, 2, a_pages}},
           MatrixF32View::of(kv_view, "kv"), MatrixF32View::of(score_view, "score"), pool, cache);
  step(b, b_rows, first, b_rows.tokens - first, t + first, b_pages);

  for (std::int64_t n = 0; n < scratch.tokens / m; ++n)
    EXPECT_EQ(cache.entry_bytes(physical_slot(b_pages.data(), n, per_page)), want_b.entries[static_cast<std::size_t>(n)]) << "B entry " << n;
  for (std::int64_t n = 0; n < a_rows.tokens / m; ++n)
    EXPECT_EQ(cache.entry_bytes(physical_slot(a_pages.data(), n, per_page)), want_a.entries[static_cast<std::size_t>(n)]) << "A entry " << n;
  // B may not roll back into the shared prefix.
  EXPECT_THROW(rollback(pool, b, pool.tokens(b) - t + 1, cache, b_pages), Error);
}

INSTANTIATE_TEST_SUITE_P(Specs, CompressorStreaming, ::testing::ValuesIn(kCases), spec_case_name);

}  // namespace
}  // namespace dsv4
