// DeepSeek-V4 chat encoding against golden prompts in golden/*.txt. The goldens are hand-derived
// from DeepSeek's documented V4 encoder (encoding/encoding_dsv4.py in their model repositories)
// and were checked line by line against it; the reference encoder itself is not run in CI.
// MOESERVE_UPDATE_GOLDEN=1 rewrites them (review the diff against the format before committing).
#include "tokenizer/chat_encoding.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "tokenizer/python_json.h"

namespace moeserve::tokenizer::dsv4 {
namespace {

const std::string kGoldenDir = std::string(MOESERVE_SOURCE_DIR) + "/tests/unit/tokenizer/golden/";

void expect_golden(const std::string& name, const std::string& got) {
  const std::string path = kGoldenDir + name + ".txt";
  if (const char* update = std::getenv("MOESERVE_UPDATE_GOLDEN"); update && *update == '1') {
    std::ofstream(path, std::ios::binary) << got;
  }
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in) << "missing golden " << path;
  std::stringstream want;
  want << in.rdbuf();
  EXPECT_EQ(got, want.str()) << "golden " << path;
}

ChatMessage msg(ChatRole role, std::string content) {
  ChatMessage m;
  m.role = role;
  m.content = std::move(content);
  return m;
}

ToolDefinition weather_tool() {
  ToolDefinition t;
  t.function = nlohmann::ordered_json::parse(R"({"name": "get_weather",
    "description": "Get the weather for a city", "parameters": {"type": "object",
    "properties": {"city": {"type": "string", "description": "City name, e.g. 巴黎"},
    "days": {"type": "integer"}}, "required": ["city"]}})");
  return t;
}

TEST(ChatEncodingTest, ThinkingDropsOldReasoning) {
  ChatMessage reply = msg(ChatRole::kAssistant, "Hello! I am DeepSeek.");
  reply.reasoning_content = "thinking...";
  const std::vector<ChatMessage> messages = {msg(ChatRole::kSystem, "You are a helpful assistant."),
                                             msg(ChatRole::kUser, "hello"), reply,
                                             msg(ChatRole::kUser, "1+1=?")};
  const std::string prompt = encode_chat(messages, {}, {.thinking = true});
  EXPECT_EQ(
      prompt,
      "<｜begin▁of▁sentence｜>You are a helpful assistant.<｜User｜>hello<｜Assistant｜></"
      "think>Hello! I am DeepSeek.<｜end▁of▁sentence｜><｜User｜>1+1=?<｜Assistant｜><think>");
  expect_golden("thinking_multi_turn", prompt);
  // Keeping reasoning renders it, closed by </think>, after an opening <think>.
  expect_golden("thinking_keep_reasoning",
                encode_chat(messages, {}, {.thinking = true, .drop_thinking = false}));
}

TEST(ChatEncodingTest, NonThinking) {
  const std::string prompt = encode_chat({msg(ChatRole::kUser, "Hi")}, {}, {});
  EXPECT_EQ(prompt, "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>");
  ChatMessage reply = msg(ChatRole::kAssistant, "Hello.");
  reply.reasoning_content = "ignored in chat mode";
  expect_golden("chat_multi_turn",
                encode_chat({msg(ChatRole::kSystem, "Be brief."), msg(ChatRole::kUser, "Hi"), reply,
                             msg(ChatRole::kUser, "Bye")},
                            {}, {}));
}

TEST(ChatEncodingTest, MaxReasoningEffort) {
  expect_golden("thinking_max_effort",
                encode_chat({msg(ChatRole::kUser, "Prove it.")}, {},
                            {.thinking = true, .reasoning_effort = ReasoningEffort::kMax}));
}

std::vector<ChatMessage> tool_conversation(bool finished) {
  ChatMessage call = msg(ChatRole::kAssistant, "");
  call.reasoning_content = "I need the weather in both cities.";
  call.tool_calls = {
      {"c1", "get_weather", R"({"city": "Paris"})"},
      {"c2", "get_weather", R"({"city": "东京", "days": 2, "opts": {"u": [1, 2.5]}})"}};
  ChatMessage r2 = msg(ChatRole::kTool, "rain, 14°C");
  r2.tool_call_id = "c2";
  ChatMessage r1 = msg(ChatRole::kTool, "{\"sky\": \"sunny\"}");
  r1.tool_call_id = "c1";
  std::vector<ChatMessage> m = {msg(ChatRole::kUser, "Weather in Paris and 东京?"), call, r2, r1};
  if (finished) {
    ChatMessage answer = msg(ChatRole::kAssistant, "Paris is sunny; Tokyo has rain.");
    answer.reasoning_content = "Both results are in.";
    m.push_back(answer);
    m.push_back(msg(ChatRole::kUser, "Thanks! And tomorrow?"));
  }
  return m;
}

TEST(ChatEncodingTest, MultiTurnToolUse) {
  const std::string after_results =
      encode_chat(tool_conversation(false), {weather_tool()}, {.thinking = true});
  // Results are reordered to the call order (c1 before c2) and folded into one user turn.
  EXPECT_NE(after_results.find("<｜User｜><tool_result>{\"sky\": \"sunny\"}</tool_result>\n\n"
                               "<tool_result>rain, 14°C</tool_result><｜Assistant｜><think>"),
            std::string::npos);
  expect_golden("tools_after_results", after_results);
  expect_golden("tools_multi_turn",
                encode_chat(tool_conversation(true), {weather_tool()}, {.thinking = true}));
  expect_golden("tools_non_thinking", encode_chat(tool_conversation(true), {weather_tool()}, {}));
}

TEST(ChatEncodingTest, ToolCallRendering) {
  EXPECT_EQ(
      render_tool_calls({{"x", "f", R"({"s": "a\nb", "n": 1, "o": {"k": [true, null]}})"}}),
      "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
      "<｜DSML｜parameter name=\"s\" string=\"true\">a\nb</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"n\" string=\"false\">1</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"o\" string=\"false\">{\"k\": [true, null]}</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n</｜DSML｜tool_calls>");
  // Arguments that are not a JSON object travel as one string parameter.
  EXPECT_NE(render_tool_calls({{"x", "f", "not json"}})
                .find("<｜DSML｜parameter name=\"arguments\" string=\"true\">not json<"),
            std::string::npos);
}

TEST(PythonJsonTest, MatchesJsonDumps) {
  const auto v = nlohmann::ordered_json::parse(
      R"({"b": 1, "a": [1.5, "x\"y\\\n\u0001é", null, true, {}, []], "c": {"z": -2e-07}})");
  EXPECT_EQ(python_json_dumps(v),
            R"({"b": 1, "a": [1.5, "x\"y\\\n\u0001é", null, true, {}, []], "c": {"z": -2e-07}})");
}

}  // namespace
}  // namespace moeserve::tokenizer::dsv4
