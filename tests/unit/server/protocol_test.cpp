#include "server/protocol.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace moeserve::server {
namespace {

ProtocolLimits limits() { return {}; }

TEST(ProtocolTest, CompletionDefaultsAndFields) {
  auto r = parse_completion_request(
      R"({"model":"m","prompt":"hi","max_tokens":5,"temperature":0,"top_p":0.5,"top_k":-1,
          "min_p":0.1,"seed":7,"stop":"x","n":2,"logprobs":3,"echo":true,"user":"u",
          "presence_penalty":1,"frequency_penalty":-1,"repetition_penalty":1.2,"unknown":1})",
      limits());
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(*r->common.model, "m");
  ASSERT_EQ(r->prompts.size(), 1u);
  EXPECT_EQ(*r->prompts[0].text, "hi");
  EXPECT_EQ(*r->common.max_tokens, 5);
  EXPECT_EQ(r->common.sampling.temperature, 0.0f);
  EXPECT_EQ(r->common.sampling.top_k, 0);
  EXPECT_EQ(*r->common.sampling.seed, 7u);
  EXPECT_EQ(r->common.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(r->common.n, 2);
  EXPECT_EQ(r->logprobs, 3);
  EXPECT_EQ(r->common.sampling.logprobs, 3);
  EXPECT_TRUE(r->echo);
  EXPECT_FLOAT_EQ(r->common.sampling.repetition_penalty, 1.2f);
}

TEST(ProtocolTest, PromptForms) {
  auto ids = parse_completion_request(R"({"prompt":[1,2,3]})", limits());
  ASSERT_TRUE(ids);
  EXPECT_EQ(ids->prompts[0].token_ids, (std::vector<int32_t>{1, 2, 3}));
  auto batch = parse_completion_request(R"({"prompt":["a",[4,5]]})", limits());
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->prompts.size(), 2u);
  EXPECT_FALSE(parse_completion_request(R"({"prompt":""})", limits()));
  EXPECT_FALSE(parse_completion_request(R"({"prompt":[]})", limits()));
  EXPECT_FALSE(parse_completion_request(R"({})", limits()));
}

TEST(ProtocolTest, WrongTypesNameTheField) {
  auto r = parse_completion_request(R"({"prompt":"x","temperature":"hot"})", limits());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().status, 400);
  EXPECT_EQ(r.error().param, "temperature");
  r = parse_completion_request(R"({"prompt":"x","max_tokens":1.5})", limits());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().param, "max_tokens");
  r = parse_completion_request(R"({"prompt":"x","stop":["a",3]})", limits());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().param, "stop[1]");
}

TEST(ProtocolTest, OutOfRange) {
  for (const char* body :
       {R"({"prompt":"x","temperature":3})", R"({"prompt":"x","top_p":0})",
        R"({"prompt":"x","n":0})", R"({"prompt":"x","max_tokens":-2})",
        R"({"prompt":"x","logprobs":21})", R"({"prompt":"x","presence_penalty":2.5})"}) {
    auto r = parse_completion_request(body, limits());
    ASSERT_FALSE(r) << body;
    EXPECT_EQ(r.error().status, 400) << body;
  }
}

TEST(ProtocolTest, MalformedJsonAndUtf8) {
  auto r = parse_completion_request("{\"prompt\":", limits());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, "invalid_json");
  r = parse_completion_request("{\"prompt\":\"\xC3\x28\"}", limits());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, "invalid_utf8");
  r = parse_completion_request("[]", limits());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().status, 400);
}

