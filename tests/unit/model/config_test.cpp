#include "model/config.h"

#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace moeserve {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string full_config_path() {
  return std::string(MOESERVE_SOURCE_DIR) + "/configs/deepseek-v4.1-flash/config.json";
}
std::string tiny_config_path() {
  return std::string(MOESERVE_SOURCE_DIR) + "/configs/tiny/config.json";
}

// The same model in the flat inference/config.json names.
json to_flat(const json& hf) {
  const json& t = hf["text_config"];
  json f;
  f["vocab_size"] = t["vocab_size"];
  f["dim"] = t["hidden_size"];
  f["n_layers"] = t["num_hidden_layers"];
  f["n_mtp_layers"] = t["num_nextn_predict_layers"];
  f["n_heads"] = t["num_attention_heads"];
  f["head_dim"] = t["head_dim"];
  f["rope_head_dim"] = t["qk_rope_head_dim"];
  f["q_lora_rank"] = t["q_lora_rank"];
  f["o_groups"] = t["o_groups"];
  f["o_lora_rank"] = t["o_lora_rank"];
  f["window_size"] = t["sliding_window"];
  f["compress_ratios"] = t["compress_ratios"];
  f["kv_source_layers"] = t["kv_source_layer_ids"];
  f["index_source_layers"] = t["index_source_layer_ids"];
  f["candidate_source_layer"] = t["candidate_source_layer_id"];
  for (const char* k :
       {"candidate_topk_blocks", "candidate_block_size", "index_n_heads", "index_head_dim",
        "index_topk", "rope_theta", "compress_rope_theta", "n_routed_experts", "n_shared_experts",
        "swiglu_limit", "hc_mult", "hc_sinkhorn_iters", "hc_eps", "gate_temp"})
    f[k] = t[k];
  f["original_seq_len"] = t["rope_scaling"]["original_max_position_embeddings"];
  f["rope_factor"] = t["rope_scaling"]["factor"];
  f["beta_fast"] = t["rope_scaling"]["beta_fast"];
  f["beta_slow"] = t["rope_scaling"]["beta_slow"];
  f["n_activated_experts"] = t["num_experts_per_tok"];
  f["moe_inter_dim"] = t["moe_intermediate_size"];
  f["score_func"] = t["scoring_func"];
  f["route_scale"] = t["routed_scaling_factor"];
  f["norm_eps"] = t["rms_norm_eps"];
  for (auto it = t.begin(); it != t.end(); ++it)
    if (it.key().rfind("engram_", 0) == 0 || it.key().rfind("dspark_", 0) == 0) f[it.key()] = *it;
  f["dtype"] = "fp8";
  f["scale_fmt"] = "ue8m0";
  f["expert_dtype"] = "fp4";
  if (hf.contains("image_token_id")) f["image_token_id"] = hf["image_token_id"];
  return f;
}

