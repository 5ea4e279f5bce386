// The checkpoint layout of docs/checkpoint_format.md as data: for a ModelConfig, every logical
// weight (name, storage format, logical [out, in] shape, parameter group, init hint) and the
// safetensors tensors it expands to. One table feeds the validator, `model inspect` (parameter
// counts, bytes per dtype) and `model gen-tiny`. Invariant: the expansion of weight_specs() is
// exactly the set of tensors the format doc lists for that config.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"
#include "tensor/tensor.h"

namespace moeserve {

// How a logical weight is stored.
enum class WeightFormat : uint8_t {
  kBf16,         // name: BF16 [shape]
  kF32,          // name: F32 [shape]
  kFp8Linear,    // name.weight F8_E4M3 [out, in] + name.scale F8_E8M0 [ceil32(out), ceil32(in)]
  kMxfp4Linear,  // name.weight I8 [out, in/2] + name.scale F8_E8M0 [out, ceil32(in)]
  kFp8RowTable,  // name.weight F8_E4M3 [rows, d] + name.scale F8_E8M0 [rows, ceil32(d)] (Engram)
};

// Parameter groups reported by `model inspect`.
enum class ParamGroup : uint8_t {
  kEmbedHead,      // embed, head, final norm
  kBackbone,       // layers.*: attention, norms, mHC, router, shared expert
  kRoutedExperts,  // layers.*.ffn.experts.*
  kEngramTables,   // layers.*.engram.table
  kEngramProj,     // layers.*.engram.{wkv, q_weight, k_weight}
  kDraft,          // mtp.*: everything but routed experts
  kDraftExperts,   // mtp.*.ffn.experts.*
};
inline constexpr int kNumParamGroups = 7;
[[nodiscard]] std::string_view param_group_name(ParamGroup group);

// Init hint for the tiny generator.
enum class WeightInit : uint8_t {
  kNormal,  // mean + std * N(0, 1)
  kHcBase,  // mHC base [M]: pre/post ~ N(0, std), comb = 2·I + N(0, std) (well-conditioned
            // Sinkhorn)
};

struct WeightSpec {
  std::string name;  // full tensor name for kBf16/kF32; the prefix before .weight/.scale otherwise
  WeightFormat format = WeightFormat::kBf16;
  std::vector<int64_t> shape;  // logical shape ([out, in] for linears/tables)
  ParamGroup group = ParamGroup::kBackbone;
  int32_t layer_id = -1;       // backbone layer or L + draft stage; -1 for top-level tensors
  bool routed_expert = false;  // one of ffn.experts.{e}: active for top-k tokens only
  WeightInit init = WeightInit::kNormal;
  float init_mean = 0.0f;
  float init_std = 0.0f;

  // Logical parameter count (FP4 counts 2 per byte; scales are not parameters).
  [[nodiscard]] int64_t num_params() const;
};

// One safetensors tensor the checkpoint must hold.
struct ExpectedTensor {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  bool is_scale = false;  // a .scale tensor (no parameters)

  [[nodiscard]] size_t nbytes() const { return dtype_bytes(dtype, shape.numel()); }
};

// Every logical weight of the DeepSeek-V4.1 checkpoint for `config`, in a fixed order (top level,
// layers.0.., mtp.0..).
[[nodiscard]] std::vector<WeightSpec> weight_specs(const ModelConfig& config);
// The safetensors tensors one spec expands to (1 or 2).
[[nodiscard]] std::vector<ExpectedTensor> expand_weight_spec(const WeightSpec& spec);
// All expected tensors of the config.
[[nodiscard]] std::vector<ExpectedTensor> expected_tensors(const ModelConfig& config);

}  // namespace moeserve
