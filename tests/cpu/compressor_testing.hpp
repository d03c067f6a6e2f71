// tests/cpu/compressor_testing.hpp — helpers shared by the compressor suites: specs, random
// streams, an independent straightforward implementation of SPEC §4, chunked runs, and byte
// snapshots of state and cache for "an error changes nothing" checks.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "dsv4/compressor.hpp"
#include "dsv4/formats.hpp"
#include "testing/testing.hpp"

namespace dsv4::compressor_testing {

// The YaRN table of the published compressor layers (SPEC §2).
inline RopeConfig yarn_rope() { return testing::published_compressed_rope(); }

inline CompressorSpec make_spec(int ratio, bool overlap, EntryKind output, bool online = false) {
  CompressorSpec spec;
  spec.ratio = ratio;
  spec.overlap = overlap;
  spec.online = online;
  spec.output = output;
  spec.width = output == EntryKind::Attention ? 512 : 128;
  spec.rope = yarn_rope();
  spec.eps = 1e-6;
  spec.max_positions = 1 << 20;
  return spec;
}

// A named compressor configuration for parameterized suites (CPU and GPU share the case type).
struct SpecCase {
  const char* name;
  int ratio;
  bool overlap;
  EntryKind output;
  bool online;
};
inline std::string spec_case_name(const ::testing::TestParamInfo<SpecCase>& info) { return info.param.name; }
inline CompressorSpec spec_of(const SpecCase& c) { return make_spec(c.ratio, c.overlap, c.output, c.online); }

// The model's compressors plus other ratios (nothing may hard-wire 4 or 128); suites add their own.
inline std::vector<SpecCase> model_and_other_ratio_cases() {
  return {
      {"C4Attention", 4, true, EntryKind::Attention, false},
      {"C4IndexerFP8", 4, true, EntryKind::IndexerFP8, false},
      {"C4IndexerFP4", 4, true, EntryKind::IndexerFP4, false},
      {"C128", 128, false, EntryKind::Attention, false},
      {"C128Online", 128, false, EntryKind::Attention, true},
      {"C2OverlapFP8", 2, true, EntryKind::IndexerFP8, false},
      {"C1Attention", 1, false, EntryKind::Attention, false},
      {"C8OnlineFP4", 8, false, EntryKind::IndexerFP4, true},
  };
}

// One request's inputs: T rows of kv and score (score without ape), ape and norm, random.
struct Stream {
  std::int64_t tokens = 0;
  int row_width = 0;
  std::vector<float> kv, score;  // [T, coff·c]
  std::vector<float> ape;        // [m, coff·c]
  std::vector<float> norm;       // [c]

  TensorView kv_rows(std::int64_t begin, std::int64_t count) const { return rows(kv, begin, count); }
  TensorView score_rows(std::int64_t begin, std::int64_t count) const { return rows(score, begin, count); }
  TensorView ape_view() const {
    return TensorView{const_cast<float*>(ape.data()), DType::F32,
                      {static_cast<std::int64_t>(ape.size()) / row_width, row_width}, Device::CPU};
  }
  TensorView norm_view() const {
    return TensorView{const_cast<float*>(norm.data()), DType::F32, {static_cast<std::int64_t>(norm.size())},
                      Device::CPU};
  }

