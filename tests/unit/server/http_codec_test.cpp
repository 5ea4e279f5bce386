#include "server/http_codec.h"

#include <gtest/gtest.h>

#include "server/metrics.h"

namespace moeserve::server {
namespace {

TEST(HttpCodecTest, SseEventFraming) {
  std::string out;
  append_sse_event(R"({"a":1})", out);
  append_sse_event(R"({"b":2})", out);
  EXPECT_EQ(out, "data: {\"a\":1}\n\ndata: {\"b\":2}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
}

TEST(HttpCodecTest, ChunkedFraming) {
  std::string out;
  append_chunk("", out);
  EXPECT_TRUE(out.empty()) << "an empty chunk would end the body";
  append_chunk(std::string(26, 'x'), out);
  EXPECT_EQ(out, "1a\r\n" + std::string(26, 'x') + "\r\n");
  EXPECT_EQ(last_chunk(), "0\r\n\r\n");
}

TEST(HttpCodecTest, ResponseHead) {
  const std::string r = serialize_response(404, "application/json", "{}", true);
  EXPECT_EQ(r.rfind("HTTP/1.1 404 Not Found\r\n", 0), 0u);
  EXPECT_NE(r.find("Content-Length: 2\r\n"), std::string::npos);
  EXPECT_NE(r.find("Connection: keep-alive\r\n"), std::string::npos);
  EXPECT_EQ(r.substr(r.size() - 6), "\r\n\r\n{}");
  const std::string s = serialize_stream_head(true, true);
  EXPECT_NE(s.find("Transfer-Encoding: chunked\r\n"), std::string::npos);
  EXPECT_NE(s.find("Content-Type: text/event-stream\r\n"), std::string::npos);
  const std::string s10 = serialize_stream_head(false, true);
  EXPECT_EQ(s10.find("Transfer-Encoding"), std::string::npos);
  EXPECT_NE(s10.find("Connection: close\r\n"), std::string::npos);
}

TEST(MetricsTest, PrometheusText) {
  ServerMetrics m("tiny");
  m.record_prompt_tokens(5);
  m.record_generation_tokens(7);
  m.record_ttft(0.05);
  m.record_finished(FinishReason::kLength, 0.2, 5, 7);
  EngineStats e;
  e.num_requests_running = 3;
  e.kv_cache_usage = 0.25;
  const std::string text = m.render(e);
  EXPECT_NE(text.find("moeserve:num_requests_running{model_name=\"tiny\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("moeserve:kv_cache_usage_perc{model_name=\"tiny\"} 0.25\n"),
            std::string::npos);
  EXPECT_NE(text.find("moeserve:prompt_tokens_total{model_name=\"tiny\"} 5\n"), std::string::npos);
  EXPECT_NE(
      text.find("moeserve:request_success_total{model_name=\"tiny\",finished_reason=\"length\"} "
                "1\n"),
      std::string::npos);
  EXPECT_NE(
      text.find("moeserve:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.06\"} "
                "1\n"),
      std::string::npos);
  EXPECT_NE(text.find("moeserve:time_to_first_token_seconds_count{model_name=\"tiny\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("# TYPE moeserve:e2e_request_latency_seconds histogram\n"),
            std::string::npos);
}

}  // namespace
}  // namespace moeserve::server
