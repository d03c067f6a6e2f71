// apps/dsv4/cmd_make_weights.cpp — `dsv4 make-weights`.
#include <cstdio>

#include "commands.hpp"

namespace dsv4::cli {

void add_make_weights_command(CLI::App& app, Action& run) {
  CLI::App* sub = app.add_subcommand("make-weights", "(make-weights: coming next — not built yet)");
  sub->allow_extras();
  sub->callback([&run] {
    run = [] {
      std::fprintf(stderr, "dsv4 make-weights: coming next — this command is not built yet\n");
      return 3;
    };
  });
}

}  // namespace dsv4::cli
