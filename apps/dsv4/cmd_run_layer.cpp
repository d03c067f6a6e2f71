// apps/dsv4/cmd_run_layer.cpp — `dsv4 run-layer`: one attention layer over an input sequence,
// streamed in any chunking (contract: docs/cli.md).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cli_common.hpp"
#include "commands.hpp"
#include "dsv4/config.hpp"
#include "dsv4/error.hpp"
#include "dsv4/layer.hpp"
#include "dsv4/safetensors.hpp"
#include "dsv4/weights.hpp"

namespace dsv4::cli {

namespace {

struct RunLayerOptions {
  std::string config;
  int layer = 0;
  std::string weights, in, out;
  std::string chunks;  // "a,b,..." or empty for one chunk
  std::string device = "cpu";
  int threads = 0;     // 0: every hardware thread
};

int run_layer(const RunLayerOptions& o) {
  const Device device = parse_device(o.device, "--device");
  require(device == Device::CPU, "--device", "run-layer runs the CPU reference; a CUDA layer is not built yet");
  require(o.threads >= 0, "--threads", "must be non-negative");
  const ModelConfig model = load_model_config(o.config);
  const LayerConfig lc = layer_config(model, o.layer);

  // Everything is read and checked before anything runs; the output is written atomically at the end.
  require_output_distinct(o.out, {{"--weights", o.weights}, {"--in", o.in}});
  LayerWeights weights = load_layer_weights(o.weights, model, o.layer);
  const SafetensorsFile in = SafetensorsFile::open(o.in);
  const TensorInfo& x_info = in.info("x");
  require(x_info.dtype == DType::F32 || x_info.dtype == DType::BF16, "x",
          "expected dtype F32 or BF16 in " + o.in + ", got " + std::string(dtype_name(x_info.dtype)));
  const Tensor x = in.read_raw("x", x_info.dtype, {-1, model.hidden_size});
  const std::int64_t T = x.shape()[0];
  require(T <= model.max_positions, "x", "more rows than max_position_embeddings");
  const std::vector<std::int64_t> chunks = parse_chunk_sizes(o.chunks, T, "x");

  LayerOptions options;
  options.max_tokens = std::max<std::int64_t>(T, 1);
  options.threads = o.threads > 0 ? o.threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  AttentionLayer layer(model, std::move(weights), options);
  const bool csa = layer_has_indexer(lc);
  const int request = layer.open_request();

  Tensor y = Tensor::empty(DType::F32, {T, model.hidden_size});
  Tensor attn = Tensor::empty(DType::F32, {T, model.num_heads, model.head_dim});
  Tensor topk = Tensor::empty(DType::I32, {csa ? T : 0, model.index_topk});
  std::int64_t at = 0;
  for (const std::int64_t n : chunks) {
    layer.forward(request, row_range(x, at, n),
                  {row_range(y, at, n), row_range(attn, at, n), csa ? row_range(topk, at, n) : TensorView{}});
    at += n;
  }

  SafetensorsWriter out;
  out.add("y", y);
  out.add("attn", attn);
  if (csa) out.add("topk", topk);
  out.set_metadata("config", model.name);
  out.set_metadata("layer", std::to_string(o.layer));
  out.set_metadata("compress_ratio", std::to_string(lc.ratio));
  out.write(o.out);
  std::fprintf(stderr, "dsv4 run-layer: layer %d of %s (compress ratio %d): %lld tokens in %zu chunks -> %s\n",
               o.layer, model.name.c_str(), lc.ratio, static_cast<long long>(T), chunks.size(), o.out.c_str());
  return 0;
}

}  // namespace

void add_run_layer_command(CLI::App& app, Action& run) {
  auto options = std::make_shared<RunLayerOptions>();
  CLI::App* sub = app.add_subcommand(
      "run-layer", "Run one attention layer over x [T, D] (streamed in chunks); write y, attn and (CSA) topk");
  sub->add_option("--config", options->config, "preset (flash, pro, tiny) or path to a config.json")->required();
  sub->add_option("--layer", options->layer, "layer index")->required();
  sub->add_option("--weights", options->weights, "the layer's weights (.safetensors, checkpoint names)")->required();
  sub->add_option("--in", options->in, "input .safetensors holding x [T, D] (F32 or BF16), positions 0..T-1")
      ->required();
  sub->add_option("--out", options->out, "output .safetensors: y, attn, topk (written atomically)")->required();
  sub->add_option("--chunks", options->chunks, "feed x as consecutive chunks of these sizes, e.g. 64,1,1,7 (sum = T)");
  sub->add_option("--device", options->device, "cpu (the CUDA layer is not built yet)")->capture_default_str();
  sub->add_option("--threads", options->threads, "CPU threads (0: all); results do not depend on it")
      ->capture_default_str();
  sub->callback([&run, options] { run = [options] { return run_layer(*options); }; });
}

}  // namespace dsv4::cli
