#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <vector>

#include "parallel/eplb/replica_select.h"
#include "parallel/eplb/routing.h"
#include "parallel/eplb/simulator.h"

namespace moeserve::parallel {
namespace {

TEST(EplbReplicaSelect, HashIsBalancedAndDeterministic) {
  for (int32_t count : {1, 2, 3, 5, 13}) {
    std::vector<int64_t> hits(count, 0);
    const int32_t n = 60000;
    for (int32_t t = 0; t < n; ++t) {
      const int32_t r = hash_replica(static_cast<uint64_t>(t), 17, count);
      ASSERT_GE(r, 0);
      ASSERT_LT(r, count);
      ASSERT_EQ(r, hash_replica(static_cast<uint64_t>(t), 17, count));
      ++hits[r];
    }
    for (int64_t h : hits)
      EXPECT_NEAR(static_cast<double>(h) / n, 1.0 / count, 0.02 / count + 0.01);
  }
}

TEST(EplbReplicaSelect, RankRoundRobinSplitsWithinOnePerRank) {
  const int32_t experts = 16, count = 3, ranks = 8, per_rank = 10;
  RankRoundRobinSelector sel(experts);
  std::vector<int64_t> hits(count, 0);
  for (int32_t rank = 0; rank < ranks; ++rank) {
    sel.begin(rank);
    std::vector<int64_t> local(count, 0);
    for (int32_t t = 0; t < per_rank; ++t) ++local[sel.select(5, count)];
    const auto [lo, hi] = std::minmax_element(local.begin(), local.end());
    EXPECT_LE(*hi - *lo, 1);
    for (int32_t r = 0; r < count; ++r) hits[r] += local[r];
  }
  const auto [lo, hi] = std::minmax_element(hits.begin(), hits.end());
  EXPECT_LE(*hi - *lo, 2);
  // begin() resets: the same rank sees the same sequence again.
  sel.begin(2);
  const int32_t first = sel.select(5, count);
  sel.begin(2);
  EXPECT_EQ(sel.select(5, count), first);
  EXPECT_TRUE(replica_rule_from_name("hash"));
  EXPECT_FALSE(replica_rule_from_name("nearest"));
}

TEST(EplbRouting, DistinctTopKAndDeterministic) {
  RoutingShape shape{64, 4, 2, 256};
  PopularityConfig pop;
  pop.zipf_exponent = 1.2;
  SkewedRouting a(shape, pop, 9), b(shape, pop, 9);
  std::vector<int32_t> sa(shape.step_size()), sb(shape.step_size());
  std::vector<int64_t> freq(64, 0);
  for (int32_t step = 0; step < 20; ++step) {
    ASSERT_TRUE(*a.next_step(sa));
    ASSERT_TRUE(*b.next_step(sb));
    ASSERT_EQ(sa, sb);
    for (size_t t = 0; t < sa.size(); t += 4) {
      std::set<int32_t> picked(sa.begin() + t, sa.begin() + t + 4);
      ASSERT_EQ(picked.size(), 4u);
      for (int32_t e : picked) {
        ASSERT_GE(e, 0);
        ASSERT_LT(e, 64);
        ++freq[e];
      }
    }
  }
  // The most popular expert of layer 0 is picked most often overall (well above the mean).
  const auto pop0 = a.popularity(0);
  const int32_t hottest =
      static_cast<int32_t>(std::max_element(pop0.begin(), pop0.end()) - pop0.begin());
  EXPECT_GT(freq[hottest], 2 * (20 * 2 * 256 * 4 / 64));
}

TEST(EplbRouting, TraceRoundTripAndErrors) {
  const auto dir = std::filesystem::temp_directory_path();
  const std::string path = (dir / "moeserve_eplb_trace_test.jsonl").string();
  RoutingShape shape{16, 2, 2, 8};
  PopularityConfig pop;
  SkewedRouting gen(shape, pop, 3);
  std::vector<std::vector<int32_t>> steps;
  {
    auto w = RoutingTraceWriter::open(path, shape);
    ASSERT_TRUE(w);
    for (int32_t i = 0; i < 3; ++i) {
      std::vector<int32_t> s(shape.step_size());
      ASSERT_TRUE(*gen.next_step(s));
      ASSERT_TRUE((*w)->write_step(s));
      steps.push_back(s);
    }
    ASSERT_TRUE((*w)->close());
  }
  auto r = RoutingTraceReader::open(path);
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_EQ((*r)->shape().num_experts, 16);
  EXPECT_EQ((*r)->shape().tokens_per_step, 8);
  std::vector<int32_t> s(shape.step_size());
  for (const auto& expect : steps) {
    auto more = (*r)->next_step(s);
    ASSERT_TRUE(more && *more);
    EXPECT_EQ(s, expect);
  }
  auto end = (*r)->next_step(s);
  ASSERT_TRUE(end);
  EXPECT_FALSE(*end);

  {
    std::ofstream bad(path);
    bad << R"({"format":"moeserve-routing","version":1,"num_experts":4,"top_k":1,)"
        << R"("num_layers":1,"tokens_per_step":2})"
        << "\n"
        << R"({"step":0,"layer":0,"experts":[0,9]})"
        << "\n";
  }
  auto br = RoutingTraceReader::open(path);
  ASSERT_TRUE(br);
  std::vector<int32_t> one(2);
  auto res = (*br)->next_step(one);
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error().code, ErrorCode::kOutOfRange);
  {
    std::ofstream bad(path);
    bad << "{}\n";
  }
  EXPECT_FALSE(RoutingTraceReader::open(path));
  std::filesystem::remove(path);
}

EplbSimResult simulate(ReplicaRule rule, uint64_t seed, bool refine = true) {
  RoutingShape shape{64, 4, 2, 8 * 48};
  PopularityConfig pop;
  pop.zipf_exponent = 1.0;
  pop.layer_jitter = 0.1;
  SkewedRouting skewed(shape, pop, seed);
  PopularityConfig flat;
  flat.zipf_exponent = 0.0;
  SkewedRouting uniform(shape, flat, seed + 1);
  EplbSimConfig c;
  c.num_ranks = 8;
  c.tokens_per_rank = 48;
  c.num_redundant = 16;
  c.window_steps = 40;
  c.rebalance_interval = 40;
  c.num_steps = 160;
  c.replica_rule = rule;
  c.refine = refine;
  auto r = run_eplb_simulation(c, skewed, uniform);
  EXPECT_TRUE(r) << r.error().to_string();
  return *r;
}

TEST(EplbSimulator, EplbBeatsNoneAndApproachesUniform) {
  for (ReplicaRule rule : {ReplicaRule::kHash, ReplicaRule::kRankRoundRobin}) {
    const EplbSimResult r = simulate(rule, 5);
    EXPECT_EQ(r.steps_run, 160);
    EXPECT_EQ(r.eval_steps, 120);
    EXPECT_EQ(r.rebalances.size(), 3u);  // at steps 40, 80, 120
    const EplbBalance& b = r.step_balance;
    EXPECT_LT(b.none, 0.6);
    EXPECT_GT(b.uniform, 0.8);
    EXPECT_GT(b.eplb, b.none + 0.2) << replica_rule_name(rule);
    EXPECT_GT(b.recovered(), 0.8) << replica_rule_name(rule);
    EXPECT_GT(r.aggregate_balance.eplb, 0.95);
    for (const auto& lb : r.layer_step_balance) EXPECT_GT(lb.eplb, lb.none);
    // The plan looks better on its own window than the raw placement did.
    EXPECT_GT(r.rebalances[0].window_after, r.rebalances[0].window_before);
    EXPECT_FALSE(r.timeline_step.empty());
  }
}

TEST(EplbSimulator, DeterministicPerSeed) {
  const EplbSimResult a = simulate(ReplicaRule::kRankRoundRobin, 11);
  const EplbSimResult b = simulate(ReplicaRule::kRankRoundRobin, 11);
  EXPECT_EQ(a.step_balance.eplb, b.step_balance.eplb);
  EXPECT_EQ(a.step_balance.none, b.step_balance.none);
  EXPECT_EQ(a.timeline_eplb, b.timeline_eplb);
}

TEST(EplbSimulator, RejectsBadShapes) {
  RoutingShape shape{60, 4, 1, 8 * 4};  // 60 experts do not split over 8 ranks
  PopularityConfig pop;
  SkewedRouting s(shape, pop, 1), u(shape, pop, 2);
  EplbSimConfig c;
  c.num_ranks = 8;
  c.tokens_per_rank = 4;
  c.num_redundant = 4;
  EXPECT_FALSE(run_eplb_simulation(c, s, u));
}

}  // namespace
}  // namespace moeserve::parallel
