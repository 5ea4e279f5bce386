// Trace generator (hit-ratio band, forks, determinism), JSONL round trip, prompt determinism,
// ideal prefix cache and the Prometheus scrape parser.
#include "bench/serve_trace.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include <gtest/gtest.h>

#include "bench/serve_bench.h"

namespace moeserve::bench {
namespace {

TEST(AgenticTrace, HitRatioWithinBandForManySeeds) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    AgenticTraceConfig c;
    c.seed = seed;
    const auto reqs = make_agentic_trace(c);
    const auto stats = ideal_cache_stats(reqs);
    EXPECT_GE(stats.hit_ratio(), 0.85) << "seed " << seed;
    EXPECT_LE(stats.hit_ratio(), 0.97) << "seed " << seed;
  }
}

TEST(AgenticTrace, TurnsGrowByAppendingAndSubagentsFork) {
  AgenticTraceConfig c;
  c.subagent_probability = 0.3;
  const auto reqs = make_agentic_trace(c);
  const auto sessions = group_sessions(reqs);
  int subagents = 0;
  for (const auto& s : sessions) {
    ASSERT_FALSE(s.turns.empty());
    for (size_t t = 1; t < s.turns.size(); ++t) {
      const auto& prev = s.turns[t - 1];
      const auto& cur = s.turns[t];
      EXPECT_GT(cur.input_len, prev.input_len + prev.output_len - 1);
      // Every full block of the previous prompt is a prefix of this one.
      const size_t full = static_cast<size_t>(prev.input_len / kTraceBlockTokens);
      for (size_t b = 0; b < full; ++b) EXPECT_EQ(cur.hash_ids[b], prev.hash_ids[b]);
      EXPECT_LE(cur.output_len, c.max_output_tokens);
      EXPECT_GE(cur.idle_s, 0.0);
      EXPECT_LE(cur.idle_s, c.max_idle_s);
      EXPECT_GE(cur.arrival_s, prev.arrival_s);
    }
    for (const auto& r : s.turns)
      EXPECT_EQ(r.hash_ids.size(),
                static_cast<size_t>((r.input_len + kTraceBlockTokens - 1) / kTraceBlockTokens));
    if (!s.parent_session_id.empty()) {
      ++subagents;
      // The child's first prompt starts with the parent's system prompt blocks.
      const auto& parent = *std::find_if(sessions.begin(), sessions.end(), [&](const auto& p) {
        return p.session_id == s.parent_session_id;
      });
      EXPECT_EQ(s.turns[0].hash_ids[0], parent.turns[0].hash_ids[0]);
    }
  }
  EXPECT_GT(subagents, 0);
  // Seeded: same config, same trace.
  const auto again = make_agentic_trace(c);
  ASSERT_EQ(again.size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(again[i].hash_ids, reqs[i].hash_ids);
}

TEST(Trace, JsonlRoundTrip) {
  AgenticTraceConfig c;
  c.num_sessions = 3;
  const auto reqs = make_agentic_trace(c);
  const auto path = std::filesystem::temp_directory_path() / "moeserve_trace_roundtrip.jsonl";
  ASSERT_TRUE(write_trace_jsonl(path.string(), reqs));
  auto back = read_trace_jsonl(path.string());
  ASSERT_TRUE(back) << back.error().message;
  ASSERT_EQ(back->size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ((*back)[i].session_id, reqs[i].session_id);
    EXPECT_EQ((*back)[i].parent_session_id, reqs[i].parent_session_id);
    EXPECT_EQ((*back)[i].input_len, reqs[i].input_len);
    EXPECT_EQ((*back)[i].hash_ids, reqs[i].hash_ids);
  }
  std::filesystem::remove(path);
  EXPECT_FALSE(read_trace_jsonl("/nonexistent/trace.jsonl"));
}

TEST(Prompt, SharedHashIdsGiveSharedTokenPrefixes) {
  TraceRequest a;
  a.input_len = 150;
  a.hash_ids = {11, 22, 33};
  TraceRequest b = a;
  b.input_len = 200;
  b.hash_ids = {11, 22, 44, 55};
  const auto ta = prompt_token_ids(a, 7, 32, 127);
  const auto tb = prompt_token_ids(b, 7, 32, 127);
  ASSERT_EQ(ta.size(), 150u);
  ASSERT_EQ(tb.size(), 200u);
  for (int i = 0; i < 128; ++i) EXPECT_EQ(ta[i], tb[i]);
  EXPECT_NE(std::vector<int32_t>(ta.begin() + 128, ta.end()),
            std::vector<int32_t>(tb.begin() + 128, tb.begin() + 150));
  for (int32_t t : tb) {
    EXPECT_GE(t, 32);
    EXPECT_LT(t, 127);
  }
  // A different salt (another run / DP rank) changes every block.
  EXPECT_NE(prompt_token_ids(a, 8, 32, 127), ta);
  EXPECT_EQ(prompt_text(a, 7), prompt_text(a, 7));
}

TEST(IdealCache, LongestLeadingRun) {
  IdealPrefixCache cache;
  EXPECT_EQ(cache.observe({1, 2, 3}, 150), 0);
  EXPECT_EQ(cache.observe({1, 2, 4}, 190), 128);
  EXPECT_EQ(cache.observe({1, 5, 3}, 190), 64);   // 3 seen, but not leading
  EXPECT_EQ(cache.observe({1, 2, 3}, 150), 150);  // capped at the input length
  EXPECT_EQ(cache.observe({9}, 10), 0);
}

TEST(Random, FreshBlocks) {
  const auto reqs = make_random_workload(10, 1000, 100, 3);
  std::set<uint64_t> ids;
  for (const auto& r : reqs) {
    EXPECT_EQ(r.hash_ids.size(), 16u);
    ids.insert(r.hash_ids.begin(), r.hash_ids.end());
  }
  EXPECT_EQ(ids.size(), 160u);
  EXPECT_EQ(ideal_cache_stats(reqs).cached_tokens, 0);
}

TEST(Prometheus, SumsLabelledSamples) {
  const std::string text =
      "# HELP moeserve:prefix_cache_hits Prefix-cache hits\n"
      "# TYPE moeserve:prefix_cache_hits counter\n"
      "moeserve:prefix_cache_hits{model_name=\"m\",rank=\"0\"} 100\n"
      "moeserve:prefix_cache_hits{model_name=\"m\",rank=\"1\"} 20.5\n"
      "moeserve:prefix_cache_hits_created 1.7e9\n"
      "vllm:prefix_cache_queries_total{model_name=\"m\"} 4e2\n";
  EXPECT_DOUBLE_EQ(*prometheus_sum(text, {"moeserve:prefix_cache_hits"}), 120.5);
  EXPECT_DOUBLE_EQ(*prometheus_sum(text, {"vllm:prefix_cache_queries_total"}), 400.0);
  EXPECT_FALSE(prometheus_sum(text, {"moeserve:nothing"}).has_value());
}

}  // namespace
}  // namespace moeserve::bench
