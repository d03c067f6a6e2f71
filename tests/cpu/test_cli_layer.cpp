// `dsv4 make-weights`, `dsv4 run-layer` and `dsv4 demo` as a user runs them: contracts of
// docs/cli.md, bit-identical files for any --chunks, and errors that exit non-zero without writing.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "dsv4/config.hpp"
#include "dsv4/formats.hpp"
#include "dsv4/layer.hpp"
#include "dsv4/safetensors.hpp"
#include "testing/testing.hpp"

namespace dsv4 {
namespace {

namespace fs = std::filesystem;

std::string cli() { return testing::cli_path(); }

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// x [T, D] of a preset (tiny unless named), N(0, 1), as F32 or BF16.
std::string write_input(const std::string& dir, std::mt19937_64& rng, std::int64_t T, DType dtype,
                        const std::string& config = "tiny") {
  const int D = preset_config(config).hidden_size;
  std::vector<float> x = testing::random_normal(rng, static_cast<std::size_t>(T * D));
  SafetensorsWriter w;
  if (dtype == DType::F32) {
    w.add("x", DType::F32, {T, D}, x.data());
  } else {
    std::vector<std::uint16_t> bits(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) bits[i] = bf16_bits_from_float(x[i]);
    w.add("x", DType::BF16, {T, D}, bits.data());
  }
  const std::string path = dir + "/x.safetensors";
  w.write(path);
  return path;
}

std::string make_weights(const std::string& dir, int layer, std::uint64_t seed, const std::string& config = "tiny") {
  const std::string path = dir + "/w" + std::to_string(layer) + ".safetensors";
  std::string out;
  EXPECT_EQ(testing::run_command(cli() + " make-weights --config " + config + " --layer " + std::to_string(layer) +
                                     " --seed " +
                                     std::to_string(seed) + " --out " + path,
                                 &out),
            0)
      << out;
  return path;
}

int run_layer(const std::string& args, std::string* output = nullptr, const std::string& config = "tiny") {
  std::string out;
  const int rc = testing::run_command(cli() + " run-layer --config " + config + " " + args, &out);
  if (output) *output = out;
  return rc;
}

std::string random_chunks(std::mt19937_64& rng, std::int64_t T) {
  std::string text;
  for (std::int64_t left = T; left > 0;) {
    const std::int64_t n = std::min<std::int64_t>(left, rng() % 4 == 0 ? 1 + rng() % 60 : 1);
    if (!text.empty()) text += ',';
    text += std::to_string(n);
    left -= n;
  }
  return text;
}

// The published Flash sizes (D 4096, 64 heads, K 512) on a CSA layer, a few tokens: the contract's
// shapes, and the same bytes in one chunk or three.
TEST(CliRunLayer, FlashCsaLayerFollowsTheContract) {
  std::mt19937_64 rng(testing::fresh_seed());
  const std::string dir = testing::temp_dir();
  const ModelConfig flash = preset_config("flash");
  const int layer = 2;
  ASSERT_EQ(layer_config(flash, layer).ratio, 4);
  const std::int64_t T = 9;
  const std::string x = write_input(dir, rng, T, DType::BF16, "flash");
  const std::string w = make_weights(dir, layer, rng(), "flash");
  const std::string base = "--layer " + std::to_string(layer) + " --weights " + w + " --in " + x;
  std::string log;
  ASSERT_EQ(run_layer(base + " --out " + dir + "/one.safetensors", &log, "flash"), 0) << log;
  ASSERT_EQ(run_layer(base + " --chunks 4,1,4 --out " + dir + "/three.safetensors", &log, "flash"), 0) << log;
  const SafetensorsFile one = SafetensorsFile::open(dir + "/one.safetensors");
  const SafetensorsFile three = SafetensorsFile::open(dir + "/three.safetensors");
  EXPECT_EQ(one.info("y").shape, (Shape{T, flash.hidden_size}));
  EXPECT_EQ(one.info("attn").shape, (Shape{T, flash.num_heads, flash.head_dim}));
  EXPECT_EQ(one.info("topk").shape, (Shape{T, flash.index_topk}));
  for (const char* name : {"y", "attn", "topk"}) {
    const auto a = one.info(name).bytes, b = three.info(name).bytes;
    ASSERT_EQ(a.size(), b.size()) << name;
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin())) << name << " differs between chunkings";
  }
  const Tensor y = one.read_float("y");
  double sum_squares = 0;
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    ASSERT_TRUE(std::isfinite(y.data_as<float>()[i]));
    sum_squares += static_cast<double>(y.data_as<float>()[i]) * y.data_as<float>()[i];
  }
  EXPECT_GT(sum_squares, 0.0);
}

