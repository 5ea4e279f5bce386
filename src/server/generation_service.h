// GenerationService: the narrow interface the HTTP server is written against. It owns nothing of
// HTTP or JSON: typed requests go in, token-level outputs come back through a callback, and the
// text side (tokenize, chat encoding, incremental detokenization, reasoning/tool-call parsing) is
// reached through the same object. The real implementation wraps EngineClient + the tokenizer;
// tests use a fake (tests/server/). Implementations must be safe to call from many I/O threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "sched/request.h"

namespace moeserve::server {

// Sampling and stopping for one sequence. Stop *strings* are handled by the server (on text);
// the engine only sees token-level stops.
struct SamplingOptions {
  float temperature = 1.0f;  // 0: greedy
  float top_p = 1.0f;
  int32_t top_k = 0;  // 0: disabled
  float min_p = 0.0f;
  std::optional<uint64_t> seed;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  int32_t max_tokens = 16;
  int32_t min_tokens = 0;
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;
  // -1: no logprobs; k >= 0: the sampled token's logprob plus the top k alternatives.
  int32_t logprobs = -1;
};

struct GenerationRequest {
  std::string request_id;
  std::vector<int32_t> prompt_token_ids;
  SamplingOptions sampling;
};

// The engine's finish reasons (one enum and one name table: sched/request.h).
using sched::FinishReason;

struct TopLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
};

struct TokenLogprobs {
  float logprob = 0.0f;
  std::vector<TopLogprob> top;  // best first
};

// One delivery from the engine for one request: the tokens produced since the previous delivery.
struct GenerationOutput {
  std::vector<int32_t> token_ids;
  std::vector<TokenLogprobs> logprobs;  // parallel to token_ids when logprobs were requested
  FinishReason finish_reason = FinishReason::kNone;  // != kNone on the last delivery
  std::optional<int32_t> stop_token_id;              // the token that ended it (kStop), if any
  int32_t num_cached_tokens = 0;                     // prompt tokens served from the prefix cache
  std::string error_message;                         // for kError
};

// Called on an engine thread, in order, ending with exactly one output whose finish_reason is set.
// Must not block; the server posts the work onto the connection's I/O strand.
using OutputCallback = std::function<void(GenerationOutput&&)>;

struct ModelInfo {
  std::string id;             // the served model name
  std::string root;           // where it was loaded from
  int32_t max_model_len = 0;  // prompt + generated tokens
  int64_t created_unix = 0;
};

// Engine state sampled for /metrics and load decisions.
struct EngineStats {
  int32_t num_requests_running = 0;
  int32_t num_requests_waiting = 0;
  double kv_cache_usage = 0.0;  // 0..1
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_free = 0;
  int64_t prefix_cache_queries = 0;  // tokens
  int64_t prefix_cache_hits = 0;     // tokens
  int64_t num_preemptions = 0;
};

// Chat encoding input: typed messages, never JSON (tool parameter schemas travel as JSON text
// because the chat encoding prints them into the prompt verbatim).
struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text
};

struct ChatMessage {
  std::string role;  // system | developer | user | assistant | tool
  std::string content;
  std::optional<std::string> reasoning_content;
  std::vector<ToolCall> tool_calls;
  std::string tool_call_id;
  std::string name;
};

struct ToolDefinition {
  std::string name;
  std::string description;
  std::string parameters_json;  // JSON Schema text; "{}" when absent
  std::string function_json;    // the whole OpenAI `function` object, client key order kept
};

enum class ToolChoiceMode { kNone, kAuto, kRequired, kNamed };

struct ChatPromptInput {
  std::vector<ChatMessage> messages;
  std::vector<ToolDefinition> tools;  // empty when tool_choice is none
  ToolChoiceMode tool_choice = ToolChoiceMode::kAuto;
  std::string tool_choice_name;  // kNamed
  bool thinking = false;         // chat_template_kwargs.thinking / enable_thinking
  bool add_generation_prompt = true;
  bool continue_final_message = false;
};

struct ChatPrompt {
  std::vector<int32_t> token_ids;
  std::string text;  // the rendered prompt (for logs and echo)
  // tool_choice required / named: the assistant turn was forced to open a tool call. This is the
  // output text the prompt already ends with (the server feeds it to the output parser ahead of
  // the model's continuation) and, when known, the function the forced call names.
  std::string forced_output_prefix;
  std::string forced_tool_name;
};

// Incremental text from token ids; never splits a UTF-8 character.
class IncrementalDetokenizer {
 public:
  virtual ~IncrementalDetokenizer() = default;
  [[nodiscard]] virtual std::string push(int32_t token_id) = 0;
  [[nodiscard]] virtual std::string finish() = 0;
};

// What a chunk of generated text means: reasoning, visible content, and tool-call fragments.
struct ToolCallDelta {
  int32_t index = 0;      // position of the call in this message
  std::string id;         // set on the first fragment of a call
  std::string name;       // set on the first fragment of a call
  std::string arguments;  // appended JSON text
};

struct ParsedDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;

  [[nodiscard]] bool empty() const {
    return reasoning.empty() && content.empty() && tool_calls.empty();
  }
};

struct OutputParserOptions {
  bool thinking = false;       // the prompt opened a reasoning block
  bool tools_enabled = false;  // parse DSML tool calls out of the content
};

// Splits generated text into reasoning / content / tool calls as it streams. Never lets tool-call
// markup leak into content: text that may start a markup tag is held until it is decided.
class OutputParser {
 public:
  virtual ~OutputParser() = default;
  [[nodiscard]] virtual ParsedDelta push(std::string_view text) = 0;
  [[nodiscard]] virtual ParsedDelta finish() = 0;
};

class GenerationService {
 public:
  virtual ~GenerationService() = default;

  [[nodiscard]] virtual ModelInfo model_info() const = 0;
  [[nodiscard]] virtual std::vector<int32_t> tokenize(std::string_view text,
                                                      bool add_special_tokens) const = 0;
  [[nodiscard]] virtual std::string detokenize(std::span<const int32_t> token_ids,
                                               bool skip_special_tokens) const = 0;
  // The vocabulary size: token ids at or past it are rejected.
  [[nodiscard]] virtual int32_t vocab_size() const = 0;
  [[nodiscard]] virtual std::unique_ptr<IncrementalDetokenizer> make_detokenizer(
      bool skip_special_tokens) const = 0;
  [[nodiscard]] virtual Result<ChatPrompt> render_chat(const ChatPromptInput& input) const = 0;
  [[nodiscard]] virtual std::unique_ptr<OutputParser> make_output_parser(
      const OutputParserOptions& options) const = 0;

  // Queues a request; `on_output` is called until a finished output arrives. An error here means
  // the request was not queued (and the callback is never called).
  [[nodiscard]] virtual Status submit(GenerationRequest request, OutputCallback on_output) = 0;
  // Stops a request and frees its KV; a finished output with kAbort follows unless it had already
  // finished. Unknown ids are ignored.
  virtual void abort(const std::string& request_id) = 0;

  [[nodiscard]] virtual EngineStats stats() const = 0;
  // The engine's own Prometheus text (§4.12 names), if it renders one; the server then adds only
  // its HTTP-level metrics. Empty: the server renders the request metrics it measured itself.
  [[nodiscard]] virtual std::string engine_metrics_text(const std::string& /*model_name*/) const {
    return {};
  }
  [[nodiscard]] virtual bool healthy() const { return true; }
};

}  // namespace moeserve::server
