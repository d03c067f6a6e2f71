// src/io/weights.cpp — loading one attention layer by checkpoint name, and writing random weights in
// the same format (SPEC §8). One table, layer_weight_specs, drives both directions.
#include "dsv4/weights.hpp"

#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string_view>

#include "dsv4/formats.hpp"

namespace dsv4 {

namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

Shape block_scale_shape(const Shape& matrix) {
  return {ceil_div(matrix[0], kWeightBlock), ceil_div(matrix[1], kWeightBlock)};
}

bool is_matrix(WeightStorage s) { return s == WeightStorage::Fp8Matrix || s == WeightStorage::Bf16Matrix; }

// The four spellings of a layer's attention prefix found in checkpoints.
std::vector<std::string> layer_prefixes(int layer) {
  const std::string n = std::to_string(layer);
  return {"layers." + n + ".attn.", "model.layers." + n + ".attn.", "layers." + n + ".self_attn.",
          "model.layers." + n + ".self_attn."};
}

// The stored name of `tail` (e.g. "wq_a.weight") under any accepted prefix, or "" when absent.
std::string find_tensor(const SafetensorsFile& file, int layer, const std::string& tail) {
  for (const auto& prefix : layer_prefixes(layer))
    if (file.contains(prefix + tail)) return prefix + tail;
  return {};
}

// "0, 2" — the layers that `file` holds attention tensors of, for a wrong-layer hint.
std::string layers_in_file(const SafetensorsFile& file) {
  std::set<long> layers;
  for (const auto& name : file.names()) {
    std::string_view rest = name;
    if (rest.starts_with("model.")) rest.remove_prefix(6);
    if (!rest.starts_with("layers.")) continue;
    rest.remove_prefix(7);
    const auto dot = rest.find('.');
    if (dot == 0 || dot == std::string_view::npos) continue;
    const std::string digits(rest.substr(0, dot));
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) continue;
    layers.insert(std::stol(digits));
  }
  std::string out;
  for (long l : layers) out += (out.empty() ? "" : ", ") + std::to_string(l);
  return out.empty() ? "none" : out;
}

void require_finite(const Tensor& t, const std::string& name) {
  const float* v = t.data_as<float>();  // [numel]
  for (std::int64_t i = 0; i < t.numel(); ++i)
    require(std::isfinite(v[i]), name, "holds a non-finite value at flat index " + std::to_string(i));
}

// Reads one tensor of `spec` as float32, dequantizing e4m3 matrices. Errors name `canonical`.
Tensor read_weight(const SafetensorsFile& file, int layer, const WeightSpec& spec) {
  const std::string canonical = checkpoint_weight_name(layer, spec);
  const std::string tail = is_matrix(spec.storage) || spec.storage == WeightStorage::Norm
                               ? spec.suffix + ".weight" : spec.suffix;
  const std::string stored = find_tensor(file, layer, tail);
  if (stored.empty()) {
    throw Error(canonical, "missing from " + file.path() + " (also looked for the model./self_attn spellings; "
                           "the file holds attention tensors of layers: " + layers_in_file(file) + ")");
  }
  const TensorInfo& info = file.info(stored);
  const std::string where = " (" + stored + " in " + file.path() + ")";
  require(info.shape == spec.shape, canonical,
          "expected shape " + shape_string(spec.shape) + ", got " + shape_string(info.shape) + where);

  const std::string got = std::string(dtype_name(info.dtype));
  Tensor out;
  if (is_matrix(spec.storage)) {
    if (info.dtype == DType::F8_E4M3) {
      const std::string scale_stored = [&] {
        std::string s = find_tensor(file, layer, spec.suffix + ".scale");
        return s.empty() ? find_tensor(file, layer, spec.suffix + ".weight_scale_inv") : s;
      }();
      const std::string scale_canonical = "layers." + std::to_string(layer) + ".attn." + spec.suffix + ".scale";
      require(!scale_stored.empty(), scale_canonical,
              "missing from " + file.path() + ": an F8_E4M3 matrix needs its per-128x128-block scale");
      const TensorInfo& scale_info = file.info(scale_stored);
      require(scale_info.dtype == DType::F8_E8M0 || scale_info.dtype == DType::F32, scale_canonical,
              "expected dtype F8_E8M0 or F32, got " + std::string(dtype_name(scale_info.dtype)));
      const Shape scale_shape = block_scale_shape(spec.shape);
      require(scale_info.shape == scale_shape, scale_canonical,
              "expected shape " + shape_string(scale_shape) + ", got " + shape_string(scale_info.shape));
      const Tensor codes = file.read_raw(stored, DType::F8_E4M3, spec.shape);
      const Tensor scales = file.read_float(scale_stored, scale_shape);
      out = Tensor::empty(DType::F32, spec.shape);
      dequantize_block_e4m3(codes.data_as<std::uint8_t>(), spec.shape[0], spec.shape[1], scales.data_as<float>(),
                            out.data_as<float>());
    } else {
      require(info.dtype == DType::BF16 || info.dtype == DType::F32, canonical,
              "expected dtype F8_E4M3 (with a block scale), BF16 or F32, got " + got + where);
      out = file.read_float(stored, spec.shape);
    }
  } else if (spec.storage == WeightStorage::Norm) {
    require(info.dtype == DType::BF16 || info.dtype == DType::F32, canonical,
            "expected dtype BF16 or F32, got " + got + where);
    out = file.read_float(stored, spec.shape);
  } else {
    require(info.dtype == DType::F32, canonical, "expected dtype F32, got " + got + where);
    out = file.read_float(stored, spec.shape);
  }
  require_finite(out, canonical);
  return out;
}

