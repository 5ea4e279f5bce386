// DSparkDraft: the DSpark draft model of DeepSeek-V4.1 (model.md §6) on top of a loaded
// DeepseekV41Model (shares its embed/head and backend). commit() turns the target's main_hidden
// taps of committed positions into per-stage context KV rows (the SequenceState's DSpark rings);
// draft() runs one cycle: [anchor, noise x (B-1)] through the window-only MoE stages with
// bidirectional attention inside the block, then the Markov and confidence heads.
// Invariant: the rings hold the committed positions [max(begin, end - window), end), contiguous.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "common/result.h"
#include "model/arch/deepseek_v41.h"

namespace moeserve::arch {

struct DraftOutput {
  int32_t anchor = 0;
  std::vector<int32_t> positions;      // [B] block positions (anchor first)
  std::vector<int32_t> ctx_positions;  // context ring positions the block attended to
  std::vector<float> base_logits;      // [B, V] U = head(norm(hb))
  std::vector<float> logits;           // [B, V] U + Markov transition bias
  std::vector<int32_t> tokens;         // [B] greedy drafts (argmax, ties -> lowest id)
  std::vector<float> confidences;      // [B] sigmoid(conf_w · [hb_i; m_i])
};

struct DSparkStats {
  std::vector<int64_t> stage_calls;  // per draft stage
  int64_t committed_rows = 0;
  int64_t markov_steps = 0;
};

class DSparkDraft {
 public:
  explicit DSparkDraft(const DeepseekV41Model& model);

  // Pushes committed positions (consecutive, continuing the ring) with their main_hidden rows
  // [n, taps * D] into every stage's ring: kv_ctx = fq_fp8(rope(kv_norm(wkv(main_norm(
  // main_proj(main_hidden)))))).
  [[nodiscard]] Status commit(SequenceState& state, std::span<const int32_t> positions,
                              std::span<const float> main_hidden);
  // One draft cycle after the last committed position; anchor = the token the target emitted.
  [[nodiscard]] Result<DraftOutput> draft(SequenceState& state, int32_t anchor);

  [[nodiscard]] const DSparkStats& stats() const { return stats_; }

 private:
  const DeepseekV41Model& model_;
  const ModelConfig& config_;
  const DSparkWeights& weights_;
  Rope rope_main_;
  DSparkStats stats_;
};

}  // namespace moeserve::arch
