// src/io/safetensors.cpp — the safetensors reader (POSIX mmap, strict validation) and the atomic
// writer. The validation rules are listed in include/dsv4/safetensors.hpp.
#include "dsv4/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "dsv4/error.hpp"
#include "dsv4/formats.hpp"

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; this reader copies bytes as they are");

namespace dsv4 {
namespace {

constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit
// A valid header nests three levels (header object → tensor object → shape array); the bound
// only keeps hostile input from building deep trees.
constexpr int kMaxJsonDepth = 8;
constexpr const char* kMetadataKey = "__metadata__";

[[noreturn]] void fail_tensor(const std::string& file, const std::string& tensor, const std::string& reason) {
  throw Error(file, "tensor '" + tensor + "': " + reason);
}

// Sets `numel` and returns true when every extent is non-negative and the product of the non-zero
// extents fits int64 (then every partial product, in any order, fits too); false otherwise.
bool checked_numel(const Shape& shape, std::int64_t& numel) {
  std::int64_t product = 1;
  bool any_zero = false;
  for (auto extent : shape) {
    if (extent < 0) return false;
    if (extent == 0) { any_zero = true; continue; }
    if (product > std::numeric_limits<std::int64_t>::max() / extent) return false;
    product *= extent;
  }
  numel = any_zero ? 0 : product;
  return true;
}

// float16 (IEEE binary16) → float32, exact.
float float_from_f16_bits(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return detail::bits_float(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  if (exponent == 0) {  // zero or subnormal: mantissa · 2^-24
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  return detail::bits_float(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

// Reads every element of `bytes` as `Stored` (unaligned-safe) and writes convert(element) to out.
template <class Stored, class Out, class Convert>
void convert_elements(std::span<const std::byte> bytes, Out* out, Convert convert) {
  const std::size_t count = bytes.size() / sizeof(Stored);
  for (std::size_t i = 0; i < count; ++i) {
    Stored value;
    std::memcpy(&value, bytes.data() + i * sizeof(Stored), sizeof(Stored));
    out[i] = convert(value);
  }
}

std::string describe(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::object: return "an object";
    case nlohmann::json::value_t::array: return "an array";
    case nlohmann::json::value_t::string: return "a string";
    case nlohmann::json::value_t::boolean: return "a boolean";
    case nlohmann::json::value_t::number_integer: return "the negative integer " + value.dump();
    case nlohmann::json::value_t::number_unsigned: return "the integer " + value.dump();
    case nlohmann::json::value_t::number_float: return "the non-integer number " + value.dump();
    default: return "an invalid value";
  }
}

// Parses the header JSON, rejecting invalid UTF-8/JSON, repeated keys in any object and nesting
// beyond kMaxJsonDepth (nlohmann::json would silently keep the last of two equal keys).
nlohmann::json parse_header_json(const char* text, std::size_t length, const std::string& file) {
  // nlohmann::json ends its input at a NUL byte; valid JSON text never contains one.
  if (const void* nul = std::memchr(text, 0, length)) {
    throw Error(file, "header contains a NUL byte at offset " + std::to_string(static_cast<const char*>(nul) - text));
  }
  std::vector<std::set<std::string>> keys_per_open_object;
  auto on_event = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start || event == Event::array_start) {
      if (depth >= kMaxJsonDepth) throw Error(file, "header JSON nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
      if (event == Event::object_start) keys_per_open_object.emplace_back();
    } else if (event == Event::object_end) {
      keys_per_open_object.pop_back();
    } else if (event == Event::key) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!keys_per_open_object.back().insert(key).second) throw Error(file, "header JSON repeats the key '" + key + "'");
    }
    return true;
  };
  nlohmann::json header = nlohmann::json::parse(text, text + length, on_event, /*allow_exceptions=*/false);
  if (header.is_discarded()) throw Error(file, "header is not valid JSON (or not UTF-8)");
  if (!header.is_object()) throw Error(file, "header JSON is " + describe(header) + ", expected an object");
  return header;
}

std::map<std::string, std::string> parse_metadata(const nlohmann::json& value, const std::string& file) {
  if (!value.is_object()) throw Error(file, std::string(kMetadataKey) + " is " + describe(value) + ", expected an object of strings");
  std::map<std::string, std::string> metadata;
  for (const auto& [key, text] : value.items()) {
    if (!text.is_string()) throw Error(file, std::string(kMetadataKey) + " entry '" + key + "' is " + describe(text) + ", expected a string");
    metadata.emplace(key, text.get<std::string>());
  }
  return metadata;
}

// One validated tensor entry plus its byte range in the data buffer.
struct ParsedTensor {
  TensorInfo info;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

const nlohmann::json& required_field(const nlohmann::json& entry, const char* field, const std::string& file,
                                     const std::string& name) {
  const auto it = entry.find(field);
  if (it == entry.end()) fail_tensor(file, name, std::string("missing field '") + field + "'");
  return *it;
}

ParsedTensor parse_tensor(const std::string& name, const nlohmann::json& entry, std::span<const std::byte> data,
                          const std::string& file) {
  if (!entry.is_object()) fail_tensor(file, name, "entry is " + describe(entry) + ", expected an object");
  ParsedTensor parsed;
  parsed.info.name = name;

  const auto& dtype = required_field(entry, "dtype", file, name);
  if (!dtype.is_string()) fail_tensor(file, name, "'dtype' is " + describe(dtype) + ", expected a string");
  if (!parse_dtype(dtype.get_ref<const std::string&>(), parsed.info.dtype)) {
    fail_tensor(file, name, "unknown or unsupported dtype '" + dtype.get<std::string>() + "'");
  }

  const auto& shape = required_field(entry, "shape", file, name);
  if (!shape.is_array()) fail_tensor(file, name, "'shape' is " + describe(shape) + ", expected an array");
  for (const auto& extent : shape) {
    if (!extent.is_number_unsigned()) fail_tensor(file, name, "shape extent is " + describe(extent) + ", expected a non-negative integer");
    const auto value = extent.get<std::uint64_t>();
    if (value > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      fail_tensor(file, name, "shape extent " + std::to_string(value) + " is too large");
    }
    parsed.info.shape.push_back(static_cast<std::int64_t>(value));
  }
  std::int64_t numel = 0;
  if (!checked_numel(parsed.info.shape, numel)) {
    fail_tensor(file, name, "shape " + shape_string(parsed.info.shape) + " has too many elements");
  }
  const auto element_bytes = static_cast<std::uint64_t>(dtype_size(parsed.info.dtype));
  if (static_cast<std::uint64_t>(numel) > std::numeric_limits<std::uint64_t>::max() / element_bytes) {
    fail_tensor(file, name, "shape " + shape_string(parsed.info.shape) + " has too many bytes");
  }
  const std::uint64_t expected_bytes = static_cast<std::uint64_t>(numel) * element_bytes;

  const auto& offsets = required_field(entry, "data_offsets", file, name);
  if (!offsets.is_array() || offsets.size() != 2) {
    fail_tensor(file, name, "'data_offsets' is " + describe(offsets) + ", expected [begin, end]");
  }
  for (const auto& offset : offsets) {
    if (!offset.is_number_unsigned()) fail_tensor(file, name, "data offset is " + describe(offset) + ", expected a non-negative integer");
  }
  parsed.begin = offsets[0].get<std::uint64_t>();
  parsed.end = offsets[1].get<std::uint64_t>();
  const std::string range = "data_offsets [" + std::to_string(parsed.begin) + ", " + std::to_string(parsed.end) + "]";
  if (parsed.begin > parsed.end) fail_tensor(file, name, range + " begin after end");
  if (parsed.end > data.size()) {
    fail_tensor(file, name, range + " end past the data buffer (" + std::to_string(data.size()) + " bytes)");
  }
  if (parsed.end - parsed.begin != expected_bytes) {
    fail_tensor(file, name, range + " hold " + std::to_string(parsed.end - parsed.begin) + " bytes but shape " +
                                shape_string(parsed.info.shape) + " of " + std::string(dtype_name(parsed.info.dtype)) +
                                " needs " + std::to_string(expected_bytes));
  }
  parsed.info.bytes = data.subspan(static_cast<std::size_t>(parsed.begin), static_cast<std::size_t>(expected_bytes));
  return parsed;
}

// Sorted by offset, the byte ranges must tile [0, data_size) exactly.
void check_ranges_tile_buffer(std::vector<ParsedTensor>& tensors, std::uint64_t data_size, const std::string& file) {
  std::sort(tensors.begin(), tensors.end(), [](const ParsedTensor& a, const ParsedTensor& b) {
    return std::tie(a.begin, a.end, a.info.name) < std::tie(b.begin, b.end, b.info.name);
  });
  std::uint64_t covered = 0;
  const ParsedTensor* previous = nullptr;
  for (const auto& t : tensors) {
    if (t.begin < covered) {
      fail_tensor(file, t.info.name, "bytes [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                                         ") overlap tensor '" + previous->info.name + "' (which ends at " +
                                         std::to_string(covered) + ")");
    }
    if (t.begin > covered) {
      fail_tensor(file, t.info.name, "gap of " + std::to_string(t.begin - covered) + " unused bytes before it (at offset " +
                                         std::to_string(covered) + "); the data buffer must be covered exactly");
    }
    covered = t.end;
    previous = &t;
  }
  if (covered != data_size) {
    throw Error(file, std::to_string(data_size - covered) + " unused bytes after the last tensor; the data buffer (" +
                          std::to_string(data_size) + " bytes) must be covered exactly");
  }
}

}  // namespace

// ---- SafetensorsFile --------------------------------------------------------------------------

struct SafetensorsFile::Impl {
  std::string path;
  void* mapping = nullptr;  // from mmap (open), unmapped on destruction
  std::size_t mapping_size = 0;
  std::vector<std::byte> owned;  // the image (from_bytes)
  std::map<std::string, std::string> metadata;
  std::map<std::string, TensorInfo> tensors;

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl() {
    if (mapping != nullptr) ::munmap(mapping, mapping_size);
  }

