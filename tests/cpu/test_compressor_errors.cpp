// SPEC §10: every invalid argument of the compressor operations raises dsv4::Error naming it, and
// leaves state and cache byte-for-byte untouched — including when only a later request of a batch
// is at fault.
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>

#include "compressor_testing.hpp"

namespace dsv4 {
namespace {

using namespace compressor_testing;

class CompressErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    rng.seed(testing::fresh_seed());
    weights = random_stream(rng, spec, 0);
    rows_a = random_stream(rng, spec, 12);
    rows_b = random_stream(rng, spec, 9);
    a = pool.allocate();
    b = pool.allocate();
    // History: a has 6 tokens, b has 3.
    run({{a, 0, 6, pages_a}}, rows_a, 0, 6);
    run({{b, 0, 3, pages_b}}, rows_b, 0, 3);
    // The valid next step: a brings 6 (completing entries 1 and 2: logical pages 0 and 1), b brings 6
    // (entries 0 and 1: logical page 0).
    append(rows_a, 6, 6);
    append(rows_b, 3, 6);
  }

  void run(const CompressBatch& batch, const Stream& s, std::int64_t from, std::int64_t n) {
    compress(spec, cw(), batch, MatrixF32View::of(s.kv_rows(from, n), "kv"), MatrixF32View::of(s.score_rows(from, n), "score"),
             pool, cache);
  }
  void append(const Stream& s, std::int64_t from, std::int64_t n) {
    const int w = spec.row_width();
    kv.insert(kv.end(), s.kv.begin() + from * w, s.kv.begin() + (from + n) * w);
    score.insert(score.end(), s.score.begin() + from * w, s.score.begin() + (from + n) * w);
  }
  CompressorWeights cw() const { return {weights.ape_view(), weights.norm_view()}; }
  CompressBatch batch() const { return {{a, 6, 6, pages_a}, {b, 3, 6, pages_b}}; }
  MatrixF32View kv_view() const { return {kv.data(), 12, spec.row_width(), spec.row_width(), Device::CPU}; }
  MatrixF32View score_view() const { return {score.data(), 12, spec.row_width(), spec.row_width(), Device::CPU}; }

  // Runs `call`, which must throw Error for an argument starting with `argument`, and checks that
  // nothing changed.
  void expect_refused(const std::string& argument, const std::function<void()>& call) {
    const Snapshot before = Snapshot::of(pool, cache);
    try {
      call();
      ADD_FAILURE() << "no error for " << argument;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument().rfind(argument, 0), 0u) << "expected argument " << argument << ", got: " << e.what();
    }
    EXPECT_TRUE(Snapshot::of(pool, cache) == before) << "state or cache changed after the error on " << argument;
  }
  void expect_compress_refused(const std::string& argument, const CompressBatch& bad_batch) {
    expect_refused(argument, [&] { compress(spec, cw(), bad_batch, kv_view(), score_view(), pool, cache); });
  }

  CompressorSpec spec = make_spec(4, true, EntryKind::Attention);
  std::mt19937_64 rng;
  Stream weights, rows_a, rows_b;
  CompressorStatePool pool{spec, 5};  // slots 1..4; 4 stays unallocated
  PagedCache cache = make_compressed_cache(spec, 8, 8);  // 2 entries per page, pages 1..7 usable
  int a = 0, b = 0;
  std::vector<std::int32_t> pages_a{1, 2, 3}, pages_b{4, 5};
  std::vector<float> kv, score;  // the valid step's rows [11, coff·c]
};

