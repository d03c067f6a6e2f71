// dsv4/safetensors.hpp — reading (memory-mapped) and writing safetensors files.
//
// Format: 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape,
// data_offsets: [begin, end]}, "__metadata__": {str: str}}, then the data buffer. The reader
// rejects malformed files (bad header length, JSON errors, unknown dtype, shape/byte-size
// mismatch, overlapping or out-of-range offsets) with an Error naming the file and tensor; it never
// reads outside the mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dsv4/dtype.hpp"
#include "dsv4/tensor.hpp"

namespace dsv4 {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  std::span<const std::byte> bytes;  // inside the mapping; valid while the file object lives
};

class SafetensorsFile {
 public:
  // Maps and validates `path`. Throws Error(path, reason).
  static SafetensorsFile open(const std::string& path);
  // Parses an in-memory image (same validation; the buffer is copied).
  static SafetensorsFile from_bytes(std::vector<std::byte> image, const std::string& name = "<memory>");

  const std::string& path() const;
  const std::map<std::string, std::string>& metadata() const;
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const;
  // Throws Error(name, "no tensor named ... in FILE") when absent.
  const TensorInfo& info(const std::string& name) const;

  // Copies a tensor converted to float32 / int32 / raw bytes, checking dtype compatibility and
  // (when `expected` is given, -1 = any extent) the shape. Errors name the tensor.
  // to_float accepts F64, F32, F16, BF16, F8_E4M3, F8_E8M0 (as 2^(e-127)), I32, I64, U8, I8.
  Tensor read_float(const std::string& name, const Shape& expected = {}) const;
  Tensor read_int32(const std::string& name, const Shape& expected = {}) const;  // I32 or I64 (range-checked)
  Tensor read_raw(const std::string& name, DType dtype, const Shape& expected = {}) const;  // exact dtype

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

 private:
  struct Impl;
  explicit SafetensorsFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Collects tensors, then writes them atomically (to a temporary file in the same directory, then
// renamed), so a failure never leaves a partial output file.
class SafetensorsWriter {
 public:
  void add(const std::string& name, DType dtype, const Shape& shape, const void* bytes);
  void add(const std::string& name, const Tensor& host_tensor);  // CPU tensors only
  void set_metadata(const std::string& key, const std::string& value);
  void write(const std::string& path) const;          // throws Error(path, reason)
  std::vector<std::byte> to_bytes() const;            // the file image

 private:
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    std::vector<std::byte> bytes;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace dsv4
