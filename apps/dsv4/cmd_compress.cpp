// apps/dsv4/cmd_compress.cpp — `dsv4 compress`: runs one layer's compressor over kv/score rows from
// a safetensors file, in the given chunking, and writes the compressed rows, the cache entries and
// their decoded values (contract: docs/cli.md).
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cli_common.hpp"
#include "commands.hpp"
#include "dsv4/compressor.hpp"
#include "dsv4/config.hpp"
#include "dsv4/error.hpp"
#include "dsv4/safetensors.hpp"

namespace dsv4::cli {

namespace {

struct CompressOptions {
  std::string config;
  int layer = 0;
  bool indexer = false;
  std::string indexer_format = "fp8";
  bool indexer_format_given = false;
  bool online = false;
  std::string chunks;  // "a,b,..." or empty for one chunk
  std::string in, out;
  std::string device = "cpu";
};

IndexerKeyFormat parse_indexer_format(const CompressOptions& o) {
  require(!o.indexer_format_given || o.indexer, "--indexer-format", "only applies with --indexer");
  if (o.indexer_format == "fp8") return IndexerKeyFormat::FP8;
  if (o.indexer_format == "fp4") return IndexerKeyFormat::FP4;
  throw Error("--indexer-format", "expected fp8 or fp4, got '" + o.indexer_format + "'");
}

int compress_file(const CompressOptions& o) {
  const Device device = parse_device(o.device, "--device");
  require(device == Device::CPU || cuda_backend_built(), "--device",
          "cuda: this build of dsv4 has no CUDA backend (configure with -DDSV4_CUDA=ON)");
  const IndexerKeyFormat format = parse_indexer_format(o);
  const ModelConfig model = load_model_config(o.config);
  const CompressorSpec spec = CompressorSpec::for_layer(model, o.layer, o.indexer, format, o.online);

  require_output_distinct(o.out, {{"--in", o.in}});
  const SafetensorsFile in = SafetensorsFile::open(o.in);
  const Tensor kv = in.read_raw("kv", DType::F32, {-1, spec.row_width()});
  const Tensor score = in.read_raw("score", DType::F32, kv.shape());
  const Tensor ape = in.read_raw("ape", DType::F32, {spec.ratio, spec.row_width()});
  const Tensor norm = in.read_raw("norm", DType::F32, {spec.width});
  const std::int64_t rows = kv.shape()[0];
  const std::vector<std::int64_t> chunks = parse_chunk_sizes(o.chunks, rows, "the input");

  SingleRequestCompressor compressor(spec, ape.view(), norm.view(), rows, model.page_size, device);
  std::vector<float> compressed;
  std::int64_t at = 0;
  for (const std::int64_t n : chunks) {
    const auto appended = compressor.append(row_range(kv, at, n), row_range(score, at, n));
    const float* p = appended.compressed.data_as<const float>();
    compressed.insert(compressed.end(), p, p + appended.compressed.numel());
    at += n;
  }

  const std::int64_t entries = compressor.num_entries();
  const int entry_bytes = spec.layout().entry_bytes();
  std::vector<std::uint8_t> bytes;
  std::vector<float> decoded;
  std::vector<std::int32_t> positions;
  // One copy of the pool to the host (from the GPU when --device cuda), then every entry from it.
  const PagedCache& cache = compressor.cache();
  const std::vector<std::uint8_t> pool = cache.host_bytes();
  const EntryLayout& layout = cache.layout();
  bytes.resize(static_cast<std::size_t>(entries * entry_bytes));
  decoded.resize(static_cast<std::size_t>(entries * spec.width));
  for (std::int64_t e = 0; e < entries; ++e) {
    const std::int64_t slot = compressor.cache_slot(e);
    const std::uint8_t* page = pool.data() + slot / cache.entries_per_page() * cache.page_bytes();
    const int index = static_cast<int>(slot % cache.entries_per_page());
    layout.gather(page, index, cache.entries_per_page(), bytes.data() + e * entry_bytes);
    layout.decode(page, index, cache.entries_per_page(), decoded.data() + e * spec.width);
    positions.push_back(static_cast<std::int32_t>(e * spec.ratio));
  }

  SafetensorsWriter out;
  out.add("compressed", DType::F32, {entries, spec.width}, compressed.data());
  out.add("entries", DType::U8, {entries, entry_bytes}, bytes.data());
  out.add("decoded", DType::F32, {entries, spec.width}, decoded.data());
  out.add("positions", DType::I32, {entries}, positions.data());
  out.set_metadata("config", model.name);
  out.set_metadata("layer", std::to_string(o.layer));
  out.set_metadata("mode", entry_kind_name(spec.output));
  out.set_metadata("online", o.online ? "True" : "False");
  out.set_metadata("chunks", std::to_string(chunks.size()));
  out.write(o.out);
  std::fprintf(stderr, "dsv4 compress: layer %d of %s (ratio %d, %s%s, width %d): %lld rows in %zu chunks -> %lld entries of %d bytes -> %s\n",
               o.layer, model.name.c_str(), spec.ratio, entry_kind_name(spec.output), spec.online ? ", online" : "",
               spec.width, static_cast<long long>(rows), chunks.size(), static_cast<long long>(entries), entry_bytes,
               o.out.c_str());
  return 0;
}

}  // namespace

void add_compress_command(CLI::App& app, Action& run) {
  auto options = std::make_shared<CompressOptions>();
  CLI::App* sub = app.add_subcommand(
      "compress", "Run one layer's KV compressor over kv/score rows (streamed in chunks) and write its cache entries");
  sub->add_option("--config", options->config, "preset (flash, pro, tiny) or path to a config.json")->required();
  sub->add_option("--layer", options->layer, "layer index; its compress ratio must be non-zero")->required();
  sub->add_flag("--indexer", options->indexer, "the indexer's own compressor (width index_head_dim)");
  sub->add_option("--indexer-format", options->indexer_format, "indexer key format: fp8 (132 B) or fp4 (68 B)")
      ->capture_default_str();
  sub->add_flag("--online", options->online, "online (M, S, V) variant (layers without overlap)");
  sub->add_option("--chunks", options->chunks, "feed the rows as consecutive chunks of these sizes, e.g. 64,1,1,7 (sum = T)");
  sub->add_option("--in", options->in, "input .safetensors: kv, score [T, coff*c] F32 (score without ape), ape, norm")
      ->required();
  sub->add_option("--out", options->out, "output .safetensors (written atomically)")->required();
  sub->add_option("--device", options->device, "cpu or cuda (the CUDA backend, when built and a GPU is present)")->capture_default_str();
  sub->callback([&run, options, sub] {
    options->indexer_format_given = sub->count("--indexer-format") > 0;
    run = [options] { return compress_file(*options); };
  });
}

}  // namespace dsv4::cli