TEST_F(CompressErrors, RowsShapesDtypesDevicesStrides) {
  const int w = spec.row_width();
  expect_refused("kv", [&] { compress(spec, cw(), batch(), {kv.data(), 12, w - 1, w, Device::CPU}, score_view(), pool, cache); });
  // Σ new_tokens = 12 ≠ 11 rows:
  expect_refused("kv", [&] { compress(spec, cw(), batch(), {kv.data(), 11, w, w, Device::CPU}, score_view(), pool, cache); });
  expect_refused("score", [&] { compress(spec, cw(), batch(), kv_view(), {score.data(), 13, w, w, Device::CPU}, pool, cache); });
  expect_refused("kv", [&] { compress(spec, cw(), batch(), {kv.data(), 12, w, w - 1, Device::CPU}, score_view(), pool, cache); });
  expect_refused("kv", [&] { compress(spec, cw(), batch(), {kv.data(), 12, w, w, Device::CUDA}, score_view(), pool, cache); });
  expect_refused("kv", [&] { compress(spec, cw(), batch(), {nullptr, 12, w, w, Device::CPU}, score_view(), pool, cache); });
  // A stride whose 12 rows span more bytes than int64 counts (addresses and checks would wrap).
  const std::int64_t huge_stride = std::numeric_limits<std::int64_t>::max() / 16;
  expect_refused("score", [&] { compress(spec, cw(), batch(), kv_view(), {score.data(), 12, w, huge_stride, Device::CPU}, pool, cache); });
  std::vector<std::int32_t> ints(static_cast<std::size_t>(12 * w));
  expect_refused("kv", [&] { MatrixF32View::of(TensorView{ints.data(), DType::I32, {12, w}, Device::CPU}, "kv"); });
  expect_refused("kv", [&] { MatrixF32View::of(TensorView{kv.data(), DType::F32, {12, w, 1}, Device::CPU}, "kv"); });
  expect_refused("columns", [&] { kv_view().columns(w - 2, 3); });
  // begin + count overflows int64: it used to wrap below the width and pass.
  expect_refused("columns", [&] { kv_view().columns(1, std::numeric_limits<std::int64_t>::max()); });
  expect_refused("columns", [&] { kv_view().columns(w + 1, 0); });
  EXPECT_EQ(kv_view().columns(w, 0).cols, 0);
}

TEST_F(CompressErrors, Weights) {
  const auto with = [&](TensorView ape, TensorView norm) {
    return [=, this] { compress(spec, {ape, norm}, batch(), kv_view(), score_view(), pool, cache); };
  };
  TensorView ape = weights.ape_view(), norm = weights.norm_view();
  TensorView bad = ape;
  bad.shape = {3, spec.row_width()};
  expect_refused("ape", with(bad, norm));
  bad = ape;
  bad.dtype = DType::BF16;
  expect_refused("ape", with(bad, norm));
  bad = norm;
  bad.shape = {spec.width - 1};
  expect_refused("norm", with(ape, bad));
  bad = norm;
  bad.device = Device::CUDA;
  expect_refused("norm", with(ape, bad));
}

TEST_F(CompressErrors, Requests) {
  CompressBatch bad = batch();
  bad[1].prefix_len = 2;  // b has seen 3 tokens: a chunk out of order
  expect_compress_refused("batch[1].prefix_len", bad);
  bad = batch();
  bad[0].slot = 4;  // never allocated
  expect_compress_refused("batch[0].slot", bad);
  for (int slot : {-1, 5, 1 << 30}) {
    bad = batch();
    bad[0].slot = slot;
    expect_compress_refused("batch[0].slot", bad);
  }
  bad = batch();
  bad[1].slot = a;  // the same slot twice in one step
  bad[1].prefix_len = 6;
  expect_compress_refused("batch[1].slot", bad);
  bad = batch();
  bad.insert(bad.begin(), CompressRequest{0, 0, 1, {}});  // the null slot with a token
  expect_compress_refused("batch[0].slot", bad);
  bad = batch();
  bad[0].new_tokens = -1;
  bad[1].new_tokens = 13;  // keeps Σ = 12
  expect_compress_refused("batch[0].new_tokens", bad);
}

TEST_F(CompressErrors, PositionsPastMaxPositions) {
  CompressorSpec limited = spec;
  limited.max_positions = 11;  // a reaches position 11
  expect_refused("batch[0].new_tokens", [&] { compress(limited, cw(), batch(), kv_view(), score_view(), pool, cache); });
  limited.max_positions = 12;  // positions 0..11 are fine
  const Snapshot before = Snapshot::of(pool, cache);
  compress(limited, cw(), batch(), kv_view(), score_view(), pool, cache);
  EXPECT_FALSE(Snapshot::of(pool, cache) == before);
}

