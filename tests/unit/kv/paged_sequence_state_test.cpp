// PagedSequenceState: global entries addressed through the block table, SWA/DSpark rows in the
// state slot, prefix adoption, and isolation between requests sharing the storage.
#include "kv/paged_sequence_state.h"

#include <numeric>
#include <random>

#include <gtest/gtest.h>

#include "model/config.h"

namespace moeserve::kv {
namespace {

ModelConfig tiny() {
  auto c = parse_model_config(tiny_config_json());
  EXPECT_TRUE(c.has_value());
  return *c;
}

std::vector<uint8_t> random_bytes(std::mt19937& rng, size_t n) {
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rng() | 1u);
  return b;
}

constexpr int32_t kBlock = 16;

TEST(PagedSequenceState, EntriesLandInTheBlocksOfTheTable) {
  const ModelConfig c = tiny();
  KvStorage storage(KvLayout::from_model_config(c, kBlock), 8, 2, kBlock);
  // Blocks deliberately out of order.
  std::vector<int32_t> table = {5, 2, 7};
  PagedSequenceState s(storage, c, 1, &table);
  std::mt19937 rng(3);
  std::map<std::pair<int32_t, int64_t>, std::pair<std::vector<uint8_t>, std::vector<uint8_t>>> want;
  for (int32_t l : c.kv_source_layer_ids) {
    const int32_t ratio = c.compress_ratios[static_cast<size_t>(l)];
    const int64_t n = 3 * kBlock / ratio;  // fills all three blocks
    for (int64_t j = 0; j < n; ++j) {
      auto m = random_bytes(rng, c.main_entry_bytes());
      auto k = random_bytes(rng, c.index_entry_bytes());
      EXPECT_EQ(s.num_global_entries(l), j);
      s.append_global_entry(l, m, k);
      want[{l, j}] = {m, k};
    }
  }
  for (const auto& [key, bytes] : want) {
    const auto [l, j] = key;
    const auto m = s.main_entry(l, j);
    const auto k = s.index_key(l, j);
    EXPECT_TRUE(std::equal(m.begin(), m.end(), bytes.first.begin())) << l << " " << j;
    EXPECT_TRUE(std::equal(k.begin(), k.end(), bytes.second.begin())) << l << " " << j;
    // Entry j sits in block table[j / (B / ratio)] of the main region.
    const int32_t ratio = c.compress_ratios[static_cast<size_t>(l)];
    const int32_t per_block = kBlock / ratio;
    const int32_t kind = storage.find_kind(CacheKind::kGlobalMain, l);
    const auto page = storage.page(kind, table[static_cast<size_t>(j / per_block)]);
    EXPECT_EQ(m.data(), page.data() + (j % per_block) * c.main_entry_bytes());
  }
  // One more entry than the table covers is a checked failure, not a silent overrun.
  const int32_t l0 = c.kv_source_layer_ids[0];
  EXPECT_DEATH(s.append_global_entry(l0, random_bytes(rng, c.main_entry_bytes()),
                                     random_bytes(rng, c.index_entry_bytes())),
               "needs block");
}

TEST(PagedSequenceState, TwoRequestsShareBlocksButNotSlots) {
  const ModelConfig c = tiny();
  KvStorage storage(KvLayout::from_model_config(c, kBlock), 4, 2, kBlock);
  std::vector<int32_t> ta = {0, 1}, tb = {0, 2};  // block 0 shared (a prefix hit)
  PagedSequenceState a(storage, c, 0, &ta), b(storage, c, 1, &tb);
  std::mt19937 rng(5);
  const int32_t l = c.kv_source_layer_ids[0];
  const int32_t per_block = kBlock / c.compress_ratios[static_cast<size_t>(l)];
  std::vector<std::vector<uint8_t>> mains;
  for (int32_t j = 0; j < per_block; ++j) {
    mains.push_back(random_bytes(rng, c.main_entry_bytes()));
    a.append_global_entry(l, mains.back(), random_bytes(rng, c.index_entry_bytes()));
  }
  // b adopts the first block as cached and resumes inside it (replay from kBlock - 8).
  ASSERT_TRUE(b.adopt_prefix(kBlock, kBlock - 8).has_value());
  EXPECT_EQ(b.num_tokens(), kBlock - 8);
  EXPECT_EQ(b.swa_floor(), kBlock - 8);
  EXPECT_EQ(b.num_global_entries(l), per_block);
  for (int32_t j = 0; j < per_block; ++j) {
    const auto m = b.main_entry(l, j);
    EXPECT_TRUE(std::equal(m.begin(), m.end(), mains[static_cast<size_t>(j)].begin()));
  }
  // SWA rows: same layer and position in the two slots are different memory; the ring wraps.
  const auto ra = a.swa_row(3, 5), rb = b.swa_row(3, 5);
  EXPECT_NE(ra.data(), rb.data());
  EXPECT_EQ(a.swa_row(3, 5).data(), a.swa_row(3, 5 + c.sliding_window).data());
  EXPECT_NE(a.swa_row(3, 5).data(), a.swa_row(4, 5).data());
  std::fill(ra.begin(), ra.end(), uint8_t{0xAB});
  std::fill(rb.begin(), rb.end(), uint8_t{0xCD});
  EXPECT_EQ(a.swa_row(3, 5)[0], 0xAB);
  if (c.num_nextn_predict_layers > 0) {
    EXPECT_NE(a.dspark_row(0, 1).data(), b.dspark_row(0, 1).data());
    EXPECT_NE(a.dspark_row(0, 1).data(), a.dspark_row(1, 1).data());
  }
}

TEST(PagedSequenceState, AdoptPrefixRejectsBadRanges) {
  const ModelConfig c = tiny();
  KvStorage storage(KvLayout::from_model_config(c, kBlock), 4, 1, kBlock);
  std::vector<int32_t> table = {0, 1};
  {
    PagedSequenceState s(storage, c, 0, &table);
    EXPECT_FALSE(s.adopt_prefix(kBlock + 1, 0).has_value());   // not whole blocks
    EXPECT_FALSE(s.adopt_prefix(3 * kBlock, 0).has_value());   // table too short
    EXPECT_FALSE(s.adopt_prefix(kBlock, kBlock + 2).has_value());  // resume past the hit
    EXPECT_FALSE(s.adopt_prefix(kBlock, kBlock - 3).has_value());  // splits a ratio-2 group
    ASSERT_TRUE(s.adopt_prefix(2 * kBlock, 2 * kBlock - 8).has_value());
    EXPECT_FALSE(s.adopt_prefix(kBlock, 0).has_value());  // a state adopts once, before compute
  }
}

TEST(KvStorage, SizesFollowTheLayout) {
  const ModelConfig c = tiny();
  const KvLayout layout = KvLayout::from_model_config(c, kBlock);
  KvStorage storage(layout, 6, 3, kBlock);
  EXPECT_EQ(storage.total_bytes(), 6 * layout.global_block_bytes() + 3 * layout.state_slot_bytes());
  const int32_t swa = storage.find_kind(CacheKind::kSwaRing);
  ASSERT_GE(swa, 0);
  EXPECT_EQ(storage.page(swa, 2).size(), c.swa_ring_bytes_per_request());
  EXPECT_EQ(storage.find_kind(CacheKind::kGlobalMain, 1), -1);  // layer 1 is no KV source
  EXPECT_DEATH((void)storage.page(swa, 3), "outside");
}

}  // namespace
}  // namespace moeserve::kv
