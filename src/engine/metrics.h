// EngineMetrics: the serving.md §4.12 metric set (vLLM names, `vllm:`-style prefix `moeserve:`)
// as counters, gauges and histograms, rendered in the Prometheus text format. Written by the
// EngineCore thread, read by anyone (a mutex guards every access; updates are batched per step).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace moeserve::engine {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  [[nodiscard]] const std::vector<double>& bounds() const { return bounds_; }
  [[nodiscard]] const std::vector<uint64_t>& counts() const { return counts_; }  // per bucket + inf
  [[nodiscard]] double sum() const { return sum_; }
  [[nodiscard]] uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

struct MetricsSnapshot {
  // gauges
  int64_t num_requests_running = 0;
  int64_t num_requests_waiting = 0;
  double kv_cache_usage_perc = 0.0;  // 0..1 as vLLM
  // counters
  int64_t prefix_cache_queries = 0;
  int64_t prefix_cache_hits = 0;
  int64_t prompt_tokens_total = 0;
  int64_t generation_tokens_total = 0;
  int64_t num_preemptions_total = 0;
  std::map<std::string, int64_t> request_success_total;  // by finished_reason
};

class EngineMetrics {
 public:
  EngineMetrics();

  void set_scheduler_state(int64_t running, int64_t waiting, double kv_usage, int64_t pc_queries,
                           int64_t pc_hits, int64_t preemptions);
  void add_generation_tokens(int64_t n);
  // One finished request: its token counts and timings (seconds; negative = unknown).
  struct FinishedRequest {
    std::string finished_reason;
    int64_t prompt_tokens = 0;
    int64_t generation_tokens = 0;
    double queue_time = -1, ttft = -1, prefill_time = -1, decode_time = -1, e2e = -1;
  };
  void record_finished(const FinishedRequest& r);
  void observe_inter_token_latency(double seconds);
  void observe_ttft(double seconds);
  // KV residency of cached blocks (kv_block_lifetime_seconds, kv_block_idle_before_evict_seconds,
  // kv_block_reuse_gap_seconds), from kv::BlockPool::take_residency_samples.
  void observe_kv_residency(const std::vector<double>& lifetime,
                            const std::vector<double>& idle_before_evict,
                            const std::vector<double>& reuse_gap);

  [[nodiscard]] MetricsSnapshot snapshot() const;
  [[nodiscard]] std::string render_prometheus(const std::string& model_name) const;

 private:
  mutable std::mutex mu_;
  MetricsSnapshot s_;
  Histogram time_to_first_token_;
  Histogram inter_token_latency_;
  Histogram e2e_request_latency_;
  Histogram request_queue_time_;
  Histogram request_prefill_time_;
  Histogram request_decode_time_;
  Histogram request_prompt_tokens_;
  Histogram request_generation_tokens_;
  Histogram kv_block_lifetime_;
  Histogram kv_block_idle_before_evict_;
  Histogram kv_block_reuse_gap_;
};

}  // namespace moeserve::engine
