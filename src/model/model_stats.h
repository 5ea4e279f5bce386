// Parameter and byte accounting for `moeserve model inspect`, computed from ModelConfig and the
// checkpoint layout (docs/checkpoint_format.md), and optionally from an actual checkpoint.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>

#include "model/checkpoint_layout.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace moeserve {

struct ModelStats {
  // Logical parameters per group (FP4 counts two per byte; scales excluded).
  std::array<int64_t, kNumParamGroups> params{};
  // Stored bytes per safetensors dtype name (weights and scales).
  std::map<std::string, size_t> bytes_by_dtype;
  std::map<std::string, int64_t> tensors_by_dtype;
  size_t total_bytes = 0;
  size_t scale_bytes = 0;
  int64_t num_tensors = 0;
  // Active parameters per token (see docs/model_loading.md for what each includes).
  int64_t active_decode =
      0;  // all backbone layers: dense + top-k routed + Engram rows + embed row/head
  int64_t active_prefill = 0;  // encoder layers only (bounded replay) + embed row + Engram rows
  int64_t active_draft = 0;    // one draft pass over one position (all stages + heads)

  [[nodiscard]] int64_t param(ParamGroup g) const { return params[static_cast<size_t>(g)]; }
  [[nodiscard]] int64_t total_params() const;
  // Backbone = embed/head + dense + routed experts + Engram projections (no tables, no draft).
  [[nodiscard]] int64_t backbone_params() const;
};

[[nodiscard]] ModelStats compute_model_stats(const ModelConfig& config);
// Bytes per dtype of the tensors actually present in a checkpoint.
[[nodiscard]] ModelStats checkpoint_byte_stats(const Checkpoint& checkpoint);

}  // namespace moeserve
