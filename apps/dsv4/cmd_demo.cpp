// apps/dsv4/cmd_demo.cpp — `dsv4 demo`, the main job: a model with random weights and one layer of
// each kind (SWA, CSA, HCA) streams a long prompt in chunks, then decodes token by token; it reports
// what the compressed caches cost per token against a dense bf16 MQA cache and DeepSeek-V3.2, how
// fast each layer kind ran, and checks the streamed result against a one-shot recomputation.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "commands.hpp"
#include "dsv4/config.hpp"
#include "dsv4/error.hpp"
#include "dsv4/layer.hpp"
#include "dsv4/norms.hpp"
#include "dsv4/weights.hpp"

namespace dsv4::cli {

namespace {

// Bytes per token of the caches the demo compares against (shared/ANCHORS.md).
constexpr double kDenseMqaBytes = 2.0 * 512;         // one 512-wide bf16 latent per token
constexpr double kV32Bytes = 656.0 + 132.0;          // DeepSeek-V3.2: FP8 MLA entry + FP8 indexer key

struct DemoOptions {
  std::string config = "tiny";
  std::int64_t prompt_tokens = 4096;
  std::int64_t decode_tokens = 64;
  std::int64_t chunk = 512;
  std::string device = "cpu";
  std::uint64_t seed = 1;
  int threads = 0;  // 0: every hardware thread
};

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One layer of the demo stack and what it measured.
struct StackLayer {
  std::string kind;  // "SWA", "CSA", "HCA"
  int index = 0;     // layer index in the config
  std::unique_ptr<AttentionLayer> layer;
  int request = 0;
  double prefill_seconds = 0, decode_seconds = 0;
  std::vector<float> y;  // [tokens, D]: every output, for the self-check
};

// The first layer of each kind in the config.
std::vector<StackLayer> pick_layers(const ModelConfig& model) {
  std::vector<StackLayer> picked;
  const auto find = [&](const char* kind, auto predicate) {
    for (int i = 0; i < model.num_layers(); ++i) {
      if (predicate(layer_config(model, i))) {
        StackLayer s;
        s.kind = kind;
        s.index = i;
        picked.push_back(std::move(s));
        return;
      }
    }
    std::fprintf(stdout, "note: %s has no %s layer; it is left out\n", model.name.c_str(), kind);
  };
  find("SWA", [](const LayerConfig& l) { return l.ratio == 0; });
  find("CSA", [](const LayerConfig& l) { return layer_has_indexer(l); });
  find("HCA", [](const LayerConfig& l) { return l.ratio > 0 && !layer_has_indexer(l); });
  return picked;
}

// A progress bar on stderr, redrawn at most ten times a second.
class Progress {
 public:
  explicit Progress(std::int64_t total) : total_(total), start_(Clock::now()) {}
  void update(const char* phase, std::int64_t done, bool force = false) {
    const double now = seconds_since(start_);
    if (!force && now - last_draw_ < 0.1 && done < total_) return;
    last_draw_ = now;
    constexpr int kWidth = 32;
    const int filled = total_ > 0 ? static_cast<int>(kWidth * done / total_) : kWidth;
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r  %-10s [%s] %lld/%lld tokens  %.1f s ", phase, bar.c_str(), static_cast<long long>(done),
                 static_cast<long long>(total_), now);
    std::fflush(stderr);
  }
  void finish() { std::fprintf(stderr, "\n"); }

