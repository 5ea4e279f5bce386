// moeserve_fake_serve: the real HTTP server (src/server) for tests, around either the scripted fake
// engine (--engine fake, default) or the real EngineCore + tokenizer driving a toy forward model
// (--engine toy), with the same options as `moeserve serve`.
#include <CLI/CLI.hpp>

#include "common/logging.h"
#include "engine/engine_core.h"
#include "runtime/model_runner.h"
#include "server/engine_service.h"
#include "server/fake_generation_service.h"
#include "server/serve.h"
#include "server/toy_forward_model.h"
#include "tokenizer/default_paths.h"

namespace {

int run_toy(const moeserve::server::ServeOptions& options, int32_t kv_blocks) {
  using namespace moeserve;
  auto tok = tokenizer::Tokenizer::load(tokenizer::default_tokenizer_dir());
  if (!tok) {
    MS_LOG_ERROR("{}", tok.error().message);
    return 1;
  }
  const int32_t max_len = options.max_model_len > 0 ? options.max_model_len : 4096;
  engine::EngineCoreConfig cfg;
  cfg.scheduler.max_model_len = max_len;
  cfg.scheduler.max_num_seqs = 256;
  cfg.scheduler.max_num_batched_tokens = 8192;
  cfg.scheduler.replay_window = 0;
  cfg.kv.num_global_blocks = kv_blocks;
  cfg.kv.num_state_slots = 256;
  cfg.kv.check_invariants = false;
  cfg.eos_token_id = (*tok)->token_to_id("<｜end▁of▁sentence｜>").value_or(1);
  auto model = std::make_unique<server::testing::ToyForwardModel>((*tok)->vocab_size());
  auto core = std::make_unique<engine::EngineCore>(
      cfg, std::make_unique<runtime::ModelRunner>(std::move(model), 1234));
  server::EngineGenerationService service({"moeserve-toy", "toy", max_len}, std::move(core),
                                          std::move(*tok));
  return server::run_server(service, options);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace moeserve;
  CLI::App app{"moeserve HTTP server around a test engine", "moeserve_fake_serve"};
  server::ServeOptions options;
  std::string engine = "fake";
  double step_ms = 2.0;
  int64_t kv_blocks = 4096;
  std::string log_level = "info";
  server::add_serve_options(app, options);
  app.add_option("--engine", engine, "fake (scripted) | toy (real EngineCore, toy forward)")
      ->check(CLI::IsMember({"fake", "toy"}));
  app.add_option("--fake-step-ms", step_ms, "Milliseconds per fake engine step");
  app.add_option("--fake-kv-blocks", kv_blocks, "KV pool size in blocks");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off");
  CLI11_PARSE(app, argc, argv);
  init_logging(log_level);
  if (engine == "toy")
    return run_toy(options, static_cast<int32_t>(std::min<int64_t>(kv_blocks, 1024)));
  server::testing::FakeGenerationService service(
      "moeserve-fake", options.max_model_len > 0 ? options.max_model_len : 4096, step_ms,
      kv_blocks);
  return server::run_server(service, options);
}
