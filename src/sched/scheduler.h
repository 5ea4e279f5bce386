// Scheduler: the one token-budget scheduler (no prefill/decode phases). Each step it walks the
// running requests (oldest first), then the waiting queue, and advances each request's computed
// tokens toward its target under max_num_batched_tokens. It owns every Request and drives the
// KvCacheManager; when KV runs out it preempts the newest running request (recompute), so a step
// never deadlocks. Single-threaded: the EngineCore thread owns it.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "common/result.h"
#include "kv/kv_cache_manager.h"
#include "sched/request.h"
#include "sched/scheduler_output.h"

namespace moeserve::sched {

struct SchedulerConfig {
  int32_t max_num_batched_tokens = 8192;
  int32_t max_num_seqs = 256;
  int32_t long_prefill_token_threshold = 0;  // 0: off; else cap per request per step
  int32_t max_model_len = 1 << 20;
  // Encoder replay window after a prefix hit (model.md §2.6): the model's sliding_window. 0: none.
  int32_t replay_window = 128;
  // The replay start is a multiple of this (the lcm of the compression ratios, so no compressor
  // group is split; model.md §2.6).
  int32_t replay_align = 1;
  int32_t num_lookahead_tokens = 0;  // KV room reserved for speculative tokens
};

struct SchedulerStats {
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  double kv_usage = 0.0;
  int64_t prefix_cache_queries = 0;  // tokens looked up
  int64_t prefix_cache_hits = 0;     // tokens found
  int64_t num_preemptions = 0;
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, const kv::KvCacheConfig& kv_config);

  [[nodiscard]] Status add_request(std::unique_ptr<Request> request);
  // Frees everything the request holds; its update (reason `reason`) is returned by the next
  // update_from_output / take_finished_updates. No-op for unknown or finished ids.
  void finish_request(RequestId id, FinishReason reason);

  [[nodiscard]] SchedulerOutput schedule();
  // Applies one step's sampled tokens (steps are applied in the order they were scheduled).
  [[nodiscard]] std::vector<RequestUpdate> update_from_output(const SchedulerOutput& scheduled,
                                                              const ModelRunnerOutput& output);
  // Updates of requests finished outside a step (abort, stop strings).
  [[nodiscard]] std::vector<RequestUpdate> take_finished_updates();

  [[nodiscard]] bool has_unfinished_requests() const {
    return !running_.empty() || !waiting_.empty();
  }
  // Finished-outside-a-step updates (abort, stop strings) not yet taken.
  [[nodiscard]] bool has_finished_updates() const { return !finished_updates_.empty(); }
  [[nodiscard]] int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  [[nodiscard]] int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  [[nodiscard]] const Request* find(RequestId id) const;
  [[nodiscard]] SchedulerStats stats() const;
  [[nodiscard]] kv::KvCacheManager& kv() { return kv_; }
  [[nodiscard]] const kv::KvCacheManager& kv() const { return kv_; }
  [[nodiscard]] const SchedulerConfig& config() const { return config_; }

 private:
  void preempt(Request& request);
  void free_request(Request& request, FinishReason reason);
  // Fills the runner-facing record of a request scheduled for `num_new` tokens.
  void emit_scheduled(Request& request, int32_t num_new, SchedulerOutput& out);
  [[nodiscard]] bool check_stop(Request& request, int32_t token) const;
  [[nodiscard]] RequestUpdate make_update(const Request& request) const;
  void remove_finished_from_running();

  SchedulerConfig config_;
  kv::KvCacheManager kv_;
  std::unordered_map<RequestId, std::unique_ptr<Request>> requests_;
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;
  std::vector<RequestId> finished_since_last_step_;
  std::vector<RequestUpdate> finished_updates_;
  bool running_has_finished_ = false;
  int64_t step_id_ = 0;
  int64_t prefix_cache_queries_ = 0;
  int64_t prefix_cache_hits_ = 0;
  int64_t num_preemptions_ = 0;
};

}  // namespace moeserve::sched
