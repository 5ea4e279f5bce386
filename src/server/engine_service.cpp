#include "server/engine_service.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "model/config.h"
#include "model/tiny_model.h"
#include "tokenizer/default_paths.h"
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

FinishReason to_finish(engine::FinishReason r) {
  switch (r) {
    case engine::FinishReason::kStop:
      return FinishReason::kStop;
    case engine::FinishReason::kLength:
      return FinishReason::kLength;
    case engine::FinishReason::kAbort:
      return FinishReason::kAbort;
    case engine::FinishReason::kError:
      return FinishReason::kError;
    default:
      return FinishReason::kNone;
  }
}

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
    out.finish_reason = to_finish(o.finish_reason);
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
  if (const char* d = std::getenv("MOESERVE_CACHE_DIR")) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME")) return std::string(x) + "/moeserve";
  if (const char* h = std::getenv("HOME")) return std::string(h) + "/.cache/moeserve";
  return "/tmp/moeserve-cache";
}

// The embedded tiny model: generated deterministically (seed 0, the tiny config) on first use.
Result<std::string> ensure_tiny_model() {
  const fs::path dir = fs::path(cache_root()) / "tiny-seed0";
  if (fs::exists(dir / "config.json") && fs::exists(dir / "model.safetensors")) return dir.string();
  MS_LOG_INFO("serve: generating the embedded tiny model (random weights) into {}", dir.string());
  const fs::path tmp = dir.string() + fmt::format(".tmp{}", ::getpid());
  std::error_code ec;
  fs::create_directories(tmp, ec);
  if (ec) return make_error(ErrorCode::kIo, "cannot create {}: {}", tmp.string(), ec.message());
  MS_RETURN_IF_ERROR(write_generated_model(tmp, tiny_config_json(), /*seed=*/0));
  fs::rename(tmp, dir, ec);
  if (ec && !fs::exists(dir / "config.json")) {
    return make_error(ErrorCode::kIo, "cannot move {} to {}: {}", tmp.string(), dir.string(),
                      ec.message());
  }
  fs::remove_all(tmp, ec);
  return dir.string();
}

}  // namespace

EngineGenerationService::EngineGenerationService(Config config,
                                                 std::unique_ptr<engine::EngineCore> core,
                                                 std::unique_ptr<tokenizer::Tokenizer> tokenizer)
    : config_(std::move(config)), core_(std::move(core)), tokenizer_(std::move(tokenizer)) {
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
  std::string model_dir = options.model;
  if (model_dir.empty()) {
    MS_ASSIGN_OR_RETURN(model_dir, ensure_tiny_model());
  }
  MS_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(model_dir));
  const std::string tokenizer_dir =
      options.model.empty() ? tokenizer::default_tokenizer_dir() : model_dir;
  MS_ASSIGN_OR_RETURN(auto tok, tokenizer::Tokenizer::load(tokenizer_dir));
  (void)config;
  (void)tok;
  // NOTE: the DeepSeek-V4.1 forward (src/model/arch) is not yet wrapped as a
  // runtime::ForwardModel with a loader; once it is, this builds ModelRunner → EngineCore →
  // EngineGenerationService here.
  return make_error(ErrorCode::kUnimplemented,
                    "model {} and tokenizer {} load, but the DeepSeek-V4.1 forward is not yet "
                    "available as a runtime::ForwardModel, so `moeserve serve` cannot generate yet",
                    model_dir, tokenizer_dir);
}

}  // namespace moeserve::server