TEST_F(CompressErrors, PageTables) {
  const std::vector<std::int32_t> short_table{1};           // a's entry 2 needs logical page 1
  const std::vector<std::int32_t> null_page{1, 0, 3};        // page 0 is the null page
  const std::vector<std::int32_t> outside{1, 8, 3};          // the pool has 8 pages (0..7)
  const std::vector<std::int32_t> negative{1, -1, 3};
  const std::vector<std::int32_t> huge{1, 1 << 30, 3};
  for (const auto* table : {&short_table, &null_page, &outside, &negative, &huge}) {
    CompressBatch bad = batch();
    bad[0].page_table = *table;
    expect_compress_refused("batch[0].page_table", bad);
  }
  // a's entry 2 would go to page 4, where b writes its entries 0 and 1 in this step.
  const std::vector<std::int32_t> a_clash{1, 4, 3};
  CompressBatch bad = batch();
  bad[0].page_table = a_clash;
  expect_compress_refused("batch[1].page_table", bad);
  // One request mapping two logical pages it writes to one physical page.
  const std::vector<std::int32_t> self_clash{1, 1, 3};
  bad = batch();
  bad[0].page_table = self_clash;
  expect_compress_refused("batch[0].page_table", bad);
}

TEST_F(CompressErrors, Outputs) {
  const std::int64_t events = count_compress_events(spec, batch());
  ASSERT_EQ(events, 4);  // a: entries 1, 2; b: entries 0, 1
  Tensor rows_wrong = Tensor::zeros(DType::F32, {events - 1, spec.width});
  Tensor ids_wrong_dtype = Tensor::zeros(DType::I64, {events});
  Tensor positions_wrong = Tensor::zeros(DType::I32, {events, 1});
  expect_refused("outputs.compressed", [&] { compress(spec, cw(), batch(), kv_view(), score_view(), pool, cache, {rows_wrong.view(), {}, {}, {}}); });
  expect_refused("outputs.entry_ids", [&] { compress(spec, cw(), batch(), kv_view(), score_view(), pool, cache, {{}, ids_wrong_dtype.view(), {}, {}}); });
  expect_refused("outputs.positions", [&] { compress(spec, cw(), batch(), kv_view(), score_view(), pool, cache, {{}, {}, positions_wrong.view(), {}}); });
  expect_refused("outputs.cache_slots", [&] { compress(spec, cw(), batch(), kv_view(), score_view(), pool, cache, {{}, {}, {}, rows_wrong.view()}); });
  // Outputs over what the step reads (the rows, the weights), writes besides them (the cache), or over
  // each other; the rows read must stay as they were.
  const std::vector<float> kv_before = kv;
  const TensorView on_kv{kv.data() + spec.row_width(), DType::F32, {events, spec.width}};  // inside the second row on
  expect_refused("outputs.compressed", [&] { compress(spec, cw(), batch(), kv_view(), score_view(), pool, cache, {on_kv, {}, {}, {}}); });
  EXPECT_EQ(kv, kv_before);
  const TensorView on_norm{cw().norm.data, DType::I32, {events}};
  expect_refused("outputs.positions", [&] { compress(spec, cw(), batch(), kv_view(), score_view(), pool, cache, {{}, {}, on_norm, {}}); });
  const TensorView on_cache{cache.storage().data(), DType::I32, {events}};
  expect_refused("outputs.cache_slots", [&] { compress(spec, cw(), batch(), kv_view(), score_view(), pool, cache, {{}, {}, {}, on_cache}); });
  Tensor ids = Tensor::zeros(DType::I32, {events});
  expect_refused("outputs.entry_ids", [&] { compress(spec, cw(), batch(), kv_view(), score_view(), pool, cache, {{}, ids.view(), ids.view(), {}}); });
}

