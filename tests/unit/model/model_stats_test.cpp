#include "model/model_stats.h"

#include <string>

#include <gtest/gtest.h>

namespace moeserve {
namespace {

// The numbers `moeserve model inspect configs/deepseek-v4.1-flash` prints (model.md §0, §2.7, §4).
TEST(ModelStats, FullSizeConfig) {
  auto c = load_model_config(std::string(MOESERVE_SOURCE_DIR) +
                             "/configs/deepseek-v4.1-flash/config.json");
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_DOUBLE_EQ(c->global_kv_bytes_per_token(), 890.0);
  EXPECT_EQ(c->engram_layers[0].num_embeddings, 384006168);
  EXPECT_EQ(c->engram_layers[1].num_embeddings, 384016682);
  const ModelStats st = compute_model_stats(*c);
  // §0: 552B backbone + 196B Engram ≈ 763B checkpoint (+vision, draft); 16B active (decode),
  // 8B (prefill).
  EXPECT_NEAR(static_cast<double>(st.backbone_params()) / 1e9, 552.0, 3.0);
  EXPECT_NEAR(static_cast<double>(st.param(ParamGroup::kEngramTables)) / 1e9, 196.6, 0.1);
  EXPECT_EQ(st.param(ParamGroup::kEngramTables), (384006168LL + 384016682LL) * 256);
  EXPECT_NEAR(static_cast<double>(st.total_params()) / 1e9, 763.0, 3.0);
  EXPECT_NEAR(static_cast<double>(st.active_decode) / 1e9, 16.0, 1.0);
  EXPECT_NEAR(static_cast<double>(st.active_prefill) / 1e9, 8.0, 1.0);
  // Engram tables: 768,022,850 rows × 256 B + 8 B scales = 202.8 GB (§4 "196.6 GB + 6.1 GB").
  EXPECT_EQ(st.bytes_by_dtype.at("F8_E8M0") > 6'000'000'000ull, true);
}

}  // namespace
}  // namespace moeserve
