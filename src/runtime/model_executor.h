// ModelExecutor: runs one scheduled step and returns the sampled tokens. The EngineCore only sees
// this interface (ModelRunner over a ForwardModel, later multi-rank executors). Steps are executed
// in the order they are submitted; an executor may keep per-request state between steps and drops
// it for SchedulerOutput::finished_req_ids / preempted_req_ids.
#pragma once

#include "common/result.h"
#include "kv/kv_cache_manager.h"
#include "sched/scheduler_output.h"

namespace moeserve::runtime {

class ModelExecutor {
 public:
  virtual ~ModelExecutor() = default;
  [[nodiscard]] virtual Result<sched::ModelRunnerOutput> execute(
      const sched::SchedulerOutput& scheduled) = 0;
  // Allocates the KV cache memory for the pools of `config` (before the first step).
  [[nodiscard]] virtual Status initialize_kv_cache(const kv::KvCacheConfig& /*config*/) {
    return ok_status();
  }
};

}  // namespace moeserve::runtime
