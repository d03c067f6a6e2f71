// safetensors reader and writer: round trips of every dtype, metadata, empty tensors, the shared
// vector files, every malformed-file rule of include/dsv4/safetensors.hpp with its message, and a
// randomized mutation test (valid files, randomly damaged, must parse consistently or throw Error).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "dsv4/formats.hpp"
#include "dsv4/safetensors.hpp"
#include "fuzz/safetensors_consistency.hpp"
#include "testing/testing.hpp"

namespace dsv4 {
namespace {

using Bytes = std::vector<std::byte>;

constexpr DType kAllDtypes[] = {DType::F64, DType::F32,     DType::F16,     DType::BF16, DType::F8_E4M3,
                                DType::F8_E8M0, DType::U8, DType::I8, DType::I32, DType::I64};

Bytes random_bytes(std::mt19937_64& rng, std::size_t n) {
  Bytes out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng() & 0xff);
  return out;
}

// A file image with the given header text (its length field set to the text's size unless
// `header_length` overrides it) followed by `data`.
Bytes image_with_header(const std::string& header, const Bytes& data = {},
                        std::optional<std::uint64_t> header_length = std::nullopt) {
  Bytes image(8 + header.size() + data.size());
  const std::uint64_t length = header_length.value_or(header.size());
  std::memcpy(image.data(), &length, 8);
  std::memcpy(image.data() + 8, header.data(), header.size());
  if (!data.empty()) std::memcpy(image.data() + 8 + header.size(), data.data(), data.size());
  return image;
}

std::string header_text(const Bytes& image) {
  std::uint64_t length = 0;
  std::memcpy(&length, image.data(), 8);
  return std::string(reinterpret_cast<const char*>(image.data()) + 8, length);
}

// float16 bits → value, written independently of the reader (sign, 5-bit exponent, 10-bit mantissa).
double f16_value(std::uint16_t bits) {
  const double sign = (bits & 0x8000) ? -1.0 : 1.0;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  if (exponent == 31) return mantissa ? NAN : sign * INFINITY;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

// The float value read_float must produce for element `i` of `bytes` stored as `dtype`.
float expected_float(DType dtype, const Bytes& bytes, std::size_t i) {
  auto load = [&](auto sample) {
    std::memcpy(&sample, bytes.data() + i * sizeof(sample), sizeof(sample));
    return sample;
  };
  switch (dtype) {
    case DType::F64: return static_cast<float>(load(double{}));
    case DType::F32: return load(float{});
    case DType::F16: return static_cast<float>(f16_value(load(std::uint16_t{})));
    case DType::BF16: return float_from_bf16_bits(load(std::uint16_t{}));
    case DType::F8_E4M3: return float_from_e4m3(load(std::uint8_t{}));
    case DType::F8_E8M0: {
      const auto e = load(std::uint8_t{});
      return e == 0xff ? NAN : static_cast<float>(std::ldexp(1.0, e - 127));
    }
    case DType::U8: return load(std::uint8_t{});
    case DType::I8: return load(std::int8_t{});
    case DType::I32: return static_cast<float>(load(std::int32_t{}));
    case DType::I64: return static_cast<float>(load(std::int64_t{}));
  }
  return NAN;
}

void expect_same_float(float actual, float expected, const std::string& where) {
  if (std::isnan(expected)) {
    EXPECT_TRUE(std::isnan(actual)) << where;
  } else {
    EXPECT_EQ(actual, expected) << where;
  }
}

// Runs `action`, expects dsv4::Error with argument `argument` and a message containing `text`.
template <class Action>
void expect_error(Action action, const std::string& argument, const std::string& text) {
  try {
    action();
    ADD_FAILURE() << "no error; expected one containing \"" << text << "\"";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << "message: " << e.what() << "\nexpected: " << text;
  }
}

// A rejected in-memory image: the error names the image ("bad") and contains `text`.
void expect_rejected(const Bytes& image, const std::string& text) {
  expect_error([&] { (void)SafetensorsFile::from_bytes(image, "bad"); }, "bad", text);
}

Shape random_shape(std::mt19937_64& rng, int max_rank, int max_extent) {
  Shape shape(rng() % static_cast<unsigned>(max_rank + 1));
  for (auto& extent : shape) extent = static_cast<std::int64_t>(rng() % static_cast<unsigned>(max_extent + 1));
  return shape;
}

std::size_t byte_size(DType dtype, const Shape& shape) {
  return static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
}

// ---- round trips -----------------------------------------------------------------------------

TEST(SafetensorsRoundTrip, EveryDtypeThroughFileAndMemory) {
  std::mt19937_64 rng(testing::fresh_seed());
  SafetensorsWriter writer;
  std::map<std::string, std::pair<DType, Shape>> layout;
  std::map<std::string, Bytes> contents;
  for (DType dtype : kAllDtypes) {
    const std::string name = "tensor_" + std::string(dtype_name(dtype));
    const Shape shape = {static_cast<std::int64_t>(1 + rng() % 5), static_cast<std::int64_t>(1 + rng() % 7)};
    Bytes bytes = random_bytes(rng, byte_size(dtype, shape));
    writer.add(name, dtype, shape, bytes.data());
    layout[name] = {dtype, shape};
    contents[name] = std::move(bytes);
  }
  const std::string path = testing::temp_dir() + "/all.safetensors";
  writer.write(path);
  std::vector<SafetensorsFile> files;
  files.push_back(SafetensorsFile::open(path));
  files.push_back(SafetensorsFile::from_bytes(writer.to_bytes(), "memory"));
  for (const auto& file : files) {
    ASSERT_EQ(file.names().size(), layout.size());
    for (const auto& [name, dtype_shape] : layout) {
      const auto& [dtype, shape] = dtype_shape;
      const Bytes& bytes = contents[name];
      const auto& info = file.info(name);
      EXPECT_EQ(info.dtype, dtype) << name;
      EXPECT_EQ(info.shape, shape) << name;
      ASSERT_EQ(info.bytes.size(), bytes.size()) << name;
      EXPECT_EQ(std::memcmp(info.bytes.data(), bytes.data(), bytes.size()), 0) << name;

      const Tensor raw = file.read_raw(name, dtype, shape);
      EXPECT_EQ(std::memcmp(raw.data(), bytes.data(), bytes.size()), 0) << name;
      const Tensor values = file.read_float(name, {-1, shape[1]});
      ASSERT_EQ(values.numel(), shape_numel(shape));
      for (std::size_t i = 0; i < static_cast<std::size_t>(values.numel()); ++i) {
        expect_same_float(values.data_as<float>()[i], expected_float(dtype, bytes, i), name + "[" + std::to_string(i) + "]");
      }
    }
  }
}

TEST(SafetensorsRoundTrip, F16ConversionIsExactForEveryCode) {
  std::vector<std::uint16_t> codes(65536);
  for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<std::uint16_t>(i);
  SafetensorsWriter writer;
  writer.add("codes", DType::F16, {65536}, codes.data());
  const auto file = SafetensorsFile::from_bytes(writer.to_bytes());
  const Tensor values = file.read_float("codes");
  for (std::size_t i = 0; i < codes.size(); ++i) {
    const double expected = f16_value(codes[i]);
    const float actual = values.data_as<float>()[i];
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(actual)) << i;
    } else {
      EXPECT_EQ(static_cast<double>(actual), expected) << "code " << i;
      EXPECT_EQ(std::signbit(actual), (i & 0x8000) != 0) << "code " << i;
    }
  }
}

