// CausalLm: what callers (generate, bench, later the model runner) see of a model architecture:
// per-request states, a batched forward over sequences, and the two execution modes. Each
// architecture implements it in its own file set and is listed in registry.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "model/arch/sequence_state.h"
#include "model/config.h"

namespace moeserve::arch {

enum class ForwardMode : uint8_t { kOracle, kProduction };
enum class LogitsRows : uint8_t { kNone, kLast, kAll };

// Per-layer intermediate values of one forward call, for tests and debugging (optional).
struct ForwardTrace {
  std::vector<float> encoder_out;  // [T, HC, D] streams entering the candidate-source layer
  std::vector<int32_t> encoder_positions;
  std::map<int32_t, std::vector<float>> attn_in;    // attn_norm output [rows, D]
  std::map<int32_t, std::vector<float>> layer_out;  // streams leaving the layer [rows, HC, D]
  std::map<int32_t, std::vector<int32_t>> layer_positions;
  std::map<int32_t, std::vector<int32_t>> experts;     // [rows, top_k]
  std::map<int32_t, std::vector<float>> attn_out;      // attention output y [rows, D]
  std::map<int32_t, std::vector<float>> ffn_in;        // ffn_norm output f [rows, D]
  std::map<int32_t, std::vector<float>> ffn_out;       // MoE output [rows, D]
  std::map<int32_t, std::vector<int64_t>> engram_ids;  // [T, hashes]
  // Per index-source layer: selected global entries per chunk row.
  std::map<int32_t, std::vector<std::vector<int32_t>>> selected;
};

struct SequenceInput {
  SequenceState* state = nullptr;
  std::span<const int32_t> tokens;    // positions state->num_tokens() .. + tokens.size()
  std::span<const uint8_t> is_image;  // empty, or one flag per token (Engram DEAD, bias_vl)
  // kProduction: the prompt length P of the request (needed on its first chunk); -1 = this call's
  // end. Ignored in kOracle.
  int32_t prompt_len = -1;
  LogitsRows logits = LogitsRows::kLast;
  bool want_main_hidden = true;  // DSpark taps of the rows the target layers ran on
  ForwardTrace* trace = nullptr;
};

struct SequenceOutput {
  std::vector<int32_t> logit_positions;
  std::vector<float> logits;  // [logit_positions.size(), V]
  std::vector<int32_t> main_hidden_positions;
  std::vector<float> main_hidden;  // [positions, taps * D]: mean over streams entering each target
};

[[nodiscard]] Result<ForwardMode> forward_mode_from_name(std::string_view name);

class CausalLm {
 public:
  virtual ~CausalLm() = default;
  [[nodiscard]] virtual const ModelConfig& config() const = 0;
  [[nodiscard]] virtual std::unique_ptr<SequenceState> new_state() const = 0;
  // One step over a batch of sequences; each input advances its own state by its tokens.
  [[nodiscard]] virtual Result<std::vector<SequenceOutput>> forward(
      std::span<const SequenceInput> inputs, ForwardMode mode) = 0;
  // After a prefix-cache hit: brings the per-request history that is not kept in the KV pools
  // (V4.1: the Engram n-gram history) to the end of `prefix`, the tokens before
  // state.num_tokens(). Text tokens only.
  virtual void restore_history(SequenceState& /*state*/,
                               std::span<const int32_t> /*prefix*/) const {}
  // Bytes of weights one decode token reads (the CPU roofline's numerator).
  [[nodiscard]] virtual double weight_bytes_per_decode_token() const = 0;
  // true (default): batch-invariant reference GEMM; false: the backend's fast GEMM.
  virtual void set_batch_invariant(bool on) = 0;
};

}  // namespace moeserve::arch
