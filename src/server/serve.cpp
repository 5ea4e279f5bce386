#include "server/serve.h"

#include <cstdlib>

#include "common/logging.h"
#include "server/metrics.h"
#include "server/openai_api.h"

namespace moeserve::server {

void add_serve_options(CLI::App& cmd, ServeOptions& o) {
  cmd.add_option("--model", o.model,
                 "Model folder (config.json, safetensors, tokenizer.json); default: the embedded "
                 "tiny model (random weights)");
  cmd.add_option("--host", o.http.host, "Address to bind")->capture_default_str();
  cmd.add_option("--port", o.http.port, "Port to bind")->capture_default_str();
  cmd.add_option("--api-key", o.api_key,
                 "Require 'Authorization: Bearer <key>' on /v1/* (default: $MOESERVE_API_KEY)");
  cmd.add_option("--served-model-name", o.served_model_name,
                 "Model name in the API (default: the model folder's name)");
  cmd.add_option("--max-model-len", o.max_model_len,
                 "Context length limit (prompt + generated); default: the model's");
  cmd.add_option("--max-num-seqs", o.max_num_seqs,
                 "Requests the engine runs at once (KV and state slots are sized for this many "
                 "sequences of --max-model-len); more wait in its queue")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  cmd.add_option("--block-size", o.block_size,
                 "Tokens per prefix-cache block (a multiple of every compression ratio)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd.add_option("--prefix-replay-tokens", o.prefix_replay_tokens,
                 "Tokens replayed before a prefix-cache hit to rebuild the sliding window "
                 "(0: the model's sliding_window; longer is closer to a miss)")
      ->check(CLI::Range(0, 1 << 30))
      ->capture_default_str();
  cmd.add_flag("!--no-enable-prefix-caching", o.enable_prefix_caching,
               "Turn the prefix cache off");
  cmd.add_option("--max-body-bytes", o.http.max_body_bytes, "Request body size limit")
      ->capture_default_str();
  cmd.add_option("--io-threads", o.http.io_threads, "HTTP I/O threads")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd.add_option("--drain-timeout", o.http.drain_timeout_s,
                 "Seconds in-flight requests may run after SIGTERM before they are aborted")
      ->capture_default_str();
  cmd.add_option("--idle-timeout", o.http.idle_timeout_s,
                 "Seconds an idle keep-alive connection is kept")
      ->capture_default_str();
}

int run_server(GenerationService& service, const ServeOptions& options) {
  ApiOptions api_options;
  api_options.served_model_name =
      options.served_model_name.empty() ? service.model_info().id : options.served_model_name;
  api_options.api_key = options.api_key;
  if (api_options.api_key.empty()) {
    if (const char* env = std::getenv("MOESERVE_API_KEY")) api_options.api_key = env;
  }
  api_options.max_model_len = options.max_model_len;
  ServerMetrics metrics(api_options.served_model_name);
  OpenAiApi api(service, api_options, metrics);
  HttpServer server(options.http, api, metrics);
  auto st = server.run();
  if (!st) {
    MS_LOG_ERROR("serve: {}", st.error().message);
    return 1;
  }
  return 0;
}

}  // namespace moeserve::server