TEST(SafetensorsRoundTrip, IntegersReadAsInt32WithRangeCheck) {
  std::mt19937_64 rng(testing::fresh_seed());
  std::vector<std::int64_t> small(17);
  for (auto& v : small) v = static_cast<std::int64_t>(rng() % 2000000) - 1000000;
  std::vector<std::int32_t> as_i32(small.begin(), small.end());
  std::vector<std::int64_t> large = small;
  large[rng() % large.size()] = std::int64_t{1} << 31;  // one element just past int32
  SafetensorsWriter writer;
  writer.add("small", DType::I64, {17}, small.data());
  writer.add("i32", DType::I32, {17}, as_i32.data());
  writer.add("large", DType::I64, {17}, large.data());
  const auto file = SafetensorsFile::from_bytes(writer.to_bytes(), "ints");
  for (const char* name : {"small", "i32"}) {
    const Tensor t = file.read_int32(name, {17});
    EXPECT_EQ(t.dtype(), DType::I32);
    EXPECT_EQ(std::memcmp(t.data(), as_i32.data(), as_i32.size() * 4), 0) << name;
  }
  expect_error([&] { (void)file.read_int32("large"); }, "large", "outside the int32 range");
}

TEST(SafetensorsRoundTrip, MetadataAndHeaderLayout) {
  std::mt19937_64 rng(testing::fresh_seed());
  SafetensorsWriter writer;
  writer.set_metadata("config", "flash_config.json");
  writer.set_metadata("note", "ünïcode ✓ and \"quotes\"");
  writer.set_metadata("note", "replaced");
  // Insertion order deliberately not sorted.
  const std::vector<std::string> order = {"zeta", "alpha", "mid.dle", "beta"};
  std::vector<Bytes> data;
  for (const auto& name : order) {
    data.push_back(random_bytes(rng, 4 * (1 + rng() % 9)));
    writer.add(name, DType::F32, {static_cast<std::int64_t>(data.back().size() / 4)}, data.back().data());
  }
  const Bytes image = writer.to_bytes();
  const std::string header = header_text(image);
  EXPECT_EQ(header.size() % 8, 0u);
  EXPECT_EQ(header.front(), '{');
  const auto last_brace = header.find_last_of('}');
  EXPECT_EQ(header.find_first_not_of(' ', last_brace + 1), std::string::npos) << "padding must be spaces";
  EXPECT_GE(last_brace + 8, header.size()) << "at most 7 padding bytes";
  // Metadata first, then the tensors in insertion order; data contiguous in the same order.
  std::size_t previous = header.find("__metadata__");
  EXPECT_NE(previous, std::string::npos);
  std::size_t offset = 0;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const auto position = header.find("\"" + order[i] + "\"");
    EXPECT_GT(position, previous) << order[i];
    previous = position;
    EXPECT_EQ(std::memcmp(image.data() + 8 + header.size() + offset, data[i].data(), data[i].size()), 0) << order[i];
    offset += data[i].size();
  }
  EXPECT_EQ(image.size(), 8 + header.size() + offset);

  const auto file = SafetensorsFile::from_bytes(image);
  const std::map<std::string, std::string> expected = {{"config", "flash_config.json"}, {"note", "replaced"}};
  EXPECT_EQ(file.metadata(), expected);
  EXPECT_EQ(file.names(), (std::vector<std::string>{"alpha", "beta", "mid.dle", "zeta"}));
}

