// dsv4/weights.hpp — one attention layer's weights, loaded by checkpoint name (SPEC §8).
//
// Every matrix is held dequantized as float32 on the host: an e4m3 matrix is multiplied by its
// per-128×128-block scale (ue8m0 or float32) at load time, a bf16 matrix is widened. The same
// table of tensors (names, shapes, stored dtypes) drives the loader and the random checkpoint
// writer behind `dsv4 make-weights`, so the two cannot drift apart.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dsv4/config.hpp"
#include "dsv4/safetensors.hpp"
#include "dsv4/tensor.hpp"

namespace dsv4 {

// How a tensor is stored in a published checkpoint (what make-weights writes). The loader is more
// lenient: any matrix may be F8_E4M3 with a block scale, BF16 or F32; norms BF16 or F32.
enum class WeightStorage {
  Fp8Matrix,   // F8_E4M3 `.weight` + `.scale` [ceil(out/128), ceil(in/128)] (F8_E8M0 or F32)
  Bf16Matrix,  // BF16 `.weight`
  Norm,        // BF16 `.weight` (an RMSNorm gain)
  Float32,     // F32, stored bare (no `.weight` suffix): attn_sink, ape
};

// One tensor of a layer: `suffix` is the name after the layer prefix, e.g. "compressor.wkv"
// (".weight" is appended for matrices and norms).
struct WeightSpec {
  std::string suffix;
  WeightStorage storage = WeightStorage::Float32;
  Shape shape;
};

// The tensors layer `layer` of `model` needs, in checkpoint order: the attention tensors, then
// for ratio > 0 the compressor, then for CSA layers the indexer and its compressor.
// Throws Error("layer", ...) when `layer` is out of range and Error(key) for an invalid `model`
// (validate_model_config).
std::vector<WeightSpec> layer_weight_specs(const ModelConfig& model, int layer);

// True for layers with a lightning indexer (CSA): the overlapping-compressor layers (SPEC §2).
bool layer_has_indexer(const LayerConfig& layer);

// Canonical checkpoint name: "layers.{layer}.attn.{suffix}" plus ".weight" for matrices and norms.
std::string checkpoint_weight_name(int layer, const WeightSpec& spec);

// All weights of one attention layer, float32 on the host.
struct LayerWeights {
  // A compressor's weights (SPEC §4), c = head_dim (attention) or index_head_dim (indexer).
  struct Compressor {
    Tensor wkv;    // [coff·c, D]
    Tensor wgate;  // [coff·c, D]
    Tensor ape;    // [m, coff·c]
    Tensor norm;   // [c]
  };
  // The lightning indexer's weights (SPEC §7).
  struct Indexer {
    Tensor wq_b;           // [H_I·d_I, q_lora]
    Tensor weights_proj;   // [H_I, D]
    Compressor compressor; // c = d_I, the layer's ratio and overlap
  };

  LayerConfig layer;
  Tensor wq_a;       // [q_lora, D]
  Tensor q_norm;     // [q_lora]
  Tensor wq_b;       // [H·d, q_lora]
  Tensor wkv;        // [d, D]
  Tensor kv_norm;    // [d]
  Tensor wo_a;       // [G·o_lora, (H/G)·d]
  Tensor wo_b;       // [D, G·o_lora]
  Tensor attn_sink;  // [H]
  std::optional<Compressor> compressor;  // ratio > 0
  std::optional<Indexer> indexer;        // CSA layers (layer_has_indexer)
};

// The tensors of `w` in layer_weight_specs order: the eight attention tensors, then the compressor's
// four when present, then the indexer's two and its compressor's four when present.
std::vector<Tensor*> layer_weight_tensors(LayerWeights& w);
std::vector<const Tensor*> layer_weight_tensors(const LayerWeights& w);

// Loads layer `layer` of `model` from `file`. Names are looked up under "layers.{i}.attn.", also
// accepting a leading "model." and "self_attn" for "attn"; an e4m3 matrix's scale may be named
// ".scale" or ".weight_scale_inv". Tensors of other layers or other modules are ignored.
// Throws Error(canonical tensor name, reason) for a missing tensor, a wrong shape or a dtype that
// is not accepted (see WeightStorage), and Error("layer", ...) for a layer out of range.
LayerWeights load_layer_weights(const SafetensorsFile& file, const ModelConfig& model, int layer);
LayerWeights load_layer_weights(const std::string& path, const ModelConfig& model, int layer);

// Dequantizes an e4m3 matrix with one scale per 128×128 block:
// out[i, j] = e4m3(codes[i, j]) · scales[i / 128, j / 128].
// codes [rows, cols] e4m3 bytes; scales [ceil(rows/128), ceil(cols/128)] f32; out [rows, cols].
// Throws Error("rows") / Error("cols") for a negative extent and Error naming a null pointer.
void dequantize_block_e4m3(const std::uint8_t* codes, std::int64_t rows, std::int64_t cols, const float* scales,
                           float* out);

// Block size of the e4m3 weight scales (the checkpoints' `weight_block_size`).
inline constexpr std::int64_t kWeightBlock = 128;

// Random weights for layer `layer` in the checkpoint format: every tensor of layer_weight_specs
// under its canonical name and stored dtype (e4m3 with ue8m0 block scales, bf16, f32), with
// magnitudes that keep a normalized input's activations near unit scale: matrices with standard
// deviation 1/sqrt(in) (compressor gates 2/sqrt(in)), norm gains 1 + N(0, 0.1²), ape N(0, 0.5²),
// sinks N(0, 0.75²). Deterministic in (seed, layer, tensor name).
// Metadata: "format" = "dsv4-layer", "config" = model.name, "layer", "seed".
SafetensorsWriter random_layer_checkpoint(const ModelConfig& model, int layer, std::uint64_t seed);

}  // namespace dsv4
