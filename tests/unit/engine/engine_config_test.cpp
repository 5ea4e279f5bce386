#include "engine/engine_config.h"

#include <gtest/gtest.h>

namespace moeserve::engine {
namespace {

TEST(EngineConfig, SizesPoolsFromModelConfig) {
  auto model = load_model_config(std::string(MOESERVE_SOURCE_DIR) + "/configs/deepseek-v4.1-flash");
  ASSERT_TRUE(model.has_value()) << model.error().message;
  EngineOptions opt;
  opt.max_num_seqs = 64;
  opt.kv_cache_memory_bytes = size_t{16} << 30;
  auto s = size_engine(*model, opt);
  ASSERT_TRUE(s.has_value()) << s.error().message;
  EXPECT_EQ(s->core.kv.num_state_slots, 64);
  EXPECT_EQ(s->core.scheduler.replay_window, 128);
  EXPECT_EQ(s->core.kv.num_global_blocks,
            static_cast<int32_t>(((size_t{16} << 30) - s->plan.state_bytes) / (890 * 256)));
  // Fraction of the available memory instead of a byte count.
  opt.kv_cache_memory_bytes = 0;
  opt.available_memory_bytes = size_t{32} << 30;
  opt.kv_cache_memory_fraction = 0.5;
  auto f = size_engine(*model, opt);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->core.kv.num_global_blocks, s->core.kv.num_global_blocks);
  opt.available_memory_bytes = 0;
  EXPECT_FALSE(size_engine(*model, opt).has_value());
}

TEST(EngineConfig, BlockSizeAndReplayKnobs) {
  auto model = load_model_config(std::string(MOESERVE_SOURCE_DIR) + "/configs/deepseek-v4.1-flash");
  ASSERT_TRUE(model.has_value()) << model.error().message;
  EngineOptions opt;
  opt.max_num_seqs = 8;
  opt.kv_cache_memory_bytes = size_t{1} << 30;
  opt.block_tokens = 64;
  opt.prefix_replay_tokens = 300;
  auto s = size_engine(*model, opt);
  ASSERT_TRUE(s.has_value()) << s.error().message;
  EXPECT_EQ(s->core.kv.block_tokens, 64);
  EXPECT_EQ(s->core.scheduler.replay_window, 300);
  EXPECT_EQ(s->core.scheduler.replay_align, 2);  // V4.1 compression ratios 1 and 2
  EXPECT_EQ(s->layout.global_block_bytes(), 890u * 64u);
  // A block that splits a compressor group, or nonsense values, are rejected with the flag name.
  opt.block_tokens = 65;
  auto bad = size_engine(*model, opt);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("--block-size"), std::string::npos);
  opt.block_tokens = 0;
  EXPECT_FALSE(size_engine(*model, opt).has_value());
  opt.block_tokens = 64;
  opt.prefix_replay_tokens = -1;
  auto neg = size_engine(*model, opt);
  ASSERT_FALSE(neg.has_value());
  EXPECT_NE(neg.error().message.find("--prefix-replay-tokens"), std::string::npos);
}

}  // namespace
}  // namespace moeserve::engine
