// `moeserve generate --model DIR --prompt-ids 1,2,3 --max-tokens N`: greedy generation with the
// CPU forward (src/model/arch), printing the generated token ids. Prefill in chunks of
// --chunk-size, then one decode step per token; stops at --max-tokens or eos.
// `moeserve generate --model DIR --prompt "text" [--prompt ...] [--prompts-file F]`: text prompts
// through the engine (continuous batching, prefix caching; src/engine offline API), printing one
// completion per prompt.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "app/commands.h"
#include "backend/backend.h"
#include "common/logging.h"
#include "engine/engine_config.h"
#include "engine/offline.h"
#include "model/arch/registry.h"
#include "runtime/causal_lm_forward.h"
#include "runtime/model_runner.h"
#include "server/engine_service.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::app {
namespace {

struct GenerateOptions {
  std::string model;
  std::string prompt_ids;
  int32_t max_tokens = 16;
  std::string mode = "production";
  int32_t chunk_size = 0;  // 0: whole prompt in one chunk
  std::string backend = "cpu";
  bool stop_at_eos = true;
  // Text mode.
  std::vector<std::string> prompts;
  std::string prompts_file;
  float temperature = 0.0f;
  int64_t seed = -1;
  size_t kv_cache_memory_bytes = size_t{256} << 20;
  int32_t block_size = 256;
  int32_t prefix_replay_tokens = 0;
  bool enable_prefix_caching = true;
};

// Text prompts through the engine: one EngineCore, all prompts submitted at once so they are
// batched continuously; completions come back in prompt order.
Result<std::vector<std::string>> generate_text(const GenerateOptions& opt) {
  std::vector<std::string> prompts = opt.prompts;
  if (!opt.prompts_file.empty()) {
    std::ifstream in(opt.prompts_file);
    if (!in)
      return make_error(ErrorCode::kNotFound, "cannot open --prompts-file {}", opt.prompts_file);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) prompts.push_back(line);
    }
  }
  if (prompts.empty()) return make_error(ErrorCode::kInvalidArgument, "no prompts given");
  MS_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok,
                      tokenizer::Tokenizer::load(opt.model));
  MS_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, create_backend(opt.backend));
  // The Engram token map comes from the tokenizer at load (no identity-map warning first).
  MS_ASSIGN_OR_RETURN(std::unique_ptr<arch::CausalLm> lm,
                      server::load_causal_lm_with_tokenizer(opt.model, *backend, *tok));
  lm->set_batch_invariant(true);
  MS_ASSIGN_OR_RETURN(arch::ForwardMode mode, arch::forward_mode_from_name(opt.mode));
  engine::EngineOptions eo;
  eo.kv_cache_memory_bytes = opt.kv_cache_memory_bytes;
  eo.block_tokens = opt.block_size;
  eo.prefix_replay_tokens = opt.prefix_replay_tokens;
  eo.enable_prefix_caching = opt.enable_prefix_caching;
  eo.max_num_seqs = std::max<int32_t>(1, static_cast<int32_t>(prompts.size()));
  MS_ASSIGN_OR_RETURN(engine::EngineSizing sizing, engine::size_engine(lm->config(), eo));
  auto forward = std::make_unique<runtime::CausalLmForwardModel>(std::move(lm), mode);
  engine::EngineCore core(sizing.core,
                          std::make_unique<runtime::ModelRunner>(std::move(forward), /*seed=*/0));
  std::vector<engine::EngineRequest> requests;
  for (const std::string& p : prompts) {
    engine::EngineRequest r;
    r.prompt_token_ids = tok->encode(p, /*add_special_tokens=*/true);
    r.params.temperature = opt.temperature;
    r.params.max_tokens = opt.max_tokens;
    r.params.ignore_eos = !opt.stop_at_eos;
    if (opt.seed >= 0) r.params.seed = static_cast<uint64_t>(opt.seed);
    MS_RETURN_IF_ERROR(r.params.validate());
    requests.push_back(std::move(r));
  }
  MS_ASSIGN_OR_RETURN(std::vector<engine::Completion> done,
                      engine::generate(core, std::move(requests)));
  std::vector<std::string> texts;
  for (const engine::Completion& c : done)
    texts.push_back(tok->decode(c.token_ids, /*skip_special_tokens=*/true));
  return texts;
}

Result<std::vector<int32_t>> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    try {
      size_t used = 0;
      const long v = std::stol(item, &used);
      if (used != item.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument(item);
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::exception&) {
      return make_error(ErrorCode::kInvalidArgument, "--prompt-ids: '{}' is not a token id", item);
    }
  }
  if (ids.empty()) return make_error(ErrorCode::kInvalidArgument, "--prompt-ids is empty");
  return ids;
}

