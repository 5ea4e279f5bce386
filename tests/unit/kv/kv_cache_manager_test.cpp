#include "kv/kv_cache_manager.h"

#include <random>

#include <gtest/gtest.h>

#include "kv/kv_layout.h"
#include "model/config.h"

namespace moeserve::kv {
namespace {

std::vector<int32_t> tokens(uint32_t seed, int32_t n) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % 1000);
  return t;
}

KvCacheConfig small(int32_t blocks, int32_t slots) {
  KvCacheConfig c;
  c.num_global_blocks = blocks;
  c.num_state_slots = slots;
  c.check_invariants = true;
  return c;
}

TEST(BlockHash, ChainAndSalt) {
  const auto t = tokens(1, 600);
  std::vector<BlockHash> a, b, c;
  extend_block_hashes(a, t, "");
  extend_block_hashes(b, t, "salt");
  EXPECT_EQ(a.size(), 2u);
  EXPECT_NE(a[0], b[0]);
  EXPECT_NE(a[1], b[1]);  // chained: the salt reaches every block
  auto t2 = t;
  t2[3] += 1;
  extend_block_hashes(c, t2, "");
  EXPECT_NE(a[1], c[1]);
  std::vector<BlockHash> again;
  extend_block_hashes(again, std::span<const int32_t>(t).first(300), "");
  extend_block_hashes(again, t, "");
  EXPECT_EQ(again, a);
}

TEST(KvCacheManager, PrefixHitSharesBlocksAndLeavesOneToken) {
  KvCacheManager kv(small(8, 4));
  const auto t = tokens(2, 512);
  std::vector<BlockHash> hashes;
  extend_block_hashes(hashes, t, "");
  ASSERT_TRUE(kv.allocate_slots(1, 512));
  kv.cache_blocks(1, hashes, 512);
  // Exactly 512 tokens: the hit stops at 256 so the last token is computed.
  PrefixHit hit = kv.find_prefix_hit(hashes, 512);
  EXPECT_EQ(hit.num_tokens, 256);
  ASSERT_TRUE(kv.allocate_slots(2, 512, &hit));
  EXPECT_EQ(kv.block_table(2)[0], kv.block_table(1)[0]);
  EXPECT_NE(kv.block_table(2)[1], kv.block_table(1)[1]);
  EXPECT_EQ(kv.num_free_blocks(), 5);
  kv.free(1);
  kv.free(2);
  EXPECT_EQ(kv.num_free_blocks(), 8);
  EXPECT_EQ(kv.num_free_state_slots(), 4);
  // Still cached after free.
  EXPECT_EQ(kv.find_prefix_hit(hashes, 600).num_tokens, 512);
}

TEST(KvCacheManager, FailedAllocationChangesNothing) {
  KvCacheManager kv(small(3, 2));
  ASSERT_TRUE(kv.allocate_slots(1, 512));
  EXPECT_FALSE(kv.allocate_slots(2, 512));
  EXPECT_FALSE(kv.has_request(2));
  EXPECT_EQ(kv.num_free_blocks(), 1);
  EXPECT_FALSE(kv.allocate_slots(1, 1024));
  EXPECT_EQ(kv.block_table(1).size(), 2u);
  ASSERT_TRUE(kv.allocate_slots(2, 10));
  EXPECT_FALSE(kv.allocate_slots(3, 1));  // no state slot left
  EXPECT_TRUE(kv.check_invariants().has_value());
}

TEST(KvCacheManager, DifferentSaltNeverShares) {
  KvCacheManager kv(small(16, 4));
  const auto t = tokens(3, 800);
  std::vector<BlockHash> a, b;
  extend_block_hashes(a, t, "alice");
  extend_block_hashes(b, t, "bob");
  ASSERT_TRUE(kv.allocate_slots(1, 800));
  kv.cache_blocks(1, a, 800);
  EXPECT_EQ(kv.find_prefix_hit(b, 800).num_tokens, 0);
  EXPECT_EQ(kv.find_prefix_hit(a, 800).num_tokens, 768);
}

