#include "model/tiny_model.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "model/checkpoint_validator.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class TinyModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("moeserve_tiny_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

TEST_F(TinyModelTest, DeterministicAndValid) {
  ASSERT_TRUE(write_generated_model(dir_ / "a", tiny_config_json(), 7));
  ASSERT_TRUE(write_generated_model(dir_ / "b", tiny_config_json(), 7));
  ASSERT_TRUE(write_generated_model(dir_ / "c", tiny_config_json(), 8));
  const std::string a = slurp(dir_ / "a" / "model.safetensors");
  EXPECT_GT(a.size(), 100000u);
  EXPECT_EQ(a, slurp(dir_ / "b" / "model.safetensors"));
  EXPECT_NE(a, slurp(dir_ / "c" / "model.safetensors"));
  EXPECT_EQ(slurp(dir_ / "a" / "config.json"), std::string(tiny_config_json()));

  auto config = load_model_config(dir_ / "a");
  ASSERT_TRUE(config) << config.error().to_string();
  auto ckpt = CheckpointLoader().load(dir_ / "a");
  ASSERT_TRUE(ckpt) << ckpt.error().to_string();
  const CheckpointValidation v = validate_checkpoint(*config, *ckpt);
  EXPECT_TRUE(v.ok()) << v.to_status("tiny").error().message;
  EXPECT_TRUE(v.warnings.empty());
  EXPECT_EQ(v.num_expected, ckpt->tensors().size());
  EXPECT_EQ(ckpt->metadata().at("seed"), "7");
}

// Dequantises every weight and checks it is finite with a plausible mean and spread (the forward
// test runs the 40-random-step no-inf/NaN check once the forward exists).
TEST_F(TinyModelTest, DequantizedWeightsAreFiniteAndPlausible) {
  ASSERT_TRUE(write_generated_model(dir_, tiny_config_json(), 0));
  auto config = load_model_config(dir_);
  ASSERT_TRUE(config);
  auto ckpt = CheckpointLoader().load(dir_);
  ASSERT_TRUE(ckpt);
  int checked = 0;
  for (const WeightSpec& s : weight_specs(*config)) {
    auto w = dequantize_weight(s, *ckpt);
    ASSERT_TRUE(w) << w.error().to_string();
    double sum = 0, sq = 0, amax = 0;
    for (float x : *w) {
      ASSERT_TRUE(std::isfinite(x)) << s.name;
      sum += x;
      sq += static_cast<double>(x) * x;
      amax = std::max(amax, std::fabs(static_cast<double>(x)));
    }
    const double n = static_cast<double>(w->size());
    const double mean = sum / n, stdev = std::sqrt(std::max(0.0, sq / n - mean * mean));
    // Irwin–Hall normals are bounded by ±6σ; the comb base adds 2 on its diagonal; FP4 rounds
    // up by at most 1.5× around the block max.
    const double bound = std::fabs(s.init_mean) + 9.0 * s.init_std + 2.0;
    EXPECT_LE(amax, bound) << s.name;
    if (n >= 256 && s.init == WeightInit::kNormal) {
      EXPECT_NEAR(mean, s.init_mean, 0.25 * s.init_std + 1e-3) << s.name;
      EXPECT_GT(stdev, 0.6 * s.init_std) << s.name;
      EXPECT_LT(stdev, 1.4 * s.init_std) << s.name;
    }
    ++checked;
  }
  EXPECT_GT(checked, 300);
}

TEST(CheckpointValidator, NamesEveryMissingAndMisshapedTensor) {
  auto config = parse_model_config(tiny_config_json());
  ASSERT_TRUE(config);
  std::vector<TensorSignature> sigs;
  for (const ExpectedTensor& e : expected_tensors(*config))
    sigs.push_back({e.name, e.dtype, e.shape});
  // Drop one, mis-shape one, mis-type one, add an extra.
  sigs.erase(std::find_if(sigs.begin(), sigs.end(), [](const TensorSignature& t) {
    return t.name == "layers.4.attn.compressor.wgate.weight";
  }));
  for (TensorSignature& t : sigs) {
    if (t.name == "layers.8.attn.indexer.wq_b.scale") t.shape = Shape{2, 2};
    if (t.name == "mtp.2.markov_head.embed.weight") t.dtype = DType::kF32;
  }
  sigs.push_back({"layers.0.attn.bogus", DType::kF32, Shape{3}});
  const CheckpointValidation v = validate_checkpoint_tensors(*config, sigs);
  EXPECT_FALSE(v.ok());
  EXPECT_EQ(v.errors.size(), 3u);
  const std::string msg = v.to_status("tiny").error().message;
  EXPECT_THAT(msg, HasSubstr("missing: layers.4.attn.compressor.wgate.weight (BF16 [64, 64])"));
  EXPECT_THAT(msg, HasSubstr("wrong shape: layers.8.attn.indexer.wq_b.scale is [2, 2], expected "
                             "[2, 1]"));
  EXPECT_THAT(msg, HasSubstr("wrong dtype: mtp.2.markov_head.embed.weight is F32, expected BF16"));
  ASSERT_EQ(v.warnings.size(), 1u);
  EXPECT_THAT(v.warnings[0], HasSubstr("unexpected tensor: layers.0.attn.bogus"));
}

TEST(CheckpointLayout, RolesShapeTheTensorSet) {
  auto config = parse_model_config(tiny_config_json());
  ASSERT_TRUE(config);
  std::set<std::string> names;
  for (const ExpectedTensor& e : expected_tensors(*config)) names.insert(e.name);
  EXPECT_TRUE(names.count("layers.2.attn.compressor.wgate.weight"));   // ratio-2 KV source
  EXPECT_FALSE(names.count("layers.6.attn.compressor.wgate.weight"));  // ratio-1 KV source
  EXPECT_FALSE(names.count("layers.3.attn.compressor.wkv.weight"));    // Reuse
  EXPECT_TRUE(names.count("layers.8.attn.indexer.wq_b.weight"));       // Reindex
  EXPECT_FALSE(names.count("layers.8.attn.indexer.wk.weight"));
  EXPECT_TRUE(names.count("layers.4.engram.table.scale"));
  EXPECT_TRUE(names.count("mtp.0.main_proj.scale"));
  EXPECT_FALSE(names.count("mtp.1.main_proj.scale"));
  EXPECT_TRUE(names.count("mtp.2.confidence_head.proj.weight"));
  EXPECT_TRUE(names.count("mtp.1.ffn.experts.3.w2.weight"));
  EXPECT_FALSE(names.count("mtp.1.ffn.experts.4.w2.weight"));
  EXPECT_FALSE(names.count("mtp.0.ffn.gate.bias_vl"));
  EXPECT_TRUE(names.count("layers.11.ffn.gate.bias_vl"));
}

}  // namespace
}  // namespace moeserve