TEST(SafetensorsRoundTrip, EmptyTensorsScalarsAndEmptyFiles) {
  std::mt19937_64 rng(testing::fresh_seed());
  const float scalar = std::uniform_real_distribution<float>(-5.0f, 5.0f)(rng);
  const Bytes tail = random_bytes(rng, 12);
  SafetensorsWriter writer;
  writer.add("empty_first", DType::F32, {0}, nullptr);
  writer.add("scalar", DType::F32, {}, &scalar);
  writer.add("empty_middle", DType::BF16, {3, 0, 2}, nullptr);
  writer.add("tail", DType::U8, {12}, tail.data());
  writer.add("empty_last", DType::I64, {0, 5}, nullptr);
  const auto file = SafetensorsFile::from_bytes(writer.to_bytes());
  EXPECT_EQ(file.info("empty_middle").shape, (Shape{3, 0, 2}));
  EXPECT_EQ(file.info("empty_middle").bytes.size(), 0u);
  EXPECT_EQ(file.read_float("empty_middle").numel(), 0);
  EXPECT_EQ(file.read_int32("empty_last", {0, 5}).numel(), 0);
  EXPECT_EQ(file.info("scalar").shape, Shape{});
  EXPECT_EQ(file.read_float("scalar").data_as<float>()[0], scalar);
  EXPECT_EQ(std::memcmp(file.read_raw("tail", DType::U8).data(), tail.data(), tail.size()), 0);

  SafetensorsWriter only_empty;
  only_empty.add("nothing", DType::F32, {0, 0}, nullptr);
  const auto empty_data = SafetensorsFile::from_bytes(only_empty.to_bytes());
  EXPECT_EQ(empty_data.names(), std::vector<std::string>{"nothing"});

  const std::string path = testing::temp_dir() + "/none.safetensors";
  SafetensorsWriter().write(path);
  const auto no_tensors = SafetensorsFile::open(path);
  EXPECT_TRUE(no_tensors.names().empty());
  EXPECT_TRUE(no_tensors.metadata().empty());
}

TEST(SafetensorsRoundTrip, HostTensorsAreAdded) {
  std::mt19937_64 rng(testing::fresh_seed());
  const auto values = testing::random_floats(rng, 24);
  const Tensor t = Tensor::from_host(DType::F32, {4, 6}, values.data());
  SafetensorsWriter writer;
  writer.add("t", t);
  const auto file = SafetensorsFile::from_bytes(writer.to_bytes());
  const Tensor back = file.read_float("t", {4, 6});
  EXPECT_EQ(std::memcmp(back.data(), values.data(), values.size() * 4), 0);
}

// ---- the API's argument errors ----------------------------------------------------------------

TEST(SafetensorsApi, ReadErrorsNameTheTensorAndFile) {
  std::mt19937_64 rng(testing::fresh_seed());
  const auto values = testing::random_floats(rng, 6);
  SafetensorsWriter writer;
  writer.add("w", DType::F32, {2, 3}, values.data());
  const auto file = SafetensorsFile::from_bytes(writer.to_bytes(), "weights.safetensors");
  EXPECT_TRUE(file.contains("w"));
  EXPECT_FALSE(file.contains("v"));
  expect_error([&] { (void)file.info("v"); }, "v", "no tensor named 'v' in weights.safetensors");
  expect_error([&] { (void)file.read_float("v"); }, "v", "no tensor named");
  expect_error([&] { (void)file.read_raw("w", DType::BF16); }, "w", "expected dtype BF16, got F32 in weights.safetensors");
  expect_error([&] { (void)file.read_int32("w"); }, "w", "expected an I32 or I64 tensor, got F32");
  expect_error([&] { (void)file.read_float("w", {3, 2}); }, "w", "expected shape [3, 2], got [2, 3]");
  expect_error([&] { (void)file.read_float("w", {2, 3, 1}); }, "w", "expected shape");
  expect_error([&] { (void)file.read_float("w", {-1}); }, "w", "expected shape");
  EXPECT_EQ(file.read_float("w", {-1, 3}).numel(), 6);
  EXPECT_EQ(file.read_raw("w", DType::F32, {2, -1}).numel(), 6);
}

