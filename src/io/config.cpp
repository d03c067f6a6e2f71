// src/io/config.cpp — DeepSeek-V4 config.json parsing, presets, validation and per-layer
// configuration (SPEC §2; keys and rules in docs/config.md).
#include "dsv4/config.hpp"

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "dsv4/error.hpp"

namespace dsv4 {
namespace {

using Json = nlohmann::json;

// The FP8 attention entry (SPEC §5.1: 448 e4m3 "nope" dims in 7 blocks of 64, then 64 bf16 RoPE
// dims) exists only for this geometry.
constexpr int kCacheHeadDim = 512;
constexpr int kCacheRopeDim = 64;
// The top-k kernels keep one row of K candidates on chip; K above this is not supported.
constexpr int kMaxIndexTopk = 2048;

// Reads config.json keys, naming the key (and the source) in every error.
class KeyReader {
 public:
  KeyReader(const Json& object, std::string prefix, const std::string& source)
      : object_(object), prefix_(std::move(prefix)), source_(source) {}

  bool has(const char* key) const { return object_.contains(key); }

  const Json& value(const char* key) const {
    const auto it = object_.find(key);
    if (it == object_.end()) throw Error(name(key), "missing from " + source_);
    return *it;
  }

  std::int64_t integer(const char* key, std::int64_t lo = std::numeric_limits<int>::min(),
                       std::int64_t hi = std::numeric_limits<int>::max()) const {
    return as_integer(value(key), name(key), lo, hi);
  }

  int int32(const char* key) const { return static_cast<int>(integer(key)); }

  double number(const char* key) const {
    const auto& v = value(key);
    if (!v.is_number()) throw Error(name(key), "expected a number, got " + v.dump() + " in " + source_);
    return v.get<double>();
  }

  std::vector<int> integer_array(const char* key) const {
    const auto& v = value(key);
    if (!v.is_array()) throw Error(name(key), "expected an array of integers, got " + v.dump() + " in " + source_);
    std::vector<int> out;
    for (const auto& element : v) {
      out.push_back(static_cast<int>(as_integer(element, name(key), std::numeric_limits<int>::min(),
                                                std::numeric_limits<int>::max())));
    }
    return out;
  }

  std::string name(const char* key) const { return prefix_ + key; }

 private:
  std::int64_t as_integer(const Json& v, const std::string& key, std::int64_t lo, std::int64_t hi) const {
    if (v.is_number_unsigned()) {
      const auto u = v.get<std::uint64_t>();
      if (u <= static_cast<std::uint64_t>(hi)) return static_cast<std::int64_t>(u);
    } else if (v.is_number_integer()) {
      const auto i = v.get<std::int64_t>();
      if (i >= lo && i <= hi) return i;
    } else {
      throw Error(key, "expected an integer, got " + v.dump() + " in " + source_);
    }
    throw Error(key, "integer " + v.dump() + " out of range in " + source_);
  }

