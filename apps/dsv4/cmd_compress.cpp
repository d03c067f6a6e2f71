// apps/dsv4/cmd_compress.cpp — `dsv4 compress`.
#include <cstdio>

#include "commands.hpp"

namespace dsv4::cli {

void add_compress_command(CLI::App& app, Action& run) {
  CLI::App* sub = app.add_subcommand("compress", "(compress: coming next — not built yet)");
  sub->allow_extras();
  sub->callback([&run] {
    run = [] {
      std::fprintf(stderr, "dsv4 compress: coming next — this command is not built yet\n");
      return 3;
    };
  });
}

}  // namespace dsv4::cli
