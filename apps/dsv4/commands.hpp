// apps/dsv4/commands.hpp — the CLI's subcommands. Each lives in its own file and only parses,
// validates, calls the library and reports; errors propagate as dsv4::Error to main().
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace dsv4::cli {

// Each function adds one subcommand to `app` and sets `run` to the action to perform when the
// subcommand is chosen.
using Action = std::function<int()>;
void add_compress_command(CLI::App& app, Action& run);
void add_make_weights_command(CLI::App& app, Action& run);
void add_run_layer_command(CLI::App& app, Action& run);
void add_demo_command(CLI::App& app, Action& run);

// Check of an unsigned option (a seed): CLI11 would wrap "-1" to 2^64 − 1.
inline CLI::Validator non_negative_integer() {
  return CLI::Validator(
      [](std::string& text) {
        return text.find('-') == std::string::npos ? std::string() : "must be a non-negative integer, got " + text;
      },
      "UINT64");
}

}  // namespace dsv4::cli
