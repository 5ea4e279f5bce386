// CausalLmForwardModel: the ForwardModel over the forward pass of model/arch (CausalLm). Once the
// engine has sized the KV pools (initialize_kv_cache) each running request's SequenceState is a
// kv::PagedSequenceState over kv::KvStorage: global entries in the request's blocks, SWA/DSpark
// rings in its state slot. A request admitted with a prefix-cache hit adopts the cached blocks
// and replays only the scheduler's replay tokens (encoder bounded replay, model.md §2.6).
// Without initialize_kv_cache (unit tests of the runner) states are the forward's own
// ContiguousSequenceState and a hit prefix is recomputed.
// Every step's requests run as one batched forward call.
#pragma once

#include <memory>
#include <unordered_map>

#include "kv/kv_storage.h"
#include "model/arch/causal_lm.h"
#include "runtime/batch_metadata.h"

namespace moeserve::runtime {

class CausalLmForwardModel final : public ForwardModel {
 public:
  CausalLmForwardModel(std::unique_ptr<arch::CausalLm> model, arch::ForwardMode mode);

  [[nodiscard]] int32_t vocab_size() const override;
  [[nodiscard]] Status initialize_kv_cache(const kv::KvCacheConfig& config) override;
  [[nodiscard]] Status forward(const BatchMetadata& batch, std::span<float> logits) override;
  void release_request(sched::RequestId id) override { states_.erase(id); }
  [[nodiscard]] arch::CausalLm& model() { return *model_; }
  // nullptr until initialize_kv_cache.
  [[nodiscard]] const kv::KvStorage* storage() const { return storage_.get(); }
  // Tokens computed by forward calls so far (replayed and new; not the skipped cached ones).
  [[nodiscard]] int64_t num_computed_tokens() const { return num_computed_tokens_; }

 private:
  // The state of a request entering the batch; on a prefix hit it adopts the cached blocks.
  [[nodiscard]] Result<arch::SequenceState*> admit(const BatchRequest& r);

  std::unique_ptr<arch::CausalLm> model_;
  arch::ForwardMode mode_;
  std::unique_ptr<kv::KvStorage> storage_;
  std::unordered_map<sched::RequestId, std::unique_ptr<arch::SequenceState>> states_;
  std::vector<arch::SequenceInput> inputs_;
  int64_t num_computed_tokens_ = 0;
};

}  // namespace moeserve::runtime