// Property test: long seeded sequences of allocate / grow / prefix hit / free with eviction
// pressure keep every invariant, and freeing everything restores the full free count.
TEST(KvCacheManager, RandomSequencesKeepInvariants) {
  for (uint32_t seed = 0; seed < 6; ++seed) {
    std::mt19937_64 rng(seed);
    KvCacheManager kv(small(48, 12));
    struct Live {
      RequestId id;
      std::vector<int32_t> toks;
      std::vector<BlockHash> hashes;
      int32_t computed;
    };
    std::vector<Live> live;
    std::vector<std::vector<int32_t>> corpus;
    for (int i = 0; i < 6; ++i)
      corpus.push_back(tokens(seed * 100 + static_cast<uint32_t>(i), 2048));
    RequestId next = 0;
    for (int iter = 0; iter < 4000; ++iter) {
      const int op = static_cast<int>(rng() % 10);
      if (op < 3) {  // admit, maybe with a prefix hit
        Live l{next++, {}, {}, 0};
        const auto& base = corpus[rng() % corpus.size()];
        const int32_t len = 1 + static_cast<int32_t>(rng() % 1500);
        l.toks.assign(base.begin(), base.begin() + len);
        extend_block_hashes(l.hashes, l.toks, rng() % 4 == 0 ? "s" : "");
        PrefixHit hit = kv.find_prefix_hit(l.hashes, len);
        ASSERT_LT(hit.num_tokens, len);
        const int32_t chunk = std::min(len, hit.num_tokens + 1 + static_cast<int32_t>(rng() % 600));
        if (kv.allocate_slots(l.id, chunk, &hit)) {
          l.computed = chunk;
          kv.cache_blocks(l.id, l.hashes, chunk);
          live.push_back(std::move(l));
        } else {
          ASSERT_FALSE(kv.has_request(l.id));
        }
      } else if (op < 7 && !live.empty()) {  // grow (prefill chunk or decode)
        Live& l = live[rng() % live.size()];
        const int32_t add = 1 + static_cast<int32_t>(rng() % 300);
        while (static_cast<int32_t>(l.toks.size()) < l.computed + add) {
          l.toks.push_back(static_cast<int32_t>(rng() % 1000));
        }
        extend_block_hashes(l.hashes, l.toks, "");
        if (kv.allocate_slots(l.id, l.computed + add)) {
          l.computed += add;
          kv.cache_blocks(l.id, l.hashes, l.computed);
        }
      } else if (!live.empty()) {  // finish / abort / preempt
        const size_t i = rng() % live.size();
        kv.free(live[i].id);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      }
      ASSERT_TRUE(kv.check_invariants().has_value()) << "seed " << seed << " iter " << iter;
      (void)kv.take_events();
    }
    for (const Live& l : live) kv.free(l.id);
    EXPECT_EQ(kv.num_free_blocks(), 48);
    EXPECT_EQ(kv.num_free_state_slots(), 12);
    EXPECT_TRUE(kv.check_invariants().has_value());
  }
}

TEST(KvLayout, V41FlashSizes) {
  auto cfg = load_model_config(std::string(MOESERVE_SOURCE_DIR) + "/configs/deepseek-v4.1-flash");
  ASSERT_TRUE(cfg.has_value()) << cfg.error().message;
  const KvLayout layout = KvLayout::from_model_config(*cfg);
  // 890 B/token of global KV (model.md §2.7) × 256 tokens per block.
  EXPECT_EQ(layout.global_block_bytes(), 890u * 256u);
  size_t swa = 0;
  for (const CacheKindSpec& k : layout.kinds) {
    if (k.kind == CacheKind::kGlobalMain && k.layer_id == 20) {
      EXPECT_EQ(k.entries_per_block, 256);
      EXPECT_EQ(k.page_bytes, 256u * 288u);
    }
    if (k.kind == CacheKind::kGlobalIndex && k.layer_id == 2) {
      EXPECT_EQ(k.entries_per_block, 128);
      EXPECT_EQ(k.page_bytes, 128u * 68u);
    }
    if (k.kind == CacheKind::kSwaRing) swa = k.page_bytes;
  }
  EXPECT_EQ(swa, cfg->swa_ring_bytes_per_request());
  auto plan = plan_kv_memory(layout, size_t{8} << 30, 64);
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->num_state_slots, 64);
  EXPECT_LE(plan->global_bytes + plan->state_bytes, size_t{8} << 30);
  EXPECT_FALSE(plan_kv_memory(layout, 1 << 20, 64).has_value());
}

}  // namespace
}  // namespace moeserve::kv
