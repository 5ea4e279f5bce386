// ChatOutputParser: reasoning/content/tool-call splitting of sample outputs fed whole, split at
// every byte position, and byte by byte; malformed DSML comes back as content, never lost.
#include "tokenizer/chat_output_parser.h"

#include <gtest/gtest.h>

#include "tokenizer/chat_encoding.h"

namespace moeserve::tokenizer::dsv4 {
namespace {

ParsedDelta parse_split(std::string_view text, const ChatOutputParserOptions& opts,
                        const std::vector<size_t>& cuts) {
  ChatOutputParser parser(opts);
  ParsedDelta out;
  size_t last = 0;
  for (size_t cut : cuts) {
    out.append(parser.feed(text.substr(last, cut - last)));
    last = cut;
  }
  out.append(parser.feed(text.substr(last)));
  out.append(parser.finish());
  return out;
}

void expect_same(const ParsedDelta& a, const ParsedDelta& b, const std::string& where) {
  EXPECT_EQ(a.reasoning_content, b.reasoning_content) << where;
  EXPECT_EQ(a.content, b.content) << where;
  ASSERT_EQ(a.tool_calls.size(), b.tool_calls.size()) << where;
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    EXPECT_EQ(a.tool_calls[i].id, b.tool_calls[i].id) << where;
    EXPECT_EQ(a.tool_calls[i].name, b.tool_calls[i].name) << where;
    EXPECT_EQ(a.tool_calls[i].arguments, b.tool_calls[i].arguments) << where;
  }
}

// Parses whole, at every split position, at every pair of positions (short texts) and byte by
// byte; all must agree. Returns the whole-text result.
ParsedDelta parse_everywhere(std::string_view text, bool thinking) {
  const ChatOutputParserOptions opts{.thinking = thinking};
  const ParsedDelta whole = parse_split(text, opts, {});
  for (size_t i = 0; i <= text.size(); ++i) {
    expect_same(whole, parse_split(text, opts, {i}), "split at " + std::to_string(i));
  }
  for (size_t i = 0; i <= text.size() && text.size() <= 200; i += 3) {
    for (size_t j = i; j <= text.size(); j += 5) {
      expect_same(whole, parse_split(text, opts, {i, j}),
                  "splits " + std::to_string(i) + "," + std::to_string(j));
    }
  }
  std::vector<size_t> bytes;
  for (size_t i = 1; i < text.size(); ++i) bytes.push_back(i);
  expect_same(whole, parse_split(text, opts, bytes), "byte by byte");
  return whole;
}

const std::string kCalls =
    "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"city\" string=\"true\">Paris \"Île\"</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n<｜DSML｜invoke name=\"now\">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";

TEST(ChatOutputParserTest, SplitsReasoningAndContent) {
  const ParsedDelta out =
      parse_everywhere("Let me think.\n1+1 is 2.</think>The answer is **2**.", true);
  EXPECT_EQ(out.reasoning_content, "Let me think.\n1+1 is 2.");
  EXPECT_EQ(out.content, "The answer is **2**.");
  EXPECT_TRUE(out.tool_calls.empty());
  const ParsedDelta repeated = parse_everywhere("<think>hm</think>ok", true);
  EXPECT_EQ(repeated.reasoning_content, "hm");
  EXPECT_EQ(repeated.content, "ok");
}

TEST(ChatOutputParserTest, NonThinkingWithEosText) {
  const ParsedDelta out = parse_everywhere("Hi there.\n\nBye.<｜end▁of▁sentence｜>", false);
  EXPECT_EQ(out.reasoning_content, "");
  EXPECT_EQ(out.content, "Hi there.\n\nBye.");
}

TEST(ChatOutputParserTest, ExtractsToolCalls) {
  const ParsedDelta out =
      parse_everywhere("Need the weather.</think>Checking now.\n\n" + kCalls, true);
  EXPECT_EQ(out.reasoning_content, "Need the weather.");
  EXPECT_EQ(out.content, "Checking now.");
  ASSERT_EQ(out.tool_calls.size(), 2u);
  EXPECT_EQ(out.tool_calls[0].id, "call_0");
  EXPECT_EQ(out.tool_calls[0].name, "get_weather");
  EXPECT_EQ(out.tool_calls[0].arguments, R"({"city": "Paris \"Île\"", "days": 3})");
  EXPECT_EQ(out.tool_calls[1].name, "now");
  EXPECT_EQ(out.tool_calls[1].arguments, "{}");
  const nlohmann::json openai = to_openai_json(out.tool_calls[0]);
  EXPECT_EQ(openai["type"], "function");
  EXPECT_EQ(nlohmann::json::parse(openai["function"]["arguments"].get<std::string>())["days"], 3);
}

TEST(ChatOutputParserTest, RoundTripsTheEncoder) {
  const std::vector<ToolCall> calls = {
      {"a", "search", R"({"q": "moe <b>serve</b>", "k": 5, "f": {"x": [1, "y"]}, "ok": false})"},
      {"b", "noop", "{}"}};
  const ParsedDelta out = parse_everywhere("\n\n" + render_tool_calls(calls), false);
  EXPECT_EQ(out.content, "");
  ASSERT_EQ(out.tool_calls.size(), 2u);
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(out.tool_calls[i].name, calls[i].name);
    EXPECT_EQ(nlohmann::json::parse(out.tool_calls[i].arguments),
              nlohmann::json::parse(calls[i].arguments));
  }
}

TEST(ChatOutputParserTest, MalformedDsmlBecomesContent) {
  const std::vector<std::string> malformed = {
      // unclosed block and parameter
      "Hi\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" "
      "string=\"true\">x",
      // arguments that are not JSON
      "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" "
      "string=\"false\">{bad</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
      // text where an invoke should be
      "<｜DSML｜tool_calls>\nhello</｜DSML｜tool_calls> tail",
      // missing name, duplicate parameter, bad string flag
      "<｜DSML｜tool_calls>\n<｜DSML｜invoke>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
      "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" "
      "string=\"true\">1</｜DSML｜parameter>\n<｜DSML｜parameter name=\"a\" "
      "string=\"true\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
      "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" "
      "string=\"maybe\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
      // a block that never gets an invoke
      "text <｜DSML｜tool_calls>",
      "<｜DSML｜tool_call",
  };
  for (const std::string& text : malformed) {
    const ParsedDelta out = parse_everywhere(text, false);
    EXPECT_EQ(out.content, text);
    EXPECT_TRUE(out.tool_calls.empty()) << text;
  }
  // Unclosed thinking: everything is reasoning.
  EXPECT_EQ(parse_everywhere("still thinking </thi", true).reasoning_content,
            "still thinking </thi");
}

TEST(ChatOutputParserTest, GoodInvokesSurviveABadNeighbour) {
  const std::string bad =
      "<｜DSML｜invoke name=\"g\">\n<｜DSML｜parameter name=\"n\" "
      "string=\"false\">[1,</｜DSML｜parameter>\n</｜DSML｜invoke>";
  const std::string text =
      "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n" + bad +
      "\n</｜DSML｜tool_calls>";
  const ParsedDelta out = parse_everywhere(text, false);
  ASSERT_EQ(out.tool_calls.size(), 1u);
  EXPECT_EQ(out.tool_calls[0].name, "f");
  EXPECT_EQ(out.content, "\n" + bad);
}

}  // namespace
}  // namespace moeserve::tokenizer::dsv4
