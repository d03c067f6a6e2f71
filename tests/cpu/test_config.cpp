// Model configuration (SPEC §2): the shared config.json files parse to the expected fields, the
// presets are valid, every missing / ill-typed / invalid key is named in its error, and
// layer_config picks ratio, overlap and the RoPE table per layer.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "dsv4/config.hpp"
#include "dsv4/error.hpp"
#include "testing/testing.hpp"

namespace dsv4 {
namespace {

using Json = nlohmann::json;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

Json flash_json() { return Json::parse(read_text(testing::vector_path("flash_config.json"))); }

// Expects parse_model_config(json) to throw Error whose argument is `key` (and whose message
// contains `text` when given).
void expect_key_error(const Json& json, const std::string& key, const std::string& text = "") {
  try {
    (void)parse_model_config(json.dump(), "edited.json");
    ADD_FAILURE() << "no error for key " << key;
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), key) << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what() << "\nexpected: " << text;
  }
}

std::vector<int> count_ratios(const ModelConfig& c) {
  std::vector<int> counts(3);  // ratio 0, 4, 128
  for (int r : c.compress_ratios) counts[r == 0 ? 0 : r == 4 ? 1 : 2]++;
  return counts;
}

TEST(Config, FlashJsonParsesToThePublishedValues) {
  const ModelConfig c = load_model_config(testing::vector_path("flash_config.json"));
  EXPECT_EQ(c.name, testing::vector_path("flash_config.json"));
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_heads, 64);
  EXPECT_EQ(c.head_dim, 512);
  EXPECT_EQ(c.rope_dim, 64);
  EXPECT_EQ(c.q_lora_rank, 1024);
  EXPECT_EQ(c.o_lora_rank, 1024);
  EXPECT_EQ(c.o_groups, 8);
  EXPECT_EQ(c.window, 128);
  EXPECT_EQ(c.index_heads, 64);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_topk, 512);
  EXPECT_EQ(c.num_layers(), 44);  // 43 layers + the MTP layer
  EXPECT_EQ(count_ratios(c), (std::vector<int>{3, 21, 20}));
  EXPECT_EQ(c.compress_ratios[0], 0);
  EXPECT_EQ(c.compress_ratios[2], 4);
  EXPECT_EQ(c.compress_ratios[3], 128);
  EXPECT_EQ(c.compress_ratios.back(), 0);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.compress_rope_theta, 160000.0);
  EXPECT_TRUE(c.yarn);
  EXPECT_EQ(c.yarn_factor, 16.0);
  EXPECT_EQ(c.yarn_original_max_positions, 65536.0);
  EXPECT_EQ(c.yarn_beta_fast, 32.0);
  EXPECT_EQ(c.yarn_beta_slow, 1.0);
  EXPECT_EQ(c.rms_eps, 1e-6);
  EXPECT_EQ(c.max_positions, 1048576);
  EXPECT_EQ(c.page_size, 256);

  ModelConfig preset = preset_config("flash");
  preset.name = c.name;
  EXPECT_EQ(c, preset) << "the flash preset must equal flash_config.json";
}

TEST(Config, SmallJsonParsesToItsValues) {
  const ModelConfig c = load_model_config(testing::vector_path("small_config.json"));
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.num_heads, 16);
  EXPECT_EQ(c.head_dim, 512);
  EXPECT_EQ(c.rope_dim, 64);
  EXPECT_EQ(c.q_lora_rank, 256);
  EXPECT_EQ(c.o_lora_rank, 256);
  EXPECT_EQ(c.o_groups, 4);
  EXPECT_EQ(c.window, 32);
  EXPECT_EQ(c.index_heads, 16);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_topk, 64);
  EXPECT_EQ(c.compress_ratios, (std::vector<int>{0, 4, 128, 0}));
  EXPECT_TRUE(c.yarn);
  EXPECT_EQ(c.yarn_factor, 16.0);
  EXPECT_EQ(c.compress_rope_theta, 160000.0);
  EXPECT_EQ(c.max_positions, 1048576);
}

