#include "model/checkpoint_validator.h"

#include <unordered_map>
#include <unordered_set>

#include "model/checkpoint_layout.h"

namespace moeserve {

Status CheckpointValidation::to_status(std::string_view checkpoint_name) const {
  if (errors.empty()) return ok_status();
  std::string msg = fmt::format(
      "{}: {} problem{} with the checkpoint tensors ({} expected, {} found", checkpoint_name,
      errors.size(), errors.size() == 1 ? "" : "s", num_expected, num_found);
  msg += warnings.empty() ? "):" : fmt::format(", {} unexpected):", warnings.size());
  for (const std::string& e : errors) msg += "\n  " + e;
  return make_error(ErrorCode::kInvalidArgument, std::move(msg));
}

CheckpointValidation validate_checkpoint_tensors(const ModelConfig& config,
                                                 const std::vector<TensorSignature>& tensors) {
  CheckpointValidation v;
  std::unordered_map<std::string_view, const TensorSignature*> found;
  for (const TensorSignature& t : tensors) found.emplace(t.name, &t);
  v.num_found = tensors.size();
  std::unordered_set<std::string> expected_names;
  for (const ExpectedTensor& e : expected_tensors(config)) {
    ++v.num_expected;
    expected_names.insert(e.name);
    auto it = found.find(e.name);
    if (it == found.end()) {
      v.errors.push_back(
          fmt::format("missing: {} ({} {})", e.name, dtype_name(e.dtype), e.shape.to_string()));
      continue;
    }
    const TensorSignature& t = *it->second;
    if (t.dtype != e.dtype)
      v.errors.push_back(fmt::format("wrong dtype: {} is {}, expected {}", e.name,
                                     dtype_name(t.dtype), dtype_name(e.dtype)));
    if (!(t.shape == e.shape))
      v.errors.push_back(fmt::format("wrong shape: {} is {}, expected {}", e.name,
                                     t.shape.to_string(), e.shape.to_string()));
  }
  for (const TensorSignature& t : tensors)
    if (expected_names.count(t.name) == 0)
      v.warnings.push_back(fmt::format("unexpected tensor: {} ({} {})", t.name, dtype_name(t.dtype),
                                       t.shape.to_string()));
  return v;
}

CheckpointValidation validate_checkpoint(const ModelConfig& config, const Checkpoint& checkpoint) {
  std::vector<TensorSignature> sigs;
  sigs.reserve(checkpoint.tensors().size());
  for (const Checkpoint::Tensor& t : checkpoint.tensors())
    sigs.push_back({t.name, t.dtype, t.shape});
  return validate_checkpoint_tensors(config, sigs);
}

}  // namespace moeserve