TEST_F(CompressErrors, PoolCacheAndSpecMismatches) {
  CompressorSpec other = spec;
  other.ratio = 8;  // a different state geometry than the pool's
  expect_refused("pool", [&] { compress(other, cw(), batch(), kv_view(), score_view(), pool, cache); });
  CompressorSpec indexer = spec;
  indexer.output = EntryKind::IndexerFP8;
  indexer.width = 512;  // same state geometry, but the cache holds attention entries
  expect_refused("cache", [&] { compress(indexer, cw(), batch(), kv_view(), score_view(), pool, cache); });
  CompressorSpec bad = spec;
  bad.width = 256;  // attention entries are 512 wide
  expect_refused("width", [&] { compress(bad, cw(), batch(), kv_view(), score_view(), pool, cache); });
  bad = spec;
  bad.online = true;  // with overlap
  expect_refused("online", [&] { compress(bad, cw(), batch(), kv_view(), score_view(), pool, cache); });
  bad = spec;
  bad.ratio = 0;
  expect_refused("ratio", [&] { compress(bad, cw(), batch(), kv_view(), score_view(), pool, cache); });
  bad = spec;
  bad.rope.rope_dim = 32;  // the attention entry stores exactly 64 RoPE dims
  expect_refused("rope", [&] { compress(bad, cw(), batch(), kv_view(), score_view(), pool, cache); });
  CompressorSpec fp4 = make_spec(4, true, EntryKind::IndexerFP4);
  fp4.width = 96;  // not a power of two (Walsh–Hadamard)
  testing::expect_error("width", [&] { validate_compressor_spec(fp4); });
  testing::expect_error("page_size", [&] { make_compressed_cache(spec, 10, 4); });  // not a multiple of the ratio
  testing::expect_error("page_size", [&] { make_compressed_cache(spec, 0, 4); });
  testing::expect_error("num_pages", [&] { make_compressed_cache(spec, 8, 0); });
  testing::expect_error("num_slots", [&] { CompressorStatePool(spec, 1); });
  CompressorSpec no_positions = spec;
  no_positions.max_positions = 0;
  testing::expect_error("max_positions", [&] { CompressorStatePool(no_positions, 2); });
  CompressorSpec negative_eps = spec;
  negative_eps.eps = -1e-6;
  testing::expect_error("eps", [&] { make_compressed_cache(negative_eps, 8, 4); });
  // A RoPE base or an eps that no model has: refused by the spec's checks, before the step writes.
  bad = spec;
  bad.rope.base = 0.5;
  expect_refused("rope", [&] { compress(bad, cw(), batch(), kv_view(), score_view(), pool, cache); });
  testing::expect_error("rope", [&] { CompressorStatePool(bad, 2); });
  bad = spec;
  bad.eps = std::numeric_limits<double>::infinity();
  expect_refused("eps", [&] { compress(bad, cw(), batch(), kv_view(), score_view(), pool, cache); });
}

// The pool's own entry points: slots outside the pool or not allocated, and a full pool.
TEST_F(CompressErrors, PoolSlots) {
  expect_refused("slot", [&] { pool.release(4); });  // never allocated
  expect_refused("slot", [&] { pool.release(0); });  // the null slot
  expect_refused("slot", [&] { pool.release(5); });
  expect_refused("slot", [&] { pool.tokens(-1); });
  expect_refused("slot", [&] { pool.rollback_floor(5); });
  expect_refused("what", [&] { pool.check_allocated(4, "what"); });
  EXPECT_EQ(pool.allocate(), 3);
  EXPECT_EQ(pool.allocate(), 4);
  expect_refused("pool", [&] { pool.allocate(); });
  pool.release(3);
  EXPECT_FALSE(pool.in_use(3));
  EXPECT_EQ(pool.allocate(), 3);
}

TEST_F(CompressErrors, LayersWithoutACompressorAndOnlineOverlap) {
  const ModelConfig tiny = preset_config("tiny");
  try {
    CompressorSpec::for_layer(tiny, 0);
    ADD_FAILURE() << "a ratio-0 layer has no compressor";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "layer");
  }
  EXPECT_THROW(CompressorSpec::for_layer(tiny, tiny.num_layers()), Error);
  try {
    CompressorSpec::for_layer(tiny, 1, false, IndexerKeyFormat::FP8, /*online=*/true);
    ADD_FAILURE() << "ratio 4 overlaps: no online variant";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "online");
  }
  const CompressorSpec c128 = CompressorSpec::for_layer(tiny, 2, false, IndexerKeyFormat::FP8, true);
  EXPECT_TRUE(c128.online);
  EXPECT_EQ(c128.ratio, 128);
}