TEST(Config, PresetsAreValidAndShaped) {
  for (const auto& name : preset_names()) {
    const ModelConfig c = preset_config(name);
    EXPECT_EQ(c.name, name);
    EXPECT_NO_THROW(validate_model_config(c)) << name;
    EXPECT_EQ(load_model_config(name), c) << name;
    // Every preset shares the published RoPE, YaRN, eps and position limit.
    EXPECT_EQ(c.head_dim, 512);
    EXPECT_EQ(c.rope_dim, 64);
    EXPECT_TRUE(c.yarn);
    EXPECT_EQ(c.yarn_factor, 16.0);
    EXPECT_EQ(c.rms_eps, 1e-6);
    EXPECT_EQ(c.max_positions, 1048576);
    EXPECT_EQ(c.page_size, 256);
  }
  const ModelConfig pro = preset_config("pro");
  EXPECT_EQ(pro.hidden_size, 7168);
  EXPECT_EQ(pro.num_heads, 128);
  EXPECT_EQ(pro.q_lora_rank, 1536);
  EXPECT_EQ(pro.o_groups, 16);
  EXPECT_EQ(pro.o_lora_rank, 1024);
  EXPECT_EQ(pro.index_topk, 1024);
  EXPECT_EQ(pro.index_heads, 64);
  EXPECT_EQ(pro.index_head_dim, 128);
  EXPECT_EQ(pro.window, 128);
  EXPECT_EQ(pro.num_layers(), 62);  // 61 layers + the MTP layer
  EXPECT_EQ(count_ratios(pro), (std::vector<int>{1, 30, 31}));
  EXPECT_EQ((std::vector<int>(pro.compress_ratios.begin(), pro.compress_ratios.begin() + 4)),
            (std::vector<int>{128, 128, 4, 128}));
  EXPECT_EQ(pro.compress_ratios[60], 4);
  EXPECT_EQ(pro.compress_ratios[61], 0);

  const ModelConfig tiny = preset_config("tiny");
  EXPECT_EQ(tiny.hidden_size, 256);
  EXPECT_EQ(tiny.num_heads, 8);
  EXPECT_EQ(tiny.q_lora_rank, 128);
  EXPECT_EQ(tiny.o_lora_rank, 128);
  EXPECT_EQ(tiny.o_groups, 2);
  EXPECT_EQ(tiny.window, 16);
  EXPECT_EQ(tiny.index_heads, 8);
  EXPECT_EQ(tiny.index_head_dim, 128);
  EXPECT_EQ(tiny.index_topk, 16);
  EXPECT_EQ(tiny.compress_ratios, (std::vector<int>{0, 4, 128, 4}));
}

TEST(Config, UnknownPresetOrPathIsAConfigError) {
  for (const std::string& bad : std::vector<std::string>{"Flash", "huge", testing::temp_dir() + "/absent.json"}) {
    try {
      (void)load_model_config(bad);
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "config") << e.what();
      EXPECT_NE(std::string(e.what()).find("neither a preset"), std::string::npos) << e.what();
    }
  }
  try {
    (void)preset_config("huge");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "config");
  }
  const std::string path = testing::temp_dir() + "/broken.json";
  std::ofstream(path) << "{\"hidden_size\": ";
  try {
    (void)load_model_config(path);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "config");
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos) << e.what();
  }
  try {
    (void)parse_model_config("[1, 2]");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "config");
  }
}

const char* const kRequiredKeys[] = {
    "hidden_size",    "num_attention_heads", "head_dim",   "qk_rope_head_dim", "q_lora_rank",
    "o_lora_rank",    "o_groups",            "sliding_window", "index_n_heads", "index_head_dim",
    "index_topk",     "compress_ratios",     "rope_theta", "compress_rope_theta", "rms_norm_eps",
    "max_position_embeddings"};

TEST(Config, MissingKeysAreNamed) {
  for (const char* key : kRequiredKeys) {
    Json json = flash_json();
    json.erase(key);
    expect_key_error(json, key, "missing from edited.json");
  }
  for (const char* key : {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "type"}) {
    Json json = flash_json();
    json["rope_scaling"].erase(key);
    expect_key_error(json, std::string("rope_scaling.") + key, "missing");
  }
}

