// apps/dsv4/cli_common.hpp — small helpers shared by the CLI's subcommands.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dsv4/tensor.hpp"

namespace dsv4::cli {

// Parses "--chunks a,b,..." (non-negative integers summing to `total`); empty text is one chunk of
// `total`. `what` names the rows in messages ("the input", "x"). Throws Error("--chunks", ...).
std::vector<std::int64_t> parse_chunk_sizes(const std::string& text, std::int64_t total, const std::string& what);

// Throws Error("--out", ...) when `out` names the same file as one of `inputs` (option name, path):
// the atomic write would otherwise replace an input.
void require_output_distinct(const std::string& out, const std::vector<std::pair<std::string, std::string>>& inputs);

// Rows [begin, begin + count) of a contiguous host tensor [T, ...] as a view.
TensorView row_range(const Tensor& t, std::int64_t begin, std::int64_t count);

}  // namespace dsv4::cli