// splitmix64: decorrelates the per-tensor seeds derived from (seed, layer, name).
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::uint64_t tensor_seed(std::uint64_t seed, int layer, const std::string& name) {
  std::uint64_t h = mix(seed ^ mix(static_cast<std::uint64_t>(layer)));
  for (char c : name) h = mix(h ^ static_cast<unsigned char>(c));
  return h;
}

// Quantizes `values` [rows, cols] to e4m3 `codes` with one ue8m0 byte per 128×128 block
// (`scale_bytes` [ceil(rows/128), ceil(cols/128)]), the block scale rounded up so nothing saturates.
void quantize_block_e4m3(const std::vector<float>& values, std::int64_t rows, std::int64_t cols,
                         std::vector<std::uint8_t>& codes, std::vector<std::uint8_t>& scale_bytes) {
  const std::int64_t block_rows = ceil_div(rows, kWeightBlock), block_cols = ceil_div(cols, kWeightBlock);
  codes.assign(static_cast<std::size_t>(rows * cols), 0);
  scale_bytes.assign(static_cast<std::size_t>(block_rows * block_cols), 0);
  for (std::int64_t bi = 0; bi < block_rows; ++bi) {
    for (std::int64_t bj = 0; bj < block_cols; ++bj) {
      const std::int64_t r_end = std::min(rows, (bi + 1) * kWeightBlock);
      const std::int64_t c_end = std::min(cols, (bj + 1) * kWeightBlock);
      float amax = 0.0f;
      for (std::int64_t r = bi * kWeightBlock; r < r_end; ++r)
        for (std::int64_t c = bj * kWeightBlock; c < c_end; ++c) amax = std::fmax(amax, std::fabs(values[r * cols + c]));
      const std::uint8_t e = ue8m0_scale_byte(amax, kE4m3Max, kUe8m0FloorE4m3);
      scale_bytes[bi * block_cols + bj] = e;
      const float scale = float_from_ue8m0(e);
      for (std::int64_t r = bi * kWeightBlock; r < r_end; ++r)
        for (std::int64_t c = bj * kWeightBlock; c < c_end; ++c) codes[r * cols + c] = e4m3_from(values[r * cols + c] / scale);
    }
  }
}

}  // namespace

bool layer_has_indexer(const LayerConfig& layer) { return layer.ratio > 0 && layer.overlap; }

std::vector<WeightSpec> layer_weight_specs(const ModelConfig& model, int layer) {
  validate_model_config(model);  // the shapes below divide by o_groups
  const LayerConfig lc = layer_config(model, layer);
  const std::int64_t D = model.hidden_size, H = model.num_heads, d = model.head_dim;
  const std::int64_t q_lora = model.q_lora_rank, G = model.o_groups, o_lora = model.o_lora_rank;
  using S = WeightStorage;
  std::vector<WeightSpec> specs = {
      {"wq_a", S::Fp8Matrix, {q_lora, D}},
      {"q_norm", S::Norm, {q_lora}},
      {"wq_b", S::Fp8Matrix, {H * d, q_lora}},
      {"wkv", S::Fp8Matrix, {d, D}},
      {"kv_norm", S::Norm, {d}},
      {"wo_a", S::Fp8Matrix, {G * o_lora, H / G * d}},
      {"wo_b", S::Fp8Matrix, {D, G * o_lora}},
      {"attn_sink", S::Float32, {H}},
  };
  if (lc.ratio == 0) return specs;
  const auto add_compressor = [&](const std::string& prefix, std::int64_t c) {
    const std::int64_t width = lc.coff() * c;
    specs.push_back({prefix + "wkv", S::Bf16Matrix, {width, D}});
    specs.push_back({prefix + "wgate", S::Bf16Matrix, {width, D}});
    specs.push_back({prefix + "ape", S::Float32, {lc.ratio, width}});
    specs.push_back({prefix + "norm", S::Norm, {c}});
  };
  add_compressor("compressor.", d);
  if (layer_has_indexer(lc)) {
    const std::int64_t HI = model.index_heads, dI = model.index_head_dim;
    specs.push_back({"indexer.wq_b", S::Fp8Matrix, {HI * dI, q_lora}});
    specs.push_back({"indexer.weights_proj", S::Bf16Matrix, {HI, D}});
    add_compressor("indexer.compressor.", dI);
  }
  return specs;
}

std::string checkpoint_weight_name(int layer, const WeightSpec& spec) {
  const bool has_weight_suffix = spec.storage != WeightStorage::Float32;
  return "layers." + std::to_string(layer) + ".attn." + spec.suffix + (has_weight_suffix ? ".weight" : "");
}

