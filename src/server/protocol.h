// OpenAI protocol at the edge: request bodies are parsed (nlohmann-json) and validated into the
// typed structs below, or rejected with an ApiError carrying the HTTP status and the OpenAI error
// object fields. Nothing past this file sees JSON. Unknown fields are ignored.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <tl/expected.hpp>

#include "server/generation_service.h"

namespace moeserve::server {

// An error a client can act on. status is the HTTP status; type/param/code fill the OpenAI error
// object {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" → null
  std::string code;   // "" → null

  [[nodiscard]] std::string to_json() const;
};

template <typename T>
using ApiResult = tl::expected<T, ApiError>;

[[nodiscard]] ApiError bad_request(std::string message, std::string param = {},
                                   std::string code = {});
[[nodiscard]] ApiError unprocessable(std::string message, std::string param = {},
                                     std::string code = {});

// Limits a request is validated against.
struct ProtocolLimits {
  int32_t max_n = 128;
  int32_t max_logprobs = 20;
  int32_t max_stop_strings = 16;
  int32_t max_batch_prompts = 64;
};

// Fields common to /v1/completions and /v1/chat/completions.
struct CommonParams {
  std::optional<std::string> model;
  std::optional<int32_t> max_tokens;  // absent: completions 16, chat: the rest of the context
  SamplingOptions sampling;           // max_tokens filled in after tokenization
  int32_t n = 1;
  std::vector<std::string> stop;
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;
  bool stream = false;
  bool include_usage = false;           // stream_options.include_usage
  bool continuous_usage_stats = false;  // stream_options.continuous_usage_stats
  std::string user;
};

// A prompt for /v1/completions: text or token ids.
struct PromptInput {
  std::optional<std::string> text;
  std::vector<int32_t> token_ids;  // used when text is absent
};

struct CompletionRequest {
  CommonParams common;
  std::vector<PromptInput> prompts;  // one per choice group (batched prompts)
  bool echo = false;
  int32_t logprobs = -1;  // -1: none
};

struct ChatCompletionRequest {
  CommonParams common;
  ChatPromptInput chat;
  bool logprobs = false;
  int32_t top_logprobs = 0;
  bool parallel_tool_calls = true;
};

struct TokenizeRequest {
  std::optional<std::string> model;
  std::optional<std::string> prompt;    // completions-style
  std::optional<ChatPromptInput> chat;  // chat-style ("messages")
  bool add_special_tokens = true;
  bool return_token_strs = false;
};

struct DetokenizeRequest {
  std::optional<std::string> model;
  std::vector<int32_t> tokens;
};

// Body → struct. Each rejects malformed JSON, wrong types and out-of-range values with a 400
// naming the field (`param`), and unsupported-but-well-formed requests with a 422.
[[nodiscard]] ApiResult<CompletionRequest> parse_completion_request(std::string_view body,
                                                                    const ProtocolLimits& limits);
[[nodiscard]] ApiResult<ChatCompletionRequest> parse_chat_request(std::string_view body,
                                                                  const ProtocolLimits& limits);
[[nodiscard]] ApiResult<TokenizeRequest> parse_tokenize_request(std::string_view body);
[[nodiscard]] ApiResult<DetokenizeRequest> parse_detokenize_request(std::string_view body);

// True when `bytes` is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
[[nodiscard]] bool is_valid_utf8(std::string_view bytes);
// Length of the longest prefix of valid UTF-8 that does not end inside a character.
[[nodiscard]] size_t utf8_complete_prefix(std::string_view bytes);

}  // namespace moeserve::server