TEST(ModelConfig, FullSizeParsesAndDerivesRoles) {
  auto c = load_model_config(full_config_path());
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_EQ(c->num_total_layers(), 43);
  EXPECT_EQ(c->layers.size(), 43u);
  EXPECT_EQ(c->layer(0).mode, LayerMode::kSwaOnly);
  EXPECT_EQ(c->layer(2).mode, LayerMode::kFull);
  EXPECT_EQ(c->layer(3).mode, LayerMode::kReuse);
  EXPECT_EQ(c->layer(3).kv_owner, 2);
  EXPECT_EQ(c->layer(13).kv_owner, 8);
  EXPECT_TRUE(c->layer(20).is_candidate_source);
  EXPECT_EQ(c->layer(24).mode, LayerMode::kReindex);
  EXPECT_EQ(c->layer(24).kv_owner, 20);
  EXPECT_EQ(c->layer(27).index_owner, 24);
  EXPECT_EQ(c->layer(39).index_owner, 36);
  EXPECT_EQ(c->layer(40).is_draft, true);
  EXPECT_EQ(c->layer(42).draft_stage, 2);
  EXPECT_EQ(c->layer(20).rope, RopeKind::kCompress);
  EXPECT_EQ(c->layer(1).rope, RopeKind::kMain);
  EXPECT_EQ(c->decoder_start_layer(), 20);
  EXPECT_TRUE(c->rope_scaling.enabled);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 65536);
  EXPECT_EQ(c->hc_mix_count(), 24);
  EXPECT_EQ(c->engram_embed_dim(), 6144);
  EXPECT_EQ(c->routed_experts_of(41), 128);
  EXPECT_EQ(c->experts_per_tok_of(41), 3);
  EXPECT_EQ(c->experts_per_tok_of(5), 6);
  // §2.7: 890 bytes/token; §2.7: 43 × 128 × 528 B SWA per request.
  EXPECT_EQ(c->main_entry_bytes(), 288u);
  EXPECT_EQ(c->index_entry_bytes(), 68u);
  EXPECT_EQ(c->swa_row_bytes(), 528u);
  EXPECT_DOUBLE_EQ(c->global_entries_per_token(), 2.5);
  EXPECT_DOUBLE_EQ(c->global_kv_bytes_per_token(), 890.0);
  EXPECT_EQ(c->swa_ring_bytes_per_request(), 43u * 128u * 528u);
  for (int l : {37, 38, 39}) EXPECT_TRUE(c->layer(l).is_dspark_target);
}

TEST(ModelConfig, FullSizeEngramPrimesAndMultipliers) {
  auto c = load_model_config(full_config_path());
  ASSERT_TRUE(c) << c.error().to_string();
  ASSERT_EQ(c->engram_layers.size(), 2u);
  const EngramLayer& e1 = c->engram_layers[0];
  EXPECT_EQ(e1.layer_id, 1);
  EXPECT_EQ(e1.num_embeddings, 384006168);
  EXPECT_EQ(c->engram_layers[1].num_embeddings, 384016682);
  EXPECT_EQ(e1.primes[0], (std::vector<int64_t>{16000057, 16000079, 16000081, 16000097, 16000121,
                                                16000129, 16000133, 16000183}));
  EXPECT_EQ(e1.offsets.size(), 24u);
  EXPECT_EQ(e1.offsets[0], 0);
  EXPECT_EQ(e1.offsets[1], 16000057);
  EXPECT_EQ(e1.multipliers,
            (std::vector<int64_t>{76632096046245, 4839876093313, 35959672319349, 73987337458391}));
  EXPECT_EQ(c->engram_layers[1].multipliers,
            (std::vector<int64_t>{67716810739261, 51510806800915, 30921347202721, 82619226485591}));
  EXPECT_EQ(c->engram_for_layer(14), &c->engram_layers[1]);
  EXPECT_EQ(c->engram_for_layer(2), nullptr);
  EXPECT_EQ(c->layer(14).engram_index, 1);
}

TEST(ModelConfig, TinyParsesWithSpecRoles) {
  auto c = load_model_config(tiny_config_path());
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_EQ(c->num_total_layers(), 15);
  EXPECT_EQ(c->layer(6).mode, LayerMode::kFull);
  EXPECT_TRUE(c->layer(6).is_candidate_source);
  EXPECT_EQ(c->layer(8).mode, LayerMode::kReindex);
  EXPECT_EQ(c->layer(9).index_owner, 8);
  EXPECT_EQ(c->layer(11).index_owner, 10);
  EXPECT_EQ(c->layer(5).kv_owner, 4);
  // §9: layer 1 primes {101,103 | 107,109 | 113,127}, layer 4 {131,137 | 139,149 | 151,157}.
  EXPECT_EQ(c->engram_layers[0].primes,
            (std::vector<std::vector<int64_t>>{{101, 103}, {107, 109}, {113, 127}}));
  EXPECT_EQ(c->engram_layers[1].primes,
            (std::vector<std::vector<int64_t>>{{131, 137}, {139, 149}, {151, 157}}));
  EXPECT_EQ(c->engram_layers[1].offsets, (std::vector<int64_t>{0, 131, 268, 407, 556, 707}));
  // Embedded copy == shipped file.
  auto embedded = parse_model_config(tiny_config_json(), "embedded");
  ASSERT_TRUE(embedded) << embedded.error().to_string();
  EXPECT_EQ(*embedded, *c);
}