TEST_F(CompressErrors, RollbackAndFork) {
  expect_refused("n", [&] { rollback(pool, a, 7, cache, pages_a); });   // more than its 6 tokens
  expect_refused("n", [&] { rollback(pool, a, -1, cache, pages_a); });
  expect_refused("slot", [&] { rollback(pool, 4, 1, cache, pages_a); });
  const std::vector<std::int32_t> null_page{0};
  expect_refused("page_table", [&] { rollback(pool, a, 3, cache, null_page); });  // entry 0 must be cleared
  CompressorStatePool other_pool(make_spec(4, true, EntryKind::IndexerFP8), 4);
  const int c = pool.allocate();
  expect_refused("prefix_tokens", [&] { fork_prefix(pool, a, c, 4, cache); });  // block boundary, mid-page
  expect_refused("dst_slot", [&] { fork_prefix(pool, a, 4, 0, cache); });  // not allocated
  expect_refused("dst_slot", [&] { fork_prefix(pool, a, b, 0, cache); });       // b already has tokens
  expect_refused("src_slot", [&] { fork_prefix(pool, 0, c, 0, cache); });
  expect_refused("cache", [&] { rollback(other_pool, 1, 0, cache, pages_a); });
  // Valid calls still work afterwards.
  rollback(pool, a, 3, cache, pages_a);
  EXPECT_EQ(pool.tokens(a), 3);
  fork_prefix(pool, a, c, 0, cache);
  EXPECT_EQ(pool.tokens(c), 0);
}

TEST_F(CompressErrors, SingleRequestCapacity) {
  SingleRequestCompressor comp(spec, weights.ape_view(), weights.norm_view(), 10, 8);
  comp.append(rows_a.kv_rows(0, 6), rows_a.score_rows(0, 6));
  const Snapshot before = Snapshot::of(comp.pool(), comp.cache());
  testing::expect_error("kv", [&] { comp.append(rows_a.kv_rows(6, 5), rows_a.score_rows(6, 5)); });  // 11 > 10
  testing::expect_error("score", [&] { comp.append(rows_a.kv_rows(6, 2), rows_a.score_rows(6, 1)); });
  testing::expect_error("n", [&] { comp.rollback(7); });
  testing::expect_error("entry", [&] { comp.cache_slot(1); });  // 6 tokens: entry 0 only
  testing::expect_error("entry", [&] { comp.entry_bytes(-1); });
  EXPECT_TRUE(Snapshot::of(comp.pool(), comp.cache()) == before);
  EXPECT_EQ(comp.tokens(), 6);
}

TEST_F(CompressErrors, SingleRequestConstruction) {
  const TensorView ape = weights.ape_view(), norm = weights.norm_view();
  TensorView bad = ape;
  bad.shape = {spec.ratio - 1, spec.row_width()};
  testing::expect_error("ape", [&] { SingleRequestCompressor(spec, bad, norm, 10, 8); });
  bad = norm;
  bad.device = Device::CUDA;  // the weights are copied from the host
  testing::expect_error("norm", [&] { SingleRequestCompressor(spec, ape, bad, 10, 8); });
  testing::expect_error("capacity_tokens", [&] { SingleRequestCompressor(spec, ape, norm, -1, 8); });
  testing::expect_error("capacity_tokens", [&] { SingleRequestCompressor(spec, ape, norm, spec.max_positions + 1, 8); });
  testing::expect_error("page_size", [&] { SingleRequestCompressor(spec, ape, norm, 10, 6); });
  CompressorSpec bad_spec = spec;
  bad_spec.ratio = 0;
  testing::expect_error("ratio", [&] { SingleRequestCompressor(bad_spec, ape, norm, 10, 8); });
}

TEST_F(CompressErrors, TheValidStepWorksAfterAllRefusals) {
  const Snapshot before = Snapshot::of(pool, cache);
  compress(spec, cw(), batch(), kv_view(), score_view(), pool, cache);
  EXPECT_EQ(pool.tokens(a), 12);
  EXPECT_EQ(pool.tokens(b), 9);
  EXPECT_FALSE(Snapshot::of(pool, cache) == before);
}

}  // namespace
}  // namespace dsv4