TEST(SafetensorsApi, WriterRejectsBadTensorsAndKeepsItsState) {
  std::mt19937_64 rng(testing::fresh_seed());
  const auto values = testing::random_floats(rng, 8);
  SafetensorsWriter writer;
  writer.add("a", DType::F32, {8}, values.data());
  const Bytes before = writer.to_bytes();
  expect_error([&] { writer.add("a", DType::F32, {8}, values.data()); }, "a", "already added");
  expect_error([&] { writer.add("", DType::F32, {8}, values.data()); }, "name", "must not be empty");
  expect_error([&] { writer.add("__metadata__", DType::F32, {8}, values.data()); }, "__metadata__", "reserved");
  expect_error([&] { writer.add("neg", DType::F32, {2, -1}, values.data()); }, "neg", "invalid shape");
  expect_error([&] { writer.add("huge", DType::F32, {1LL << 40, 1LL << 40}, values.data()); }, "huge", "invalid shape");
  expect_error([&] { writer.add("null", DType::F32, {2}, nullptr); }, "null", "null data pointer");
  const std::string bad_utf8 = "bad\xff";
  expect_error([&] { writer.add(bad_utf8, DType::F32, {1}, values.data()); }, bad_utf8, "not valid UTF-8");
  expect_error([&] { writer.set_metadata("k", "v\xc3"); }, "k", "metadata value is not valid UTF-8");
  EXPECT_EQ(writer.to_bytes(), before) << "failed calls must not change the writer";
}

TEST(SafetensorsApi, WriteIsAtomicAndLeavesNoTemporaryFiles) {
  std::mt19937_64 rng(testing::fresh_seed());
  const std::string dir = testing::temp_dir();
  const std::string path = dir + "/out.safetensors";
  const auto first = random_bytes(rng, 40);
  const auto second = random_bytes(rng, 24);
  SafetensorsWriter one;
  one.add("x", DType::U8, {40}, first.data());
  one.write(path);
  SafetensorsWriter two;
  two.add("y", DType::U8, {24}, second.data());
  two.write(path);  // replaces the file as a whole
  const auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file.names(), std::vector<std::string>{"y"});
  EXPECT_EQ(file.path(), path);

  // Renaming onto a directory fails after the temporary file was written: the error names the
  // path and the temporary file is gone.
  const std::string blocker = dir + "/blocker";
  std::filesystem::create_directory(blocker);
  std::filesystem::create_directory(blocker + "/keep");  // non-empty, so rename cannot replace it
  expect_error([&] { two.write(blocker); }, blocker, "renaming the temporary file into place failed");
  expect_error([&] { two.write(dir + "/missing/out.safetensors"); }, dir + "/missing/out.safetensors",
               "cannot create the temporary file");
  std::vector<std::string> entries;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) entries.push_back(entry.path().filename().string());
  std::sort(entries.begin(), entries.end());
  EXPECT_EQ(entries, (std::vector<std::string>{"blocker", "out.safetensors"}));
  EXPECT_EQ(SafetensorsFile::open(path).names(), std::vector<std::string>{"y"}) << "the old file must survive";
}

TEST(SafetensorsApi, OpenRejectsMissingDirectoriesAndShortFiles) {
  const std::string dir = testing::temp_dir();
  expect_error([&] { (void)SafetensorsFile::open(dir + "/absent"); }, dir + "/absent", "cannot open");
  expect_error([&] { (void)SafetensorsFile::open(dir); }, dir, "not a regular file");
  const std::string empty = dir + "/empty.safetensors";
  std::ofstream(empty).close();
  expect_error([&] { (void)SafetensorsFile::open(empty); }, empty, "file is 0 bytes, shorter than the 8-byte header length");
  const std::string bad = dir + "/bad.safetensors";
  const Bytes image = image_with_header("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", Bytes(4));
  std::ofstream(bad, std::ios::binary).write(reinterpret_cast<const char*>(image.data()), static_cast<std::streamsize>(image.size()));
  expect_error([&] { (void)SafetensorsFile::open(bad); }, bad, "tensor 't': data_offsets [0, 8] end past the data buffer (4 bytes)");
}

// ---- the shared vector files -------------------------------------------------------------------