  // Validates the image [image, image + size) and fills `metadata` and `tensors`.
  void parse(const std::byte* image, std::size_t size) {
    if (size < 8) {
      throw Error(path, "file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
    }
    std::uint64_t header_bytes = 0;
    std::memcpy(&header_bytes, image, 8);  // little-endian host (static_assert above)
    if (header_bytes > kMaxHeaderBytes) {
      throw Error(path, "header length " + std::to_string(header_bytes) + " exceeds the limit of " +
                            std::to_string(kMaxHeaderBytes) + " bytes");
    }
    if (header_bytes > size - 8) {
      throw Error(path, "header length " + std::to_string(header_bytes) + " runs past the end of the file (" +
                            std::to_string(size - 8) + " bytes follow the length)");
    }
    const auto header = parse_header_json(reinterpret_cast<const char*>(image + 8),
                                          static_cast<std::size_t>(header_bytes), path);
    const std::span<const std::byte> data(image + 8 + header_bytes, size - 8 - static_cast<std::size_t>(header_bytes));

    std::vector<ParsedTensor> parsed;
    for (const auto& [key, value] : header.items()) {
      if (key == kMetadataKey) {
        metadata = parse_metadata(value, path);
      } else {
        parsed.push_back(parse_tensor(key, value, data, path));
      }
    }
    check_ranges_tile_buffer(parsed, data.size(), path);
    for (auto& t : parsed) tensors.emplace(t.info.name, std::move(t.info));
  }

  const TensorInfo& find(const std::string& name) const {
    const auto it = tensors.find(name);
    if (it == tensors.end()) throw Error(name, "no tensor named '" + name + "' in " + path);
    return it->second;
  }

  void check_shape(const TensorInfo& info, const Shape& expected) const {
    if (expected.empty()) return;
    bool same = expected.size() == info.shape.size();
    for (std::size_t i = 0; same && i < expected.size(); ++i) same = expected[i] < 0 || expected[i] == info.shape[i];
    if (!same) {
      throw Error(info.name, "expected shape " + shape_string(expected) + ", got " + shape_string(info.shape) + " in " + path);
    }
  }
};

SafetensorsFile::SafetensorsFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat status {};
  if (::fstat(fd, &status) != 0) {
    const int saved = errno;
    ::close(fd);
    throw Error(path, std::string("cannot stat: ") + std::strerror(saved));
  }
  if (!S_ISREG(status.st_mode)) {
    ::close(fd);
    throw Error(path, "not a regular file");
  }
  const auto size = static_cast<std::size_t>(status.st_size);
  if (size >= 8) {  // mmap rejects length 0; shorter files fail in parse() with the usual message
    void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapping == MAP_FAILED) {
      const int saved = errno;
      ::close(fd);
      throw Error(path, std::string("cannot mmap: ") + std::strerror(saved));
    }
    impl->mapping = mapping;
    impl->mapping_size = size;
  }
  ::close(fd);  // the mapping stays valid
  impl->parse(static_cast<const std::byte*>(impl->mapping), size);
  return SafetensorsFile(std::move(impl));
}

SafetensorsFile SafetensorsFile::from_bytes(std::vector<std::byte> image, const std::string& name) {
  auto impl = std::make_unique<Impl>();
  impl->path = name;
  impl->owned = std::move(image);
  impl->parse(impl->owned.data(), impl->owned.size());
  return SafetensorsFile(std::move(impl));
}

const std::string& SafetensorsFile::path() const { return impl_->path; }
const std::map<std::string, std::string>& SafetensorsFile::metadata() const { return impl_->metadata; }

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> names;
  names.reserve(impl_->tensors.size());
  for (const auto& entry : impl_->tensors) names.push_back(entry.first);
  return names;
}

