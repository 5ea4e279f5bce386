// `moeserve serve`: the OpenAI-compatible HTTP server (src/server) around the engine.
#include "app/commands.h"
#include "common/logging.h"
#include "server/engine_service.h"
#include "server/serve.h"

namespace moeserve::app {

void register_serve_command(CLI::App& app) {
  auto options = std::make_shared<server::ServeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "serve", "OpenAI-compatible HTTP server (default: the embedded tiny model, random weights)");
  server::add_serve_options(*cmd, *options);
  cmd->callback([options] {
    auto service = server::make_engine_service(*options);
    if (!service) {
      MS_LOG_ERROR("serve: {}", service.error().message);
      exit_code() = 1;
      return;
    }
    exit_code() = server::run_server(**service, *options);
  });
}

}  // namespace moeserve::app
