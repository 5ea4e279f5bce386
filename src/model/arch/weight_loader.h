// WeightLoader: turns the tensors of a checkpoint (model/safetensors.h, the one safetensors reader)
// into the fp32 weights the CPU forward runs on, per the formats of docs/checkpoint_format.md:
// plain F32/BF16 tensors, FP8 e4m3 linears with 32x32 ue8m0 block scales, MXFP4 experts.
// Errors name the tensor. Invariant: views handed out (e.g. the mmap-backed Engram tables) stay
// valid while keep_alive() or any copy of the loader is alive.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"
#include "model/safetensors.h"
#include "tensor/tensor.h"

namespace moeserve::arch {

// A linear weight as the CPU forward holds it: fp32 [out, in] plus whether the checkpoint stored it
// block-scaled (FP8 e4m3 with 32x32 ue8m0 blocks, or MXFP4). Block-scaled linears read MXFP8
// activations (model.md §5; arch::linear applies the fake-quant).
struct LinearWeight {
  HostTensor weight;
  bool block_scaled = false;
};

class WeightLoader {
 public:
  // Maps a checkpoint (a directory or one .safetensors file; CheckpointLoader rules).
  [[nodiscard]] static Result<WeightLoader> open(const std::filesystem::path& path);
  explicit WeightLoader(std::shared_ptr<const Checkpoint> checkpoint)
      : checkpoint_(std::move(checkpoint)) {}

  [[nodiscard]] const Checkpoint& checkpoint() const { return *checkpoint_; }
  [[nodiscard]] const Checkpoint::Tensor* find(const std::string& name) const {
    return checkpoint_->find(name);
  }
  // kNotFound naming the tensor when it is absent.
  [[nodiscard]] Result<const Checkpoint::Tensor*> get(const std::string& name) const;
  // The mapped bytes of a tensor.
  [[nodiscard]] static std::span<const uint8_t> bytes(const Checkpoint::Tensor& t) {
    return {static_cast<const uint8_t*>(t.view.data()), t.nbytes};
  }
  [[nodiscard]] std::shared_ptr<const void> keep_alive() const { return checkpoint_; }

  // A plain tensor (F32 / BF16) as fp32, checked against `shape`.
  [[nodiscard]] Result<HostTensor> load_dense(const std::string& name,
                                              const std::vector<int64_t>& shape) const;
  // A linear weight [out, in] as fp32: FP8 e4m3 with 32x32 ue8m0 blocks (`<name>.scale`), MXFP4
  // (I8/U8 [out, in/2] + ue8m0 [out, in/32]), or a plain BF16/F32 tensor.
  [[nodiscard]] Result<HostTensor> load_linear(const std::string& name, int64_t out,
                                               int64_t in) const;
  // load_linear plus the checkpoint format: block_scaled for FP8 e4m3 and MXFP4 tensors.
  [[nodiscard]] Result<LinearWeight> load_linear_weight(const std::string& name, int64_t out,
                                                        int64_t in) const;

 private:
  std::shared_ptr<const Checkpoint> checkpoint_;
};

}  // namespace moeserve::arch
