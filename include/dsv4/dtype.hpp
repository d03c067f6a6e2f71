// dsv4/dtype.hpp — element types of tensors as stored in files and buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dsv4 {

// The safetensors dtype names are the canonical spelling (F8_E4M3 = e4m3 "fn", F8_E8M0 = ue8m0).
enum class DType { F64, F32, F16, BF16, F8_E4M3, F8_E8M0, U8, I8, I32, I64 };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: return 2;
    case DType::F8_E4M3: case DType::F8_E8M0: case DType::U8: case DType::I8: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F64: return "F64";
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::F8_E8M0: return "F8_E8M0";
    case DType::U8: return "U8";
    case DType::I8: return "I8";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
  }
  return "?";
}

// Parses a safetensors dtype name; returns false when unknown.
inline bool parse_dtype(std::string_view name, DType& out) {
  for (DType t : {DType::F64, DType::F32, DType::F16, DType::BF16, DType::F8_E4M3, DType::F8_E8M0,
                  DType::U8, DType::I8, DType::I32, DType::I64}) {
    if (dtype_name(t) == name) { out = t; return true; }
  }
  return false;
}

}  // namespace dsv4
