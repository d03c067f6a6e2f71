// dsv4/config.hpp — model and per-layer configuration (SPEC §2).
//
// Nothing in the library hard-wires a ratio, head count, window or top-k: every kernel and the
// reference read them from here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsv4 {

// RoPE frequencies of one table (SPEC §3). YaRN applies when `yarn` is set.
struct RopeConfig {
  double base = 10000.0;
  int rope_dim = 64;  // r: the LAST r dims of a head or entry are rotated
  bool yarn = false;
  double factor = 1.0;
  double original_max_positions = 0.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;

  bool operator==(const RopeConfig&) const = default;
};

struct ModelConfig {
  int hidden_size = 0;        // D   [hidden_size]
  int num_heads = 0;          // H   [num_attention_heads]
  int head_dim = 0;           // d   [head_dim]
  int rope_dim = 0;           // r   [qk_rope_head_dim]
  int q_lora_rank = 0;        //     [q_lora_rank]
  int o_lora_rank = 0;        //     [o_lora_rank]
  int o_groups = 0;           // G   [o_groups]
  int window = 0;             // W   [sliding_window]
  int index_heads = 0;        // H_I [index_n_heads]
  int index_head_dim = 0;     // d_I [index_head_dim]
  int index_topk = 0;         // K   [index_topk]
  std::vector<int> compress_ratios;  // [compress_ratios], one per layer (last: MTP layer)
  double rope_theta = 10000.0;           // ratio-0 layers, plain RoPE
  double compress_rope_theta = 160000.0; // ratio > 0 layers, with YaRN from rope_scaling
  bool yarn = false;                     // [rope_scaling] present with type yarn
  double yarn_factor = 1.0;
  double yarn_original_max_positions = 0.0;
  double yarn_beta_fast = 32.0;
  double yarn_beta_slow = 1.0;
  double rms_eps = 1e-6;                 // [rms_norm_eps]
  std::int64_t max_positions = 0;        // [max_position_embeddings]
  int page_size = 256;                   // P: raw tokens per cache page (not in config.json)
  std::string name;                      // preset name or source path, for messages

  int num_layers() const { return static_cast<int>(compress_ratios.size()); }
  bool operator==(const ModelConfig&) const = default;
};

// What one layer needs: its ratio and derived compressor geometry and RoPE table.
struct LayerConfig {
  int index = 0;
  int ratio = 0;          // m: 0 (SWA only), 4 (CSA), 128 (HCA), or another ratio
  bool overlap = false;   // on exactly when ratio == 4 (SPEC §2)
  RopeConfig rope;        // this layer's table (used by attention, compressor and indexer)
  int coff() const { return overlap ? 2 : 1; }
  bool operator==(const LayerConfig&) const = default;
};

// Layer `index` of `model`: ratio m, overlap (m == 4), and the RoPE table — ratio 0: base
// rope_theta, no YaRN; ratio > 0: compress_rope_theta with YaRN from rope_scaling (when present).
// Throws Error("layer", ...) when index is outside [0, num_layers()).
LayerConfig layer_config(const ModelConfig& model, int index);

// Parses a Hugging Face DeepSeek-V4 config.json (text) and validates the result
// (validate_model_config). Keys and rules: docs/config.md. A missing, ill-typed or invalid key
// throws Error whose argument is the key name ("rope_scaling.factor" for nested keys); the reason
// names `source_name`. page_size is not a config.json key and keeps its default.
ModelConfig parse_model_config(const std::string& json_text, const std::string& source_name = "config.json");

// Loads `name_or_path`: a preset name (preset_names()) or a path to a config.json.
// Throws Error("config", ...) when it is neither; parse errors as parse_model_config.
ModelConfig load_model_config(const std::string& name_or_path);

// Preset configurations: "flash" (DeepSeek-V4-Flash), "pro" (DeepSeek-V4-Pro), "tiny" (the same
// structure with small sizes, for tests and the CPU demo). Throws Error("config", ...) for an
// unknown name.
ModelConfig preset_config(const std::string& name);
const std::vector<std::string>& preset_names();  // {"flash", "pro", "tiny"}

// Checks internal consistency: positive sizes, the cache-format constraints (head_dim 512,
// qk_rope_head_dim 64), divisibility (heads by o_groups, page_size by every ratio), the indexer
// width and top-k limits. Throws Error(key name, reason).
void validate_model_config(const ModelConfig& config);

}  // namespace dsv4
