// DeepSeek-V4 chat encoding: turns a conversation (system/developer/user/assistant/tool turns,
// tool definitions, assistant tool calls in DSML, tool results) into the prompt text the model was
// trained on, in thinking or non-thinking mode. Pure function of its inputs. The format follows
// DeepSeek's published V4 encoder (see docs/tokenizer.md); this is an independent C++ version.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/chat_types.h"

namespace moeserve::tokenizer::dsv4 {

inline constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kUser = "<｜User｜>";
inline constexpr std::string_view kAssistant = "<｜Assistant｜>";
inline constexpr std::string_view kLatestReminder = "<｜latest_reminder｜>";
inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";
inline constexpr std::string_view kDsml = "｜DSML｜";
inline constexpr std::string_view kToolCallsStart = "<｜DSML｜tool_calls>";
inline constexpr std::string_view kToolCallsEnd = "</｜DSML｜tool_calls>";
inline constexpr std::string_view kInvokeStart = "<｜DSML｜invoke";
inline constexpr std::string_view kInvokeEnd = "</｜DSML｜invoke>";
inline constexpr std::string_view kParameterStart = "<｜DSML｜parameter";
inline constexpr std::string_view kParameterEnd = "</｜DSML｜parameter>";

// Renders the prompt. `request_tools` (OpenAI request-level tools) are attached to the first
// system turn, or to a new empty system turn at the front when there is none.
[[nodiscard]] std::string encode_chat(const std::vector<ChatMessage>& messages,
                                      const std::vector<ToolDefinition>& request_tools,
                                      const ChatEncodeOptions& options);

// The DSML block an assistant turn's tool calls render to (without the leading blank line).
[[nodiscard]] std::string render_tool_calls(const std::vector<ToolCall>& calls);

}  // namespace moeserve::tokenizer::dsv4
