#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>
#include <vector>

#include "parallel/eplb/expert_load.h"
#include "parallel/eplb/placement.h"

namespace moeserve::parallel {
namespace {

// Zipf-shaped loads with the hot experts scattered over the id space.
std::vector<double> zipf_loads(int32_t n, double exponent, uint32_t seed) {
  std::vector<double> load(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    // A fixed permutation: (i * 7919 + seed) mod n is a bijection when gcd(7919, n) == 1.
    load[(static_cast<int64_t>(i) * 7919 + seed) % n] = 1e6 * std::pow(i + 1.0, -exponent);
  }
  return load;
}

PlannerConfig config(int32_t logical, int32_t slots, int32_t ranks) {
  PlannerConfig c;
  c.num_logical = logical;
  c.num_slots = slots;
  c.num_ranks = ranks;
  return c;
}

void expect_valid(const ExpertPlacement& p, int32_t logical, int32_t slots, int32_t ranks) {
  ASSERT_TRUE(p.validate()) << p.validate().error().to_string();
  EXPECT_EQ(p.num_logical(), logical);
  EXPECT_EQ(p.num_slots(), slots);
  EXPECT_EQ(p.num_ranks(), ranks);
  EXPECT_EQ(p.slots_per_rank() * ranks, slots);
  int32_t total = 0;
  for (int32_t e = 0; e < logical; ++e) {
    EXPECT_GE(p.replica_count(e), 1) << "expert " << e;
    total += p.replica_count(e);
    for (int32_t s : p.replicas(e)) EXPECT_EQ(p.logical_of(s), e);
  }
  EXPECT_EQ(total, slots);
  // Padded layout agrees with the CSR one.
  const int32_t m = p.max_replica_count();
  const auto padded = p.padded_log_to_phy(m);
  for (int32_t e = 0; e < logical; ++e) {
    for (int32_t j = 0; j < m; ++j) {
      const int32_t s = padded[static_cast<size_t>(e) * m + j];
      if (j < p.replica_count(e)) {
        EXPECT_EQ(s, p.replicas(e)[j]);
      } else {
        EXPECT_EQ(s, -1);
      }
    }
  }
}

TEST(EplbPlacement, ValidForTargetAndDraftShapes) {
  for (auto [logical, redundant] : {std::pair{384, 32}, std::pair{128, 32}, std::pair{384, 0}}) {
    const auto load = zipf_loads(logical, 1.0, 3);
    auto p = plan_expert_placement(load, config(logical, logical + redundant, 32));
    ASSERT_TRUE(p) << p.error().to_string();
    expect_valid(*p, logical, logical + redundant, 32);
  }
}

TEST(EplbPlacement, BeatsContiguousAndApproachesIdeal) {
  const int32_t logical = 384, slots = 416, ranks = 32;
  const auto load = zipf_loads(logical, 1.0, 11);
  auto none = ExpertPlacement::contiguous(logical, logical, ranks);
  ASSERT_TRUE(none);
  const double b_none = balance_of(std::span<const double>(expected_rank_load(*none, load)));
  for (bool refine : {false, true}) {
    PlannerConfig c = config(logical, slots, ranks);
    c.refine = refine;
    auto p = plan_expert_placement(load, c);
    ASSERT_TRUE(p);
    const double b = balance_of(std::span<const double>(expected_rank_load(*p, load)));
    EXPECT_GT(b, b_none + 0.2) << "refine " << refine;
    EXPECT_GT(b, 0.97) << "refine " << refine;
  }
}

TEST(EplbPlacement, RefineIsNoWorseThanPublishedAlgorithm) {
  for (uint32_t seed = 0; seed < 8; ++seed) {
    const auto load = zipf_loads(128, 1.2, seed);
    PlannerConfig c = config(128, 160, 32);
    c.refine = false;
    auto plain = plan_expert_placement(load, c);
    c.refine = true;
    auto refined = plan_expert_placement(load, c);
    ASSERT_TRUE(plain && refined);
    const double b_plain = balance_of(std::span<const double>(expected_rank_load(*plain, load)));
    const double b_ref = balance_of(std::span<const double>(expected_rank_load(*refined, load)));
    EXPECT_GE(b_ref, b_plain - 1e-12) << "seed " << seed;
  }
}

TEST(EplbPlacement, HotExpertGetsMoreReplicasThanCold) {
  std::vector<double> load(64, 9.0);
  load[5] = 60.0;
  load[40] = 25.0;
  auto p = plan_expert_placement(load, config(64, 72, 8));
  ASSERT_TRUE(p);
  EXPECT_EQ(p->replica_count(5), 7);
  EXPECT_EQ(p->replica_count(40), 3);
  EXPECT_EQ(p->replica_count(0), 1);
  // Replicas of the hot expert sit on distinct ranks.
  std::set<int32_t> ranks;
  for (int32_t s : p->replicas(5)) ranks.insert(p->rank_of_slot(s));
  EXPECT_EQ(static_cast<int32_t>(ranks.size()), p->replica_count(5));
}

TEST(EplbPlacement, Deterministic) {
  const auto load = zipf_loads(384, 0.9, 5);
  PlannerConfig c = config(384, 416, 32);
  auto a = plan_expert_placement(load, c);
  auto b = plan_expert_placement(load, c);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(*a, *b);
  // All-equal loads: ties by index, redundant slots spread one per expert.
  std::vector<double> flat(384, 7.0);
  auto f = plan_expert_placement(flat, c);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->max_replica_count(), 2);
  EXPECT_EQ(f->replica_count(0), 2);
  EXPECT_EQ(f->replica_count(31), 2);
  EXPECT_EQ(f->replica_count(32), 1);
}

TEST(EplbPlacement, EdgeCases) {
  // No redundant slots: a permutation of experts onto ranks.
  {
    const auto load = zipf_loads(64, 1.0, 1);
    auto p = plan_expert_placement(load, config(64, 64, 8));
    ASSERT_TRUE(p);
    expect_valid(*p, 64, 64, 8);
    EXPECT_EQ(p->max_replica_count(), 1);
  }
  // One rank.
  {
    const auto load = zipf_loads(16, 1.0, 1);
    auto p = plan_expert_placement(load, config(16, 20, 1));
    ASSERT_TRUE(p);
    expect_valid(*p, 16, 20, 1);
  }
  // More ranks than experts (one slot per rank).
  {
    const auto load = zipf_loads(8, 1.0, 1);
    auto p = plan_expert_placement(load, config(8, 16, 16));
    ASSERT_TRUE(p);
    expect_valid(*p, 8, 16, 16);
  }
  // All-zero load.
  {
    std::vector<double> zero(32, 0.0);
    auto p = plan_expert_placement(zero, config(32, 40, 8));
    ASSERT_TRUE(p);
    expect_valid(*p, 32, 40, 8);
  }
  // Slots not divisible by ranks: a clear error.
  {
    std::vector<double> load(384, 1.0);
    auto p = plan_expert_placement(load, config(384, 384 + 30, 32));
    ASSERT_FALSE(p);
    EXPECT_EQ(p.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(p.error().message.find("multiple of num_ranks"), std::string::npos)
        << p.error().message;
  }
  // Fewer slots than experts, wrong load count, negative load.
  {
    std::vector<double> load(64, 1.0);
    EXPECT_FALSE(plan_expert_placement(load, config(64, 32, 8)));
    EXPECT_FALSE(plan_expert_placement(load, config(65, 72, 8)));
    load[3] = -1.0;
    EXPECT_FALSE(plan_expert_placement(load, config(64, 72, 8)));
  }
}

TEST(EplbPlacement, HierarchicalKeepsGroupsOnOneNode) {
  const int32_t logical = 64, groups = 8, nodes = 2, ranks = 8;
  const auto load = zipf_loads(logical, 1.0, 9);
  PlannerConfig c = config(logical, 80, ranks);
  c.num_groups = groups;
  c.num_nodes = nodes;
  c.mode = PlacementMode::kHierarchical;
  auto p = plan_expert_placement(load, c);
  ASSERT_TRUE(p) << p.error().to_string();
  expect_valid(*p, logical, 80, ranks);
  const int32_t group_size = logical / groups, ranks_per_node = ranks / nodes;
  for (int32_t g = 0; g < groups; ++g) {
    std::set<int32_t> node_of_group;
    for (int32_t e = g * group_size; e < (g + 1) * group_size; ++e) {
      for (int32_t s : p->replicas(e)) node_of_group.insert(p->rank_of_slot(s) / ranks_per_node);
    }
    EXPECT_EQ(node_of_group.size(), 1u) << "group " << g;
  }
  // Each node holds half the groups.
  std::vector<int32_t> experts_per_node(nodes, 0);
  for (int32_t e = 0; e < logical; ++e) {
    ++experts_per_node[p->rank_of_slot(p->replicas(e)[0]) / ranks_per_node];
  }
  EXPECT_EQ(experts_per_node[0], logical / nodes);
}

TEST(EplbPlacement, HierarchicalErrorsAndAutoFallback) {
  std::vector<double> load(64, 1.0);
  load[0] = 9.0;
  PlannerConfig c = config(64, 96, 32);
  c.num_groups = 4;
  c.num_nodes = 8;  // more nodes (and ranks) than groups
  c.mode = PlacementMode::kHierarchical;
  auto bad = plan_expert_placement(load, c);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("global mode"), std::string::npos);
  c.mode = PlacementMode::kAuto;  // falls back to global
  auto ok = plan_expert_placement(load, c);
  ASSERT_TRUE(ok) << ok.error().to_string();
  expect_valid(*ok, 64, 96, 32);
  // More ranks than groups but nodes divide groups: hierarchical works.
  c.num_groups = 8;
  c.num_nodes = 4;
  c.mode = PlacementMode::kHierarchical;
  auto h = plan_expert_placement(load, c);
  ASSERT_TRUE(h) << h.error().to_string();
  expect_valid(*h, 64, 96, 32);
}

TEST(EplbPlacement, HeterogeneousTargetAndDraft) {
  const int32_t ranks = 32;
  std::vector<double> target, draft;
  for (int32_t l = 0; l < 4; ++l) {
    auto t = zipf_loads(384, 1.0, l);
    target.insert(target.end(), t.begin(), t.end());
  }
  for (int32_t l = 0; l < 3; ++l) {
    auto d = zipf_loads(128, 1.1, l);
    draft.insert(draft.end(), d.begin(), d.end());
  }
  auto plan = plan_heterogeneous_placement(target, 4, config(384, 416, ranks), draft, 3,
                                           config(128, 160, ranks));
  ASSERT_TRUE(plan) << plan.error().to_string();
  ASSERT_EQ(plan->target.layers.size(), 4u);
  ASSERT_EQ(plan->draft.layers.size(), 3u);
  for (const auto& p : plan->target.layers) expect_valid(p, 384, 416, ranks);
  for (const auto& p : plan->draft.layers) expect_valid(p, 128, 160, ranks);
  auto mismatch = plan_heterogeneous_placement(target, 4, config(384, 416, ranks), draft, 3,
                                               config(128, 160, 16));
  EXPECT_FALSE(mismatch);
}

TEST(EplbPlacement, FromPhyToLogRejectsBadMaps) {
  EXPECT_FALSE(ExpertPlacement::from_phy_to_log(4, 2, {0, 1, 2, 7}));
  EXPECT_FALSE(ExpertPlacement::from_phy_to_log(4, 3, {0, 1, 2, 3}));
  auto missing = ExpertPlacement::from_phy_to_log(4, 2, {0, 1, 2, 2});
  ASSERT_TRUE(missing);
  EXPECT_FALSE(missing->validate());
}

}  // namespace
}  // namespace moeserve::parallel