TEST(CliRunLayer, OutputsFollowTheContractAndAreIdenticalForAnyChunks) {
  std::mt19937_64 rng(testing::fresh_seed());
  const std::string dir = testing::temp_dir();
  const ModelConfig tiny = preset_config("tiny");
  const std::int64_t T = 140;
  for (int layer : {0, 1, 2}) {
    const std::string weights = make_weights(dir, layer, rng());
    const std::string x = write_input(dir, rng, T, layer == 1 ? DType::BF16 : DType::F32);
    const std::string whole = dir + "/whole.safetensors", parts = dir + "/parts.safetensors";
    std::string out;
    ASSERT_EQ(run_layer("--layer " + std::to_string(layer) + " --weights " + weights + " --in " + x + " --out " + whole,
                        &out),
              0)
        << out;
    const std::string chunks = random_chunks(rng, T);
    ASSERT_EQ(run_layer("--layer " + std::to_string(layer) + " --weights " + weights + " --in " + x + " --out " + parts +
                            " --chunks " + chunks + " --threads 1",
                        &out),
              0)
        << out;
    EXPECT_EQ(read_bytes(whole), read_bytes(parts)) << "layer " << layer << ", --chunks " << chunks;

    const SafetensorsFile y = SafetensorsFile::open(whole);
    EXPECT_EQ(y.info("y").dtype, DType::F32);
    EXPECT_EQ(y.info("y").shape, (Shape{T, tiny.hidden_size}));
    EXPECT_EQ(y.info("attn").dtype, DType::F32);
    EXPECT_EQ(y.info("attn").shape, (Shape{T, tiny.num_heads, tiny.head_dim}));
    EXPECT_EQ(y.contains("topk"), layer == 1);
    if (layer != 1) continue;
    const Tensor topk = y.read_int32("topk", {T, tiny.index_topk});
    for (std::int64_t t = 0; t < T; ++t) {
      const std::int32_t* row = topk.data_as<std::int32_t>() + t * tiny.index_topk;
      const std::int64_t count = std::min<std::int64_t>((t + 1) / 4, tiny.index_topk);
      for (int k = 0; k < tiny.index_topk; ++k) {
        if (k < count) {
          EXPECT_TRUE(row[k] >= 0 && (k == 0 || row[k] > row[k - 1])) << "t=" << t;
        } else {
          EXPECT_EQ(row[k], -1) << "t=" << t;
        }
      }
    }
  }
}

TEST(CliRunLayer, KnownAnswerVectorThroughTheCommandLine) {
  const std::string dir = testing::temp_dir(), out_path = dir + "/y.safetensors";
  const std::string vectors = testing::vector_path("layer_small_2.safetensors");
  std::string out;
  ASSERT_EQ(testing::run_command(cli() + " run-layer --config " + testing::vector_path("small_config.json") +
                                     " --layer 2 --weights " + vectors + " --in " + vectors + " --out " + out_path +
                                     " --chunks 100,1,1,198",
                                 &out),
            0)
      << out;
  const SafetensorsFile got = SafetensorsFile::open(out_path), want = SafetensorsFile::open(vectors);
  const auto values = [](const Tensor& t) { return std::vector<float>(t.data_as<float>(), t.data_as<float>() + t.numel()); };
  EXPECT_LE(testing::relative_l2(values(got.read_float("y")), values(want.read_float("expected.y"))), 1e-2);
  EXPECT_LE(testing::relative_l2(values(got.read_float("attn")), values(want.read_float("expected.attn"))), 1e-2);
}

