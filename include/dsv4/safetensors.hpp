// dsv4/safetensors.hpp — reading (memory-mapped) and writing safetensors files.
//
// Format: 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape,
// data_offsets: [begin, end]}, "__metadata__": {str: str}}, then the data buffer; offsets are
// relative to the start of the data buffer.
//
// The reader is strict. It rejects, with Error(file, reason) where the reason names the tensor:
//   - a file shorter than 8 bytes, a header length past the end of the file or above 100,000,000
//     bytes (the limit of the reference implementation);
//   - a header that is not UTF-8 JSON (or holds a NUL byte), is not an object, nests deeper than
//     8 levels, or repeats a key in any object;
//   - "__metadata__" that is not an object of strings;
//   - a tensor entry that is not an object, lacks `dtype` (string), `shape` (array of non-negative
//     integers) or `data_offsets` (two non-negative integers), or whose dtype is not one of F64,
//     F32, F16, BF16, F8_E4M3, F8_E8M0, U8, I8, I32, I64 (other fields are ignored, as the
//     reference implementation does);
//   - a shape whose element count (or byte size) overflows 64-bit integers;
//   - data_offsets with begin > end, end past the buffer, or end − begin ≠ numel · dtype size;
//   - tensors whose byte ranges overlap, leave a gap, or do not cover the data buffer exactly
//     (sorted by offset, the ranges must tile [0, buffer size); an empty tensor may sit on any
//     boundary between ranges, not inside one).
// It never reads outside the mapping. (A file truncated by another process while mapped can
// still raise SIGBUS; that is outside what a reader can check.)
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
  std::span<const std::byte> bytes;  // [numel · dtype_size] inside the mapping; valid while the file object lives
};

class SafetensorsFile {
 public:
  // Maps (read-only, POSIX mmap) and validates `path`. Throws Error(path, reason).
  static SafetensorsFile open(const std::string& path);
  // Parses an in-memory image (same validation; the image is moved into the object).
  // Errors name `name` in place of a path.
  static SafetensorsFile from_bytes(std::vector<std::byte> image, const std::string& name = "<memory>");

  const std::string& path() const;
  const std::map<std::string, std::string>& metadata() const;
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const;
  // Throws Error(name, "no tensor named ... in FILE") when absent.
  const TensorInfo& info(const std::string& name) const;

  // Copies a tensor converted to float32 / int32 / raw bytes, checking dtype compatibility and
  // the shape. `expected` empty = any shape; otherwise same rank, and each extent equal unless
  // it is -1. Errors are Error(name, reason naming FILE).
  // read_float accepts F64 (rounded to nearest float), F32, F16, BF16, F8_E4M3, F8_E8M0
  // (2^(e-127); byte 255 is NaN), I32, I64, U8, I8 (converted to the nearest float).
  Tensor read_float(const std::string& name, const Shape& expected = {}) const;
  // I32, or I64 with every value inside the int32 range.
  Tensor read_int32(const std::string& name, const Shape& expected = {}) const;
  // A byte copy; the stored dtype must equal `dtype`.
  Tensor read_raw(const std::string& name, DType dtype, const Shape& expected = {}) const;

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

 private:
  struct Impl;
  explicit SafetensorsFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Collects tensors, then writes them atomically (to a temporary file in the same directory, then
// renamed), so a failure never leaves a partial output file. The header lists "__metadata__"
// (when set) and then the tensors in insertion order, padded with spaces to a multiple of 8
// bytes; the data follow in insertion order without gaps.
class SafetensorsWriter {
 public:
  // Copies numel(shape) · dtype_size(dtype) bytes from `bytes` (may be null when that is 0).
  // Throws Error(name, ...) for an empty, reserved ("__metadata__"), non-UTF-8 or duplicate name,
  // a negative extent or an overflowing shape.
  void add(const std::string& name, DType dtype, const Shape& shape, const void* bytes);
  void add(const std::string& name, const Tensor& host_tensor);  // CPU tensors only
  // Sets (or replaces) one metadata entry; key and value must be UTF-8 (Error(key, ...)).
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