TEST(Config, IllTypedKeysAreNamed) {
  for (const char* key : kRequiredKeys) {
    for (const Json& bad : {Json("4"), Json(nullptr), Json::array({1}), Json::object()}) {
      if (bad.is_array() && std::string(key) == "compress_ratios") continue;  // the right type
      Json json = flash_json();
      json[key] = bad;
      expect_key_error(json, key, "expected");
    }
  }
  const char* integer_keys[] = {"hidden_size", "num_attention_heads", "head_dim", "index_topk", "o_groups"};
  for (const char* key : integer_keys) {
    Json json = flash_json();
    json[key] = 64.5;
    expect_key_error(json, key, "expected an integer");
    json[key] = 1e12;  // a float even when integral: config.json integers are written as integers
    expect_key_error(json, key, "expected an integer");
    json[key] = std::int64_t{1} << 40;
    expect_key_error(json, key, "out of range");
  }
  Json json = flash_json();
  json["compress_ratios"][5] = "4";
  expect_key_error(json, "compress_ratios", "expected an integer");
  json = flash_json();
  json["rope_scaling"] = "yarn";
  expect_key_error(json, "rope_scaling", "expected an object or null");
  json = flash_json();
  json["rope_scaling"]["factor"] = "16";
  expect_key_error(json, "rope_scaling.factor", "expected a number");
  json = flash_json();
  json["rope_scaling"]["type"] = "linear";
  expect_key_error(json, "rope_scaling.type", "only \"yarn\" is supported");
}

TEST(Config, InvalidValuesAreNamed) {
  struct Case {
    const char* key;
    Json value;
    const char* message;
  };
  const Case cases[] = {
      {"hidden_size", 0, "must be in [1, "},
      {"num_attention_heads", -64, "must be in [1, 4096]"},
      {"num_attention_heads", 100000, "must be in [1, 4096]"},
      {"hidden_size", 1 << 20, "must be in [1, 65536]"},
      {"q_lora_rank", 1 << 20, "must be in [1, 65536]"},
      {"o_lora_rank", 1 << 17, "must be in [1, 65536]"},
      {"sliding_window", 1 << 21, "must be in [1, 1048576]"},
      {"index_n_heads", 5000, "must be in [1, 4096]"},
      {"q_lora_rank", 0, "must be in [1, "},
      {"o_lora_rank", 0, "must be in [1, "},
      {"o_groups", 0, "must be positive"},
      {"sliding_window", 0, "must be in [1, "},
      {"index_n_heads", 0, "must be in [1, "},
      {"max_position_embeddings", 0, "must be positive"},
      {"max_position_embeddings", std::int64_t{1} << 31, "must fit a 32-bit position"},
      {"head_dim", 256, "584-byte FP8 cache entry"},
      {"head_dim", 0, "must be positive"},
      {"qk_rope_head_dim", 32, "584-byte FP8 cache entry"},
      {"qk_rope_head_dim", 63, "must be even"},
      {"qk_rope_head_dim", 512, "smaller than head_dim"},
      {"o_groups", 5, "does not divide num_attention_heads 64"},
      {"index_head_dim", 96, "power of two"},
      {"index_head_dim", 16, "multiple of 32"},
      {"index_head_dim", 64, "larger than qk_rope_head_dim"},
      {"index_topk", 0, "[1, 2048]"},
      {"index_topk", 2049, "top-k kernel limit"},
      {"compress_ratios", Json::array(), "at least one layer"},
      {"compress_ratios", Json::array({0, -4, 128}), "entry 1 is negative"},
      {"compress_ratios", Json::array({0, 4, 3}), "entry 2 (3) does not divide page_size 256"},
      {"compress_ratios", Json::array({0, 512}), "does not divide page_size"},
      {"rms_norm_eps", 0.0, "positive"},
      {"rope_theta", 1.0, "above 1"},
      {"compress_rope_theta", -5, "above 1"},
  };
  for (const auto& c : cases) {
    Json json = flash_json();
    json.erase("num_hidden_layers");  // so compress_ratios may change length
    json[c.key] = c.value;
    expect_key_error(json, c.key, c.message);
  }
  const Case yarn_cases[] = {
      {"factor", 0.5, "at least 1"},
      {"original_max_position_embeddings", 0, "positive"},
      {"beta_slow", 0, "positive"},
      {"beta_fast", 1, "above beta_slow"},
  };
  for (const auto& c : yarn_cases) {
    Json json = flash_json();
    json["rope_scaling"][c.key] = c.value;
    expect_key_error(json, std::string("rope_scaling.") + c.key, c.message);
  }
}

