// apps/dsv4/cmd_run_layer.cpp — `dsv4 run-layer`.
#include <cstdio>

#include "commands.hpp"

namespace dsv4::cli {

void add_run_layer_command(CLI::App& app, Action& run) {
  CLI::App* sub = app.add_subcommand("run-layer", "(run-layer: coming next — not built yet)");
  sub->allow_extras();
  sub->callback([&run] {
    run = [] {
      std::fprintf(stderr, "dsv4 run-layer: coming next — this command is not built yet\n");
      return 3;
    };
  });
}

}  // namespace dsv4::cli