bool SafetensorsFile::contains(const std::string& name) const { return impl_->tensors.count(name) != 0; }

const TensorInfo& SafetensorsFile::info(const std::string& name) const { return impl_->find(name); }

Tensor SafetensorsFile::read_float(const std::string& name, const Shape& expected) const {
  const auto& info = impl_->find(name);
  impl_->check_shape(info, expected);
  Tensor out = Tensor::empty(DType::F32, info.shape);
  float* values = out.data_as<float>();  // [numel]
  const auto bytes = info.bytes;
  switch (info.dtype) {
    case DType::F64: convert_elements<double>(bytes, values, [](double v) { return static_cast<float>(v); }); break;
    case DType::F32: convert_elements<float>(bytes, values, [](float v) { return v; }); break;
    case DType::F16: convert_elements<std::uint16_t>(bytes, values, float_from_f16_bits); break;
    case DType::BF16: convert_elements<std::uint16_t>(bytes, values, float_from_bf16_bits); break;
    case DType::F8_E4M3: convert_elements<std::uint8_t>(bytes, values, float_from_e4m3); break;
    case DType::F8_E8M0:  // 0xff is the format's NaN, not 2^128
      convert_elements<std::uint8_t>(bytes, values, [](std::uint8_t e) { return e == 0xff ? NAN : float_from_ue8m0(e); });
      break;
    case DType::U8: convert_elements<std::uint8_t>(bytes, values, [](std::uint8_t v) { return static_cast<float>(v); }); break;
    case DType::I8: convert_elements<std::int8_t>(bytes, values, [](std::int8_t v) { return static_cast<float>(v); }); break;
    case DType::I32: convert_elements<std::int32_t>(bytes, values, [](std::int32_t v) { return static_cast<float>(v); }); break;
    case DType::I64: convert_elements<std::int64_t>(bytes, values, [](std::int64_t v) { return static_cast<float>(v); }); break;
  }
  return out;
}

