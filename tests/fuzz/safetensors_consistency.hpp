// tests/fuzz/safetensors_consistency.hpp — the property shared by the randomized mutation test
// (tests/cpu/test_safetensors.cpp) and the libFuzzer target (fuzz_safetensors.cpp): any byte image
// either parses into a self-consistent SafetensorsFile or is rejected with dsv4::Error.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "dsv4/error.hpp"
#include "dsv4/safetensors.hpp"

namespace dsv4::testing {

struct ImageVerdict {
  bool accepted = false;
  std::string error;          // the Error message when rejected
  std::string inconsistency;  // non-empty when an accepted file breaks an invariant
};

// Parses `image`; when it is accepted, checks that every tensor's bytes lie in the data buffer,
// that the byte ranges tile it exactly, that sizes match shapes and dtypes, and that every read
// function returns what the bytes hold (or a dsv4::Error where one is allowed). Exceptions other
// than dsv4::Error propagate: they are failures.
inline ImageVerdict check_safetensors_image(std::vector<std::byte> image) {
  ImageVerdict verdict;
  // Moving a vector keeps its buffer, so these addresses stay those of the parsed image.
  const auto image_begin = reinterpret_cast<std::uintptr_t>(image.data());
  const auto image_end = image_begin + image.size();
  std::uint64_t header_bytes = 0;
  if (image.size() >= 8) std::memcpy(&header_bytes, image.data(), 8);

  std::optional<SafetensorsFile> file;
  try {
    file.emplace(SafetensorsFile::from_bytes(std::move(image), "image"));
  } catch (const Error& e) {
    verdict.error = e.what();
    return verdict;
  }
  verdict.accepted = true;
  auto fail = [&](const std::string& what) {
    if (verdict.inconsistency.empty()) verdict.inconsistency = what;
  };
  // Accepted means the header length was in range, so the data buffer starts inside the image.
  const auto data_begin = image_begin + 8 + header_bytes;
  if (data_begin > image_end) fail("the data buffer starts past the end of the image");

  struct Range {
    std::uintptr_t begin, end;
  };
  std::vector<Range> ranges;
  const auto names = file->names();
  if (!std::is_sorted(names.begin(), names.end()) || std::adjacent_find(names.begin(), names.end()) != names.end()) {
    fail("names() is not sorted and unique");
  }
  for (const auto& name : names) {
    if (!file->contains(name)) fail("contains() denies listed tensor " + name);
    const auto& info = file->info(name);
    if (info.name != name) fail("info(" + name + ").name is " + info.name);
    const std::int64_t numel = shape_numel(info.shape);
    if (numel < 0 || info.bytes.size() != static_cast<std::size_t>(numel) * dtype_size(info.dtype)) {
      fail("tensor " + name + " has " + std::to_string(info.bytes.size()) + " bytes for shape " + shape_string(info.shape));
      continue;
    }
    const auto begin = reinterpret_cast<std::uintptr_t>(info.bytes.data());
    const Range range{begin, begin + info.bytes.size()};
    if (range.begin < data_begin || range.end > image_end) {
      fail("tensor " + name + " points outside the data buffer");
      continue;
    }
    ranges.push_back(range);

    const Tensor raw = file->read_raw(name, info.dtype, info.shape);
    if (raw.nbytes() != info.bytes.size() ||
        (raw.nbytes() > 0 && std::memcmp(raw.data(), info.bytes.data(), raw.nbytes()) != 0)) {
      fail("read_raw(" + name + ") differs from the stored bytes");
    }
    const Tensor as_float = file->read_float(name);
    if (as_float.numel() != numel || as_float.shape() != info.shape) fail("read_float(" + name + ") has the wrong shape");
    if (info.dtype == DType::I32 || info.dtype == DType::I64) {
      try {
        const Tensor as_int = file->read_int32(name);
        if (as_int.numel() != numel) fail("read_int32(" + name + ") has the wrong size");
      } catch (const Error&) {
        if (info.dtype == DType::I32) fail("read_int32(" + name + ") rejected an I32 tensor");
      }
    }
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  std::uintptr_t covered = data_begin;
  for (const auto& range : ranges) {
    if (range.begin != covered) fail("tensor byte ranges overlap or leave a gap");
    covered = range.end;
  }
  if (covered != image_end) fail("tensor byte ranges do not reach the end of the data buffer");
  return verdict;
}

}  // namespace dsv4::testing