TEST(ModelConfig, FlatLayoutParsesToTheSameConfig) {
  for (const std::string& path : {full_config_path(), tiny_config_path()}) {
    json hf = json::parse(read_text(path));
    ConfigLayout layout{};
    auto a = parse_model_config(hf.dump(), "hf", &layout);
    ASSERT_TRUE(a) << a.error().to_string();
    EXPECT_EQ(layout, ConfigLayout::kHfComposite);
    json flat = to_flat(hf);
    auto b = parse_model_config(flat.dump(), "flat", &layout);
    ASSERT_TRUE(b) << b.error().to_string();
    EXPECT_EQ(layout, ConfigLayout::kFlat);
    EXPECT_EQ(*a, *b) << path;
  }
}

TEST(ModelConfig, DerivedDefaults) {
  json hf = json::parse(read_text(full_config_path()));
  hf["text_config"].erase("candidate_source_layer_id");
  hf["text_config"].erase("dspark_target_layer_ids");
  auto c = parse_model_config(hf.dump());
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_EQ(c->candidate_source_layer_id, 20);
  EXPECT_EQ(c->dspark_target_layer_ids, (std::vector<int32_t>{37, 38, 39}));
}

Result<ModelConfig> parse_modified(const std::string& path, const std::function<void(json&)>& f) {
  json j = json::parse(read_text(path));
  f(j);
  return parse_model_config(j.dump(), "config.json");
}

TEST(ModelConfig, BadFieldsAreNamed) {
  auto bad =
      parse_modified(full_config_path(), [](json& j) { j["text_config"]["hidden_size"] = "abc"; });
  ASSERT_FALSE(bad);
  EXPECT_THAT(bad.error().message,
              HasSubstr("text_config.hidden_size: expected a positive integer, got \"abc\""));

  bad = parse_modified(full_config_path(), [](json& j) { j["text_config"].erase("head_dim"); });
  ASSERT_FALSE(bad);
  EXPECT_THAT(bad.error().message, HasSubstr("text_config.head_dim: missing (required)"));

  // Several problems are all reported.
  bad = parse_modified(full_config_path(), [](json& j) {
    j["text_config"]["num_attention_heads"] = -3;
    j["text_config"]["rms_norm_eps"] = "tiny";
    j["text_config"]["compress_ratios"] = json::array({0, 1, "x"});
  });
  ASSERT_FALSE(bad);
  EXPECT_THAT(bad.error().message, HasSubstr("text_config.num_attention_heads"));
  EXPECT_THAT(bad.error().message, HasSubstr("text_config.rms_norm_eps"));
  EXPECT_THAT(bad.error().message, HasSubstr("text_config.compress_ratios[2]"));

  bad = parse_modified(full_config_path(), [](json& j) { j["model_type"] = "deepseek_v4"; });
  ASSERT_FALSE(bad);
  EXPECT_THAT(bad.error().message, HasSubstr("model_type: expected \"deepseek_v41\""));

  // Flat layout names the flat field.
  json flat = to_flat(json::parse(read_text(tiny_config_path())));
  flat["dim"] = 1.5;
  flat.erase("moe_inter_dim");
  auto fb = parse_model_config(flat.dump(), "inference/config.json");
  ASSERT_FALSE(fb);
  EXPECT_THAT(fb.error().message, HasSubstr("inference/config.json"));
  EXPECT_THAT(fb.error().message, HasSubstr("dim: expected a positive integer, got 1.5"));
  EXPECT_THAT(fb.error().message, HasSubstr("moe_inter_dim: missing (required)"));

  auto nj = parse_model_config("{not json", "x.json");
  ASSERT_FALSE(nj);
  EXPECT_THAT(nj.error().message, HasSubstr("x.json: not valid JSON"));
}