Tensor SafetensorsFile::read_int32(const std::string& name, const Shape& expected) const {
  const auto& info = impl_->find(name);
  if (info.dtype != DType::I32 && info.dtype != DType::I64) {
    throw Error(name, "expected an I32 or I64 tensor, got " + std::string(dtype_name(info.dtype)) + " in " + impl_->path);
  }
  impl_->check_shape(info, expected);
  Tensor out = Tensor::empty(DType::I32, info.shape);
  auto* values = out.data_as<std::int32_t>();  // [numel]
  if (info.dtype == DType::I32) {
    convert_elements<std::int32_t>(info.bytes, values, [](std::int32_t v) { return v; });
    return out;
  }
  std::size_t index = 0;
  convert_elements<std::int64_t>(info.bytes, values, [&](std::int64_t v) {
    if (v < std::numeric_limits<std::int32_t>::min() || v > std::numeric_limits<std::int32_t>::max()) {
      throw Error(name, "element " + std::to_string(index) + " = " + std::to_string(v) + " is outside the int32 range in " +
                            impl_->path);
    }
    ++index;
    return static_cast<std::int32_t>(v);
  });
  return out;
}

Tensor SafetensorsFile::read_raw(const std::string& name, DType dtype, const Shape& expected) const {
  const auto& info = impl_->find(name);
  if (info.dtype != dtype) {
    throw Error(name, "expected dtype " + std::string(dtype_name(dtype)) + ", got " + std::string(dtype_name(info.dtype)) +
                          " in " + impl_->path);
  }
  impl_->check_shape(info, expected);
  return Tensor::from_host(dtype, info.shape, info.bytes.data());
}

// ---- SafetensorsWriter ------------------------------------------------------------------------

