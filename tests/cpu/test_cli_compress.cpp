// `dsv4 compress` (docs/cli.md): outputs equal the library's bytes for the tiny and flash presets
// and a config.json path, in any chunking; every error exits non-zero and leaves no output file.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "compressor_testing.hpp"
#include "dsv4/safetensors.hpp"

namespace dsv4 {
namespace {

using namespace compressor_testing;

std::string quoted(const std::string& s) { return "'" + s + "'"; }

// Writes kv, score (F32 [T, coff·c]), ape, norm of `s` to `path`.
void write_input(const Stream& s, const std::string& path, DType kv_dtype = DType::F32) {
  SafetensorsWriter w;
  const std::int64_t width = s.row_width;
  if (kv_dtype == DType::F32) {
    w.add("kv", DType::F32, {s.tokens, width}, s.kv.data());
  } else {
    const std::vector<double> wide(s.kv.begin(), s.kv.end());
    w.add("kv", DType::F64, {s.tokens, width}, wide.data());
  }
  w.add("score", DType::F32, {s.tokens, width}, s.score.data());
  w.add("ape", DType::F32, {static_cast<std::int64_t>(s.ape.size()) / width, width}, s.ape.data());
  w.add("norm", DType::F32, {static_cast<std::int64_t>(s.norm.size())}, s.norm.data());
  w.write(path);
}

int run_cli(const std::string& args, std::string* output = nullptr) {
  std::string text;
  const int rc = testing::run_command(quoted(testing::cli_path()) + " compress " + args, &text);
  if (output) *output = text;
  return rc;
}

struct CliCase {
  const char* name;
  const char* config;  // preset or file in shared/vectors
  int layer;
  const char* flags;
  bool indexer;
  IndexerKeyFormat format;
  bool online;
};

class CliCompress : public ::testing::TestWithParam<CliCase> {};

TEST_P(CliCompress, OutputsEqualTheLibraryInEveryChunking) {
  const CliCase& cc = GetParam();
  const std::string config = std::string(cc.config).find(".json") != std::string::npos ? testing::vector_path(cc.config) : cc.config;
  const ModelConfig model = load_model_config(config);
  const CompressorSpec spec = CompressorSpec::for_layer(model, cc.layer, cc.indexer, cc.format, cc.online);
  std::mt19937_64 rng(testing::fresh_seed());
  const Stream s = random_stream(rng, spec, 2 * spec.ratio + 3);
  const std::string dir = testing::temp_dir();
  write_input(s, dir + "/in.safetensors");

  SingleRequestCompressor lib(spec, s.ape_view(), s.norm_view(), s.tokens, model.page_size);
  const auto appended = lib.append(s.kv_rows(0, s.tokens), s.score_rows(0, s.tokens));
  const std::int64_t n = lib.num_entries();

  const std::vector<std::int64_t> chunks = random_chunks(rng, s.tokens, spec.ratio + 2);
  std::string chunk_list;
  for (std::int64_t c : chunks) {
    if (!chunk_list.empty()) chunk_list += ',';
    chunk_list += std::to_string(c);
  }
  for (const std::string& chunk_arg : {std::string(), " --chunks " + chunk_list}) {
    const std::string out = dir + "/out.safetensors";
    std::filesystem::remove(out);
    std::string log;
    ASSERT_EQ(run_cli("--config " + quoted(config) + " --layer " + std::to_string(cc.layer) + " " + cc.flags + " --in " +
                          quoted(dir + "/in.safetensors") + " --out " + quoted(out) + chunk_arg,
                      &log),
              0)
        << log;
    const SafetensorsFile f = SafetensorsFile::open(out);
    const Tensor compressed = f.read_raw("compressed", DType::F32, {n, spec.width});
    const Tensor entries = f.read_raw("entries", DType::U8, {n, spec.layout().entry_bytes()});
    const Tensor decoded = f.read_raw("decoded", DType::F32, {n, spec.width});
    const Tensor positions = f.read_raw("positions", DType::I32, {n});
    EXPECT_EQ(0, std::memcmp(compressed.data(), appended.compressed.data(), compressed.nbytes()));
    for (std::int64_t e = 0; e < n; ++e) {
      const auto want = lib.entry_bytes(e);
      EXPECT_EQ(0, std::memcmp(entries.data_as<std::uint8_t>() + e * spec.layout().entry_bytes(), want.data(), want.size())) << e;
      const auto want_decoded = lib.decoded_entry(e);
      EXPECT_EQ(0, std::memcmp(decoded.data_as<float>() + e * spec.width, want_decoded.data(), sizeof(float) * want_decoded.size())) << e;
      EXPECT_EQ(positions.data_as<std::int32_t>()[e], e * spec.ratio);
    }
    EXPECT_EQ(f.metadata().at("layer"), std::to_string(cc.layer));
    EXPECT_EQ(f.metadata().at("mode"), entry_kind_name(spec.output));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Configs, CliCompress,
    ::testing::Values(CliCase{"TinyC4", "tiny", 1, "", false, IndexerKeyFormat::FP8, false},
                      CliCase{"TinyC4IndexerFP8", "tiny", 1, "--indexer", true, IndexerKeyFormat::FP8, false},
                      CliCase{"TinyC4IndexerFP4", "tiny", 3, "--indexer --indexer-format fp4", true, IndexerKeyFormat::FP4, false},
                      CliCase{"TinyC128Online", "tiny", 2, "--online", false, IndexerKeyFormat::FP8, true},
                      CliCase{"FlashC4", "flash", 2, "--device cpu", false, IndexerKeyFormat::FP8, false},
                      CliCase{"FlashC128", "flash", 3, "", false, IndexerKeyFormat::FP8, false},
                      CliCase{"FlashConfigJson", "flash_config.json", 4, "--indexer --indexer-format fp8", true, IndexerKeyFormat::FP8, false}),
    [](const ::testing::TestParamInfo<CliCase>& param) { return std::string(param.param.name); });

// The known-answer vector through the CLI and a real-style config.json.
TEST(CliCompressVectors, FlashC4AttentionEntriesMatchTheVectorFile) {
  const std::string dir = testing::temp_dir();
  const std::string vec = testing::vector_path("compress_c4_attention.safetensors");
  std::string log;
  ASSERT_EQ(run_cli("--config " + quoted(testing::vector_path("flash_config.json")) + " --layer 2 --in " + quoted(vec) +
                        " --out " + quoted(dir + "/out.safetensors") + " --chunks 5,1,1,60",
                    &log),
            0)
      << log;
  const SafetensorsFile got = SafetensorsFile::open(dir + "/out.safetensors");
  const SafetensorsFile want = SafetensorsFile::open(vec);
  const Tensor a = got.read_raw("decoded", DType::F32, {16, 512});
  const Tensor b = want.read_raw("decoded", DType::F32, {16, 512});
  EXPECT_LE(testing::relative_l2(std::vector<float>(a.data_as<float>(), a.data_as<float>() + a.numel()),
                                 std::vector<float>(b.data_as<float>(), b.data_as<float>() + b.numel())),
            1e-3);
}

TEST(CliCompressErrors, ExitNonZeroAndWriteNothing) {
  const ModelConfig tiny = preset_config("tiny");
  const CompressorSpec spec = CompressorSpec::for_layer(tiny, 1);
  std::mt19937_64 rng(testing::fresh_seed());
  const Stream s = random_stream(rng, spec, 13);
  const std::string dir = testing::temp_dir();
  const std::string in = quoted(dir + "/in.safetensors");
  write_input(s, dir + "/in.safetensors");
  write_input(s, dir + "/f64.safetensors", DType::F64);
  Stream narrow = s;  // kv/score one channel short of coff·c
  narrow.row_width = spec.row_width() - 1;
  narrow.kv.resize(static_cast<std::size_t>(13 * narrow.row_width));
  narrow.score.resize(narrow.kv.size());
  narrow.ape.resize(static_cast<std::size_t>(4 * narrow.row_width));
  write_input(narrow, dir + "/narrow.safetensors");
  {
    SafetensorsWriter w;  // no score
    w.add("kv", DType::F32, {13, spec.row_width()}, s.kv.data());
    w.write(dir + "/missing.safetensors");
  }
  const std::string out = dir + "/out.safetensors";
  const std::string ok = " --out " + quoted(out);
  // Each with the argument its message must name.
  std::vector<std::pair<std::string, std::string>> bad = {
      {"--config tiny --layer 0 --in " + in + ok, "argument 'layer'"},       // ratio-0 layer
      {"--config tiny --layer 9 --in " + in + ok, "argument 'layer'"},       // no such layer
      {"--config tiny --layer 1 --online --in " + in + ok, "argument 'online'"},  // online needs no overlap
      {"--config nosuch --layer 1 --in " + in + ok, "argument 'config'"},    // unknown preset
      {"--config tiny --layer 1 --chunks 5,5 --in " + in + ok, "argument '--chunks'"},  // sum ≠ T
      {"--config tiny --layer 1 --chunks 5,x,8 --in " + in + ok, "argument '--chunks'"},  // not a number
      {"--config tiny --layer 1 --chunks 14,-1 --in " + in + ok, "argument '--chunks'"},  // negative
      {"--config tiny --layer 1 --indexer-format fp4 --in " + in + ok, "argument '--indexer-format'"},
      {"--config tiny --layer 1 --indexer --indexer-format fp6 --in " + in + ok, "argument '--indexer-format'"},
      {"--config tiny --layer 1 --device tpu --in " + in + ok, "argument '--device'"},
      {"--config tiny --layer 1 --in " + quoted(dir + "/f64.safetensors") + ok, "argument 'kv'"},     // not F32
      {"--config tiny --layer 1 --in " + quoted(dir + "/narrow.safetensors") + ok, "argument 'kv'"},  // wrong width
      {"--config tiny --layer 1 --in " + quoted(dir + "/missing.safetensors") + ok, "argument 'score'"},
      {"--config tiny --layer 1 --in " + quoted(dir + "/none.safetensors") + ok, "none.safetensors"},  // no file
      {"--config tiny --layer 1 --indexer --in " + in + ok, "argument 'kv'"},  // attention-width rows for the indexer
      {"--config tiny --layer 1 --in " + in, "--out"},                       // no --out
  };
  // Without the CUDA backend, --device cuda is refused up front; with it, the run may succeed.
  if (!cuda_backend_built()) bad.push_back({"--config tiny --layer 1 --device cuda --in " + in + ok, "argument '--device'"});
  for (const auto& [args, message] : bad) {
    std::string log;
    EXPECT_NE(run_cli(args, &log), 0) << args << "\n" << log;
    EXPECT_NE(log.find(message), std::string::npos) << args << "\n" << log;
    EXPECT_FALSE(std::filesystem::exists(out)) << args;
  }
  // An output directory that does not exist: an error, and no stray temporary file.
  std::string log;
  EXPECT_NE(run_cli("--config tiny --layer 1 --in " + in + " --out " + quoted(dir + "/no/such/dir/out.safetensors"), &log), 0);
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 4u) << "only the inputs remain";
}

}  // namespace
}  // namespace dsv4