TEST(ModelConfig, InconsistentListsAreNamed) {
  auto bad = parse_modified(full_config_path(),
                            [](json& j) { j["text_config"]["compress_ratios"].erase(0); });
  ASSERT_FALSE(bad);
  EXPECT_THAT(bad.error().message, HasSubstr("compress_ratios: has 42 entries, expected"));

  bad = parse_modified(full_config_path(), [](json& j) {
    // Layer 20 (ratio 1) would read layer 14's ratio-2 cache.
    j["text_config"]["kv_source_layer_ids"] = json::array({2, 8, 14});
    j["text_config"]["index_source_layer_ids"] = json::array({2, 8, 14, 24});
    j["text_config"].erase("candidate_source_layer_id");
  });
  ASSERT_FALSE(bad);
  EXPECT_THAT(bad.error().message, HasSubstr("compress_ratios[20]: ratio 1 differs from its "
                                             "KV-source layer 14 (ratio 2)"));

  bad = parse_modified(full_config_path(), [](json& j) {
    j["text_config"]["kv_source_layer_ids"] = json::array({0, 8, 14, 20});
  });
  ASSERT_FALSE(bad);
  EXPECT_THAT(bad.error().message, HasSubstr("kv_source_layer_ids: layer 0 has compress ratio 0"));

  bad = parse_modified(full_config_path(), [](json& j) {
    j["text_config"]["index_source_layer_ids"] = json::array({2, 8, 20, 24});
  });
  ASSERT_FALSE(bad);
  EXPECT_THAT(bad.error().message, HasSubstr("KV-source layer 14 must also be an index source"));

  bad = parse_modified(full_config_path(),
                       [](json& j) { j["text_config"]["candidate_source_layer_id"] = 24; });
  ASSERT_FALSE(bad);
  EXPECT_THAT(bad.error().message, HasSubstr("candidate_source_layer_id: 24 is not a KV-source"));

  bad = parse_modified(full_config_path(), [](json& j) {
    j["text_config"]["engram_num_embeddings"] = json::array({384006168, 5});
  });
  ASSERT_FALSE(bad);
  EXPECT_THAT(bad.error().message,
              HasSubstr("engram_num_embeddings[1]: 5 does not match the sum of layer 14's 24 hash "
                        "primes (384016682)"));

  bad = parse_modified(full_config_path(), [](json& j) { j["text_config"]["hidden_size"] = 5000; });
  ASSERT_FALSE(bad);
  EXPECT_THAT(bad.error().message, HasSubstr("hidden_size: 5000 is not a multiple of 32"));

  bad = parse_modified(full_config_path(), [](json& j) {
    j["quantization_config"]["weight_block_size"] = {128, 128};
  });
  ASSERT_FALSE(bad);
  EXPECT_THAT(bad.error().message, HasSubstr("weight_block_size: expected [32, 32]"));

  // Unknown multipliers must be given explicitly.
  bad = parse_modified(tiny_config_path(), [](json& j) {
    j["text_config"].erase("engram_multipliers");
    j["text_config"]["engram_compressed_vocab_size"] = 200;
  });
  ASSERT_FALSE(bad);
  EXPECT_THAT(bad.error().message, HasSubstr("text_config.engram_multipliers: required"));
  bad = parse_modified(tiny_config_path(),
                       [](json& j) { j["text_config"]["engram_multipliers"][0][1] = 7; });
  ASSERT_FALSE(bad);
  EXPECT_THAT(bad.error().message, HasSubstr("engram_multipliers[0]: differ"));
}

TEST(ModelConfig, Primes) {
  EXPECT_TRUE(is_prime_u64(2));
  EXPECT_TRUE(is_prime_u64(16000057));
  EXPECT_FALSE(is_prime_u64(16000059));
  EXPECT_TRUE(is_prime_u64(18446744073709551557ull));
  EXPECT_FALSE(is_prime_u64(1));
}

}  // namespace
}  // namespace moeserve