void dequantize_block_e4m3(const std::uint8_t* codes, std::int64_t rows, std::int64_t cols, const float* scales,
                           float* out) {
  require(rows >= 0, "rows", "must be non-negative, got " + std::to_string(rows));
  require(cols >= 0, "cols", "must be non-negative, got " + std::to_string(cols));
  if (rows == 0 || cols == 0) return;
  require(codes != nullptr, "codes", "null pointer");
  require(scales != nullptr, "scales", "null pointer");
  require(out != nullptr, "out", "null pointer");
  const std::int64_t block_cols = ceil_div(cols, kWeightBlock);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* scale_row = scales + (r / kWeightBlock) * block_cols;  // [block_cols]
    for (std::int64_t c = 0; c < cols; ++c)
      out[r * cols + c] = float_from_e4m3(codes[r * cols + c]) * scale_row[c / kWeightBlock];
  }
}

namespace {
// One order for both constness variants (T = Tensor or const Tensor).
template <class T, class Weights>
std::vector<T*> tensors_in_spec_order(Weights& w) {
  std::vector<T*> tensors = {&w.wq_a, &w.q_norm, &w.wq_b, &w.wkv, &w.kv_norm, &w.wo_a, &w.wo_b, &w.attn_sink};
  const auto add_compressor = [&](auto& c) { tensors.insert(tensors.end(), {&c.wkv, &c.wgate, &c.ape, &c.norm}); };
  if (w.compressor) add_compressor(*w.compressor);
  if (w.indexer) {
    tensors.insert(tensors.end(), {&w.indexer->wq_b, &w.indexer->weights_proj});
    add_compressor(w.indexer->compressor);
  }
  return tensors;
}
}  // namespace

std::vector<Tensor*> layer_weight_tensors(LayerWeights& w) { return tensors_in_spec_order<Tensor>(w); }
std::vector<const Tensor*> layer_weight_tensors(const LayerWeights& w) { return tensors_in_spec_order<const Tensor>(w); }

LayerWeights load_layer_weights(const SafetensorsFile& file, const ModelConfig& model, int layer) {
  LayerWeights w;
  w.layer = layer_config(model, layer);
  if (w.layer.ratio > 0) w.compressor.emplace();
  if (layer_has_indexer(w.layer)) w.indexer.emplace();
  const auto specs = layer_weight_specs(model, layer);
  const std::vector<Tensor*> tensors = layer_weight_tensors(w);
  for (std::size_t i = 0; i < specs.size(); ++i) *tensors[i] = read_weight(file, layer, specs[i]);
  return w;
}

LayerWeights load_layer_weights(const std::string& path, const ModelConfig& model, int layer) {
  return load_layer_weights(SafetensorsFile::open(path), model, layer);
}

SafetensorsWriter random_layer_checkpoint(const ModelConfig& model, int layer, std::uint64_t seed) {
  SafetensorsWriter writer;
  writer.set_metadata("format", "dsv4-layer");
  writer.set_metadata("config", model.name);
  writer.set_metadata("layer", std::to_string(layer));
  writer.set_metadata("seed", std::to_string(seed));
  for (const auto& spec : layer_weight_specs(model, layer)) {
    const std::string name = checkpoint_weight_name(layer, spec);
    std::mt19937_64 rng(tensor_seed(seed, layer, name));
    const std::size_t n = static_cast<std::size_t>(shape_numel(spec.shape));
    std::vector<float> values(n);
    if (is_matrix(spec.storage)) {
      const bool gate = spec.suffix.ends_with("wgate");  // scores need a wider spread than values
      const double stddev = (gate ? 2.0 : 1.0) / std::sqrt(static_cast<double>(spec.shape[1]));
      std::normal_distribution<float> dist(0.0f, static_cast<float>(stddev));
      for (auto& v : values) v = dist(rng);
    } else if (spec.storage == WeightStorage::Norm) {
      std::normal_distribution<float> dist(1.0f, 0.1f);
      for (auto& v : values) v = dist(rng);
    } else {
      const bool sink = spec.suffix == "attn_sink";
      std::normal_distribution<float> dist(0.0f, sink ? 0.75f : 0.5f);
      for (auto& v : values) v = dist(rng);
    }

    if (spec.storage == WeightStorage::Fp8Matrix) {
      std::vector<std::uint8_t> codes, scale_bytes;
      quantize_block_e4m3(values, spec.shape[0], spec.shape[1], codes, scale_bytes);
      writer.add(name, DType::F8_E4M3, spec.shape, codes.data());
      writer.add("layers." + std::to_string(layer) + ".attn." + spec.suffix + ".scale", DType::F8_E8M0,
                 block_scale_shape(spec.shape), scale_bytes.data());
    } else if (spec.storage == WeightStorage::Float32) {
      writer.add(name, DType::F32, spec.shape, values.data());
    } else {
      std::vector<std::uint16_t> bits(n);
      for (std::size_t k = 0; k < n; ++k) bits[k] = bf16_bits_from_float(values[k]);
      writer.add(name, DType::BF16, spec.shape, bits.data());
    }
  }
  return writer;
}

}  // namespace dsv4
