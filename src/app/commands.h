// Subcommand registration: main() builds the CLI11 tree from this one explicit list. Each
// register_* function lives in its own cmd_*.cpp and adds its subcommands and their callbacks.
#pragma once

#include <CLI/CLI.hpp>

namespace moeserve::app {

// `moeserve model inspect|gen-tiny`.
void register_model_commands(CLI::App& app);
// `moeserve generate`.
void register_generate_command(CLI::App& app);
// `moeserve tokenize|detokenize`.
void register_tokenizer_commands(CLI::App& app);
// `moeserve serve`.
void register_serve_command(CLI::App& app);
// `moeserve bench <name>`: each benchmark registers under the shared `bench` subcommand.
void register_bench_eplb(CLI::App& bench);
void register_bench_forward(CLI::App& bench);
void register_bench_tokenizer(CLI::App& bench);
void register_bench_scheduler(CLI::App& bench);
void register_bench_serve(CLI::App& bench);

// Exit code a subcommand callback wants main() to return (set by callbacks; 0 by default).
int& exit_code();

}  // namespace moeserve::app
