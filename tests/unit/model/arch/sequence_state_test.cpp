// ContiguousSequenceState: cache geometry (the spec's byte counts), SWA / DSpark ring slots
// (pos % window, wraparound aliasing, layers independent), append-only global entries.
#include "model/arch/sequence_state.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/config.h"

namespace moeserve::arch {
namespace {

ModelConfig load(const char* name) {
  auto c = load_model_config(std::string(MOESERVE_SOURCE_DIR) + "/configs/" + name);
  if (!c) throw std::runtime_error(c.error().to_string());
  return *c;
}

TEST(CacheGeometry, FullSizeBytesMatchTheSpec) {
  // model.md §0/§2.3: SWA row 512 e4m3 + 16 ue8m0 = 528 B; main entry 256 + 32 = 288 B; index
  // key 64 + 4 = 68 B.
  const CacheGeometry g = CacheGeometry::from_config(load("deepseek-v4.1-flash"));
  EXPECT_EQ(g.head_dim, 512);
  EXPECT_EQ(g.window, 128);
  EXPECT_EQ(g.swa_row_bytes, 528u);
  EXPECT_EQ(g.main_entry_bytes, 288u);
  EXPECT_EQ(g.index_key_bytes, 68u);
}

TEST(SequenceState, SwaRingSlotIsPositionModWindow) {
  const ModelConfig c = load("tiny");
  ContiguousSequenceState s(c);
  const int32_t w = c.sliding_window;
  ASSERT_EQ(w, 8);
  // Write position p's row with byte p in layer 0 and 100 + p in layer 3 for p < 3w.
  for (int32_t p = 0; p < 3 * w; ++p) {
    auto r0 = s.swa_row(0, p);
    std::fill(r0.begin(), r0.end(), static_cast<uint8_t>(p));
    auto r3 = s.swa_row(3, p);
    std::fill(r3.begin(), r3.end(), static_cast<uint8_t>(100 + p));
    // The row just written is visible at p and at every position of the same slot.
    EXPECT_EQ(s.swa_row(0, p).data(), s.swa_row(0, p % w).data());
    EXPECT_EQ(s.swa_row(0, p).data(), s.swa_row(0, p + 5 * w).data());
  }
  // Only the last window survives: position p in [2w, 3w) everywhere in its row.
  for (int32_t p = 2 * w; p < 3 * w; ++p) {
    const auto r0 = s.swa_row(0, p);
    EXPECT_EQ(r0.size(), CacheGeometry::from_config(c).swa_row_bytes);
    EXPECT_TRUE(std::all_of(r0.begin(), r0.end(), [&](uint8_t b) { return b == p; })) << p;
    const auto r3 = s.swa_row(3, p);
    EXPECT_TRUE(std::all_of(r3.begin(), r3.end(), [&](uint8_t b) { return b == 100 + p; })) << p;
  }
  // Rows of neighbouring slots do not overlap.
  EXPECT_EQ(s.swa_row(0, 1).data() - s.swa_row(0, 0).data(),
            static_cast<std::ptrdiff_t>(s.swa_row(0, 0).size()));
  EXPECT_EQ(s.swa_row(0, w - 1).data() + s.swa_row(0, w - 1).size(),
            s.swa_row(0, 0).data() + w * s.swa_row(0, 0).size());
}

TEST(SequenceState, DsparkRingWrapsLikeTheSwaRing) {
  const ModelConfig c = load("tiny");
  ContiguousSequenceState s(c);
  const int32_t w = c.sliding_window;
  for (int32_t stage = 0; stage < c.num_nextn_predict_layers; ++stage)
    for (int32_t p = 0; p < 2 * w + 3; ++p) {
      auto r = s.dspark_row(stage, p);
      std::fill(r.begin(), r.end(), static_cast<uint8_t>(10 * stage + p));
    }
  for (int32_t stage = 0; stage < c.num_nextn_predict_layers; ++stage)
    for (int32_t p = w + 3; p < 2 * w + 3; ++p) {
      const auto r = s.dspark_row(stage, p);
      EXPECT_EQ(r.front(), 10 * stage + p);
      EXPECT_EQ(r.back(), 10 * stage + p);
    }
  s.set_dspark_range(11, 19);
  EXPECT_EQ(s.dspark_begin(), 11);
  EXPECT_EQ(s.dspark_end(), 19);
}

TEST(SequenceState, GlobalEntriesAppendPerKvSource) {
  const ModelConfig c = load("tiny");
  ContiguousSequenceState s(c);
  const CacheGeometry g = CacheGeometry::from_config(c);
  for (int32_t l : c.kv_source_layer_ids) EXPECT_EQ(s.num_global_entries(l), 0);
  for (int32_t j = 0; j < 5; ++j)
    for (int32_t l : c.kv_source_layer_ids) {
      std::vector<uint8_t> main(g.main_entry_bytes, static_cast<uint8_t>(j + l));
      std::vector<uint8_t> idx(g.index_key_bytes, static_cast<uint8_t>(200 + j + l));
      s.append_global_entry(l, main, idx);
    }
  for (int32_t l : c.kv_source_layer_ids) {
    ASSERT_EQ(s.num_global_entries(l), 5);
    for (int32_t j = 0; j < 5; ++j) {
      const auto m = s.main_entry(l, j);
      const auto k = s.index_key(l, j);
      ASSERT_EQ(m.size(), g.main_entry_bytes);
      ASSERT_EQ(k.size(), g.index_key_bytes);
      EXPECT_TRUE(std::all_of(m.begin(), m.end(), [&](uint8_t b) { return b == j + l; }));
      EXPECT_TRUE(std::all_of(k.begin(), k.end(), [&](uint8_t b) { return b == 200 + j + l; }));
    }
  }
  // Partials are per KV source and start empty.
  for (int32_t l : c.kv_source_layer_ids) EXPECT_EQ(s.compressor_partial(l).rows, 0);
  s.compressor_partial(c.kv_source_layer_ids.front()).rows = 1;
  EXPECT_EQ(s.compressor_partial(c.kv_source_layer_ids.back()).rows, 0);
  EXPECT_GT(s.cache_bytes(), 0u);
}

TEST(SequenceState, CountersRoundTrip) {
  ContiguousSequenceState s(load("tiny"));
  EXPECT_EQ(s.num_tokens(), 0);
  EXPECT_EQ(s.replay_start(), 0);
  s.set_num_tokens(90);
  s.set_replay_start(82);
  EXPECT_EQ(s.num_tokens(), 90);
  EXPECT_EQ(s.replay_start(), 82);
}

}  // namespace
}  // namespace moeserve::arch
