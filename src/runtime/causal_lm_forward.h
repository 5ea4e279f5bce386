// CausalLmForwardModel: the ForwardModel over the CPU forward pass (model/arch CausalLm). It keeps
// one SequenceState per running request (reset when the scheduler (re)admits it) and runs every
// scheduled request of a step as one batched forward call.
// NOTE: the states are still the forward's ContiguousSequenceState, not views of the KV pools, so
// a prefix-cache hit cannot read the cached blocks yet: on admission with num_computed_tokens > 0
// the adapter recomputes [0, num_computed_tokens) first. Results are exact (hit ≡ miss); the
// savings arrive with a paged SequenceState over kv/ (docs/engine.md, "What is left").
#pragma once

#include <memory>
#include <unordered_map>

#include "model/arch/causal_lm.h"
#include "runtime/batch_metadata.h"

namespace moeserve::runtime {

class CausalLmForwardModel final : public ForwardModel {
 public:
  CausalLmForwardModel(std::unique_ptr<arch::CausalLm> model, arch::ForwardMode mode);

  [[nodiscard]] int32_t vocab_size() const override;
  [[nodiscard]] Status forward(const BatchMetadata& batch, std::span<float> logits) override;
  void release_request(sched::RequestId id) override { states_.erase(id); }
  [[nodiscard]] arch::CausalLm& model() { return *model_; }

 private:
  std::unique_ptr<arch::CausalLm> model_;
  arch::ForwardMode mode_;
  std::unordered_map<sched::RequestId, std::unique_ptr<arch::SequenceState>> states_;
  std::vector<arch::SequenceInput> inputs_;
};

}  // namespace moeserve::runtime