TEST(SafetensorsVectors, EverySharedFileOpensAndReads) {
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(testing::vector_path(""))) {
    if (entry.path().extension() != ".safetensors") continue;
    ++files;
    const auto file = SafetensorsFile::open(entry.path().string());
    ASSERT_FALSE(file.names().empty()) << entry.path();
    std::size_t total = 0;
    for (const auto& name : file.names()) {
      const auto& info = file.info(name);
      total += info.bytes.size();
      EXPECT_EQ(file.read_float(name).numel(), shape_numel(info.shape)) << entry.path() << " " << name;
    }
    const auto header_and_length = static_cast<std::size_t>(std::filesystem::file_size(entry.path())) - total;
    EXPECT_EQ(header_and_length % 8, 0u) << "reference writer pads the header to 8 bytes: " << entry.path();
  }
  EXPECT_GE(files, 10);

  const auto formats = SafetensorsFile::open(testing::vector_path("formats.safetensors"));
  EXPECT_EQ(formats.info("e4m3_in").dtype, DType::F64);
  EXPECT_EQ(formats.info("e4m3_code").dtype, DType::U8);
  EXPECT_EQ(formats.info("e4m3_code").shape, formats.info("e4m3_in").shape);
  const auto layer = SafetensorsFile::open(testing::vector_path("layer_small_1.safetensors"));
  EXPECT_EQ(layer.metadata().at("config"), "small_config.json");
  const auto& weight = layer.info("layers.1.attn.wq_a.weight");
  const auto& scale = layer.info("layers.1.attn.wq_a.scale");
  EXPECT_EQ(weight.dtype, DType::F8_E4M3);
  EXPECT_EQ(scale.dtype, DType::F8_E8M0);
  ASSERT_EQ(weight.shape.size(), 2u);
  EXPECT_EQ(scale.shape, (Shape{(weight.shape[0] + 127) / 128, (weight.shape[1] + 127) / 128}));
}

// ---- malformed files -------------------------------------------------------------------------

const std::string kOneTensor = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

TEST(SafetensorsMalformed, LengthField) {
  expect_rejected(Bytes{}, "file is 0 bytes, shorter than the 8-byte header length");
  expect_rejected(Bytes(7), "file is 7 bytes");
  expect_rejected(image_with_header("{}", {}, 3), "header length 3 runs past");
  expect_rejected(image_with_header("{}  ", {}, 5), "header length 5 runs past the end of the file (4 bytes follow");
  expect_rejected(image_with_header("{}", {}, std::uint64_t{1} << 63), "exceeds the limit of 100000000 bytes");
  expect_rejected(image_with_header("{}", {}, 100'000'001), "exceeds the limit");
  expect_rejected(image_with_header("{}", {}, 1), "not valid JSON");  // only "{"
  expect_rejected(image_with_header("{}", {}, 0), "not valid JSON");
  EXPECT_NO_THROW(SafetensorsFile::from_bytes(image_with_header("{}")));
  EXPECT_NO_THROW(SafetensorsFile::from_bytes(image_with_header(" \n{}  \t ")));
}

TEST(SafetensorsMalformed, HeaderJson) {
  expect_rejected(image_with_header("{\"t\":"), "not valid JSON");
  expect_rejected(image_with_header("{} {}"), "not valid JSON");
  expect_rejected(image_with_header("{\"t\xff\":1}"), "not valid JSON (or not UTF-8)");
  // nlohmann::json stops at a NUL byte; JSON text never contains one.
  expect_rejected(image_with_header(std::string("{}\0\0", 4)), "header contains a NUL byte at offset 2");
  expect_rejected(image_with_header(std::string("{}\0{\"x\"", 7)), "header contains a NUL byte");
  expect_rejected(image_with_header("[]"), "header JSON is an array, expected an object");
  expect_rejected(image_with_header("7"), "header JSON is the integer 7, expected an object");
  expect_rejected(image_with_header("\"x\""), "header JSON is a string");
  expect_rejected(image_with_header("{\"a\":" + std::string(20, '[') + std::string(20, ']') + "}"), "nests deeper than 8 levels");
  expect_rejected(image_with_header("{" + kOneTensor + "," + kOneTensor + "}", Bytes(8)), "repeats the key 't'");
  expect_rejected(image_with_header(R"({"t":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", Bytes(8)),
                  "repeats the key 'dtype'");
}

TEST(SafetensorsMalformed, Metadata) {
  expect_rejected(image_with_header(R"({"__metadata__":[1]})"), "__metadata__ is an array, expected an object of strings");
  expect_rejected(image_with_header(R"({"__metadata__":{"a":"x","b":2}})"), "__metadata__ entry 'b' is the integer 2");
  expect_rejected(image_with_header(R"({"__metadata__":{"a":null}})"), "entry 'a' is null");
  const auto file = SafetensorsFile::from_bytes(image_with_header(R"({"__metadata__":{}})"));
  EXPECT_TRUE(file.metadata().empty());
}

