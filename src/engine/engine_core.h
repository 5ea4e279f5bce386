// EngineCore: one rank's serving loop. step() = schedule → execute → update_from_output, built as
// a pipeline of `async_scheduling ? 2 : 1` steps in flight: with 2, the CPU schedules step N+1
// (decode inputs come from the runner's own samples) while the executor runs step N. The thread
// that calls its methods owns the scheduler, the KV manager and every request's stream state.
#pragma once

#include <chrono>
#include <deque>
#include <future>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/result.h"
#include "engine/engine_types.h"
#include "engine/metrics.h"
#include "engine/step_worker.h"
#include "runtime/model_executor.h"
#include "sched/scheduler.h"

namespace moeserve::engine {

struct EngineCoreConfig {
  sched::SchedulerConfig scheduler;
  kv::KvCacheConfig kv;
  bool async_scheduling = false;
  int32_t eos_token_id = 1;
};

class EngineCore {
 public:
  EngineCore(const EngineCoreConfig& config, std::unique_ptr<runtime::ModelExecutor> executor,
             DetokenizerFactory detokenizer = {});
  ~EngineCore();
  EngineCore(const EngineCore&) = delete;
  EngineCore& operator=(const EngineCore&) = delete;

  // Validates and queues a request; returns its id.
  [[nodiscard]] Result<RequestId> add_request(EngineRequest request);
  // Aborts at any point (waiting, mid-prefill, decoding); its final output comes from step().
  void abort_request(RequestId id);
  // One pipeline step; returns every request output produced by it (possibly none).
  [[nodiscard]] Result<std::vector<RequestOutput>> step();
  [[nodiscard]] bool has_unfinished_requests() const;

  [[nodiscard]] EngineMetrics& metrics() { return metrics_; }
  [[nodiscard]] sched::Scheduler& scheduler() { return scheduler_; }
  [[nodiscard]] const EngineCoreConfig& config() const { return config_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct StreamState {
    std::unique_ptr<IncrementalDetokenizer> detokenizer;
    std::string text;      // output text so far (after stop-string truncation)
    size_t text_sent = 0;  // bytes of `text` already streamed
    size_t stop_holdback = 0;
    std::vector<std::string> stop;
    bool include_stop_str = false;
    Clock::time_point arrival, first_scheduled, first_token, last_token;
    bool scheduled = false, has_token = false;
  };
  struct InFlight {
    std::shared_ptr<const sched::SchedulerOutput> step;
    std::future<StepResult> result;
  };
  // Turns scheduler updates into stream outputs (detokenize, stop strings, metrics).
  void process_updates(std::vector<sched::RequestUpdate>& updates, std::vector<RequestOutput>& out);
  void finish_stream(RequestId id, const RequestOutput& o);

  EngineCoreConfig config_;
  std::unique_ptr<runtime::ModelExecutor> executor_;
  DetokenizerFactory detokenizer_factory_;
  sched::Scheduler scheduler_;
  StepWorker worker_;
  std::deque<InFlight> in_flight_;
  std::vector<RequestId> carry_finished_;
  std::unordered_map<RequestId, StreamState> streams_;
  EngineMetrics metrics_;
  RequestId next_id_ = 0;
};

}  // namespace moeserve::engine
