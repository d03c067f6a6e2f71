// apps/dsv4/cmd_demo.cpp — `dsv4 demo`.
#include <cstdio>

#include "commands.hpp"

namespace dsv4::cli {

void add_demo_command(CLI::App& app, Action& run) {
  CLI::App* sub = app.add_subcommand("demo", "(demo: coming next — not built yet)");
  sub->allow_extras();
  sub->callback([&run] {
    run = [] {
      std::fprintf(stderr, "dsv4 demo: coming next — this command is not built yet\n");
      return 3;
    };
  });
}

}  // namespace dsv4::cli
