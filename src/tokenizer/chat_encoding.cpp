#include "tokenizer/chat_encoding.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "tokenizer/python_json.h"

namespace moeserve::tokenizer::dsv4 {
namespace {

// NOTE: the two prompt texts below are format data, not prose of ours: the model was trained on
// them byte for byte (DeepSeek-V4's encoding/encoding_dsv4.py), so they are reproduced exactly.
constexpr std::string_view kReasoningEffortMax =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n";

// {schemas} is replaced by the tool schemas, one JSON object per line.
constexpr std::string_view kToolsPromptHead =
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools "
    "by writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n"
    "<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</"
    "｜DSML｜parameter>\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types "
    "(numbers, booleans, arrays, objects), pass the value in JSON format and set "
    "`string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning "
    "inside <think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";
constexpr std::string_view kToolsPromptTail =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool "
    "calls.\n";
constexpr std::string_view kResponseFormatHead =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

// A conversation turn after tool results are folded into user turns.
struct Block {
  bool is_tool_result = false;
  std::string text;
  std::string tool_call_id;
};
struct Turn {
  ChatRole role = ChatRole::kUser;
  std::string content;
  std::vector<Block> blocks;  // user turns: text and tool-result blocks
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
  std::vector<ToolDefinition> tools;
  std::optional<nlohmann::ordered_json> response_format;
};

std::string render_tools(const std::vector<ToolDefinition>& tools) {
  std::string out(kToolsPromptHead);
  for (size_t i = 0; i < tools.size(); ++i) {
    if (i > 0) out += '\n';
    out += python_json_dumps(tools[i].function);
  }
  out += kToolsPromptTail;
  return out;
}

std::string render_arguments(const ToolCall& call) {
  nlohmann::ordered_json args =
      nlohmann::ordered_json::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
  if (args.is_discarded() || !args.is_object()) {
    // Not a JSON object: pass the raw text as one string parameter, as DeepSeek's encoder does.
    args = nlohmann::ordered_json::object();
    args["arguments"] = call.arguments;
  }
  std::string out;
  bool first = true;
  for (const auto& [key, value] : args.items()) {
    if (!first) out += '\n';
    first = false;
    const bool is_string = value.is_string();
    out += fmt::format(
        "{} name=\"{}\" string=\"{}\">{}{}", kParameterStart, key, is_string ? "true" : "false",
        is_string ? value.get<std::string>() : python_json_dumps(value), kParameterEnd);
  }
  return out;
}

std::string render_system_extras(const Turn& turn) {
  std::string out;
  if (!turn.tools.empty()) out += "\n\n" + render_tools(turn.tools);
  if (turn.response_format) {
    out += "\n\n";
    out += kResponseFormatHead;
    out += python_json_dumps(*turn.response_format);
  }
  return out;
}

bool is_user_like(ChatRole role) { return role == ChatRole::kUser || role == ChatRole::kDeveloper; }

int last_user_index(const std::vector<Turn>& turns) {
  for (int i = static_cast<int>(turns.size()) - 1; i >= 0; --i) {
    if (is_user_like(turns[i].role)) return i;
  }
  return -1;
}

// Tool turns become tool-result blocks of a user turn; consecutive user turns merge.
std::vector<Turn> fold_tool_results(const std::vector<ChatMessage>& messages) {
  std::vector<Turn> turns;
  for (const ChatMessage& m : messages) {
    const bool extend = !turns.empty() && turns.back().role == ChatRole::kUser;
    if (m.role == ChatRole::kTool || m.role == ChatRole::kUser) {
      Block block{m.role == ChatRole::kTool, m.content, m.tool_call_id};
      if (extend) {
        turns.back().blocks.push_back(std::move(block));
      } else {
        Turn t;
        t.role = ChatRole::kUser;
        t.content = m.content;
        t.blocks.push_back(std::move(block));
        turns.push_back(std::move(t));
      }
      continue;
    }
    Turn t;
    t.role = m.role;
    t.content = m.content;
    t.reasoning = m.reasoning_content;
    t.tool_calls = m.tool_calls;
    t.tools = m.tools;
    t.response_format = m.response_format;
    turns.push_back(std::move(t));
  }
  return turns;
}

// Orders the tool results of each user turn like the calls of the assistant turn before it.
void sort_tool_results(std::vector<Turn>& turns) {
  std::map<std::string, size_t> order;
  for (Turn& t : turns) {
    if (t.role == ChatRole::kAssistant && !t.tool_calls.empty()) {
      order.clear();
      for (size_t i = 0; i < t.tool_calls.size(); ++i) {
        if (!t.tool_calls[i].id.empty()) order[t.tool_calls[i].id] = i;
      }
    } else if (t.role == ChatRole::kUser && !order.empty()) {
      std::vector<Block> results;
      for (const Block& b : t.blocks) {
        if (b.is_tool_result) results.push_back(b);
      }
      if (results.size() < 2) continue;
      auto key = [&](const Block& b) {
        auto it = order.find(b.tool_call_id);
        return it == order.end() ? size_t{0} : it->second;
      };
      std::stable_sort(results.begin(), results.end(),
                       [&](const Block& x, const Block& y) { return key(x) < key(y); });
      size_t next = 0;
      for (Block& b : t.blocks) {
        if (b.is_tool_result) b = results[next++];
      }
    }
  }
}

// Thinking mode without tools: history before the last user turn loses its reasoning, and
// developer turns there are dropped.
std::vector<Turn> drop_old_thinking(std::vector<Turn> turns) {
  const int last_user = last_user_index(turns);
  std::vector<Turn> kept;
  for (int i = 0; i < static_cast<int>(turns.size()); ++i) {
    Turn& t = turns[i];
    if (i >= last_user || t.role == ChatRole::kUser || t.role == ChatRole::kSystem ||
        t.role == ChatRole::kLatestReminder) {
      kept.push_back(std::move(t));
    } else if (t.role == ChatRole::kAssistant) {
      t.reasoning.clear();
      kept.push_back(std::move(t));
    }
  }
  return kept;
}

std::string render_turn(const std::vector<Turn>& turns, int index, int last_user,
                        const ChatEncodeOptions& options, bool drop_thinking) {
  const Turn& t = turns[index];
  std::string out;
  if (index == 0 && options.thinking && options.reasoning_effort == ReasoningEffort::kMax) {
    out += kReasoningEffortMax;
  }
  switch (t.role) {
    case ChatRole::kSystem:
      out += t.content;
      out += render_system_extras(t);
      break;
    case ChatRole::kDeveloper:
      out += kUser;
      out += t.content;
      out += render_system_extras(t);
      break;
    case ChatRole::kUser: {
      out += kUser;
      for (size_t i = 0; i < t.blocks.size(); ++i) {
        if (i > 0) out += "\n\n";
        const Block& b = t.blocks[i];
        out += b.is_tool_result ? "<tool_result>" + b.text + "</tool_result>" : b.text;
      }
      break;
    }
    case ChatRole::kLatestReminder:
      out += kLatestReminder;
      out += t.content;
      break;
    case ChatRole::kAssistant:
      if (options.thinking && (!drop_thinking || index > last_user)) {
        out += t.reasoning;
        out += kThinkEnd;
      }
      out += t.content;
      if (!t.tool_calls.empty()) {
        out += "\n\n";
        out += render_tool_calls(t.tool_calls);
      }
      out += kEos;
      break;
    case ChatRole::kTool:
      break;  // folded into user turns before rendering
  }
  const bool has_next = index + 1 < static_cast<int>(turns.size());
  if (has_next && turns[index + 1].role != ChatRole::kAssistant &&
      turns[index + 1].role != ChatRole::kLatestReminder) {
    return out;
  }
  if (is_user_like(t.role)) {
    out += kAssistant;
    const bool open_thinking = options.thinking && (!drop_thinking || index >= last_user);
    out += open_thinking ? kThinkStart : kThinkEnd;
  }
  return out;
}

}  // namespace

std::string render_tool_calls(const std::vector<ToolCall>& calls) {
  std::string out(kToolCallsStart);
  out += '\n';
  for (size_t i = 0; i < calls.size(); ++i) {
    if (i > 0) out += '\n';
    out += fmt::format("{} name=\"{}\">\n{}\n{}", kInvokeStart, calls[i].name,
                       render_arguments(calls[i]), kInvokeEnd);
  }
  out += '\n';
  out += kToolCallsEnd;
  return out;
}

std::string encode_chat(const std::vector<ChatMessage>& messages,
                        const std::vector<ToolDefinition>& request_tools,
                        const ChatEncodeOptions& options) {
  std::vector<ChatMessage> with_tools = messages;
  if (!request_tools.empty()) {
    auto system = std::find_if(with_tools.begin(), with_tools.end(),
                               [](const ChatMessage& m) { return m.role == ChatRole::kSystem; });
    if (system == with_tools.end()) {
      system = with_tools.insert(with_tools.begin(), ChatMessage{.role = ChatRole::kSystem});
    }
    system->tools.insert(system->tools.end(), request_tools.begin(), request_tools.end());
  }
  std::vector<Turn> turns = fold_tool_results(with_tools);
  sort_tool_results(turns);
  const bool any_tools =
      std::any_of(turns.begin(), turns.end(), [](const Turn& t) { return !t.tools.empty(); });
  const bool drop_thinking = options.drop_thinking && !any_tools;
  if (options.thinking && drop_thinking) turns = drop_old_thinking(std::move(turns));

  std::string prompt = options.add_bos ? std::string(kBos) : std::string();
  const int last_user = last_user_index(turns);
  for (int i = 0; i < static_cast<int>(turns.size()); ++i) {
    prompt += render_turn(turns, i, last_user, options, drop_thinking);
  }
  return prompt;
}

}  // namespace moeserve::tokenizer::dsv4
