// `moeserve model gen-tiny`: a deterministic DeepSeek-V4.1 checkpoint for a (tiny) ModelConfig in
// the real checkpoint formats (FP8 e4m3 + ue8m0 32×32 blocks, MXFP4 experts packed in I8, FP8
// Engram tables with per-row scales, BF16/F32 elsewhere). Invariant: the output depends only on
// (config, seed) — integer PRNG (splitmix64) and IEEE basic ops only, so bytes are identical
// across machines — and it passes validate_checkpoint() for that config.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "model/checkpoint_layout.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace moeserve {

// One generated safetensors tensor (owning its bytes).
struct GeneratedTensor {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  std::vector<uint8_t> bytes;
};

// Every tensor of weight_specs(config), generated from `seed`. Linear weights ~ N(0, 1/fan_in)
// before quantisation, norms ~ 1, mHC small with a diagonal-dominant comb base, attn_sink and
// router biases ~ 0 (init hints in checkpoint_layout.cpp).
[[nodiscard]] std::vector<GeneratedTensor> generate_model_tensors(const ModelConfig& config,
                                                                  uint64_t seed);

// Writes DIR/config.json (`config_json` verbatim) and DIR/model.safetensors.
[[nodiscard]] Status write_generated_model(const std::filesystem::path& dir,
                                           std::string_view config_json, uint64_t seed);

// Dequantises one logical weight from a checkpoint to float (row-major, spec.shape): FP8 linears
// and tables via common/fake_quant.h, MXFP4 experts, BF16, F32.
[[nodiscard]] Result<std::vector<float>> dequantize_weight(const WeightSpec& spec,
                                                           const Checkpoint& checkpoint);

}  // namespace moeserve
