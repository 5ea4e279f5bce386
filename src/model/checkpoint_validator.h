// Checks a checkpoint against the tensors docs/checkpoint_format.md expects for a ModelConfig:
// every missing tensor, wrong dtype and wrong shape is collected (not just the first); tensors the
// layout does not know are warnings. Works on any name -> (dtype, shape) listing, so tests and
// tools can validate without mapping files.
#pragma once

#include <string>
#include <vector>

#include "common/result.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "tensor/tensor.h"

namespace moeserve {

struct TensorSignature {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
};

struct CheckpointValidation {
  std::vector<std::string> errors;    // missing / wrong dtype / wrong shape, one line each
  std::vector<std::string> warnings;  // unexpected extra tensors
  size_t num_expected = 0;
  size_t num_found = 0;

  [[nodiscard]] bool ok() const { return errors.empty(); }
  // kInvalidArgument naming every problem (and the warning count), or ok.
  [[nodiscard]] Status to_status(std::string_view checkpoint_name) const;
};

[[nodiscard]] CheckpointValidation validate_checkpoint_tensors(
    const ModelConfig& config, const std::vector<TensorSignature>& tensors);
[[nodiscard]] CheckpointValidation validate_checkpoint(const ModelConfig& config,
                                                       const Checkpoint& checkpoint);

}  // namespace moeserve
