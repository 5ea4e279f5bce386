// ServerMetrics: request-level counters and latency histograms measured at the HTTP edge, rendered
// with the engine's gauges (EngineStats) as Prometheus text under the `moeserve:` prefix (vLLM's
// names, spec/serving.md §4.12). All recording methods are thread-safe and lock-free.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "server/generation_service.h"

namespace moeserve::server {

// A fixed-bucket histogram of non-negative values (seconds or counts).
class Histogram final {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // Appends the _bucket/_sum/_count lines of `name` with `labels` ("k=\"v\"").
  void render(const std::string& name, const std::string& labels, std::string& out) const;
  [[nodiscard]] uint64_t count() const { return count_.load(std::memory_order_relaxed); }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // one per bound, +Inf is count_
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_micros_{0};  // sum * 1e6, so it fits an integer atomic
};

class ServerMetrics final {
 public:
  explicit ServerMetrics(std::string model_name);

  void record_prompt_tokens(int64_t n) { prompt_tokens_.fetch_add(n, std::memory_order_relaxed); }
  void record_generation_tokens(int64_t n) {
    generation_tokens_.fetch_add(n, std::memory_order_relaxed);
  }
  void record_ttft(double seconds) { ttft_.observe(seconds); }
  void record_itl(double seconds) { itl_.observe(seconds); }
  // A request (one choice) that ended; reason is stop|length|abort|error.
  void record_finished(FinishReason reason, double e2e_seconds, int64_t prompt_tokens,
                       int64_t generation_tokens);
  void record_http_status(int status);
  void connection_opened() { open_connections_.fetch_add(1, std::memory_order_relaxed); }
  void connection_closed() { open_connections_.fetch_sub(1, std::memory_order_relaxed); }
  void stream_started() { active_streams_.fetch_add(1, std::memory_order_relaxed); }
  void stream_ended() { active_streams_.fetch_sub(1, std::memory_order_relaxed); }
  void client_disconnected() { client_disconnects_.fetch_add(1, std::memory_order_relaxed); }

  // `engine_text`: the engine's own rendering of the request metrics (may be empty, see
  // GenerationService::engine_metrics_text); the HTTP-level metrics are always added.
  [[nodiscard]] std::string render(const EngineStats& engine,
                                   const std::string& engine_text = {}) const;

 private:
  std::string labels_;  // model_name="..."
  std::atomic<int64_t> prompt_tokens_{0};
  std::atomic<int64_t> generation_tokens_{0};
  std::array<std::atomic<int64_t>, 4> finished_{};     // stop, length, abort, error
  std::array<std::atomic<int64_t>, 6> http_status_{};  // 2xx 4xx(400) 401 404 413/422/other 5xx
  std::atomic<int64_t> open_connections_{0};
  std::atomic<int64_t> active_streams_{0};
  std::atomic<int64_t> client_disconnects_{0};
  Histogram ttft_;
  Histogram itl_;
  Histogram e2e_;
  Histogram request_prompt_tokens_;
  Histogram request_generation_tokens_;
};

}  // namespace moeserve::server
