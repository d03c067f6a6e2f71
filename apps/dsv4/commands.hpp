// apps/dsv4/commands.hpp — the CLI's subcommands. Each lives in its own file and only parses,
// validates, calls the library and reports; errors propagate as dsv4::Error to main().
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace dsv4::cli {

// Each function adds one subcommand to `app` and sets `run` to the action to perform when the
// subcommand is chosen.
using Action = std::function<int()>;
void add_compress_command(CLI::App& app, Action& run);
void add_make_weights_command(CLI::App& app, Action& run);
void add_run_layer_command(CLI::App& app, Action& run);
void add_demo_command(CLI::App& app, Action& run);

}  // namespace dsv4::cli
