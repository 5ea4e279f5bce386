// DeepseekV41Model: the DeepSeek-V4.1-Flash text backbone on a Backend (model.md §2–§5, §7),
// incremental over a per-request SequenceState: prefill chunks of any length and decode steps.
// Two modes (§2.6): kOracle runs every layer on every row; kProduction (bounded replay) runs the
// layers from the candidate-source layer on only on rows [max(0, P - window), P) of a prompt of
// length P (that layer's collapse/attn_norm/compressor/index keys still on all rows).
// Weights are dequantised to fp32 at load; Engram tables stay FP8 in host memory.
// Invariant: forward() leaves every state it was given advanced by exactly its tokens.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "common/result.h"
#include "model/arch/causal_lm.h"
#include "model/arch/deepseek_v41_layers.h"
#include "model/arch/deepseek_v41_weights.h"
#include "model/arch/sequence_state.h"
#include "model/config.h"
#include "model/engram_table.h"

namespace moeserve::arch {

// Invocation counters (the "every path exercised" guard of the tests).
struct ForwardStats {
  std::array<int64_t, 4> layer_mode_calls{};  // indexed by LayerMode
  int64_t candidate_source_calls = 0;
  int64_t compressor_groups_ratio1 = 0;
  int64_t compressor_groups_ratio2 = 0;    // groups of ratio > 1
  int64_t compressor_partial_carries = 0;  // calls that ended with a partial group buffered
  std::vector<int64_t> engram_calls;       // per Engram layer (config.engram_layers order)
  int64_t narrowed_calls = 0;              // production calls that skipped decoder rows
};

class DeepseekV41Model final : public CausalLm {
 public:
  // `token_map`: the Engram compressed-token map when the caller knows it (from the tokenizer);
  // without it the identity map (tiny configs) or, failing that, a pad-only map with a warning.
  [[nodiscard]] static Result<std::unique_ptr<DeepseekV41Model>> load(
      const std::filesystem::path& dir, Backend& backend,
      std::optional<EngramTokenMap> token_map = std::nullopt);
  DeepseekV41Model(ModelConfig config, ModelWeights weights, EngramTokenMap token_map,
                   Backend& backend);

  [[nodiscard]] const ModelConfig& config() const override { return config_; }
  [[nodiscard]] const ModelWeights& weights() const { return weights_; }
  [[nodiscard]] Backend& backend() const { return backend_; }
  [[nodiscard]] const LinearOps& linear_ops() const { return ops_; }
  // false: linears use the backend's fast GEMM (results then depend on the batch shape).
  void set_batch_invariant(bool on) override { ops_.batch_invariant = on; }
  [[nodiscard]] std::unique_ptr<SequenceState> new_state() const override;
  void restore_history(SequenceState& state, std::span<const int32_t> prefix) const override;
  // Replaces the Engram compressed-token map (default: identity, valid for the tiny model).
  void set_token_map(EngramTokenMap map) { token_map_ = std::move(map); }

  // One step over a batch of sequences (looped for now; shaped for batching later).
  [[nodiscard]] Result<std::vector<SequenceOutput>> forward(std::span<const SequenceInput> inputs,
                                                            ForwardMode mode) override;

  [[nodiscard]] const ForwardStats& stats() const { return stats_; }
  // Bytes of weights a decode token reads (dense + top-k experts + head): the CPU roofline.
  [[nodiscard]] double weight_bytes_per_decode_token() const override;

 private:
  struct Chunk;
  [[nodiscard]] Result<SequenceOutput> forward_one(const SequenceInput& in, ForwardMode mode);
  void run_layer(Chunk& ch, int32_t layer);
  void apply_engram(Chunk& ch, int32_t layer);
  void compress(Chunk& ch, int32_t layer, std::span<const float> a);
  void select_entries(Chunk& ch, int32_t layer, std::span<const float> qr,
                      std::span<const float> a);
  [[nodiscard]] std::vector<float> attention(Chunk& ch, int32_t layer, std::span<const float> a);

  ModelConfig config_;
  ModelWeights weights_;
  EngramTokenMap token_map_;
  Backend& backend_;
  LinearOps ops_;
  Rope rope_main_;
  Rope rope_compress_;
  ForwardStats stats_;
};

}  // namespace moeserve::arch