Result<std::vector<int32_t>> generate(const GenerateOptions& opt) {
  MS_ASSIGN_OR_RETURN(std::vector<int32_t> prompt, parse_ids(opt.prompt_ids));
  MS_ASSIGN_OR_RETURN(arch::ForwardMode mode, arch::forward_mode_from_name(opt.mode));
  MS_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, create_backend(opt.backend));
  MS_ASSIGN_OR_RETURN(std::unique_ptr<arch::CausalLm> model,
                      arch::load_causal_lm(opt.model, *backend));
  auto state = model->new_state();
  const int32_t n = static_cast<int32_t>(prompt.size());
  const int32_t chunk = opt.chunk_size > 0 ? opt.chunk_size : n;
  std::vector<float> last;
  for (int32_t s = 0; s < n; s += chunk) {
    arch::SequenceInput in;
    in.state = state.get();
    in.tokens = std::span<const int32_t>(prompt).subspan(
        static_cast<size_t>(s), static_cast<size_t>(std::min(chunk, n - s)));
    in.prompt_len = n;
    in.want_main_hidden = false;
    MS_ASSIGN_OR_RETURN(auto out, model->forward({&in, 1}, mode));
    if (!out.front().logits.empty()) last = std::move(out.front().logits);
  }
  std::vector<int32_t> generated;
  const int32_t eos = model->config().eos_token_id;
  while (static_cast<int32_t>(generated.size()) < opt.max_tokens) {
    // Greedy: argmax, ties -> lowest id.
    const int32_t next =
        static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
    generated.push_back(next);
    if ((opt.stop_at_eos && next == eos) ||
        static_cast<int32_t>(generated.size()) >= opt.max_tokens)
      break;
    arch::SequenceInput in;
    in.state = state.get();
    in.tokens = {&generated.back(), 1};
    in.want_main_hidden = false;
    MS_ASSIGN_OR_RETURN(auto out, model->forward({&in, 1}, mode));
    last = std::move(out.front().logits);
  }
  return generated;
}

}  // namespace

void register_generate_command(CLI::App& app) {
  auto opt = std::make_shared<GenerateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "generate",
      "Generate: token ids (direct forward, prints ids) or text prompts (through the engine)");
  cmd->add_option("--model", opt->model, "checkpoint directory (config.json + safetensors)")
      ->required();
  auto* ids_opt =
      cmd->add_option("--prompt-ids", opt->prompt_ids, "comma-separated prompt token ids");
  auto* text_opt =
      cmd->add_option("--prompt", opt->prompts, "text prompt (repeatable; uses the engine)");
  auto* file_opt = cmd->add_option("--prompts-file", opt->prompts_file, "one text prompt per line");
  ids_opt->excludes(text_opt)->excludes(file_opt);
  cmd->add_option("--temperature", opt->temperature, "text mode: sampling temperature (0: greedy)")
      ->capture_default_str();
  cmd->add_option("--seed", opt->seed, "text mode: per-request seed (-1: none)");
  cmd->add_option("--kv-cache-memory-bytes", opt->kv_cache_memory_bytes, "text mode: KV budget")
      ->capture_default_str();
  cmd->add_option("--block-size", opt->block_size, "text mode: tokens per prefix-cache block")
      ->capture_default_str();
  cmd->add_option("--prefix-replay-tokens", opt->prefix_replay_tokens,
                  "text mode: tokens replayed before a prefix hit (0: the sliding window)")
      ->capture_default_str();
  cmd->add_flag("!--no-enable-prefix-caching", opt->enable_prefix_caching,
                "text mode: turn the prefix cache off");
  cmd->add_option("--max-tokens", opt->max_tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--mode", opt->mode, "oracle|production (bounded replay)")->capture_default_str();
  cmd->add_option("--chunk-size", opt->chunk_size, "prefill chunk size (0: whole prompt)")
      ->capture_default_str();
  cmd->add_option("--backend", opt->backend, "cpu")->capture_default_str();
  cmd->add_flag("!--ignore-eos", opt->stop_at_eos, "keep generating after eos");
  cmd->callback([opt] {
    if (opt->prompt_ids.empty()) {
      if (opt->prompts.empty() && opt->prompts_file.empty()) {
        MS_LOG_ERROR("generate: give --prompt-ids, --prompt or --prompts-file");
        exit_code() = 2;
        return;
      }
      auto texts = generate_text(*opt);
      if (!texts) {
        MS_LOG_ERROR("generate: {}", texts.error().to_string());
        exit_code() = 1;
        return;
      }
      for (const std::string& t : *texts) std::printf("%s\n", t.c_str());
      return;
    }
    auto ids = generate(*opt);
    if (!ids) {
      MS_LOG_ERROR("generate: {}", ids.error().to_string());
      exit_code() = 1;
      return;
    }
    std::printf("%s\n", fmt::format("{}", fmt::join(*ids, ",")).c_str());
  });
}

}  // namespace moeserve::app
