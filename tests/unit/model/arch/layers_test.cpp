// Helpers of the forward (deepseek_v41_layers.h): the top-k tie rule and RoPE.
#include "model/arch/deepseek_v41_layers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace moeserve::arch {
namespace {

TEST(TopK, HigherScoreFirstTiesToLowestIndex) {
  const std::vector<double> s = {1.0, 3.0, 3.0, -0.0, 0.0, 3.0, 2.0};
  EXPECT_EQ(topk_indices(s, {}, 4), (std::vector<int32_t>{1, 2, 5, 6}));
  // -0.0 ties +0.0: the lower index wins.
  EXPECT_EQ(topk_indices(s, {}, 7), (std::vector<int32_t>{1, 2, 5, 6, 0, 3, 4}));
}

TEST(TopK, OnlyAllowedEntriesAndKClamped) {
  const std::vector<double> s = {5.0, 4.0, 3.0, 2.0, 1.0};
  const std::vector<uint8_t> allowed = {0, 1, 0, 1, 0};
  EXPECT_EQ(topk_indices(s, allowed, 8), (std::vector<int32_t>{1, 3}));
  EXPECT_TRUE(topk_indices(s, std::vector<uint8_t>(5, 0), 3).empty());
}

TEST(Rope, InverseUndoesForwardAndPreservesPairNorms) {
  auto c = load_model_config(std::string(MOESERVE_SOURCE_DIR) + "/configs/tiny");
  ASSERT_TRUE(c.has_value());
  for (RopeKind kind : {RopeKind::kMain, RopeKind::kCompress}) {
    const Rope rope(*c, kind);
    const int32_t rd = rope.dim();
    ASSERT_EQ(rd, c->qk_rope_head_dim);
    std::vector<float> x(static_cast<size_t>(rd));
    for (int32_t i = 0; i < rd; ++i) x[static_cast<size_t>(i)] = 0.25f * static_cast<float>(i - 7);
    std::vector<float> y = x;
    rope.apply(y.data(), 0);
    EXPECT_EQ(y, x) << "position 0 is the identity";
    for (int64_t pos : {1, 17, 511}) {
      y = x;
      rope.apply(y.data(), pos);
      for (int32_t i = 0; i < rd; i += 2) {
        const double n0 = std::hypot(x[static_cast<size_t>(i)], x[static_cast<size_t>(i + 1)]);
        const double n1 = std::hypot(y[static_cast<size_t>(i)], y[static_cast<size_t>(i + 1)]);
        EXPECT_NEAR(n0, n1, 1e-5) << "pair " << i / 2 << " at " << pos;
      }
      rope.apply(y.data(), pos, /*inverse=*/true);
      for (int32_t i = 0; i < rd; ++i)
        EXPECT_NEAR(y[static_cast<size_t>(i)], x[static_cast<size_t>(i)], 1e-5);
    }
  }
}

}  // namespace
}  // namespace moeserve::arch
