// moeserve: the command-line entry point. Subcommands are registered from one explicit list.
#include <cstdio>
#include <string>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "app/commands.h"
#include "common/build_info.h"
#include "common/logging.h"

namespace moeserve::app {
int& exit_code() {
  static int code = 0;
  return code;
}
}  // namespace moeserve::app

int main(int argc, char** argv) {
  using namespace moeserve;
  CLI::App app{"moeserve: a serving engine for DeepSeek-V4.1-Flash-class sparse MoE models",
               "moeserve"};
  app.set_version_flag("--version", fmt::format("{} ({})", build_version(), build_git_commit()));
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off")
      ->capture_default_str();
  app.require_subcommand(1);
  app.parse_complete_callback([&] { init_logging(log_level); });

  app::register_model_commands(app);
  app::register_generate_command(app);
  app::register_tokenizer_commands(app);
  app::register_serve_command(app);
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks (print a table, write JSON)");
  bench->require_subcommand(1);
  app::register_bench_eplb(*bench);
  app::register_bench_forward(*bench);
  app::register_bench_tokenizer(*bench);
  app::register_bench_scheduler(*bench);
  app::register_bench_serve(*bench);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return app::exit_code();
}
