// MXFP8 activations before FP8 / MXFP4 linears (model.md §5, [UNCERTAIN] there): linear() on a
// block-scaled weight equals the plain GEMM of fq_fp8_block32_pow2(x) and differs from x · W^T;
// BF16/F32 linears see x unchanged; the loader flags exactly the FP8 / MXFP4 checkpoint tensors.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "common/fake_quant.h"
#include "model/arch/deepseek_v41_layers.h"
#include "model/arch/deepseek_v41_weights.h"
#include "model/tiny_model.h"

namespace moeserve::arch {
namespace {

namespace fs = std::filesystem;

std::vector<float> random_values(size_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

HostTensor random_weight(int64_t out, int64_t in, uint32_t seed) {
  HostTensor w(DType::kF32, Shape{out, in});
  const std::vector<float> v = random_values(static_cast<size_t>(out * in), 0.125f, seed);
  std::copy(v.begin(), v.end(), w.data<float>());
  return w;
}

TEST(LinearActQuant, Mxfp8RoundsEachBlockOfThirtyTwo) {
  // amax 1.03 -> s = 2^ceil(log2(1.03/448)) = 2^-8; 1.03/s = 263.68 -> e4m3 256 -> 1.0.
  // Second block: amax 448 -> s = 1, 3.3 -> e4m3 3.25; 448 stays.
  std::vector<float> x(64, 1.03f);
  for (size_t i = 32; i < 64; ++i) x[i] = 3.3f;
  x[40] = 448.0f;
  const std::vector<float> q = quantize_activations_mxfp8(x, 1, 64);
  for (size_t i = 0; i < 32; ++i) EXPECT_EQ(q[i], 1.0f) << i;
  for (size_t i = 32; i < 64; ++i) EXPECT_EQ(q[i], i == 40 ? 448.0f : 3.25f) << i;
}

TEST(LinearActQuant, BlockScaledWeightQuantisesInputBf16DoesNot) {
  const std::unique_ptr<Backend> backend = make_cpu_backend();
  const int64_t rows = 3, in = 96, out = 7;
  const std::vector<float> x = random_values(static_cast<size_t>(rows * in), 2.0f, 11);
  const LinearWeight fp8{random_weight(out, in, 12), /*block_scaled=*/true};
  const LinearWeight bf16{random_weight(out, in, 12), /*block_scaled=*/false};  // same values
  std::vector<float> xq(x.size());
  fq_fp8_block32_pow2(x, xq);
  ASSERT_NE(xq, x);
  for (const bool batch_invariant : {true, false}) {
    const LinearOps ops{*backend, batch_invariant};
    const std::vector<float> plain = linear(ops, x, rows, fp8.weight);
    const std::vector<float> want_q = linear(ops, xq, rows, fp8.weight);
    const std::vector<float> got_q = linear(ops, x, rows, fp8);
    const std::vector<float> got_bf16 = linear(ops, x, rows, bf16);
    EXPECT_EQ(got_q, want_q) << "block-scaled linear = GEMM of fq_fp8(x)";
    EXPECT_EQ(got_bf16, plain) << "BF16 linear reads x unchanged";
    double max_diff = 0.0;
    for (size_t i = 0; i < plain.size(); ++i)
      max_diff = std::max(max_diff, std::abs(static_cast<double>(got_q[i]) - plain[i]));
    EXPECT_GT(max_diff, 1e-4) << "MXFP8 rounding must be visible in the output";
  }
  // Zero rows: nothing to quantise.
  EXPECT_TRUE(linear(LinearOps{*backend}, {}, 0, fp8).empty());
}

TEST(LinearActQuant, LoaderFlagsFp8AndMxfp4LinearsOnly) {
  const fs::path dir =
      fs::temp_directory_path() / ("moeserve_act_quant_" + std::to_string(::getpid())) / "tiny";
  std::ifstream in(std::string(MOESERVE_SOURCE_DIR) + "/configs/tiny/config.json");
  std::stringstream json;
  json << in.rdbuf();
  fs::create_directories(dir);
  ASSERT_TRUE(write_generated_model(dir, json.str(), /*seed=*/0));
  auto config = load_model_config(dir);
  ASSERT_TRUE(config.has_value()) << config.error().to_string();
  auto loader = WeightLoader::open(dir);
  ASSERT_TRUE(loader.has_value()) << loader.error().to_string();
  auto w = load_model_weights(*config, *loader);
  ASSERT_TRUE(w.has_value()) << w.error().to_string();
  fs::remove_all(dir.parent_path());

  EXPECT_FALSE(w->head.block_scaled);
  const BlockWeights& l2 = w->layers[2];  // ratio-2 KV + index source
  for (const LinearWeight* fp8 :
       {&l2.attn.wq_a, &l2.attn.wq_b, &l2.attn.wkv, &l2.attn.wo_a, &l2.attn.wo_b,
        &l2.attn.indexer_wq_b, &l2.moe.shared.w1, &l2.moe.shared.w2, &l2.moe.shared.w3,
        &l2.moe.experts[0].w1, &l2.moe.experts[3].w2, &l2.moe.experts[7].w3})
    EXPECT_TRUE(fp8->block_scaled);
  for (const LinearWeight* bf16 :
       {&l2.attn.compressor_wkv, &l2.attn.compressor_wgate, &l2.attn.indexer_wk,
        &l2.attn.indexer_weights_proj, &l2.moe.gate})
    EXPECT_FALSE(bf16->block_scaled);
  ASSERT_TRUE(w->layers[4].engram.has_value());
  EXPECT_TRUE(w->layers[4].engram->wkv.block_scaled);
  ASSERT_TRUE(w->dspark.has_value());
  EXPECT_TRUE(w->dspark->main_proj.block_scaled);
  EXPECT_TRUE(w->dspark->stages[1].attn.wq_b.block_scaled);
  EXPECT_TRUE(w->dspark->stages[2].moe.experts[0].w2.block_scaled);
  EXPECT_FALSE(w->dspark->stages[0].moe.gate.block_scaled);
}

}  // namespace
}  // namespace moeserve::arch
