// Plain chat types shared by the DeepSeek-V4 chat encoder and the output parser. Tool schemas and
// tool-call arguments stay JSON (they are JSON by nature); everything else is typed.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moeserve::tokenizer {

enum class ChatRole { kSystem, kDeveloper, kUser, kAssistant, kTool, kLatestReminder };

// One function call, OpenAI style: `arguments` is a JSON object serialised as text.
struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;
};

// One tool the model may call: the OpenAI `function` object ({"name", "description",
// "parameters", ...}) with its key order kept, because the prompt embeds it verbatim.
struct ToolDefinition {
  nlohmann::ordered_json function = nlohmann::ordered_json::object();
};

struct ChatMessage {
  ChatRole role = ChatRole::kUser;
  std::string content;
  std::string reasoning_content;      // assistant turns in thinking mode
  std::vector<ToolCall> tool_calls;   // assistant turns
  std::string tool_call_id;           // tool turns: which call this result answers
  std::vector<ToolDefinition> tools;  // system/developer turns may carry tools
  std::optional<nlohmann::ordered_json> response_format;  // system/developer turns
};

enum class ReasoningEffort { kDefault, kHigh, kMax };

struct ChatEncodeOptions {
  bool thinking = false;      // thinking mode: the prompt ends with <think>
  bool drop_thinking = true;  // drop reasoning of turns before the last user turn (no tools only)
  bool add_bos = true;
  ReasoningEffort reasoning_effort = ReasoningEffort::kDefault;
};

}  // namespace moeserve::tokenizer