TEST(SafetensorsMalformed, TensorEntryFields) {
  auto entry = [](const std::string& body) { return image_with_header("{\"w.1\":" + body + "}", Bytes(8)); };
  expect_rejected(entry("[]"), "tensor 'w.1': entry is an array, expected an object");
  expect_rejected(entry(R"({"shape":[2],"data_offsets":[0,8]})"), "tensor 'w.1': missing field 'dtype'");
  expect_rejected(entry(R"({"dtype":"F32","data_offsets":[0,8]})"), "tensor 'w.1': missing field 'shape'");
  expect_rejected(entry(R"({"dtype":"F32","shape":[2]})"), "tensor 'w.1': missing field 'data_offsets'");
  expect_rejected(entry(R"({"dtype":4,"shape":[2],"data_offsets":[0,8]})"), "'dtype' is the integer 4, expected a string");
  expect_rejected(entry(R"({"dtype":"F4","shape":[2],"data_offsets":[0,8]})"), "unknown or unsupported dtype 'F4'");
  expect_rejected(entry(R"({"dtype":"BOOL","shape":[8],"data_offsets":[0,8]})"), "unknown or unsupported dtype 'BOOL'");
  expect_rejected(entry(R"({"dtype":"f32","shape":[2],"data_offsets":[0,8]})"), "unknown or unsupported dtype 'f32'");
  expect_rejected(entry(R"({"dtype":"F32","shape":2,"data_offsets":[0,8]})"), "'shape' is the integer 2, expected an array");
  expect_rejected(entry(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"), "shape extent is the negative integer -2");
  expect_rejected(entry(R"({"dtype":"F32","shape":[2.0],"data_offsets":[0,8]})"), "shape extent is the non-integer number 2.0");
  expect_rejected(entry(R"({"dtype":"F32","shape":["2"],"data_offsets":[0,8]})"), "shape extent is a string");
  expect_rejected(entry(R"({"dtype":"F32","shape":[2],"data_offsets":"0,8"})"), "'data_offsets' is a string, expected [begin, end]");
  expect_rejected(entry(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8,8]})"), "expected [begin, end]");
  expect_rejected(entry(R"({"dtype":"F32","shape":[2],"data_offsets":[0]})"), "expected [begin, end]");
  expect_rejected(entry(R"({"dtype":"F32","shape":[2],"data_offsets":[-8,0]})"), "data offset is the negative integer -8");
  expect_rejected(entry(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8.5]})"), "data offset is the non-integer number 8.5");
  // Extra fields are ignored, like the reference implementation does.
  EXPECT_NO_THROW(SafetensorsFile::from_bytes(entry(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1})")));
}

TEST(SafetensorsMalformed, ShapeSizes) {
  auto entry = [](const std::string& dtype, const std::string& shape, const std::string& offsets, std::size_t data) {
    return image_with_header(R"({"x":{"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":)" + offsets + "}}",
                             Bytes(data));
  };
  expect_rejected(entry("F32", "[4294967296,4294967296]", "[0,0]", 0), "tensor 'x': shape [4294967296, 4294967296] has too many elements");
  expect_rejected(entry("F32", "[18446744073709551615]", "[0,0]", 0), "shape extent 18446744073709551615 is too large");
  expect_rejected(entry("F32", "[18446744073709551616]", "[0,0]", 0), "shape extent is the non-integer number");
  expect_rejected(entry("F64", "[4611686018427387904]", "[0,0]", 0), "has too many bytes");
  expect_rejected(entry("F32", "[2]", "[0,4]", 4), "data_offsets [0, 4] hold 4 bytes but shape [2] of F32 needs 8");
  expect_rejected(entry("BF16", "[3,1]", "[0,8]", 8), "hold 8 bytes but shape [3, 1] of BF16 needs 6");
  // A zero extent makes an empty tensor whatever the other extents (within int64), and it reads as
  // one even where the other extents' bytes would not fit int64 (found by the mutation test, seed
  // 12116198185022859984: shape [2^60, 2, 0]).
  EXPECT_NO_THROW(SafetensorsFile::from_bytes(entry("F64", "[4611686018427387904,0]", "[0,0]", 0)));
  for (const char* shape : {"[4611686018427387904,0]", "[1152921504606846976,2,0]", "[0,2305843009213693952,2]"}) {
    const auto file = SafetensorsFile::from_bytes(entry("F64", shape, "[0,0]", 0));
    EXPECT_EQ(file.read_raw("x", DType::F64).nbytes(), 0u) << shape;
    EXPECT_EQ(file.read_float("x").numel(), 0) << shape;
  }
  expect_rejected(entry("F32", "[4611686018427387904,4,0]", "[0,0]", 0), "has too many elements");
}

TEST(SafetensorsMalformed, OffsetsAndCoverage) {
  auto two = [](const std::string& a, const std::string& b, std::size_t data) {
    return image_with_header(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":)" + a +
                                 R"(},"b":{"dtype":"U8","shape":[4],"data_offsets":)" + b + "}}",
                             Bytes(data));
  };
  EXPECT_NO_THROW(SafetensorsFile::from_bytes(two("[4,8]", "[0,4]", 8)));  // order in the buffer is free
  expect_rejected(two("[0,4]", "[8,4]", 8), "tensor 'b': data_offsets [8, 4] begin after end");
  expect_rejected(two("[0,4]", "[4,8]", 7), "tensor 'b': data_offsets [4, 8] end past the data buffer (7 bytes)");
  expect_rejected(two("[0,4]", "[18446744073709551611,18446744073709551615]", 8), "end past the data buffer");
  expect_rejected(two("[0,4]", "[2,6]", 8), "tensor 'b': bytes [2, 6) overlap tensor 'a' (which ends at 4)");
  expect_rejected(two("[0,4]", "[0,4]", 8), "overlap tensor 'a'");
  expect_rejected(two("[0,4]", "[5,9]", 9), "tensor 'b': gap of 1 unused bytes before it (at offset 4)");
  expect_rejected(two("[1,5]", "[5,9]", 9), "tensor 'a': gap of 1 unused bytes before it (at offset 0)");
  expect_rejected(two("[0,4]", "[4,8]", 10), "2 unused bytes after the last tensor; the data buffer (10 bytes)");
  expect_rejected(image_with_header("{}", Bytes(3)), "3 unused bytes after the last tensor");
  // An empty tensor may sit on a boundary, not inside another tensor's bytes.
  const std::string empty_at = R"(,"e":{"dtype":"F32","shape":[0],"data_offsets":)";
  const std::string a = R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]})";
  EXPECT_NO_THROW(SafetensorsFile::from_bytes(image_with_header(a + empty_at + "[8,8]}}", Bytes(8))));
  EXPECT_NO_THROW(SafetensorsFile::from_bytes(image_with_header(a + empty_at + "[0,0]}}", Bytes(8))));
  expect_rejected(image_with_header(a + empty_at + "[4,4]}}", Bytes(8)), "tensor 'e': bytes [4, 4) overlap tensor 'a'");
  expect_rejected(image_with_header(a + empty_at + "[9,9]}}", Bytes(8)), "end past the data buffer");
}