  const Json& object_;
  std::string prefix_;
  const std::string& source_;
};

void read_rope_scaling(const Json& value, ModelConfig& config, const std::string& source) {
  if (value.is_null()) {  // no YaRN: compressed layers use plain RoPE with compress_rope_theta
    config.yarn = false;
    return;
  }
  if (!value.is_object()) throw Error("rope_scaling", "expected an object or null, got " + value.dump() + " in " + source);
  const KeyReader scaling(value, "rope_scaling.", source);
  // The published configs spell the kind "type"; newer transformers versions write "rope_type".
  const char* type_key = !scaling.has("type") && scaling.has("rope_type") ? "rope_type" : "type";
  const auto& type = scaling.value(type_key);
  if (!type.is_string() || type.get<std::string>() != "yarn") {
    throw Error(scaling.name(type_key), "only \"yarn\" is supported, got " + type.dump() + " in " + source);
  }
  config.yarn = true;
  config.yarn_factor = scaling.number("factor");
  config.yarn_original_max_positions = scaling.number("original_max_position_embeddings");
  config.yarn_beta_fast = scaling.number("beta_fast");
  config.yarn_beta_slow = scaling.number("beta_slow");
}

// Sizes, RoPE/YaRN, eps and max positions shared by every preset (the published values).
ModelConfig published_base() {
  ModelConfig c;
  c.head_dim = 512;
  c.rope_dim = 64;
  c.rope_theta = 10000.0;
  c.compress_rope_theta = 160000.0;
  c.yarn = true;
  c.yarn_factor = 16.0;
  c.yarn_original_max_positions = 65536.0;
  c.yarn_beta_fast = 32.0;
  c.yarn_beta_slow = 1.0;
  c.rms_eps = 1e-6;
  c.max_positions = 1048576;
  c.page_size = 256;
  return c;
}

// `head`, then `pairs` × (4, 128), then `tail`: the published layer pattern (CSA and HCA layers
// alternate after a short prefix; the last entry is the MTP layer).
std::vector<int> alternating_ratios(std::vector<int> head, int pairs, const std::vector<int>& tail) {
  for (int i = 0; i < pairs; ++i) {
    head.push_back(4);
    head.push_back(128);
  }
  head.insert(head.end(), tail.begin(), tail.end());
  return head;
}

bool is_power_of_two(int v) { return v > 0 && (v & (v - 1)) == 0; }

}  // namespace

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names = {"flash", "pro", "tiny"};
  return names;
}

ModelConfig preset_config(const std::string& name) {
  ModelConfig c = published_base();
  c.name = name;
  if (name == "flash") {  // = shared/vectors/flash_config.json (43 layers + 1 MTP)
    c.hidden_size = 4096;
    c.num_heads = 64;
    c.q_lora_rank = 1024;
    c.o_lora_rank = 1024;
    c.o_groups = 8;
    c.window = 128;
    c.index_heads = 64;
    c.index_head_dim = 128;
    c.index_topk = 512;
    c.compress_ratios = alternating_ratios({0, 0}, 20, {4, 0});
  } else if (name == "pro") {  // DeepSeek-V4-Pro config.json (61 layers + 1 MTP)
    c.hidden_size = 7168;
    c.num_heads = 128;
    c.q_lora_rank = 1536;
    c.o_lora_rank = 1024;
    c.o_groups = 16;
    c.window = 128;
    c.index_heads = 64;
    c.index_head_dim = 128;
    c.index_topk = 1024;
    c.compress_ratios = alternating_ratios({128, 128}, 29, {4, 0});
  } else if (name == "tiny") {  // small sizes; d and d_I keep the published cache formats
    c.hidden_size = 256;
    c.num_heads = 8;
    c.q_lora_rank = 128;
    c.o_lora_rank = 128;
    c.o_groups = 2;
    c.window = 16;
    c.index_heads = 8;
    c.index_head_dim = 128;
    c.index_topk = 16;
    c.compress_ratios = {0, 4, 128, 4};
  } else {
    throw Error("config", "unknown preset '" + name + "' (expected flash, pro or tiny)");
  }
  return c;
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& source_name) {
  const Json root = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) throw Error("config", source_name + " is not valid JSON");
  if (!root.is_object()) throw Error("config", source_name + " is not a JSON object");
  const KeyReader keys(root, "", source_name);

  ModelConfig c;
  c.name = source_name;
  c.hidden_size = keys.int32("hidden_size");
  c.num_heads = keys.int32("num_attention_heads");
  c.head_dim = keys.int32("head_dim");
  c.rope_dim = keys.int32("qk_rope_head_dim");
  c.q_lora_rank = keys.int32("q_lora_rank");
  c.o_lora_rank = keys.int32("o_lora_rank");
  c.o_groups = keys.int32("o_groups");
  c.window = keys.int32("sliding_window");
  c.index_heads = keys.int32("index_n_heads");
  c.index_head_dim = keys.int32("index_head_dim");
  c.index_topk = keys.int32("index_topk");
  c.compress_ratios = keys.integer_array("compress_ratios");
  c.rope_theta = keys.number("rope_theta");
  c.compress_rope_theta = keys.number("compress_rope_theta");
  read_rope_scaling(keys.has("rope_scaling") ? keys.value("rope_scaling") : Json(nullptr), c, source_name);
  c.rms_eps = keys.number("rms_norm_eps");
  c.max_positions = keys.integer("max_position_embeddings", std::numeric_limits<std::int64_t>::min(),
                                 std::numeric_limits<std::int64_t>::max());

  // compress_ratios lists the decoder layers and then the MTP layers.
  if (keys.has("num_hidden_layers") && keys.has("num_nextn_predict_layers")) {
    const auto layers = keys.integer("num_hidden_layers") + keys.integer("num_nextn_predict_layers");
    if (static_cast<std::int64_t>(c.compress_ratios.size()) != layers) {
      throw Error("compress_ratios", "has " + std::to_string(c.compress_ratios.size()) +
                                         " entries, expected num_hidden_layers + num_nextn_predict_layers = " +
                                         std::to_string(layers) + " in " + source_name);
    }
  }
  validate_model_config(c);
  return c;
}

