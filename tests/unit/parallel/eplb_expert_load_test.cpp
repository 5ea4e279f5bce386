#include <gtest/gtest.h>

#include <deque>
#include <numeric>
#include <vector>

#include "parallel/eplb/expert_load.h"
#include "parallel/eplb/routing.h"

namespace moeserve::parallel {
namespace {

TEST(EplbBalance, MeanOverMax) {
  const std::vector<int64_t> even{5, 5, 5, 5};
  EXPECT_DOUBLE_EQ(balance_of(std::span<const int64_t>(even)), 1.0);
  const std::vector<int64_t> skew{1, 1, 1, 5};
  EXPECT_DOUBLE_EQ(balance_of(std::span<const int64_t>(skew)), 2.0 / 5.0);
  const std::vector<int64_t> idle{0, 0};
  EXPECT_DOUBLE_EQ(balance_of(std::span<const int64_t>(idle)), 1.0);
}

// Brute force: keep every step, recompute sums and balances from scratch.
struct BruteWindow {
  int32_t layers, slots, ranks, window;
  std::deque<std::vector<int32_t>> steps;

  void record(const std::vector<int32_t>& s) {
    steps.push_back(s);
    if (static_cast<int32_t>(steps.size()) > window) steps.pop_front();
  }
  std::vector<int64_t> sum(int32_t l) const {
    std::vector<int64_t> out(slots, 0);
    for (const auto& s : steps) {
      for (int32_t i = 0; i < slots; ++i) out[i] += s[l * slots + i];
    }
    return out;
  }
  std::vector<int64_t> ranks_of(const int32_t* slot_load) const {
    std::vector<int64_t> r(ranks, 0);
    for (int32_t i = 0; i < slots; ++i) r[i / (slots / ranks)] += slot_load[i];
    return r;
  }
  double mean_step_balance(int32_t l) const {
    double total = 0;
    for (const auto& s : steps)
      total += balance_of(std::span<const int64_t>(ranks_of(&s[l * slots])));
    return total / steps.size();
  }
  double window_balance(int32_t l) const {
    const auto s = sum(l);
    std::vector<int32_t> narrow(s.begin(), s.end());
    return balance_of(std::span<const int64_t>(ranks_of(narrow.data())));
  }
};

TEST(EplbLoadWindow, RunningSumsMatchBruteForce) {
  const int32_t layers = 3, slots = 12, ranks = 4, window = 7;
  ExpertLoadWindow w(layers, slots, ranks, window);
  BruteWindow brute{layers, slots, ranks, window, {}};
  SplitMix64 rng(42);
  for (int32_t step = 0; step < 40; ++step) {
    std::vector<int32_t> s(layers * slots);
    for (auto& x : s) x = static_cast<int32_t>(rng.below(50));
    w.record_step(s);
    brute.record(s);
    EXPECT_EQ(w.size(), std::min(step + 1, window));
    for (int32_t l = 0; l < layers; ++l) {
      const auto expect = brute.sum(l);
      const auto got = w.window_sum(l);
      ASSERT_TRUE(std::equal(got.begin(), got.end(), expect.begin())) << "step " << step;
      EXPECT_NEAR(w.mean_step_balance(l), brute.mean_step_balance(l), 1e-12);
      EXPECT_NEAR(w.window_balance(l), brute.window_balance(l), 1e-12);
      EXPECT_NEAR(w.last_step_balance(l),
                  balance_of(std::span<const int64_t>(brute.ranks_of(&s[l * slots]))), 1e-12);
    }
  }
  EXPECT_EQ(w.steps_recorded(), 40);
  w.clear();
  EXPECT_EQ(w.size(), 0);
  EXPECT_EQ(w.window_sum(0)[0], 0);
}

TEST(EplbLoadWindow, LogicalLoadAndRemapKeepTotals) {
  const int32_t logical = 8, slots = 12, ranks = 4;
  auto from = ExpertPlacement::contiguous(logical, slots, ranks);
  ASSERT_TRUE(from);
  ExpertLoadWindow w(1, slots, ranks, 5);
  SplitMix64 rng(7);
  for (int32_t step = 0; step < 9; ++step) {
    std::vector<int32_t> s(slots);
    for (auto& x : s) x = static_cast<int32_t>(rng.below(30));
    w.record_step(s);
  }
  const auto before = w.logical_load(0, *from);
  // Hot expert 3 now gets three replicas.
  auto to = ExpertPlacement::from_phy_to_log(logical, ranks, {3, 0, 1, 3, 2, 4, 3, 5, 6, 7, 0, 1});
  ASSERT_TRUE(to && to->validate());
  w.remap(0, *from, *to);
  const auto after = w.logical_load(0, *to);
  for (int32_t e = 0; e < logical; ++e) EXPECT_DOUBLE_EQ(after[e], before[e]) << e;
  // Replicas of one expert share its load to within one token per step.
  const auto sum = w.window_sum(0);
  const auto reps = to->replicas(3);
  for (int32_t s : reps) EXPECT_NEAR(sum[s], before[3] / 3.0, 5.0);
}

}  // namespace
}  // namespace moeserve::parallel
