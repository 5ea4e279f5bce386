// DeepSeek-V4.1 weights for the CPU backend: every linear dequantised to fp32 [out, in] at load
// (FP8 32x32 blocks, MXFP4 experts, BF16), norms/biases as fp32, Engram tables kept as FP8 + ue8m0
// scales in host memory (views into the mmapped checkpoint). Names follow
// docs/checkpoint_format.md; a missing or mis-shaped tensor fails the load naming it.
#pragma once

#include <optional>
#include <vector>

#include "common/result.h"
#include "model/arch/weight_loader.h"
#include "model/config.h"
#include "model/engram_table.h"
#include "tensor/tensor.h"

namespace moeserve::arch {

struct HcWeights {
  HostTensor fn;     // [M, HC*D]
  HostTensor base;   // [M]
  HostTensor scale;  // [3]
};

// Linears are LinearWeight: fp32 plus the checkpoint's block_scaled flag (MXFP8 inputs, §5).
struct FfnWeights {
  LinearWeight w1;  // [I, D]
  LinearWeight w3;  // [I, D]
  LinearWeight w2;  // [D, I]
};

struct MoeWeights {
  LinearWeight gate;   // [E, D]
  HostTensor bias;     // [E]
  HostTensor bias_vl;  // [E] (empty for draft stages)
  std::vector<FfnWeights> experts;
  FfnWeights shared;
};

struct AttentionWeights {
  LinearWeight wq_a, wq_b, wkv, wo_a, wo_b;
  HostTensor q_norm, kv_norm, attn_sink;
  // KV sources only.
  LinearWeight compressor_wkv, compressor_wgate /* ratio > 1 */, indexer_wk;
  HostTensor compressor_norm, indexer_k_norm;
  // Index sources only.
  LinearWeight indexer_wq_b, indexer_weights_proj;
};

struct EngramWeights {
  EngramTable table;
  LinearWeight wkv;      // [D*(HC+1), NE]
  HostTensor qk_weight;  // [HC, D] = q_weight * k_weight (only the product is used)
};

struct BlockWeights {
  HcWeights hc_attn, hc_ffn;
  HostTensor attn_norm, ffn_norm;
  AttentionWeights attn;
  MoeWeights moe;
  std::optional<EngramWeights> engram;
};

struct DSparkWeights {
  std::vector<BlockWeights> stages;
  LinearWeight main_proj;   // [D, 3D]
  HostTensor main_norm;     // [D]
  HostTensor norm;          // [D]
  HostTensor markov_embed;  // [V, R]
  HostTensor markov_head;   // [V, R]
  HostTensor confidence;    // [1, D+R]
};

struct ModelWeights {
  HostTensor embed;   // [V, D]
  LinearWeight head;  // [V, D]
  HostTensor norm;    // [D]
  std::vector<BlockWeights> layers;
  std::optional<DSparkWeights> dspark;  // present when the config has draft stages
};

[[nodiscard]] Result<ModelWeights> load_model_weights(const ModelConfig& config,
                                                      const WeightLoader& reader);

}  // namespace moeserve::arch