ModelConfig load_model_config(const std::string& name_or_path) {
  for (const auto& preset : preset_names()) {
    if (name_or_path == preset) return preset_config(preset);
  }
  std::ifstream in(name_or_path, std::ios::binary);
  if (!in) {
    throw Error("config", "'" + name_or_path + "' is neither a preset (flash, pro, tiny) nor a readable config.json");
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw Error("config", "cannot read '" + name_or_path + "'");
  return parse_model_config(text.str(), name_or_path);
}

void validate_model_config(const ModelConfig& c) {
  // Upper bounds far above every published model (hidden 7168, 128 heads, ranks ≤ 1536, window 128,
  // page 256) but low enough that a layer's weights and rings stay countable: a config beyond them is
  // refused naming its key instead of failing later in an allocation.
  constexpr std::int64_t kMaxWidth = 1 << 16, kMaxHeads = 1 << 12, kMaxWindow = 1 << 20, kMaxPage = 1 << 16;
  auto positive = [](std::int64_t v, const char* key, std::int64_t most = std::numeric_limits<std::int64_t>::max()) {
    require(v > 0 && v <= most, key,
            most == std::numeric_limits<std::int64_t>::max()
                ? "must be positive, got " + std::to_string(v)
                : "must be in [1, " + std::to_string(most) + "], got " + std::to_string(v));
  };
  positive(c.hidden_size, "hidden_size", kMaxWidth);
  positive(c.num_heads, "num_attention_heads", kMaxHeads);
  positive(c.head_dim, "head_dim");
  positive(c.rope_dim, "qk_rope_head_dim");
  positive(c.q_lora_rank, "q_lora_rank", kMaxWidth);
  positive(c.o_lora_rank, "o_lora_rank", kMaxWidth);
  positive(c.o_groups, "o_groups");
  positive(c.window, "sliding_window", kMaxWindow);
  positive(c.index_heads, "index_n_heads", kMaxHeads);
  positive(c.index_head_dim, "index_head_dim", kMaxWidth);
  positive(c.max_positions, "max_position_embeddings");
  positive(c.page_size, "page_size", kMaxPage);

  require(c.rope_dim % 2 == 0, "qk_rope_head_dim", "must be even (RoPE rotates pairs), got " + std::to_string(c.rope_dim));
  require(c.rope_dim < c.head_dim, "qk_rope_head_dim",
          "must be smaller than head_dim " + std::to_string(c.head_dim) + ", got " + std::to_string(c.rope_dim));
  const std::string cache_format = "the 584-byte FP8 cache entry (SPEC 5.1) is defined only for head_dim " +
                                   std::to_string(kCacheHeadDim) + " with qk_rope_head_dim " + std::to_string(kCacheRopeDim);
  require(c.head_dim == kCacheHeadDim, "head_dim", cache_format + "; got head_dim " + std::to_string(c.head_dim));
  require(c.rope_dim == kCacheRopeDim, "qk_rope_head_dim", cache_format + "; got qk_rope_head_dim " + std::to_string(c.rope_dim));
  require(c.num_heads % c.o_groups == 0, "o_groups",
          std::to_string(c.o_groups) + " does not divide num_attention_heads " + std::to_string(c.num_heads));

  // Walsh–Hadamard needs a power of two; FP4 keys carry one scale per 32 values; the RoPE dims
  // are the last rope_dim of the index head, so the head must be wider.
  require(is_power_of_two(c.index_head_dim) && c.index_head_dim % 32 == 0 && c.index_head_dim > c.rope_dim,
          "index_head_dim",
          "must be a power of two, a multiple of 32 and larger than qk_rope_head_dim " + std::to_string(c.rope_dim) +
              ", got " + std::to_string(c.index_head_dim));
  require(c.index_topk >= 1 && c.index_topk <= kMaxIndexTopk, "index_topk",
          "must be in [1, " + std::to_string(kMaxIndexTopk) + "] (the top-k kernel limit), got " + std::to_string(c.index_topk));

  require(!c.compress_ratios.empty(), "compress_ratios", "must list at least one layer");
  for (std::size_t i = 0; i < c.compress_ratios.size(); ++i) {
    const int ratio = c.compress_ratios[i];
    require(ratio >= 0, "compress_ratios", "entry " + std::to_string(i) + " is negative (" + std::to_string(ratio) + ")");
    // A page of P raw tokens maps to P/m entries of the compressed cache (SPEC §5).
    require(ratio == 0 || c.page_size % ratio == 0, "compress_ratios",
            "entry " + std::to_string(i) + " (" + std::to_string(ratio) + ") does not divide page_size " +
                std::to_string(c.page_size));
  }
  // Positions are 32-bit in the kernels and page tables.
  require(c.max_positions <= std::numeric_limits<std::int32_t>::max(), "max_position_embeddings",
          "must fit a 32-bit position, got " + std::to_string(c.max_positions));

  auto finite_above = [](double v, double bound, const char* key, const char* what) {
    require(std::isfinite(v) && v > bound, key, std::string("must be ") + what + ", got " + std::to_string(v));
  };
  finite_above(c.rms_eps, 0.0, "rms_norm_eps", "positive and finite");
  // f_i = base^(-2i/r) and YaRN's ln(base) divisor need base > 1.
  finite_above(c.rope_theta, 1.0, "rope_theta", "finite and above 1");
  finite_above(c.compress_rope_theta, 1.0, "compress_rope_theta", "finite and above 1");
  if (c.yarn) {
    require(std::isfinite(c.yarn_factor) && c.yarn_factor >= 1.0, "rope_scaling.factor",
            "must be finite and at least 1, got " + std::to_string(c.yarn_factor));
    finite_above(c.yarn_original_max_positions, 0.0, "rope_scaling.original_max_position_embeddings", "positive and finite");
    finite_above(c.yarn_beta_slow, 0.0, "rope_scaling.beta_slow", "positive and finite");
    // The YaRN ramp runs from the beta_fast dimension to the beta_slow one.
    finite_above(c.yarn_beta_fast, c.yarn_beta_slow, "rope_scaling.beta_fast", "finite and above beta_slow");
  }
}

LayerConfig layer_config(const ModelConfig& model, int index) {
  require(index >= 0 && index < model.num_layers(), "layer",
          "index " + std::to_string(index) + " outside [0, " + std::to_string(model.num_layers()) + ") of " + model.name);
  LayerConfig layer;
  layer.index = index;
  layer.ratio = model.compress_ratios[static_cast<std::size_t>(index)];
  layer.overlap = layer.ratio == 4;  // SPEC §2: overlap exactly for ratio 4
  layer.rope.rope_dim = model.rope_dim;
  if (layer.ratio == 0) {
    layer.rope.base = model.rope_theta;
    layer.rope.yarn = false;
  } else {
    layer.rope.base = model.compress_rope_theta;
    layer.rope.yarn = model.yarn;
    if (model.yarn) {
      layer.rope.factor = model.yarn_factor;
      layer.rope.original_max_positions = model.yarn_original_max_positions;
      layer.rope.beta_fast = model.yarn_beta_fast;
      layer.rope.beta_slow = model.yarn_beta_slow;
    }
  }
  return layer;
}

}  // namespace dsv4
