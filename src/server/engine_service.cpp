#include "server/engine_service.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <utility>

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "kv/block_hash.h"
#include "kv/kv_layout.h"
#include "model/arch/deepseek_v41.h"
#include "model/arch/registry.h"
#include "model/arch/weight_loader.h"
#include "model/checkpoint_validator.h"
#include "model/config.h"
#include "model/engram_table.h"
#include "model/tiny_model.h"
#include "runtime/causal_lm_forward.h"
#include "runtime/model_runner.h"
#include "server/embedded_config.h"
#include "tokenizer/default_paths.h"
#include "tokenizer/engram_token_map.h"
// NOTE: the DeepSeek-V4 chat encoding and DSML output parser are landing in src/tokenizer in
// parallel with this file; until they do, chat prompts are refused and output is plain content.
#if __has_include("tokenizer/chat_encoding.h") && __has_include("tokenizer/chat_output_parser.h")
#define MOESERVE_HAVE_DSV4_CHAT 1
#include "tokenizer/chat_encoding.h"
#include "tokenizer/chat_output_parser.h"
#else
#define MOESERVE_HAVE_DSV4_CHAT 0
#endif
#include "tokenizer/stream_detokenizer.h"

namespace moeserve::server {
namespace {

namespace fs = std::filesystem;

class StreamDetok final : public IncrementalDetokenizer {
 public:
  StreamDetok(const tokenizer::Tokenizer& tok, bool skip) : detok_(tok, skip) {}
  std::string push(int32_t id) override { return detok_.push(id); }
  std::string finish() override { return detok_.finish(); }

 private:
  tokenizer::StreamDetokenizer detok_;
};

#if MOESERVE_HAVE_DSV4_CHAT
class DsmlParser final : public OutputParser {
 public:
  explicit DsmlParser(tokenizer::dsv4::ChatOutputParserOptions options)
      : parser_(std::move(options)) {}
  ParsedDelta push(std::string_view text) override { return convert(parser_.feed(text)); }
  ParsedDelta finish() override { return convert(parser_.finish()); }

 private:
  ParsedDelta convert(tokenizer::dsv4::ParsedDelta&& d) {
    ParsedDelta out;
    out.reasoning = std::move(d.reasoning_content);
    out.content = std::move(d.content);
    for (auto& c : d.tool_calls) {
      // The DSML parser emits each call whole (an invoke is atomic).
      out.tool_calls.push_back(
          ToolCallDelta{next_index_++, std::move(c.id), std::move(c.name), std::move(c.arguments)});
    }
    return out;
  }
  tokenizer::dsv4::ChatOutputParser parser_;
  int32_t next_index_ = 0;
};

// tool_choice none (or no tools): reasoning is split off, everything after it is content, and
// DSML markup the model writes stays in the content verbatim.
class ReasoningOnlyParser final : public OutputParser {
 public:
  explicit ReasoningOnlyParser(bool thinking) : in_reasoning_(thinking) {}
  ParsedDelta push(std::string_view text) override {
    buffer_ += text;
    return drain(false);
  }
  ParsedDelta finish() override { return drain(true); }

 private:
  ParsedDelta drain(bool final) {
    using tokenizer::dsv4::kThinkEnd;
    using tokenizer::dsv4::kThinkStart;
    ParsedDelta out;
    if (in_reasoning_) {
      if (at_start_) {
        // The prompt already opened <think>; tolerate the model repeating it.
        const size_t n = std::min(buffer_.size(), kThinkStart.size());
        if (!final && buffer_.size() < kThinkStart.size() && kThinkStart.substr(0, n) == buffer_) {
          return out;
        }
        at_start_ = false;
        if (buffer_.starts_with(kThinkStart)) buffer_.erase(0, kThinkStart.size());
      }
      const size_t end = buffer_.find(kThinkEnd);
      if (end == std::string::npos) {
        size_t hold = 0;
        if (!final) {
          for (size_t k = std::min(buffer_.size(), kThinkEnd.size() - 1); k > 0; --k) {
            if (std::string_view(buffer_).substr(buffer_.size() - k) == kThinkEnd.substr(0, k)) {
              hold = k;
              break;
            }
          }
        }
        out.reasoning = buffer_.substr(0, buffer_.size() - hold);
        buffer_.erase(0, buffer_.size() - hold);
        return out;
      }
      out.reasoning = buffer_.substr(0, end);
      buffer_.erase(0, end + kThinkEnd.size());
      in_reasoning_ = false;
    }
    out.content = std::exchange(buffer_, {});
    return out;
  }

