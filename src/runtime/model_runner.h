// ModelRunner: the ModelExecutor over a ForwardModel. It keeps each request's token ids, block
// table and sampling state (so decode inputs come from its own last sample, which is what lets the
// scheduler run one step ahead), builds BatchMetadata, runs the forward and samples.
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "runtime/batch_metadata.h"
#include "runtime/model_executor.h"
#include "runtime/sampler.h"

namespace moeserve::runtime {

class ModelRunner final : public ModelExecutor {
 public:
  ModelRunner(std::unique_ptr<ForwardModel> model, uint64_t sampler_seed);

  [[nodiscard]] Result<sched::ModelRunnerOutput> execute(
      const sched::SchedulerOutput& scheduled) override;
  [[nodiscard]] Status initialize_kv_cache(const kv::KvCacheConfig& config) override;

  // Applies the request bookkeeping of `scheduled` and fills `batch` (no forward, no sampling).
  // Exposed for the scheduler benchmark.
  [[nodiscard]] Status prepare_batch(const sched::SchedulerOutput& scheduled, BatchMetadata& batch);
  [[nodiscard]] size_t num_requests() const { return requests_.size(); }

 private:
  struct CachedRequest {
    std::vector<int32_t> token_ids;
    int32_t num_prompt_tokens = 0;
    int32_t prefill_len = 0;
    sched::SamplingParams params;
    int32_t eos_token_id = -1;
    int32_t state_slot = -1;
    std::vector<int32_t> block_table;
    bool has_penalties = false;
    PenaltyState penalties;
  };
  void drop(sched::RequestId id);

  std::unique_ptr<ForwardModel> model_;
  Sampler sampler_;
  std::unordered_map<sched::RequestId, CachedRequest> requests_;
  BatchMetadata batch_;
  std::vector<float> logits_;
};

}  // namespace moeserve::runtime
