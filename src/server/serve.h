// `serve` glue shared by `moeserve serve` and the test server: the command-line options and the
// function that runs the HTTP server around a GenerationService until a signal drains it.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "server/generation_service.h"
#include "server/http_server.h"

namespace moeserve::server {

struct ServeOptions {
  std::string model;  // "" → the embedded tiny model
  HttpServerOptions http;
  std::string api_key;
  std::string served_model_name;
  int32_t max_model_len = 0;  // 0 → the model's
  int32_t max_num_seqs = 64;  // requests the engine runs at once (the rest wait in its queue)
  int32_t block_size = 256;          // tokens per prefix-cache block (--block-size)
  int32_t prefix_replay_tokens = 0;  // tokens replayed before a prefix hit; 0 → sliding window
  bool enable_prefix_caching = true;
};

// Adds --host --port --api-key --served-model-name --max-model-len --max-body-bytes --io-threads
// --drain-timeout --idle-timeout --max-num-seqs --block-size --prefix-replay-tokens
// --no-enable-prefix-caching (and --model) to `cmd`.
void add_serve_options(CLI::App& cmd, ServeOptions& options);

// Serves until SIGINT/SIGTERM; returns the process exit code (0 after a clean drain).
[[nodiscard]] int run_server(GenerationService& service, const ServeOptions& options);

}  // namespace moeserve::server
