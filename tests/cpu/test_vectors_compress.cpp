// Known-answer vectors (shared/vectors/compress_*.safetensors, an independent float64 numpy
// implementation of SPEC §4–§5): compressed rows, entry bytes, decoded values, positions — in one
// chunk and in random chunkings, with the tolerances of shared/vectors/README.md.
#include <gtest/gtest.h>

#include <string>

#include "compressor_testing.hpp"
#include "dsv4/safetensors.hpp"

namespace dsv4 {
namespace {

using namespace compressor_testing;

class CompressVectors : public ::testing::TestWithParam<const char*> {};

TEST_P(CompressVectors, MatchInOneChunkAndInRandomChunks) {
  const SafetensorsFile file = SafetensorsFile::open(testing::vector_path(GetParam()));
  const auto& meta = file.metadata();
  const ModelConfig model = load_model_config(testing::vector_path(meta.at("config")));
  const std::string mode = meta.at("mode");
  const bool indexer = mode != "attention";
  const CompressorSpec spec =
      CompressorSpec::for_layer(model, std::stoi(meta.at("layer")), indexer,
                                mode == "indexer-fp4" ? IndexerKeyFormat::FP4 : IndexerKeyFormat::FP8,
                                meta.at("online") == "True");
  const Tensor kv = file.read_float("kv", {-1, spec.row_width()});
  const Tensor score = file.read_float("score", kv.shape());
  const Tensor ape = file.read_float("ape", {spec.ratio, spec.row_width()});
  const Tensor norm = file.read_float("norm", {spec.width});
  const Tensor want_compressed = file.read_float("compressed", {-1, spec.width});
  const std::int64_t n = want_compressed.shape()[0];
  const Tensor want_entries = file.read_raw("entries", DType::U8, {n, spec.layout().entry_bytes()});
  const Tensor want_decoded = file.read_float("decoded", {n, spec.width});
  const Tensor want_positions = file.read_int32("positions", {n});
  const std::int64_t T = kv.shape()[0];
  ASSERT_EQ(n, T / spec.ratio);

  Stream s;
  s.tokens = T;
  s.row_width = spec.row_width();
  s.kv.assign(kv.data_as<float>(), kv.data_as<float>() + kv.numel());
  s.score.assign(score.data_as<float>(), score.data_as<float>() + score.numel());
  s.ape.assign(ape.data_as<float>(), ape.data_as<float>() + ape.numel());
  s.norm.assign(norm.data_as<float>(), norm.data_as<float>() + norm.numel());

  std::mt19937_64 rng(testing::fresh_seed());
  const RunResult whole = run_chunks(spec, s, {T}, model.page_size);
  const RunResult chunked = run_chunks(spec, s, random_chunks(rng, T, 2 * spec.ratio + 3), model.page_size);
  EXPECT_EQ(whole.compressed, chunked.compressed);
  EXPECT_EQ(whole.cache, chunked.cache);

  const std::vector<float> want(want_compressed.data_as<float>(), want_compressed.data_as<float>() + want_compressed.numel());
  // SPEC §4 rounds s_p = score + ape to float32; the numpy vectors keep that sum in float64, which
  // moves C_n by a few float32 ulps at most.
  EXPECT_LE(normwise_error(whole.compressed, want), 1e-6);

  // Entries: identical except rare one-step e4m3 / bf16 / e2m1 differences.
  int values = 0, different = 0, max_steps = 0;
  SingleRequestCompressor comp(spec, s.ape_view(), s.norm_view(), T, model.page_size);
  comp.append(s.kv_rows(0, T), s.score_rows(0, T));
  for (std::int64_t e = 0; e < n; ++e) {
    const auto got = comp.entry_bytes(e);
    ASSERT_EQ(got, whole.entries[static_cast<std::size_t>(e)]);
    const EntryDiff d = compare_entry(spec.layout(), got.data(), want_entries.data_as<std::uint8_t>() + e * spec.layout().entry_bytes());
    values += d.values;
    different += d.different;
    max_steps = std::max(max_steps, d.max_steps);
    const std::vector<float> decoded = comp.decoded_entry(e);
    for (int k = 0; k < spec.width; ++k) {
      const float w = want_decoded.data_as<float>()[e * spec.width + k];
      // One e4m3 step is 1/8 relative (1/2 for e2m1 near the grid's low end); most are exact.
      EXPECT_LE(std::fabs(decoded[static_cast<std::size_t>(k)] - w), 0.25f * std::fabs(w) + 1e-3f) << "entry " << e << " value " << k;
    }
    EXPECT_EQ(want_positions.data_as<std::int32_t>()[e], e * spec.ratio);
  }
  std::cout << GetParam() << ": " << different << " of " << values << " encoded values differ (max " << max_steps
            << " step)\n";
  EXPECT_LE(max_steps, 1);
  EXPECT_LE(different, values / 200) << "more than 0.5% of the codes differ";
}

INSTANTIATE_TEST_SUITE_P(Files, CompressVectors,
                         ::testing::Values("compress_c4_attention.safetensors", "compress_c4_indexer_fp8.safetensors",
                                           "compress_c4_indexer_fp4.safetensors", "compress_c128.safetensors",
                                           "compress_c128_online.safetensors"));

}  // namespace
}  // namespace dsv4