 private:
  TensorView rows(const std::vector<float>& v, std::int64_t begin, std::int64_t count) const {
    return TensorView{const_cast<float*>(v.data()) + begin * row_width, DType::F32, {count, row_width}, Device::CPU};
  }
};

inline Stream random_stream(std::mt19937_64& rng, const CompressorSpec& spec, std::int64_t tokens) {
  Stream s;
  s.tokens = tokens;
  s.row_width = spec.row_width();
  const auto rows = static_cast<std::size_t>(tokens * spec.row_width());
  s.kv = testing::random_normal(rng, rows, 1.0f);
  s.score = testing::random_normal(rng, rows, 2.0f);  // wide enough that softmax weights differ a lot
  s.ape = testing::random_normal(rng, static_cast<std::size_t>(spec.ratio * spec.row_width()), 0.5f);
  s.norm = testing::random_floats(rng, static_cast<std::size_t>(spec.width), 0.5f, 1.5f);
  return s;
}

// Random chunk sizes summing to `total` (sizes up to `largest`, zero-sized chunks included).
inline std::vector<std::int64_t> random_chunks(std::mt19937_64& rng, std::int64_t total, std::int64_t largest) {
  std::vector<std::int64_t> chunks;
  std::uniform_int_distribution<std::int64_t> size(0, largest);
  for (std::int64_t left = total; left > 0;) {
    const std::int64_t n = std::min(left, size(rng));
    chunks.push_back(n);
    left -= n;
  }
  return chunks;
}

// ---- the independent formula (SPEC §4), written as plainly as possible -------------------------

// C_n for every complete block of the stream: [n_blocks, c], long double accumulation.
inline std::vector<float> naive_compressed(const CompressorSpec& spec, const Stream& s) {
  const int m = spec.ratio, c = spec.width, w = spec.row_width();
  const std::int64_t blocks = s.tokens / m;
  std::vector<float> out(static_cast<std::size_t>(blocks * c));
  for (std::int64_t n = 0; n < blocks; ++n) {
    for (int k = 0; k < c; ++k) {
      std::vector<long double> values, scores;
      const auto add = [&](std::int64_t p, int channel) {
        values.push_back(s.kv[static_cast<std::size_t>(p * w + channel)]);
        scores.push_back(static_cast<float>(s.score[static_cast<std::size_t>(p * w + channel)] +
                                            s.ape[static_cast<std::size_t>((p % m) * w + channel)]));
      };
      if (spec.overlap && n > 0)
        for (std::int64_t p = (n - 1) * m; p < n * m; ++p) add(p, k);  // b branch of block n−1
      for (std::int64_t p = n * m; p < n * m + m; ++p) add(p, spec.overlap ? c + k : k);
      const long double top = *std::max_element(scores.begin(), scores.end());
      long double num = 0, den = 0;
      for (std::size_t j = 0; j < values.size(); ++j) {
        num += std::exp(scores[j] - top) * values[j];
        den += std::exp(scores[j] - top);
      }
      out[static_cast<std::size_t>(n * c + k)] = static_cast<float>(num / den);
    }
  }
  return out;
}

// The post-processed values of one entry (SPEC §4), with its own RMSNorm, RoPE (angle from the
// float32 table rebuilt here) and an explicit Hadamard matrix.
inline std::vector<float> naive_postprocess(const CompressorSpec& spec, const std::vector<float>& norm,
                                            const float* compressed, std::int64_t position) {
  const int c = spec.width, r = spec.rope.rope_dim;
  std::vector<float> x(compressed, compressed + c);
  for (float& v : x) v = round_to_bf16(v);
  long double ss = 0;
  for (float v : x) ss += static_cast<long double>(v) * v;
  const long double inv = 1.0L / std::sqrt(ss / c + static_cast<long double>(spec.eps));
  for (int k = 0; k < c; ++k) x[static_cast<std::size_t>(k)] = round_to_bf16(static_cast<float>(norm[static_cast<std::size_t>(k)] * (x[static_cast<std::size_t>(k)] * inv)));
  // YaRN frequencies in float32 steps, as the serving code builds them.
  const RopeConfig& rc = spec.rope;
  const double lo = std::max(std::floor(r * std::log(rc.original_max_positions / (rc.beta_fast * 2 * std::numbers::pi)) / (2 * std::log(rc.base))), 0.0);
  const double hi = std::min(std::ceil(r * std::log(rc.original_max_positions / (rc.beta_slow * 2 * std::numbers::pi)) / (2 * std::log(rc.base))), r - 1.0);
  for (int i = 0; i < r / 2; ++i) {
    float f = 1.0f / static_cast<float>(std::pow(rc.base, static_cast<double>(static_cast<float>(2 * i) / static_cast<float>(r))));
    if (rc.yarn) {
      const float ramp = std::clamp((static_cast<float>(i) - static_cast<float>(lo)) / static_cast<float>(hi - lo), 0.0f, 1.0f);
      const float scaled = f / static_cast<float>(rc.factor) * ramp;
      const float kept = f * (1.0f - ramp);
      f = scaled + kept;
    }
    const float theta = static_cast<float>(position) * f;
    const double cs = static_cast<float>(std::cos(static_cast<double>(theta)));
    const double sn = static_cast<float>(std::sin(static_cast<double>(theta)));
    float& a = x[static_cast<std::size_t>(c - r + 2 * i)];
    float& b = x[static_cast<std::size_t>(c - r + 2 * i + 1)];
    const double a0 = a, b0 = b;
    a = round_to_bf16(static_cast<float>(a0 * cs - b0 * sn));
    b = round_to_bf16(static_cast<float>(a0 * sn + b0 * cs));
  }
  if (spec.output != EntryKind::Attention) {
    std::vector<float> y(static_cast<std::size_t>(c));
    for (int i = 0; i < c; ++i) {
      long double acc = 0;
      for (int j = 0; j < c; ++j) acc += (__builtin_popcount(static_cast<unsigned>(i & j)) % 2 ? -1.0L : 1.0L) * x[static_cast<std::size_t>(j)];
      y[static_cast<std::size_t>(i)] = round_to_bf16(static_cast<float>(acc / std::sqrt(static_cast<long double>(c))));
    }
    x = y;
  }
  return x;
}

// ---- running a stream ---------------------------------------------------------------------------

struct RunResult {
  std::vector<float> compressed;                  // [n, c] in entry order
  std::vector<std::uint8_t> cache;                // the whole cache pool
  std::vector<std::vector<std::uint8_t>> entries; // gathered bytes per entry
};

// Feeds `s` through a SingleRequestCompressor in `chunks` (sum = s.tokens).
inline RunResult run_chunks(const CompressorSpec& spec, const Stream& s, const std::vector<std::int64_t>& chunks,
                            int page_size = 256) {
  SingleRequestCompressor comp(spec, s.ape_view(), s.norm_view(), s.tokens, page_size);
  RunResult out;
  std::int64_t at = 0;
  for (std::int64_t n : chunks) {
    const auto appended = comp.append(s.kv_rows(at, n), s.score_rows(at, n));
    const float* p = appended.compressed.data_as<const float>();
    out.compressed.insert(out.compressed.end(), p, p + appended.compressed.numel());
    at += n;
  }
  EXPECT_EQ(at, s.tokens) << "chunks must cover the stream";
  out.cache = comp.cache().host_bytes();
  for (std::int64_t e = 0; e < comp.num_entries(); ++e) out.entries.push_back(comp.entry_bytes(e));
  return out;
}

// max |got − want| / max |want|: the normwise relative error of a tensor. (Elementwise relative
// error is meaningless for a convex combination that cancels to nearly zero.)
inline double normwise_error(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0, scale = 0;
  for (float v : want) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]));
  return scale > 0 ? worst / scale : worst;
}