TEST(CliRunLayer, ErrorsExitNonZeroWithoutWritingTheOutput) {
  std::mt19937_64 rng(testing::fresh_seed());
  const std::string dir = testing::temp_dir(), out = dir + "/out.safetensors";
  const std::string w1 = make_weights(dir, 1, rng());
  const std::string x = write_input(dir, rng, 20, DType::F32);
  const std::string garbage = dir + "/garbage.safetensors";
  std::ofstream(garbage) << "not a safetensors file";
  SafetensorsWriter no_x;
  const float v = 1.0f;
  no_x.add("y", DType::F32, {1}, &v);
  no_x.write(dir + "/no_x.safetensors");

  const struct {
    std::string args, message;
  } cases[] = {
      {"--layer 1 --weights " + garbage + " --in " + x, "garbage.safetensors"},
      {"--layer 1 --weights " + w1 + " --in " + garbage, "garbage.safetensors"},
      {"--layer 2 --weights " + w1 + " --in " + x, "layers.2.attn.wq_a.weight"},  // wrong layer
      {"--layer 3 --weights " + w1 + " --in " + x, "layers.3.attn.wq_a.weight"},
      {"--layer 9 --weights " + w1 + " --in " + x, "layer"},
      {"--layer 1 --weights " + w1 + " --in " + x + " --chunks 10,5", "add up to 15"},
      {"--layer 1 --weights " + w1 + " --in " + x + " --chunks 10,5,6", "add up to 21"},
      {"--layer 1 --weights " + w1 + " --in " + x + " --chunks 10,x,10", "--chunks"},
      {"--layer 1 --weights " + w1 + " --in " + x + " --chunks 10,-2,12", "--chunks"},
      {"--layer 1 --weights " + w1 + " --in " + dir + "/no_x.safetensors", "x"},
      {"--layer 1 --weights " + w1 + " --in " + x + " --device cuda", "--device"},
      {"--layer 1 --weights " + w1 + " --in " + dir + "/missing.safetensors", "missing.safetensors"},
  };
  for (const auto& c : cases) {
    std::string output;
    EXPECT_NE(run_layer(c.args + " --out " + out, &output), 0) << c.args;
    EXPECT_NE(output.find(c.message), std::string::npos) << c.args << "\n" << output;
    EXPECT_FALSE(fs::exists(out)) << c.args;
  }
  // A file of the wrong width for the config.
  std::string output;
  EXPECT_NE(testing::run_command(cli() + " run-layer --config " + testing::vector_path("small_config.json") +
                                     " --layer 1 --weights " + w1 + " --in " + x + " --out " + out,
                                 &output),
            0);
  EXPECT_FALSE(fs::exists(out));
}

// Damaged files (cut short in the data or in the header), a weight of the wrong dtype, a number
// too large for --chunks, and outputs that must not be replaced: a read-only file (unchanged
// afterwards, for every subcommand) and a directory. Each exits non-zero with a message naming the
// culprit and leaves no output or temporary file.
TEST(CliRunLayer, HostileFilesAndOutputsExitNonZeroWithoutWriting) {
  std::mt19937_64 rng(testing::fresh_seed());
  const std::string dir = testing::temp_dir(), out = dir + "/out.safetensors";
  const std::string w1 = make_weights(dir, 1, rng());
  const std::string x = write_input(dir, rng, 12, DType::F32);
  const std::string weights = read_bytes(w1), input = read_bytes(x);
  const auto write_file = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
    return dir + "/" + name;
  };
  std::uint64_t header_length = 0;
  std::copy_n(weights.data(), 8, reinterpret_cast<char*>(&header_length));
  const std::string cut_data = write_file("cut_data.safetensors", weights.substr(0, weights.size() - 1 - rng() % 1000));
  const std::string cut_header = write_file("cut_header.safetensors", weights.substr(0, 8 + header_length / 2));
  const std::string cut_input = write_file("cut_input.safetensors", input.substr(0, input.size() - 4));
  // attn_sink declared I32 instead of F32: same size, same offsets.
  std::string retyped = weights;
  const std::size_t sink = retyped.find("\"layers.1.attn.attn_sink\":{\"dtype\":\"F32\"");
  ASSERT_NE(sink, std::string::npos);
  retyped.replace(retyped.find("F32", sink), 3, "I32");
  const std::string wrong_dtype = write_file("wrong_dtype.safetensors", retyped);
  const std::string read_only = write_file("read_only.safetensors", "keep me");
  ASSERT_EQ(::chmod(read_only.c_str(), 0444), 0);
  fs::create_directory(dir + "/a_directory");

  const std::string layer = "--layer 1 --weights ";
  const struct {
    std::string command, message, output;
  } cases[] = {
      {"run-layer --config tiny " + layer + cut_data + " --in " + x, "cut_data.safetensors", out},
      {"run-layer --config tiny " + layer + cut_header + " --in " + x, "cut_header.safetensors", out},
      {"run-layer --config tiny " + layer + w1 + " --in " + cut_input, "cut_input.safetensors", out},
      {"run-layer --config tiny " + layer + wrong_dtype + " --in " + x, "layers.1.attn.attn_sink", out},
      {"run-layer --config tiny " + layer + w1 + " --in " + x + " --chunks 99999999999999999999", "--chunks", out},
      {"run-layer --config tiny " + layer + w1 + " --in " + x, "read-only", read_only},
      {"run-layer --config tiny " + layer + w1 + " --in " + x, "a_directory", dir + "/a_directory"},
      {"make-weights --config tiny --layer 1", "read-only", read_only},
      {"compress --config tiny --layer 1 --in " + cut_input, "cut_input.safetensors", out},
      // --out naming an input: refused before anything is read or written (the input stays intact).
      {"run-layer --config tiny " + layer + w1 + " --in " + x, "same file as --in", x},
      {"run-layer --config tiny " + layer + w1 + " --in " + x, "same file as --weights", w1},
      {"compress --config tiny --layer 1 --in " + cut_input, "same file as --in", cut_input},
  };
  for (const auto& c : cases) {
    std::string output;
    EXPECT_NE(testing::run_command(cli() + " " + c.command + " --out " + c.output, &output), 0) << c.command;
    EXPECT_NE(output.find(c.message), std::string::npos) << c.command << "\n" << output;
    EXPECT_FALSE(fs::exists(out)) << c.command;
  }
  EXPECT_EQ(read_bytes(read_only), "keep me");
  EXPECT_EQ(read_bytes(x), input);
  EXPECT_EQ(read_bytes(cut_input), input.substr(0, input.size() - 4));
  EXPECT_EQ(read_bytes(w1), weights);
  EXPECT_TRUE(fs::is_directory(dir + "/a_directory"));
  for (const auto& entry : fs::directory_iterator(dir))
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
}