namespace {

// Throws Error(argument, ...) unless `text` is valid UTF-8 (JSON strings must be).
void require_utf8(const std::string& text, const std::string& argument, const char* what) {
  try {
    (void)nlohmann::json(text).dump();
  } catch (const nlohmann::json::exception&) {
    throw Error(argument, std::string(what) + " is not valid UTF-8");
  }
}

// Writes all of `bytes` to `fd`, retrying short writes; false with errno set on failure.
bool write_all(int fd, const std::byte* bytes, std::size_t size) {
  while (size > 0) {
    const ssize_t written = ::write(fd, bytes, size);
    if (written < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    bytes += written;
    size -= static_cast<std::size_t>(written);
  }
  return true;
}

}  // namespace

void SafetensorsWriter::add(const std::string& name, DType dtype, const Shape& shape, const void* bytes) {
  require(!name.empty(), "name", "tensor name must not be empty");
  require(name != kMetadataKey, name, "the name is reserved for the metadata entry");
  require_utf8(name, name, "tensor name");
  for (const auto& entry : entries_) require(entry.name != name, name, "a tensor of this name was already added");
  std::int64_t numel = 0;
  require(checked_numel(shape, numel), name, "invalid shape " + shape_string(shape) + " (negative or too many elements)");
  require(static_cast<std::uint64_t>(numel) <= std::numeric_limits<std::size_t>::max() / dtype_size(dtype), name,
          "shape " + shape_string(shape) + " has too many bytes");
  const std::size_t size = static_cast<std::size_t>(numel) * dtype_size(dtype);
  require(bytes != nullptr || size == 0, name, "null data pointer");
  Entry entry{name, dtype, shape, std::vector<std::byte>(size)};
  if (size > 0) std::memcpy(entry.bytes.data(), bytes, size);
  entries_.push_back(std::move(entry));
}

void SafetensorsWriter::add(const std::string& name, const Tensor& host_tensor) {
  require(host_tensor.device() == Device::CPU, name, "only host tensors can be written; copy it to the CPU first");
  add(name, host_tensor.dtype(), host_tensor.shape(), host_tensor.data());
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  require_utf8(key, key, "metadata key");
  require_utf8(value, key, "metadata value");
  metadata_[key] = value;
}

std::vector<std::byte> SafetensorsWriter::to_bytes() const {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();  // keeps insertion order
  if (!metadata_.empty()) header[kMetadataKey] = metadata_;
  std::uint64_t offset = 0;
  for (const auto& entry : entries_) {
    const std::uint64_t end = offset + entry.bytes.size();
    header[entry.name] = {{"dtype", dtype_name(entry.dtype)},
                          {"shape", entry.shape},
                          {"data_offsets", nlohmann::ordered_json::array({offset, end})}};
    offset = end;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data start 8-byte aligned

  std::vector<std::byte> image(8 + text.size() + offset);
  const std::uint64_t header_bytes = text.size();
  std::memcpy(image.data(), &header_bytes, 8);  // little-endian host
  std::memcpy(image.data() + 8, text.data(), text.size());
  std::byte* data = image.data() + 8 + text.size();
  for (const auto& entry : entries_) {
    if (!entry.bytes.empty()) std::memcpy(data, entry.bytes.data(), entry.bytes.size());
    data += entry.bytes.size();
  }
  return image;
}

void SafetensorsWriter::write(const std::string& path) const {
  // The rename below would replace a file at `path` whatever its permissions (they guard the
  // file's bytes, not its name), so refuse what a plain write would not do: replacing a file
  // without write permission (its mode bits, which bind root too). A directory fails the rename.
  struct stat existing {};
  if (::stat(path.c_str(), &existing) == 0 && S_ISREG(existing.st_mode) &&
      ((existing.st_mode & (S_IWUSR | S_IWGRP | S_IWOTH)) == 0 || ::access(path.c_str(), W_OK) != 0))
    throw Error(path, "exists and is read-only; not replacing it");
  const auto image = to_bytes();
  static std::atomic<unsigned> counter{0};
  // Same directory as `path`, so the rename is atomic (one file system).
  const std::string temp = path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) throw Error(path, "cannot create the temporary file " + temp + ": " + std::strerror(errno));
  auto fail = [&](const char* step, int error_number) {
    ::unlink(temp.c_str());
    throw Error(path, std::string(step) + " failed: " + std::strerror(error_number));
  };
  if (!write_all(fd, image.data(), image.size()) || ::fsync(fd) != 0) {
    const int saved = errno;
    ::close(fd);
    fail("writing the temporary file", saved);
  }
  if (::close(fd) != 0) fail("closing the temporary file", errno);
  if (::rename(temp.c_str(), path.c_str()) != 0) fail("renaming the temporary file into place", errno);
}

}  // namespace dsv4