  bool in_reasoning_;
  bool at_start_ = true;
  std::string buffer_;
};

#else
class PlainParser final : public OutputParser {
 public:
  ParsedDelta push(std::string_view text) override {
    return ParsedDelta{{}, std::string(text), {}};
  }
  ParsedDelta finish() override { return {}; }
};
#endif

#if MOESERVE_HAVE_DSV4_CHAT
tokenizer::ChatRole to_role(const std::string& role) {
  if (role == "system") return tokenizer::ChatRole::kSystem;
  if (role == "developer") return tokenizer::ChatRole::kDeveloper;
  if (role == "assistant") return tokenizer::ChatRole::kAssistant;
  if (role == "tool") return tokenizer::ChatRole::kTool;
  return tokenizer::ChatRole::kUser;
}
#endif

GenerationOutput to_output(engine::RequestOutput&& o) {
  GenerationOutput out;
  out.token_ids = std::move(o.new_token_ids);
  out.logprobs.reserve(o.logprobs.size());
  for (auto& lp : o.logprobs) {
    TokenLogprobs t;
    t.logprob = lp.logprob;
    for (auto& [id, v] : lp.top) t.top.push_back(TopLogprob{id, v});
    out.logprobs.push_back(std::move(t));
  }
  if (o.finished) {
    out.finish_reason = o.finish_reason;
    if (out.finish_reason == FinishReason::kNone) out.finish_reason = FinishReason::kStop;
  }
  if (out.finish_reason == FinishReason::kStop && !o.stop_reason.empty() &&
      !out.token_ids.empty()) {
    char* end = nullptr;
    const long v = std::strtol(o.stop_reason.c_str(), &end, 10);
    if (end && *end == '\0' && v == out.token_ids.back())
      out.stop_token_id = static_cast<int32_t>(v);
  }
  out.num_cached_tokens = o.usage.cached_tokens;
  out.error_message = std::move(o.error);
  return out;
}

std::string cache_root() {
  if (const char* d = std::getenv("MOESERVE_CACHE_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/moeserve";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/moeserve";
  return "/tmp/moeserve-cache";
}

// Bump when the generator (model/tiny_model.cpp) changes its output for a given (config, seed).
constexpr std::string_view kEmbeddedGeneratorVersion = "gen-tiny-v1";
constexpr uint64_t kEmbeddedSeed = 0;

uint64_t fnv1a64(std::string_view a, std::string_view b) {
  uint64_t h = 1469598103934665603ull;
  for (std::string_view s : {a, b}) {
    for (unsigned char c : s) {
      h ^= c;
      h *= 1099511628211ull;
    }
    h ^= 0xff;
    h *= 1099511628211ull;
  }
  return h;
}

Status copy_into(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
  if (ec)
    return make_error(ErrorCode::kIo, "cannot copy {} to {}: {}", from.string(), to.string(),
                      ec.message());
  return ok_status();
}

// The embedded model (configs/embedded/config.json, built into the binary): generated
// deterministically (gen-tiny, fixed seed) with the bundled tokenizer copied beside it, into
// CACHE/embedded-<hash of config + generator version> on first use; later starts reuse it.
Result<std::string> ensure_embedded_model() {
  const std::string_view config_json = embedded_model_config_json();
  const fs::path dir =
      fs::path(cache_root()) /
      fmt::format("embedded-{:016x}", fnv1a64(config_json, kEmbeddedGeneratorVersion));
  if (fs::exists(dir / "config.json") && fs::exists(dir / "model.safetensors") &&
      fs::exists(dir / "tokenizer.json")) {
    return dir.string();
  }
  MS_LOG_INFO("serve: generating the embedded tiny model (RANDOM weights, seed {}) into {}",
              kEmbeddedSeed, dir.string());
  const fs::path tmp = dir.string() + fmt::format(".tmp{}", ::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) return make_error(ErrorCode::kIo, "cannot create {}: {}", tmp.string(), ec.message());
  MS_RETURN_IF_ERROR(write_generated_model(tmp, config_json, kEmbeddedSeed));
  const fs::path tok_dir = tokenizer::default_tokenizer_dir();
  MS_RETURN_IF_ERROR(copy_into(tok_dir / "tokenizer.json", tmp / "tokenizer.json"));
  if (fs::exists(tok_dir / "tokenizer_config.json"))
    MS_RETURN_IF_ERROR(copy_into(tok_dir / "tokenizer_config.json", tmp / "tokenizer_config.json"));
  fs::rename(tmp, dir, ec);
  if (ec) {
    // Another process may have won the race; its copy is identical.
    fs::remove_all(tmp, ec);
    if (!fs::exists(dir / "tokenizer.json"))
      return make_error(ErrorCode::kIo, "cannot move {} to {}", tmp.string(), dir.string());
  }
  return dir.string();
}

}  // namespace

namespace {

// The tokenizer-derived Engram map for a V4.1 config with Engram layers; nullopt otherwise.
Result<std::optional<EngramTokenMap>> tokenizer_engram_map(const ModelConfig& config,
                                                           const tokenizer::Tokenizer& tok) {
  if (config.model_type != "deepseek_v41" || config.engram_layer_ids.empty()) {
    return std::optional<EngramTokenMap>();
  }
  if (tok.vocab_size() != config.vocab_size) {
    return make_error(ErrorCode::kInvalidArgument,
                      "the tokenizer has {} tokens but the model's vocab_size is {}",
                      tok.vocab_size(), config.vocab_size);
  }
  tokenizer::EngramTokenMap map = tokenizer::build_engram_token_map(tok);
  if (map.num_compressed != config.engram_compressed_vocab_size) {
    return make_error(ErrorCode::kInvalidArgument,
                      "the tokenizer-derived Engram map has {} compressed ids but the config's "
                      "engram_compressed_vocab_size is {}",
                      map.num_compressed, config.engram_compressed_vocab_size);
  }
  const int32_t num_compressed = map.num_compressed;
  MS_ASSIGN_OR_RETURN(EngramTokenMap table,
                      EngramTokenMap::from_table(config, std::move(map.compressed)));
  MS_LOG_INFO("Engram token map derived from the tokenizer ({} -> {} ids)", config.vocab_size,
              num_compressed);
  return std::optional<EngramTokenMap>(std::move(table));
}

}  // namespace

// Real checkpoints ship no Engram map: it is derived from the tokenizer (model.md §4 step 1).
Status install_engram_token_map(arch::CausalLm& lm, const tokenizer::Tokenizer& tok) {
  auto* v41 = dynamic_cast<arch::DeepseekV41Model*>(&lm);
  if (v41 == nullptr) return ok_status();
  MS_ASSIGN_OR_RETURN(std::optional<EngramTokenMap> map, tokenizer_engram_map(lm.config(), tok));
  if (map) v41->set_token_map(std::move(*map));
  return ok_status();
}

Result<std::unique_ptr<arch::CausalLm>> load_causal_lm_with_tokenizer(
    const std::string& dir, Backend& backend, const tokenizer::Tokenizer& tok) {
  MS_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(dir));
  MS_ASSIGN_OR_RETURN(std::optional<EngramTokenMap> map, tokenizer_engram_map(config, tok));
  if (!map) return arch::load_causal_lm(dir, backend);
  // The map is known before the model is built, so load() never makes a placeholder map.
  MS_ASSIGN_OR_RETURN(std::unique_ptr<arch::DeepseekV41Model> model,
                      arch::DeepseekV41Model::load(dir, backend, std::move(*map)));
  return std::unique_ptr<arch::CausalLm>(std::move(model));
}

EngineGenerationService::EngineGenerationService(Config config,
                                                 std::unique_ptr<engine::EngineCore> core,
                                                 std::unique_ptr<tokenizer::Tokenizer> tokenizer,
                                                 std::unique_ptr<Backend> backend)
    : config_(std::move(config)),
      backend_(std::move(backend)),
      core_(std::move(core)),
      tokenizer_(std::move(tokenizer)) {
  thread_ = std::thread([this] { loop(); });
}

EngineGenerationService::~EngineGenerationService() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

ModelInfo EngineGenerationService::model_info() const {
  return ModelInfo{config_.model_name, config_.root, config_.max_model_len,
                   std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count()};
}

std::vector<int32_t> EngineGenerationService::tokenize(std::string_view text,
                                                       bool add_special_tokens) const {
  return tokenizer_->encode(text, add_special_tokens);
}

std::string EngineGenerationService::detokenize(std::span<const int32_t> ids, bool skip) const {
  return tokenizer_->decode(ids, skip);
}

std::unique_ptr<IncrementalDetokenizer> EngineGenerationService::make_detokenizer(
    bool skip_special) const {
  return std::make_unique<StreamDetok>(*tokenizer_, skip_special);
}

Result<ChatPrompt> EngineGenerationService::render_chat(const ChatPromptInput& input) const {
#if !MOESERVE_HAVE_DSV4_CHAT
  (void)input;
  return make_error(ErrorCode::kUnimplemented, "the DeepSeek-V4 chat encoding is not built in");
#else
  std::vector<tokenizer::ChatMessage> messages;
  messages.reserve(input.messages.size());
  for (const auto& m : input.messages) {
    tokenizer::ChatMessage t;
    t.role = to_role(m.role);
    t.content = m.content;
    t.reasoning_content = m.reasoning_content.value_or("");
    t.tool_call_id = m.tool_call_id;
    for (const auto& c : m.tool_calls) t.tool_calls.push_back({c.id, c.name, c.arguments});
    messages.push_back(std::move(t));
  }
  std::vector<tokenizer::ToolDefinition> tools;
  for (const auto& def : input.tools) {
    tokenizer::ToolDefinition t;
    t.function = nlohmann::ordered_json::parse(def.function_json, nullptr, false);
    if (t.function.is_discarded()) {
      return make_error(ErrorCode::kInvalidArgument, "tool '{}' is not valid JSON", def.name);
    }
    tools.push_back(std::move(t));
  }
  tokenizer::ChatEncodeOptions options;
  options.thinking = input.thinking;
  options.add_bos = true;
  ChatPrompt prompt;
  prompt.text = tokenizer::dsv4::encode_chat(messages, tools, options);
  const bool forced =
      input.tool_choice == ToolChoiceMode::kRequired || input.tool_choice == ToolChoiceMode::kNamed;
  if (forced && input.add_generation_prompt && !input.tools.empty()) {
    // NOTE: no constrained decoding here, so tool_choice required / named is enforced by starting
    // the assistant turn with the DSML block an assistant tool call renders to (after an empty
    // reasoning in thinking mode): "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"" and, when
    // the function is known (named, or the only tool), its name and the end of the tag.
    if (input.tool_choice == ToolChoiceMode::kNamed) {
      prompt.forced_tool_name = input.tool_choice_name;
    } else if (input.tools.size() == 1) {
      prompt.forced_tool_name = input.tools.front().name;
    }
    std::string prefix;
    if (input.thinking) prefix += tokenizer::dsv4::kThinkEnd;
    prefix += "\n\n";
    prefix += tokenizer::dsv4::kToolCallsStart;
    prefix += '\n';
    prefix += tokenizer::dsv4::kInvokeStart;
    prefix += " name=\"";
    if (!prompt.forced_tool_name.empty()) prefix += prompt.forced_tool_name + "\">\n";
    prompt.text += prefix;
    prompt.forced_output_prefix = std::move(prefix);
  }
  prompt.token_ids = tokenizer_->encode(prompt.text, /*add_special_tokens=*/false);
  return prompt;
#endif
}

std::unique_ptr<OutputParser> EngineGenerationService::make_output_parser(
    const OutputParserOptions& options) const {
#if !MOESERVE_HAVE_DSV4_CHAT
  (void)options;
  return std::make_unique<PlainParser>();
#else
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  if (!options.tools_enabled) return std::make_unique<ReasoningOnlyParser>(options.thinking);
  tokenizer::dsv4::ChatOutputParserOptions o;
  o.thinking = options.thinking;
  o.id_prefix = fmt::format("call_{:08x}{:06x}_", salt & 0xffffffffu, counter.fetch_add(1));
  return std::make_unique<DsmlParser>(std::move(o));
#endif
}

Status EngineGenerationService::submit(GenerationRequest request, OutputCallback on_output) {
  engine::EngineRequest req;
  req.prompt_token_ids = std::move(request.prompt_token_ids);
  const SamplingOptions& s = request.sampling;
  sched::SamplingParams& p = req.params;
  p.temperature = s.temperature;
  p.top_p = s.top_p;
  p.top_k = s.top_k;
  p.min_p = s.min_p;
  p.presence_penalty = s.presence_penalty;
  p.frequency_penalty = s.frequency_penalty;
  p.repetition_penalty = s.repetition_penalty;
  p.seed = s.seed;
  p.max_tokens = s.max_tokens;
  p.min_tokens = s.min_tokens;
  p.stop_token_ids = s.stop_token_ids;
  p.ignore_eos = s.ignore_eos;
  p.logprobs = s.logprobs;
  if (Status st = p.validate(); !st) return st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ || failed_) return make_error(ErrorCode::kCancelled, "the engine is not running");
    req.id = next_id_++;
    inbox_.push_back(AddCmd{std::move(req), std::move(request.request_id), std::move(on_output)});
  }
  cv_.notify_all();
  return ok_status();
}