TEST(ProtocolTest, ChatMessagesToolsAndThinking) {
  auto r = parse_chat_request(
      R"({"messages":[{"role":"system","content":"s"},
                      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
                      {"role":"assistant","content":null,"reasoning_content":"r",
                       "tool_calls":[{"id":"c1","type":"function",
                                      "function":{"name":"f","arguments":"{\"x\":1}"}}]},
                      {"role":"tool","tool_call_id":"c1","content":"42"}],
          "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],
          "tool_choice":{"type":"function","function":{"name":"f"}},
          "max_completion_tokens":9,"logprobs":true,"top_logprobs":2,
          "chat_template_kwargs":{"thinking":true},"parallel_tool_calls":false})",
      limits());
  ASSERT_TRUE(r) << r.error().message;
  const auto& m = r->chat.messages;
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[1].content, "a\nb");
  EXPECT_EQ(*m[2].reasoning_content, "r");
  ASSERT_EQ(m[2].tool_calls.size(), 1u);
  EXPECT_EQ(m[2].tool_calls[0].arguments, R"({"x":1})");
  EXPECT_EQ(m[3].tool_call_id, "c1");
  ASSERT_EQ(r->chat.tools.size(), 1u);
  EXPECT_EQ(r->chat.tools[0].parameters_json, R"({"type":"object"})");
  EXPECT_EQ(r->chat.tool_choice, ToolChoiceMode::kNamed);
  EXPECT_EQ(*r->common.max_tokens, 9);
  EXPECT_EQ(r->common.sampling.logprobs, 2);
  EXPECT_TRUE(r->chat.thinking);
  EXPECT_FALSE(r->parallel_tool_calls);
}

TEST(ProtocolTest, ChatToolChoiceNoneDropsTools) {
  auto r = parse_chat_request(
      R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"none",
          "tools":[{"type":"function","function":{"name":"f"}}]})",
      limits());
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->chat.tools.empty());
  EXPECT_EQ(r->chat.tool_choice, ToolChoiceMode::kNone);
}

TEST(ProtocolTest, ChatUnsupportedIs422) {
  auto r = parse_chat_request(
      R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]}]})",
      limits());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().status, 422);
  EXPECT_EQ(r.error().param, "messages[0].content[0].type");
}

TEST(ProtocolTest, StreamOptionsNeedStream) {
  auto r = parse_chat_request(
      R"({"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}})",
      limits());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().param, "stream_options");
  r = parse_chat_request(
      R"({"messages":[{"role":"user","content":"x"}],"stream":true,
          "stream_options":{"include_usage":true}})",
      limits());
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->common.include_usage);
}

TEST(ProtocolTest, ErrorObjectShape) {
  ApiError e = bad_request("bad", "temperature", "x");
  auto j = nlohmann::json::parse(e.to_json());
  EXPECT_EQ(j["error"]["message"], "bad");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "temperature");
  EXPECT_EQ(j["error"]["code"], "x");
  auto j2 = nlohmann::json::parse(ApiError{404, "nf", "not_found_error", "", ""}.to_json());
  EXPECT_TRUE(j2["error"]["param"].is_null());
  EXPECT_TRUE(j2["error"]["code"].is_null());
}

TEST(ProtocolTest, Utf8) {
  EXPECT_TRUE(is_valid_utf8("h\xC3\xA9llo \xF0\x9F\x9A\x80"));
  EXPECT_FALSE(is_valid_utf8("\xC0\xAF"));          // overlong
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(is_valid_utf8("\xE2\x82"));          // truncated
  EXPECT_EQ(utf8_complete_prefix("ab\xE2\x82"), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab\xE2\x82\xAC"), 5u);
  EXPECT_EQ(utf8_complete_prefix("ab\xF0"), 2u);
  EXPECT_EQ(utf8_complete_prefix(""), 0u);
}

TEST(ProtocolTest, TokenizeAndDetokenize) {
  auto t = parse_tokenize_request(R"({"prompt":"hi","add_special_tokens":false})");
  ASSERT_TRUE(t);
  EXPECT_EQ(*t->prompt, "hi");
  EXPECT_FALSE(t->add_special_tokens);
  auto c = parse_tokenize_request(R"({"messages":[{"role":"user","content":"x"}]})");
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->chat.has_value());
  EXPECT_FALSE(parse_tokenize_request(R"({})"));
  auto d = parse_detokenize_request(R"({"tokens":[1,2]})");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->tokens.size(), 2u);
  EXPECT_FALSE(parse_detokenize_request(R"({"tokens":["a"]})"));
}

}  // namespace
}  // namespace moeserve::server
