// `moeserve generate --model DIR --prompt-ids 1,2,3 --max-tokens N`: greedy generation with the
// CPU forward (src/model/arch), printing the generated token ids. Prefill in chunks of
// --chunk-size, then one decode step per token; stops at --max-tokens or eos.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "app/commands.h"
#include "backend/backend.h"
#include "common/logging.h"
#include "model/arch/registry.h"

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
};

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
      "generate", "Greedy generation from token ids with the CPU forward; prints token ids");
  cmd->add_option("--model", opt->model, "checkpoint directory (config.json + safetensors)")
      ->required();
  cmd->add_option("--prompt-ids", opt->prompt_ids, "comma-separated prompt token ids")->required();
  cmd->add_option("--max-tokens", opt->max_tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--mode", opt->mode, "oracle|production (bounded replay)")->capture_default_str();
  cmd->add_option("--chunk-size", opt->chunk_size, "prefill chunk size (0: whole prompt)")
      ->capture_default_str();
  cmd->add_option("--backend", opt->backend, "cpu")->capture_default_str();
  cmd->add_flag("!--ignore-eos", opt->stop_at_eos, "keep generating after eos");
  cmd->callback([opt] {
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
