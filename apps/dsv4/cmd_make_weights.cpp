// apps/dsv4/cmd_make_weights.cpp — `dsv4 make-weights`: random weights for one layer in the
// checkpoint format and names (contract: docs/cli.md).
#include <cstdio>
#include <memory>
#include <string>

#include "commands.hpp"
#include "dsv4/config.hpp"
#include "dsv4/weights.hpp"

namespace dsv4::cli {

namespace {
struct MakeWeightsOptions {
  std::string config;
  int layer = 0;
  std::uint64_t seed = 1;
  std::string out;
};

int make_weights(const MakeWeightsOptions& o) {
  const ModelConfig model = load_model_config(o.config);
  const LayerConfig layer = layer_config(model, o.layer);
  const SafetensorsWriter writer = random_layer_checkpoint(model, o.layer, o.seed);
  writer.write(o.out);
  std::fprintf(stderr, "dsv4 make-weights: layer %d of %s (compress ratio %d, %zu tensors) with seed %llu -> %s\n",
               o.layer, model.name.c_str(), layer.ratio, layer_weight_specs(model, o.layer).size(),
               static_cast<unsigned long long>(o.seed), o.out.c_str());
  return 0;
}
}  // namespace

void add_make_weights_command(CLI::App& app, Action& run) {
  auto options = std::make_shared<MakeWeightsOptions>();
  CLI::App* sub = app.add_subcommand(
      "make-weights", "Random weights for one attention layer, in the checkpoint's tensor names and dtypes");
  sub->add_option("--config", options->config, "preset (flash, pro, tiny) or path to a config.json")->required();
  sub->add_option("--layer", options->layer, "layer index (its compress ratio decides which tensors exist)")
      ->required();
  sub->add_option("--seed", options->seed, "random seed (same seed, same bytes)")
      ->capture_default_str()
      ->check(non_negative_integer());
  sub->add_option("--out", options->out, "output .safetensors file (written atomically)")->required();
  sub->callback([&run, options] { run = [options] { return make_weights(*options); }; });
}

}  // namespace dsv4::cli
