// CheckpointReader: read-only, mmap-backed view of a safetensors checkpoint directory (one
// model.safetensors or shards listed in model.safetensors.index.json), plus the loaders the
// forward uses to turn the checkpoint formats of docs/checkpoint_format.md into fp32 tensors.
// Invariant: every TensorRecord's bytes stay valid while any copy of the reader is alive.
// NOTE: a stopgap until src/model/safetensors.h lands; only this file set depends on it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"
#include "tensor/tensor.h"

namespace moeserve::arch {

struct TensorRecord {
  std::string dtype;  // safetensors dtype name ("F32", "BF16", "F8_E4M3", "F8_E8M0", "I8", ...)
  std::vector<int64_t> shape;
  std::span<const uint8_t> bytes;
};

class CheckpointReader {
 public:
  [[nodiscard]] static Result<CheckpointReader> open(const std::filesystem::path& dir);

  [[nodiscard]] const TensorRecord* find(const std::string& name) const;
  [[nodiscard]] Result<const TensorRecord*> get(const std::string& name) const;
  [[nodiscard]] const std::map<std::string, TensorRecord>& tensors() const { return tensors_; }
  // Keeps the mappings alive for views handed out (e.g. mmap-backed Engram tables).
  [[nodiscard]] std::shared_ptr<const void> keep_alive() const;

  // A plain tensor (F32 / BF16 / F16) as fp32, checked against `shape`.
  [[nodiscard]] Result<HostTensor> load_dense(const std::string& name,
                                              std::vector<int64_t> shape) const;
  // A linear weight [out, in] as fp32: FP8 e4m3 with 32x32 ue8m0 blocks (`name.scale`), MXFP4
  // (I8/U8 [out, in/2] + ue8m0 [out, in/32]), or a plain BF16/F32 tensor.
  [[nodiscard]] Result<HostTensor> load_linear(const std::string& name, int64_t out,
                                               int64_t in) const;

 private:
  struct Mapping;
  std::vector<std::shared_ptr<Mapping>> mappings_;
  std::map<std::string, TensorRecord> tensors_;
};

}  // namespace moeserve::arch
