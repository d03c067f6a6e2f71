#include "cli_common.hpp"

#include <cstddef>
#include <exception>
#include <filesystem>
#include <system_error>

#include "dsv4/error.hpp"

namespace dsv4::cli {

void require_output_distinct(const std::string& out, const std::vector<std::pair<std::string, std::string>>& inputs) {
  namespace fs = std::filesystem;
  for (const auto& [option, path] : inputs) {
    std::error_code error;
    const bool same = fs::equivalent(out, path, error);  // false (with an error) while `out` does not exist
    require(!(same && !error), "--out", "is the same file as " + option + " (" + path + ")");
  }
}

std::vector<std::int64_t> parse_chunk_sizes(const std::string& text, std::int64_t total, const std::string& what) {
  if (text.empty()) return {total};
  std::vector<std::int64_t> chunks;
  std::int64_t sum = 0;
  std::size_t begin = 0;
  while (true) {
    const std::size_t comma = text.find(',', begin);
    const std::string item = text.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    std::size_t used = 0;
    long long value = -1;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    require(used == item.size() && !item.empty() && value >= 0, "--chunks",
            "'" + item + "' is not a non-negative integer (expected sizes like 64,1,1,7)");
    // Bounding each item keeps the sum far from overflow; the sum itself is checked at the end.
    require(value <= total, "--chunks",
            "chunk size " + item + " exceeds the " + std::to_string(total) + " rows of " + what);
    chunks.push_back(value);
    sum += value;
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  require(sum == total, "--chunks",
          "the chunk sizes add up to " + std::to_string(sum) + " but " + what + " has " + std::to_string(total) + " rows");
  return chunks;
}

TensorView row_range(const Tensor& t, std::int64_t begin, std::int64_t count) {
  TensorView v = t.view();
  const std::int64_t row = t.shape()[0] ? t.numel() / t.shape()[0] : 0;
  v.data = static_cast<std::byte*>(v.data) + begin * row * static_cast<std::int64_t>(dtype_size(t.dtype()));
  v.shape[0] = count;
  return v;
}

}  // namespace dsv4::cli
