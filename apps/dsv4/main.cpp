// apps/dsv4/main.cpp — entry point of the `dsv4` command-line tool.
#include <cstdio>
#include <exception>

#include "commands.hpp"
#include "dsv4/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{"dsv4 — DeepSeek-V4 compressed attention (CSA/HCA): reference and CUDA kernels"};
  app.require_subcommand(1);
  dsv4::cli::Action run;
  dsv4::cli::add_demo_command(app, run);
  dsv4::cli::add_compress_command(app, run);
  dsv4::cli::add_make_weights_command(app, run);
  dsv4::cli::add_run_layer_command(app, run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return run ? run() : 0;
  } catch (const dsv4::Error& e) {
    std::fprintf(stderr, "dsv4: error: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsv4: error: %s\n", e.what());
  }
  return 1;
}