// ---- randomized mutations ----------------------------------------------------------------------

// A valid file of random tensors (random dtypes, shapes with zero extents, bytes, metadata).
Bytes random_valid_image(std::mt19937_64& rng) {
  SafetensorsWriter writer;
  const int tensors = 1 + static_cast<int>(rng() % 5);
  for (int i = 0; i < tensors; ++i) {
    const DType dtype = kAllDtypes[rng() % std::size(kAllDtypes)];
    const Shape shape = random_shape(rng, 3, 4);
    const Bytes bytes = random_bytes(rng, byte_size(dtype, shape));
    std::string name = "t";
    name += std::to_string(i);
    if (rng() % 2) name += ".weight";
    writer.add(name, dtype, shape, bytes.data());
  }
  if (rng() % 2) writer.set_metadata("k" + std::to_string(rng() % 3), "v" + std::to_string(rng() % 100));
  return writer.to_bytes();
}

// A random JSON value of a wrong-ish kind for a field (numbers near the valid range, other types).
nlohmann::ordered_json random_json_value(std::mt19937_64& rng, std::uint64_t data_size) {
  switch (rng() % 9) {
    case 0: return rng() % (data_size + 9);
    case 1: return -static_cast<std::int64_t>(rng() % 9) - 1;
    case 2: return 0.5 + static_cast<double>(rng() % 8);
    case 3: return std::numeric_limits<std::uint64_t>::max() - rng() % 4;
    case 4: return "x";
    case 5: return nullptr;
    case 6: return nlohmann::ordered_json::array({rng() % 5, rng() % 5});
    case 7: return nlohmann::ordered_json::object();
    default: return std::uint64_t{1} << (rng() % 64);
  }
}

// Edits one field of the header JSON, re-serializes it (sometimes padded) with a correct length.
Bytes edit_header_json(std::mt19937_64& rng, const Bytes& image) {
  const std::string header = header_text(image);
  auto json = nlohmann::ordered_json::parse(header);
  const Bytes data(image.begin() + static_cast<std::ptrdiff_t>(8 + header.size()), image.end());
  std::vector<std::string> tensors;
  for (const auto& item : json.items()) {
    if (item.key() != "__metadata__") tensors.push_back(item.key());
  }
  auto& entry = json[tensors[rng() % tensors.size()]];
  const char* fields[] = {"dtype", "shape", "data_offsets"};
  std::string prefix_duplicate;
  switch (rng() % 9) {
    case 0: entry["data_offsets"][rng() % 2] = rng() % (data.size() + 9); break;
    case 1: entry["data_offsets"][rng() % 2] = random_json_value(rng, data.size()); break;
    case 2: {  // exchange offsets with another tensor (valid when the sizes agree)
      auto& other = json[tensors[rng() % tensors.size()]];
      std::swap(entry["data_offsets"], other["data_offsets"]);
      break;
    }
    case 3: {
      auto& shape = entry["shape"];
      if (shape.empty() || rng() % 3 == 0) {
        shape.push_back(rng() % 4);
      } else if (rng() % 2) {
        shape.erase(shape.size() - 1);
      } else {
        shape[rng() % shape.size()] = rng() % 2 ? nlohmann::ordered_json(rng() % 9) : random_json_value(rng, data.size());
      }
      break;
    }
    case 4: {
      const char* names[] = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E8M0", "U8", "I8", "I32", "I64", "BOOL", "F4", ""};
      entry["dtype"] = names[rng() % std::size(names)];
      break;
    }
    case 5: entry.erase(fields[rng() % 3]); break;
    case 6: entry[fields[rng() % 3]] = random_json_value(rng, data.size()); break;
    case 7: json["__metadata__"] = rng() % 2 ? random_json_value(rng, data.size()) : nlohmann::ordered_json{{"k", rng() % 5}}; break;
    default: {  // repeat an existing key
      const auto& name = tensors[rng() % tensors.size()];
      prefix_duplicate = nlohmann::ordered_json(name).dump() + ":" + json[name].dump() + ",";
      break;
    }
  }
  std::string text = json.dump();
  if (!prefix_duplicate.empty()) text.insert(1, prefix_duplicate);
  text.append(rng() % 9, ' ');
  return image_with_header(text, data);
}