// Distance between two encodings of one value: codes of the same sign compare by magnitude order
// (e4m3, e2m1 and bf16 codes increase with magnitude); opposite signs count as far apart unless
// both are zero.
inline int code_steps(unsigned a, unsigned b, unsigned sign_bit) {
  const unsigned ma = a & (sign_bit - 1), mb = b & (sign_bit - 1);
  if ((a & sign_bit) != (b & sign_bit) && !(ma == 0 && mb == 0)) return static_cast<int>(ma + mb);
  return std::abs(static_cast<int>(ma) - static_cast<int>(mb));
}

struct EntryDiff {
  int values = 0;      // values compared
  int different = 0;   // values whose code differs
  int max_steps = 0;   // largest code distance
};

// Compares two gathered entries value by value (README byte order).
inline EntryDiff compare_entry(const EntryLayout& layout, const std::uint8_t* got, const std::uint8_t* want) {
  EntryDiff d;
  const auto note = [&](int steps) {
    ++d.values;
    if (steps) ++d.different;
    d.max_steps = std::max(d.max_steps, steps);
  };
  switch (layout.kind) {
    case EntryKind::Attention: {
      for (int k = 0; k < 448; ++k) note(code_steps(got[k], want[k], 0x80));
      for (int k = 0; k < 64; ++k) {
        const unsigned g = got[448 + 2 * k] | (got[449 + 2 * k] << 8), w = want[448 + 2 * k] | (want[449 + 2 * k] << 8);
        note(code_steps(g, w, 0x8000));
      }
      for (int k = 576; k < 584; ++k) note(std::abs(got[k] - want[k]));
      break;
    }
    case EntryKind::IndexerFP8: {
      for (int k = 0; k < layout.dim; ++k) note(code_steps(got[k], want[k], 0x80));
      float g, w;
      std::memcpy(&g, got + layout.dim, 4);
      std::memcpy(&w, want + layout.dim, 4);
      note(g == w ? 0 : (std::fabs(g - w) <= 1e-6f * std::fabs(w) ? 1 : 99));
      break;
    }
    case EntryKind::IndexerFP4: {
      for (int k = 0; k < layout.dim; ++k) {
        const unsigned g = (got[k / 2] >> (4 * (k % 2))) & 0xf, w = (want[k / 2] >> (4 * (k % 2))) & 0xf;
        note(code_steps(g, w, 0x8));
      }
      for (int k = layout.dim / 2; k < layout.entry_bytes(); ++k) note(std::abs(got[k] - want[k]));
      break;
    }
  }
  return d;
}

// Everything a failed call must leave as it was: state bytes, token counts, cache bytes.
struct Snapshot {
  std::vector<std::uint8_t> state, cache;
  std::vector<std::int64_t> tokens, floors;
  std::vector<bool> in_use;
  static Snapshot of(const CompressorStatePool& pool, const PagedCache& cache) {
    Snapshot s;
    const auto* p = pool.storage().data_as<const std::uint8_t>();
    s.state.assign(p, p + pool.storage().nbytes());
    s.cache = cache.host_bytes();
    for (int slot = 0; slot < pool.num_slots(); ++slot) {
      s.tokens.push_back(pool.tokens(slot));
      s.floors.push_back(pool.rollback_floor(slot));
      s.in_use.push_back(pool.in_use(slot));
    }
    return s;
  }
  bool operator==(const Snapshot&) const = default;
};

}  // namespace dsv4::compressor_testing