TEST(Config, LayerCountMustMatchHiddenPlusMtpLayers) {
  Json json = flash_json();
  json["compress_ratios"].erase(json["compress_ratios"].size() - 1);
  expect_key_error(json, "compress_ratios", "has 43 entries, expected num_hidden_layers + num_nextn_predict_layers = 44");
  json.erase("num_nextn_predict_layers");  // without both counts, any length is accepted
  EXPECT_EQ(parse_model_config(json.dump()).num_layers(), 43);
}

TEST(Config, RopeScalingMayBeAbsentOrNull) {
  for (bool erase : {true, false}) {
    Json json = flash_json();
    if (erase) {
      json.erase("rope_scaling");
    } else {
      json["rope_scaling"] = nullptr;
    }
    const ModelConfig c = parse_model_config(json.dump());
    EXPECT_FALSE(c.yarn);
    const LayerConfig compressed = layer_config(c, 2);
    EXPECT_EQ(compressed.rope.base, 160000.0);
    EXPECT_FALSE(compressed.rope.yarn);
  }
  Json json = flash_json();
  json["rope_scaling"].erase("type");
  json["rope_scaling"]["rope_type"] = "yarn";  // the newer spelling
  EXPECT_TRUE(parse_model_config(json.dump()).yarn);
}

TEST(Config, ValidationNamesPageSizeAndFields) {
  ModelConfig c = preset_config("tiny");
  c.page_size = 0;
  try {
    validate_model_config(c);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "page_size");
  }
  c.page_size = 100;  // a multiple of 4, not of 128
  try {
    validate_model_config(c);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "compress_ratios");
    EXPECT_NE(std::string(e.what()).find("(128) does not divide page_size 100"), std::string::npos) << e.what();
  }
  c.page_size = 128;
  EXPECT_NO_THROW(validate_model_config(c));
}

TEST(Config, LayerConfigPicksRatioOverlapAndRope) {
  const ModelConfig c = preset_config("flash");
  const LayerConfig swa = layer_config(c, 0);
  EXPECT_EQ(swa.index, 0);
  EXPECT_EQ(swa.ratio, 0);
  EXPECT_FALSE(swa.overlap);
  EXPECT_EQ(swa.coff(), 1);
  EXPECT_EQ(swa.rope.base, 10000.0);
  EXPECT_FALSE(swa.rope.yarn);
  EXPECT_EQ(swa.rope.rope_dim, 64);

  const LayerConfig csa = layer_config(c, 2);
  EXPECT_EQ(csa.ratio, 4);
  EXPECT_TRUE(csa.overlap);
  EXPECT_EQ(csa.coff(), 2);
  EXPECT_EQ(csa.rope.base, 160000.0);
  EXPECT_TRUE(csa.rope.yarn);
  EXPECT_EQ(csa.rope.factor, 16.0);
  EXPECT_EQ(csa.rope.original_max_positions, 65536.0);
  EXPECT_EQ(csa.rope.beta_fast, 32.0);
  EXPECT_EQ(csa.rope.beta_slow, 1.0);

  const LayerConfig hca = layer_config(c, 3);
  EXPECT_EQ(hca.ratio, 128);
  EXPECT_FALSE(hca.overlap);
  EXPECT_EQ(hca.coff(), 1);
  EXPECT_EQ(hca.rope, csa.rope) << "both compressed kinds share the compressed table";

  // Ratios other than 4 and 128 are parameters too: overlap only for 4.
  ModelConfig other = c;
  other.compress_ratios = {2, 1, 4};
  EXPECT_FALSE(layer_config(other, 0).overlap);
  EXPECT_EQ(layer_config(other, 1).ratio, 1);
  EXPECT_TRUE(layer_config(other, 2).overlap);

  for (int bad : {-1, c.num_layers()}) {
    try {
      (void)layer_config(c, bad);
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "layer");
    }
  }
}

}  // namespace
}  // namespace dsv4