void EngineGenerationService::abort(const std::string& request_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.push_back(AbortCmd{request_id});
  }
  cv_.notify_all();
}

EngineStats EngineGenerationService::stats() const {
  const engine::MetricsSnapshot m = core_->metrics().snapshot();
  EngineStats s;
  s.num_requests_running = static_cast<int32_t>(m.num_requests_running);
  s.num_requests_waiting = static_cast<int32_t>(m.num_requests_waiting);
  s.kv_cache_usage = m.kv_cache_usage_perc;
  s.prefix_cache_queries = m.prefix_cache_queries;
  s.prefix_cache_hits = m.prefix_cache_hits;
  s.num_preemptions = m.num_preemptions_total;
  return s;
}

std::string EngineGenerationService::engine_metrics_text(const std::string& model_name) const {
  return core_->metrics().render_prometheus(model_name);
}

bool EngineGenerationService::healthy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !failed_ && !stop_;
}

void EngineGenerationService::loop() {
  for (;;) {
    std::deque<std::variant<AddCmd, AbortCmd>> commands;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !inbox_.empty() || core_->has_unfinished_requests(); });
      if (stop_) break;
      commands.swap(inbox_);
    }
    for (auto& cmd : commands) {
      if (auto* add = std::get_if<AddCmd>(&cmd)) {
        const engine::RequestId id = add->request.id;
        Result<engine::RequestId> r = core_->add_request(std::move(add->request));
        if (!r) {
          GenerationOutput o;
          o.finish_reason = FinishReason::kError;
          o.error_message = r.error().message;
          add->callback(std::move(o));
          continue;
        }
        ids_[add->key] = *r;
        live_[*r] = Live{std::move(add->key), std::move(add->callback)};
        (void)id;
      } else {
        auto it = ids_.find(std::get<AbortCmd>(cmd).key);
        if (it != ids_.end()) core_->abort_request(it->second);
      }
    }
    if (!core_->has_unfinished_requests()) continue;
    Result<std::vector<engine::RequestOutput>> outs = core_->step();
    if (!outs) {
      MS_LOG_ERROR("engine step failed: {}", outs.error().message);
      fail_all(outs.error().message);
      continue;
    }
    for (engine::RequestOutput& o : *outs) {
      auto it = live_.find(o.id);
      if (it == live_.end()) continue;
      const bool finished = o.finished;
      it->second.callback(to_output(std::move(o)));
      if (finished) {
        ids_.erase(it->second.key);
        live_.erase(it);
      }
    }
  }
  for (auto& [id, live] : live_) {
    GenerationOutput o;
    o.finish_reason = FinishReason::kAbort;
    live.callback(std::move(o));
  }
  live_.clear();
}

