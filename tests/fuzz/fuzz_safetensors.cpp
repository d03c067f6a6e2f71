// libFuzzer target for the safetensors reader: every input either parses into a self-consistent
// file or is rejected with dsv4::Error (tests/fuzz/safetensors_consistency.hpp). Built with
// clang and -DDSV4_FUZZ=ON; run e.g. `build/tests/fuzz_safetensors -max_total_time=60 corpus/`.
#include <cstdio>
#include <cstdlib>

#include "fuzz/safetensors_consistency.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::byte> image(size);
  if (size > 0) std::memcpy(image.data(), data, size);
  const auto verdict = dsv4::testing::check_safetensors_image(std::move(image));
  if (!verdict.inconsistency.empty()) {
    std::fprintf(stderr, "inconsistent parse: %s\n", verdict.inconsistency.c_str());
    std::abort();
  }
  return 0;
}