 private:
  std::int64_t total_;
  Clock::time_point start_;
  double last_draw_ = -1;
};

// x = RMSNorm(h) without a weight, per row: the layers' normalized input.
std::vector<float> normalized(const std::vector<float>& h, std::int64_t rows, int width, double eps) {
  std::vector<float> x(h.size());
  for (std::int64_t t = 0; t < rows; ++t) rms_norm(h.data() + t * width, nullptr, width, eps, x.data() + t * width);
  return x;
}

// Runs rows of the residual stream `h` [rows, D] through the stack in place (h += layer(norm(h))),
// appending each layer's outputs to its record.
void run_stack(std::vector<StackLayer>& stack, const ModelConfig& model, std::vector<float>& h, std::int64_t rows,
               bool decode) {
  const int D = model.hidden_size;
  for (auto& s : stack) {
    std::vector<float> x = normalized(h, rows, D, model.rms_eps), y(static_cast<std::size_t>(rows * D));
    const Clock::time_point start = Clock::now();
    s.layer->forward(s.request, TensorView{x.data(), DType::F32, {rows, D}, Device::CPU},
                     LayerOutputs(TensorView{y.data(), DType::F32, {rows, D}, Device::CPU}));
    (decode ? s.decode_seconds : s.prefill_seconds) += seconds_since(start);
    for (std::size_t i = 0; i < h.size(); ++i) h[i] += y[i];
    s.y.insert(s.y.end(), y.begin(), y.end());
  }
}

std::vector<StackLayer> build_stack(const ModelConfig& model, const DemoOptions& o, std::int64_t total_tokens,
                                    int threads) {
  std::vector<StackLayer> stack = pick_layers(model);
  for (auto& s : stack) {
    // Through the checkpoint format and the loader, as a real checkpoint would come in.
    const auto image = random_layer_checkpoint(model, s.index, o.seed).to_bytes();
    LayerOptions options;
    options.max_tokens = total_tokens;
    options.threads = threads;
    s.layer = std::make_unique<AttentionLayer>(
        model, load_layer_weights(SafetensorsFile::from_bytes(image, "random layer"), model, s.index), options);
    s.request = s.layer->open_request();
  }
  return stack;
}

std::string human_bytes(double bytes) {
  char text[32];
  if (bytes >= 1 << 20) std::snprintf(text, sizeof text, "%.2f MiB", bytes / (1 << 20));
  else if (bytes >= 1 << 10) std::snprintf(text, sizeof text, "%.1f KiB", bytes / (1 << 10));
  else std::snprintf(text, sizeof text, "%.0f B", bytes);
  return text;
}

// Cache bytes per token a layer adds once the prompt is long: its compressed entries (and indexer
// keys); the window is a fixed ring per request.
double marginal_bytes_per_token(const ModelConfig& model, const LayerConfig& layer, IndexerKeyFormat format) {
  if (layer.ratio == 0) return 0.0;
  double bytes = 584.0 / layer.ratio;
  if (layer_has_indexer(layer)) bytes += IndexerEntryFormat{format, model.index_head_dim}.entry_bytes() / double(layer.ratio);
  return bytes;
}

void report(const std::vector<StackLayer>& stack, const ModelConfig& model, const DemoOptions& o) {
  const std::int64_t tokens = o.prompt_tokens + o.decode_tokens;
  std::printf("\nPer layer kind, one request of %lld tokens (cache bytes per token: a dense bf16 MQA cache holds "
              "%.0f B, DeepSeek-V3.2 %.0f B = 656 + 132):\n",
              static_cast<long long>(tokens), kDenseMqaBytes, kV32Bytes);
  std::printf("  %-4s %5s %8s %8s %11s %11s %10s %9s %16s %12s %12s\n", "kind", "ratio", "entries", "idx keys",
              "window", "compressed", "state", "B/token", "vs dense", "prefill", "decode");
  for (const auto& s : stack) {
    const LayerRequestUsage u = s.layer->usage(s.request);
    const double per_token = marginal_bytes_per_token(model, s.layer->layer(), s.layer->options().indexer_format);
    char versus[32] = "window only";
    if (per_token > 0) std::snprintf(versus, sizeof versus, "%.1fx / %.1fx", kDenseMqaBytes / per_token, kV32Bytes / per_token);
    char prefill[32], decode[32];
    std::snprintf(prefill, sizeof prefill, "%.0f tok/s", s.prefill_seconds > 0 ? static_cast<double>(o.prompt_tokens) / s.prefill_seconds : 0);
    std::snprintf(decode, sizeof decode, "%.0f tok/s", s.decode_seconds > 0 ? static_cast<double>(o.decode_tokens) / s.decode_seconds : 0);
    std::printf("  %-4s %5d %8lld %8lld %11s %11s %10s %9.2f %16s %12s %12s\n", s.kind.c_str(), s.layer->layer().ratio,
                static_cast<long long>(u.compressed_entries), static_cast<long long>(u.indexer_entries),
                human_bytes(static_cast<double>(u.window_bytes)).c_str(),
                human_bytes(static_cast<double>(u.compressed_bytes + u.indexer_bytes)).c_str(),
                human_bytes(static_cast<double>(u.state_bytes)).c_str(), per_token, versus, prefill, decode);
  }
  std::printf("  (B/token: compressed entries of 584 B per m tokens, plus a %d-byte indexer key per m tokens in CSA;"
              " \"vs dense\": times smaller than dense bf16 MQA / V3.2;\n   window: a fixed ring of the last tokens"
              " per request; state: the compressors' streaming state per request)\n",
              IndexerEntryFormat{stack.empty() ? IndexerKeyFormat::FP8 : stack[0].layer->options().indexer_format,
                                 model.index_head_dim}.entry_bytes());

  // The whole configuration: every layer's per-token cache, averaged.
  double sum = 0;
  int counts[3] = {0, 0, 0};
  for (int i = 0; i < model.num_layers(); ++i) {
    const LayerConfig l = layer_config(model, i);
    sum += marginal_bytes_per_token(model, l, IndexerKeyFormat::FP8);
    ++counts[l.ratio == 0 ? 0 : layer_has_indexer(l) ? 1 : 2];
  }
  const double average = sum / std::max(1, model.num_layers());
  std::printf("\nAll %d layers of %s (%d SWA, %d CSA, %d HCA): %.1f B per token per layer on average, %.1fx smaller "
              "than dense bf16 MQA and %.1fx smaller than DeepSeek-V3.2 (plus each layer's fixed window of %d tokens).\n",
              model.num_layers(), model.name.c_str(), counts[0], counts[1], counts[2], average,
              kDenseMqaBytes / average, kV32Bytes / average, model.window);
}

int run_demo(const DemoOptions& o) {
  const Device device = parse_device(o.device, "--device");
  require(device == Device::CPU, "--device", "the demo runs the CPU reference layer; a CUDA layer is not built yet");
  require(o.prompt_tokens >= 1, "--prompt-tokens", "must be at least 1");
  require(o.decode_tokens >= 0, "--decode-tokens", "must be non-negative");
  require(o.chunk >= 1, "--chunk", "must be at least 1");
  require(o.threads >= 0, "--threads", "must be non-negative");
  const ModelConfig model = load_model_config(o.config);
  const std::string limit = "max_position_embeddings = " + std::to_string(model.max_positions);
  require(o.prompt_tokens <= model.max_positions, "--prompt-tokens", "exceeds " + limit);
  // Compared without the sum, which could overflow.
  require(o.decode_tokens <= model.max_positions - o.prompt_tokens, "--decode-tokens",
          "prompt plus decode tokens exceed " + limit);
  const std::int64_t total = o.prompt_tokens + o.decode_tokens;
  const int threads = o.threads > 0 ? o.threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int D = model.hidden_size;

  std::vector<StackLayer> stack = build_stack(model, o, total, threads);
  std::printf("dsv4 demo: DeepSeek-V4 compressed attention on the CPU reference\n");
  std::printf("config %s: D %d, %d heads of %d (RoPE %d), window %d, indexer %d x %d top-%d, page %d tokens\n",
              model.name.c_str(), D, model.num_heads, model.head_dim, model.rope_dim, model.window, model.index_heads,
              model.index_head_dim, model.index_topk, model.page_size);
  std::printf("stack:");
  for (const auto& s : stack) std::printf(" %s (layer %d, ratio %d)", s.kind.c_str(), s.index, s.layer->layer().ratio);
  std::printf("; random weights, seed %llu; %d threads\n", static_cast<unsigned long long>(o.seed), threads);
  std::printf("stream: %lld prompt tokens in chunks of %lld, then %lld decode steps of one token\n",
              static_cast<long long>(o.prompt_tokens), static_cast<long long>(o.chunk),
              static_cast<long long>(o.decode_tokens));
  std::fflush(stdout);

  // Embeddings: the prompt's are random; each decoded token's is the previous token's final hidden
  // state, normalized (random weights have no vocabulary to pick a token from).
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> embeddings(static_cast<std::size_t>(total * D));  // [total, D]
  for (std::int64_t i = 0; i < o.prompt_tokens * D; ++i) embeddings[static_cast<std::size_t>(i)] = normal(rng);
  std::vector<float> final_hidden;  // [total, D]

  Progress progress(total);
  for (std::int64_t at = 0; at < o.prompt_tokens; at += o.chunk) {
    const std::int64_t n = std::min(o.chunk, o.prompt_tokens - at);
    std::vector<float> h(embeddings.begin() + at * D, embeddings.begin() + (at + n) * D);
    run_stack(stack, model, h, n, false);
    final_hidden.insert(final_hidden.end(), h.begin(), h.end());
    progress.update("prefill", at + n, true);
  }
  for (std::int64_t t = o.prompt_tokens; t < total; ++t) {
    rms_norm(final_hidden.data() + (t - 1) * D, nullptr, D, model.rms_eps, embeddings.data() + t * D);
    std::vector<float> h(embeddings.begin() + t * D, embeddings.begin() + (t + 1) * D);
    run_stack(stack, model, h, 1, true);
    final_hidden.insert(final_hidden.end(), h.begin(), h.end());
    progress.update("decode", t + 1, t + 1 == total);
  }

  // Self-check: the same embeddings through fresh layers in one step each must give the same bits.
  progress.update("self-check", 0, true);
  const Clock::time_point check_start = Clock::now();
  std::vector<StackLayer> oneshot = build_stack(model, o, total, threads);
  std::vector<float> h = embeddings;
  run_stack(oneshot, model, h, total, false);
  progress.update("self-check", total, true);
  progress.finish();
  bool pass = std::memcmp(h.data(), final_hidden.data(), h.size() * sizeof(float)) == 0;
  for (std::size_t i = 0; i < stack.size(); ++i) pass = pass && stack[i].y == oneshot[i].y;
  for (float v : final_hidden) pass = pass && std::isfinite(v);

  report(stack, model, o);
  std::printf("\nSelf-check: %lld tokens recomputed in one step per layer (%.1f s) against the streamed run "
              "(chunks of %lld, then single tokens): every layer output and final hidden state %s -> %s\n",
              static_cast<long long>(total), seconds_since(check_start), static_cast<long long>(o.chunk),
              pass ? "bit-identical" : "DIFFERS", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

}  // namespace

void add_demo_command(CLI::App& app, Action& run) {
  auto options = std::make_shared<DemoOptions>();
  CLI::App* sub = app.add_subcommand(
      "demo", "The main job: stream a long prompt through an SWA, a CSA and an HCA layer with random weights, "
              "decode, report cache sizes and speed, self-check");
  sub->add_option("--config", options->config, "preset (flash, pro, tiny) or path to a config.json")
      ->capture_default_str();
  sub->add_option("--prompt-tokens", options->prompt_tokens, "prompt length")->capture_default_str();
  sub->add_option("--decode-tokens", options->decode_tokens, "tokens decoded one at a time after the prompt")
      ->capture_default_str();
  sub->add_option("--chunk", options->chunk, "prefill chunk size")->capture_default_str();
  sub->add_option("--device", options->device, "cpu (the CUDA layer is not built yet)")->capture_default_str();
  sub->add_option("--seed", options->seed, "random seed of weights and prompt")
      ->capture_default_str()
      ->check(non_negative_integer());
  sub->add_option("--threads", options->threads, "CPU threads (0: all)")->capture_default_str();
  sub->callback([&run, options] { run = [options] { return run_demo(*options); }; });
}

}  // namespace dsv4::cli
