// The §9 tiny config (model.md §9 + engram_multipliers), kept identical to configs/tiny/config.json
// (tests/unit/model/config_test.cpp checks that both parse to the same ModelConfig).
#include "model/config.h"

namespace moeserve {

std::string_view tiny_config_json() {
  static constexpr std::string_view kText = R"json(
{
  "architectures": ["DeepseekV41ForCausalLM"],
  "model_type": "deepseek_v41",
  "bos_token_id": 0,
  "eos_token_id": 1,
  "pad_token_id": 2,
  "text_config": {
    "model_type": "deepseek_v41_text",
    "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 12,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64, "qk_rope_head_dim": 16,
    "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 16,
    "sliding_window": 8,
    "compress_ratios": [0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 0, 0, 0],
    "kv_source_layer_ids": [2, 4, 6],
    "index_source_layer_ids": [2, 4, 6, 8, 10],
    "candidate_source_layer_id": 6, "candidate_topk_blocks": 4, "candidate_block_size": 4,
    "index_n_heads": 2, "index_head_dim": 32, "index_topk": 8,
    "rope_theta": 10000, "compress_rope_theta": 160000,
    "rope_scaling": {"rope_type": "yarn", "factor": 16, "original_max_position_embeddings": 32,
                     "beta_fast": 32, "beta_slow": 1},
    "max_position_embeddings": 512,
    "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc",
    "norm_topk_prob": true, "routed_scaling_factor": 1.5, "gate_temp": 1.0, "swiglu_limit": 10.0,
    "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-20,
    "engram_layer_ids": [1, 4], "engram_vocab_size": 101, "engram_num_embeddings": [660, 864],
    "engram_max_ngram_size": 4, "engram_n_heads": 2, "engram_head_dim": 32,
    "engram_pad_id": 2, "engram_compressed_vocab_size": 256,
    "engram_multipliers": [
      [29662608052400909, 1873410163432121, 13919202536988139, 28638879857136817],
      [31841131192811251, 1950019090429101, 28509641033320619, 7337012813361983]
    ],
    "num_nextn_predict_layers": 3, "dspark_block_size": 5, "dspark_noise_token_id": 255,
    "dspark_target_layer_ids": [9, 10, 11], "dspark_markov_rank": 8,
    "dspark_n_routed_experts": 4, "dspark_num_experts_per_tok": 1,
    "hidden_act": "silu", "tie_word_embeddings": false, "eos_token_id": 1
  },
  "quantization_config": {"quant_method": "fp8", "weight_block_size": [32, 32], "scale_fmt": "ue8m0",
                          "expert_dtype": "fp4"}
}
)json";
  return kText;
}

}  // namespace moeserve
