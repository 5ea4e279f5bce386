// ChatOutputParser: splits DeepSeek-V4 model output, fed as text chunks while it streams, into
// reasoning_content, content and OpenAI tool calls (from DSML <｜DSML｜tool_calls> blocks).
// Markers split across chunks are handled by holding back any suffix that could start one.
// Each <｜DSML｜invoke> is atomic: a well-formed one becomes a tool call when its closing tag
// arrives; a malformed one (bad tags, duplicate or unknown parameters, arguments that are not
// JSON) and any unclosed block at finish() come back verbatim as content: no text is ever lost.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/chat_types.h"

namespace moeserve::tokenizer::dsv4 {

struct ParsedDelta {
  std::string reasoning_content;
  std::string content;
  std::vector<ToolCall> tool_calls;

  [[nodiscard]] bool empty() const {
    return reasoning_content.empty() && content.empty() && tool_calls.empty();
  }
  void append(ParsedDelta&& other);
};

struct ChatOutputParserOptions {
  // Thinking mode: output starts inside the reasoning (the prompt ended with <think>).
  bool thinking = false;
  // Tool call ids are id_prefix + a running index; give each request its own prefix.
  std::string id_prefix = "call_";
};

class ChatOutputParser final {
 public:
  explicit ChatOutputParser(ChatOutputParserOptions options);

  // Consumes the next chunk of decoded text; returns what became final.
  [[nodiscard]] ParsedDelta feed(std::string_view chunk);
  // Ends the stream: flushes held-back text (unfinished markers and blocks become content).
  [[nodiscard]] ParsedDelta finish();

 private:
  enum class State { kReasoning, kContent, kToolCalls };
  void process(bool final, ParsedDelta& out);
  bool parse_invoke(std::string_view text, ToolCall& call) const;

  ChatOutputParserOptions options_;
  State state_;
  bool at_start_ = true;
  std::string buffer_;           // received, not yet consumed
  std::string block_raw_;        // consumed text of the open tool-call block not yet accounted for
  bool block_has_call_ = false;  // the open block produced at least one tool call
  int tool_index_ = 0;
};

// {"id", "type": "function", "function": {"name", "arguments"}} for an OpenAI response.
[[nodiscard]] nlohmann::json to_openai_json(const ToolCall& call);

// Whole-output convenience: feed(text) + finish().
[[nodiscard]] ParsedDelta parse_chat_output(std::string_view text,
                                            const ChatOutputParserOptions& options);

}  // namespace moeserve::tokenizer::dsv4