enum class Mutation { HeaderFlip, DataFlip, Truncate, LengthField, JsonEdit, Append };
constexpr int kMutationKinds = 6;

TEST(SafetensorsMutation, DamagedFilesParseConsistentlyOrThrowError) {
  std::mt19937_64 rng(testing::fresh_seed());
  const auto start = std::chrono::steady_clock::now();
  constexpr int kCases = 20000;
  int accepted[kMutationKinds] = {}, rejected[kMutationKinds] = {};
  for (int c = 0; c < kCases; ++c) {
    const Bytes original = random_valid_image(rng);
    std::uint64_t header_bytes = 0;
    std::memcpy(&header_bytes, original.data(), 8);
    const std::size_t data_begin = 8 + static_cast<std::size_t>(header_bytes);
    const std::size_t data_size = original.size() - data_begin;
    Bytes image = original;
    auto kind = static_cast<Mutation>(rng() % kMutationKinds);
    if (kind == Mutation::DataFlip && data_size == 0) kind = Mutation::HeaderFlip;
    switch (kind) {
      case Mutation::HeaderFlip:
        for (int flips = 1 + static_cast<int>(rng() % 3); flips > 0; --flips) {
          image[8 + rng() % header_bytes] ^= static_cast<std::byte>(1 + rng() % 255);
        }
        break;
      case Mutation::DataFlip: image[data_begin + rng() % data_size] ^= static_cast<std::byte>(1 + rng() % 255); break;
      case Mutation::Truncate: image.resize(rng() % image.size()); break;
      case Mutation::LengthField: {
        std::uint64_t length = header_bytes;
        while (length == header_bytes) {
          length = rng() % 3 == 0 ? rng() : header_bytes + rng() % 17 - 8;
        }
        std::memcpy(image.data(), &length, 8);
        break;
      }
      case Mutation::JsonEdit: image = edit_header_json(rng, original); break;
      case Mutation::Append: {
        const Bytes extra = random_bytes(rng, 1 + rng() % 8);
        image.insert(image.end(), extra.begin(), extra.end());
        break;
      }
    }
    const Bytes mutated = image;
    const auto verdict = testing::check_safetensors_image(std::move(image));
    ASSERT_TRUE(verdict.inconsistency.empty()) << "case " << c << ": " << verdict.inconsistency;
    (verdict.accepted ? accepted : rejected)[static_cast<int>(kind)]++;
    // Mutations whose outcome is certain: the data are opaque, while any change of the file's
    // length or of the header length breaks the exact coverage of the data buffer.
    switch (kind) {
      case Mutation::DataFlip: {
        ASSERT_TRUE(verdict.accepted) << "case " << c << ": " << verdict.error;
        // The bytes read are the mutated image's bytes at the offsets the header gives.
        const auto file = SafetensorsFile::from_bytes(mutated);
        const auto header = nlohmann::json::parse(header_text(mutated));
        for (const auto& name : file.names()) {
          const Tensor raw = file.read_raw(name, file.info(name).dtype);
          const auto begin = header[name]["data_offsets"][0].get<std::size_t>();
          const auto end = header[name]["data_offsets"][1].get<std::size_t>();
          ASSERT_EQ(raw.nbytes(), end - begin) << name;
          ASSERT_TRUE(raw.nbytes() == 0 || std::memcmp(raw.data(), mutated.data() + data_begin + begin, raw.nbytes()) == 0)
              << "case " << c << " tensor " << name;
        }
        break;
      }
      case Mutation::Truncate:
      case Mutation::LengthField:
      case Mutation::Append: ASSERT_FALSE(verdict.accepted) << "case " << c; break;
      default: break;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 10.0);
  // Header damage must produce both outcomes, or the generator is not exercising the parser.
  for (Mutation kind : {Mutation::HeaderFlip, Mutation::JsonEdit}) {
    EXPECT_GT(accepted[static_cast<int>(kind)], 0) << static_cast<int>(kind);
    EXPECT_GT(rejected[static_cast<int>(kind)], 0) << static_cast<int>(kind);
  }
  std::cout << "[ mutation ] " << kCases << " cases in " << seconds << " s; accepted/rejected per kind:";
  for (int k = 0; k < kMutationKinds; ++k) std::cout << " " << accepted[k] << "/" << rejected[k];
  std::cout << "\n";
}

}  // namespace
}  // namespace dsv4