TEST(CliMakeWeights, ErrorsExitNonZeroWithoutWritingTheOutput) {
  const std::string dir = testing::temp_dir(), out = dir + "/w.safetensors";
  for (const std::string args : {"--config tiny --layer 4", "--config tiny --layer -1", "--config nonesuch --layer 0",
                                 "--config tiny --layer 0 --seed banana", "--config tiny --layer 0 --seed -1"}) {
    std::string output;
    EXPECT_NE(testing::run_command(cli() + " make-weights " + args + " --out " + out, &output), 0) << args;
    EXPECT_FALSE(fs::exists(out)) << args;
  }
  std::string output;
  EXPECT_NE(testing::run_command(cli() + " make-weights --config tiny --layer 0 --out " + dir + "/no/such/dir/w.safetensors",
                                 &output),
            0);
}

TEST(CliDemo, ShortRunPassesItsSelfCheck) {
  std::string output;
  ASSERT_EQ(testing::run_command(cli() + " demo --prompt-tokens 300 --decode-tokens 6 --chunk 64 --threads 2", &output), 0)
      << output;
  EXPECT_NE(output.find("PASS"), std::string::npos) << output;
  for (const char* kind : {"SWA", "CSA", "HCA"}) EXPECT_NE(output.find(kind), std::string::npos) << output;
  EXPECT_NE(output.find("179.00"), std::string::npos) << "CSA: 584/4 + 132/4 bytes per token\n" << output;
  EXPECT_NE(testing::run_command(cli() + " demo --chunk 0", &output), 0);
  EXPECT_NE(output.find("argument '--chunk'"), std::string::npos) << output;
  EXPECT_NE(testing::run_command(cli() + " demo --device cuda", &output), 0);
  EXPECT_NE(output.find("argument '--device'"), std::string::npos) << output;
  // Past max_position_embeddings, and prompt + decode overflowing int64: refused naming the option that
  // goes too far, before anything runs.
  EXPECT_EQ(testing::run_command(cli() + " demo --prompt-tokens 9223372036854775807 --decode-tokens 10", &output), 1);
  EXPECT_NE(output.find("argument '--prompt-tokens'"), std::string::npos) << output;
  EXPECT_EQ(testing::run_command(cli() + " demo --prompt-tokens 64 --decode-tokens 9223372036854775807", &output), 1);
  EXPECT_NE(output.find("argument '--decode-tokens'"), std::string::npos) << output;
  EXPECT_NE(testing::run_command(cli() + " demo --seed -1", &output), 0);  // would wrap to 2^64 - 1
  EXPECT_NE(output.find("non-negative"), std::string::npos) << output;
}

}  // namespace
}  // namespace dsv4