void EngineGenerationService::fail_all(const std::string& message) {
  for (auto& [id, live] : live_) {
    core_->abort_request(id);
    GenerationOutput o;
    o.finish_reason = FinishReason::kError;
    o.error_message = message;
    live.callback(std::move(o));
  }
  live_.clear();
  ids_.clear();
}

Result<std::unique_ptr<GenerationService>> make_engine_service(const ServeOptions& options) {
  const bool embedded = options.model.empty();
  std::string model_dir = options.model;
  if (embedded) {
    MS_ASSIGN_OR_RETURN(model_dir, ensure_embedded_model());
  }
  MS_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok,
                      tokenizer::Tokenizer::load(model_dir));
  MS_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, create_backend("cpu"));
  // The tokenizer first: the Engram map derived from it goes into the model as it is built.
  MS_ASSIGN_OR_RETURN(std::unique_ptr<arch::CausalLm> lm,
                      load_causal_lm_with_tokenizer(model_dir, *backend, *tok));
  // Batch-invariant GEMM: a request's tokens do not depend on what it is batched with.
  lm->set_batch_invariant(true);
  const ModelConfig& mc = lm->config();
  int32_t max_len = static_cast<int32_t>(
      std::min<int64_t>(mc.max_position_embeddings, std::numeric_limits<int32_t>::max()));
  if (options.max_model_len > 0) {
    if (options.max_model_len > max_len) {
      return make_error(ErrorCode::kInvalidArgument,
                        "--max-model-len {} exceeds the model's max_position_embeddings {}",
                        options.max_model_len, max_len);
    }
    max_len = options.max_model_len;
  }
  const int32_t max_seqs = std::max(1, options.max_num_seqs);
  engine::EngineCoreConfig cfg;
  cfg.scheduler.max_model_len = max_len;
  cfg.scheduler.max_num_seqs = max_seqs;
  cfg.scheduler.max_num_batched_tokens = std::max(2048, max_seqs);
  MS_ASSIGN_OR_RETURN(const int32_t replay_align, kv::check_block_tokens(mc, options.block_size));
  cfg.scheduler.replay_window =
      options.prefix_replay_tokens > 0 ? options.prefix_replay_tokens : mc.sliding_window;
  cfg.scheduler.replay_align = replay_align;
  const int32_t block = options.block_size;
  const int32_t blocks_per_seq = (max_len + block - 1) / block + 1;
  cfg.kv.num_global_blocks = max_seqs * blocks_per_seq;
  cfg.kv.block_tokens = block;
  cfg.kv.enable_prefix_caching = options.enable_prefix_caching;
  cfg.kv.num_state_slots = max_seqs;
  cfg.kv.check_invariants = false;
  cfg.eos_token_id = mc.eos_token_id;
  auto forward = std::make_unique<runtime::CausalLmForwardModel>(std::move(lm),
                                                                 arch::ForwardMode::kProduction);
  auto core = std::make_unique<engine::EngineCore>(
      cfg, std::make_unique<runtime::ModelRunner>(std::move(forward), /*seed=*/0));
  EngineGenerationService::Config sc;
  sc.model_name = embedded ? std::string(kEmbeddedModelName)
                           : fs::path(model_dir).lexically_normal().filename().string();
  if (sc.model_name.empty()) sc.model_name = fs::path(model_dir).parent_path().filename().string();
  sc.root = model_dir;
  sc.max_model_len = max_len;
  if (embedded) {
    MS_LOG_WARN(
        "serve: serving the EMBEDDED TINY MODEL '{}' from {}: its weights are RANDOM, so its "
        "output is gibberish (use --model DIR for a real checkpoint)",
        sc.model_name, model_dir);
  } else {
    MS_LOG_INFO("serve: model {} ({} layers, vocab {}), max_model_len {}", model_dir,
                mc.num_hidden_layers, mc.vocab_size, max_len);
  }
  return std::unique_ptr<GenerationService>(std::make_unique<EngineGenerationService>(
      std::move(sc), std::move(core), std::move(tok), std::move(backend)));
}

}  // namespace moeserve::server
