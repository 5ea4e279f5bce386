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

struct FfnWeights {
  HostTensor w1;  // [I, D]
  HostTensor w3;  // [I, D]
  HostTensor w2;  // [D, I]
};

struct MoeWeights {
  HostTensor gate;     // [E, D]
  HostTensor bias;     // [E]
  HostTensor bias_vl;  // [E] (empty for draft stages)
  std::vector<FfnWeights> experts;
  FfnWeights shared;
};

struct AttentionWeights {
  HostTensor wq_a, q_norm, wq_b, wkv, kv_norm, wo_a, wo_b, attn_sink;
  // KV sources only.
  HostTensor compressor_wkv, compressor_wgate /* ratio > 1 */, compressor_norm;
  HostTensor indexer_wk, indexer_k_norm;
  // Index sources only.
  HostTensor indexer_wq_b, indexer_weights_proj;
};

struct EngramWeights {
  EngramTable table;
  HostTensor wkv;        // [D*(HC+1), NE]
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
  HostTensor main_proj;     // [D, 3D]
  HostTensor main_norm;     // [D]
  HostTensor norm;          // [D]
  HostTensor markov_embed;  // [V, R]
  HostTensor markov_head;   // [V, R]
  HostTensor confidence;    // [1, D+R]
};

struct ModelWeights {
  HostTensor embed;  // [V, D]
  HostTensor head;   // [V, D]
  HostTensor norm;   // [D]
  std::vector<BlockWeights> layers;
  std::optional<DSparkWeights> dspark;  // present when the config has draft stages
};

[[nodiscard]] Result<ModelWeights> load_model_weights(const ModelConfig& config,
                                                      const WeightLoader& reader);

}  // namespace moeserve::arch
