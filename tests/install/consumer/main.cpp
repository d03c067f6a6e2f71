// Uses the installed library: a preset config, a compressor over random rows, one cache entry.
#include <cstdio>
#include <random>
#include <vector>

#include "dsv4/compressor.hpp"
#include "dsv4/config.hpp"

int main() {
  const dsv4::ModelConfig model = dsv4::preset_config("tiny");
  const dsv4::CompressorSpec spec = dsv4::CompressorSpec::for_layer(model, 2);  // the HCA layer
  const std::int64_t T = 2 * spec.ratio;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  auto fill = [&](std::vector<float>& v) { for (auto& x : v) x = normal(rng); };
  std::vector<float> kv(static_cast<std::size_t>(T * spec.row_width())), score(kv.size()),
      ape(static_cast<std::size_t>(spec.ratio * spec.row_width())), norm(static_cast<std::size_t>(spec.width), 1.0f);
  fill(kv);
  fill(score);
  fill(ape);
  using dsv4::DType;
  dsv4::SingleRequestCompressor compressor(
      spec, {ape.data(), DType::F32, {spec.ratio, spec.row_width()}}, {norm.data(), DType::F32, {spec.width}}, T,
      model.page_size);
  compressor.append({kv.data(), DType::F32, {T, spec.row_width()}}, {score.data(), DType::F32, {T, spec.row_width()}});
  std::printf("entries: %lld, first entry %zu bytes\n", static_cast<long long>(compressor.num_entries()),
              compressor.entry_bytes(0).size());
  return compressor.num_entries() == 2 ? 0 : 1;
}
