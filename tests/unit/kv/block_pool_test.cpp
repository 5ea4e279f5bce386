#include "kv/block_pool.h"

#include <random>

#include <gtest/gtest.h>

namespace moeserve::kv {
namespace {

BlockHash h(uint64_t x) { return BlockHash{x, ~x}; }

TEST(FreeBlockQueue, OrderAndRemove) {
  BlockPool pool(5, true);
  std::vector<int32_t> got;
  pool.get_new_blocks(3, got);
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(pool.num_free_blocks(), 2);
  // Freed in the given order: appended to the tail, evicted after the never-used 3, 4.
  std::vector<int32_t> tail_first = {2, 1, 0};
  pool.free_blocks(tail_first);
  got.clear();
  pool.get_new_blocks(5, got);
  EXPECT_EQ(got, (std::vector<int32_t>{3, 4, 2, 1, 0}));
}

TEST(BlockPool, CacheHitTouchEvictAndEvents) {
  BlockPool pool(4, true);
  std::vector<int32_t> a;
  pool.get_new_blocks(2, a);
  EXPECT_TRUE(pool.cache_block(a[0], h(1)));
  EXPECT_TRUE(pool.cache_block(a[1], h(2)));
  EXPECT_FALSE(pool.cache_block(a[1], h(3)));  // already cached under another hash
  pool.free_blocks(std::vector<int32_t>{a[1], a[0]});
  EXPECT_EQ(pool.num_free_blocks(), 4);
  // Still cached while free: a hit takes it back out of the free queue.
  ASSERT_EQ(pool.lookup(h(1)), a[0]);
  pool.touch(std::vector<int32_t>{a[0]});
  EXPECT_EQ(pool.num_free_blocks(), 3);
  // Allocating everything else evicts the other cached block (h(2)).
  std::vector<int32_t> b;
  pool.get_new_blocks(3, b);
  EXPECT_FALSE(pool.lookup(h(2)).has_value());
  EXPECT_TRUE(pool.lookup(h(1)).has_value());
  const auto events = pool.take_events();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].type, KvEventType::kBlockStored);
  EXPECT_EQ(events[2].type, KvEventType::kBlockRemoved);
  EXPECT_EQ(events[2].hash, h(2));
  // A duplicate hash from a second block is refused (the first copy stays the cached one).
  EXPECT_FALSE(pool.cache_block(b[0], h(1)));
  std::vector<int32_t> refs(4, 1);
  refs[static_cast<size_t>(a[0])] = 1;
  EXPECT_TRUE(pool.check_invariants(refs).has_value());
}

TEST(BlockPool, RandomOpsKeepInvariants) {
  std::mt19937_64 rng(42);
  BlockPool pool(64, true);
  std::vector<std::vector<int32_t>> owners;
  std::vector<int32_t> refs(64, 0);
  for (int iter = 0; iter < 20000; ++iter) {
    const int op = static_cast<int>(rng() % 4);
    if (op == 0 && pool.num_free_blocks() > 0) {
      std::vector<int32_t> got;
      pool.get_new_blocks(1 + static_cast<int32_t>(rng() % std::min(4, pool.num_free_blocks())),
                          got);
      for (int32_t id : got) ++refs[static_cast<size_t>(id)];
      for (int32_t id : got) (void)pool.cache_block(id, h(rng() % 256));
      owners.push_back(got);
    } else if (op == 1 && !owners.empty()) {
      const size_t i = rng() % owners.size();
      std::vector<int32_t> rev(owners[i].rbegin(), owners[i].rend());
      pool.free_blocks(rev);
      for (int32_t id : rev) --refs[static_cast<size_t>(id)];
      owners.erase(owners.begin() + static_cast<std::ptrdiff_t>(i));
    } else if (op == 2) {
      if (auto id = pool.lookup(h(rng() % 256))) {
        pool.touch(std::vector<int32_t>{*id});
        ++refs[static_cast<size_t>(*id)];
        owners.push_back({*id});
      }
    } else {
      (void)pool.take_events();
    }
    if (iter % 97 == 0) ASSERT_TRUE(pool.check_invariants(refs).has_value()) << iter;
  }
  for (auto& o : owners) pool.free_blocks(o);
  std::fill(refs.begin(), refs.end(), 0);
  EXPECT_TRUE(pool.check_invariants(refs).has_value());
  EXPECT_EQ(pool.num_free_blocks(), 64);
}

}  // namespace
}  // namespace moeserve::kv

namespace moeserve::kv {
namespace {

// Residency samples with an injected clock: fill at 1, release at 3, hit at 7 (gap 4), release
// at 8, evicted by a new allocation at 20 (lifetime 19, idle 12). Uncached blocks never sample.
TEST(BlockPoolResidency, LifetimeIdleAndReuseGapFollowTheClock) {
  BlockPool pool(2, /*enable_caching=*/true);
  double t = 1.0;
  pool.set_clock([&t] { return t; });
  std::vector<int32_t> ids;
  pool.get_new_blocks(1, ids);
  const int32_t cached_id = ids[0];
  ASSERT_TRUE(pool.cache_block(cached_id, BlockHash{42, 7}));
  t = 3.0;
  pool.free_blocks(ids);
  t = 7.0;
  pool.touch(ids);
  t = 8.0;
  pool.free_blocks(ids);
  // cached_id was released last, so the never-cached block is at the front of the free queue and
  // is taken without a residency sample.
  std::vector<int32_t> first;
  t = 10.0;
  pool.get_new_blocks(1, first);
  ASSERT_NE(first[0], cached_id);
  KvResidencySamples s = pool.take_residency_samples();
  EXPECT_TRUE(s.lifetime.empty());
  ASSERT_EQ(s.reuse_gap.size(), 1u);
  EXPECT_DOUBLE_EQ(s.reuse_gap[0], 4.0);
  t = 20.0;
  std::vector<int32_t> second;
  pool.get_new_blocks(1, second);
  ASSERT_EQ(second[0], cached_id);
  s = pool.take_residency_samples();
  ASSERT_EQ(s.lifetime.size(), 1u);
  EXPECT_DOUBLE_EQ(s.lifetime[0], 19.0);
  ASSERT_EQ(s.idle_before_evict.size(), 1u);
  EXPECT_DOUBLE_EQ(s.idle_before_evict[0], 12.0);
  EXPECT_TRUE(s.reuse_gap.empty());
  EXPECT_FALSE(pool.lookup(BlockHash{42, 7}).has_value());
}

}  // namespace
}  // namespace moeserve::kv
