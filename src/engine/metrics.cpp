#include "engine/metrics.h"

#include <algorithm>

#include <fmt/format.h>

namespace moeserve::engine {
namespace {

std::vector<double> latency_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,
          0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
}
// Block residency spans milliseconds (a hot prefix) to hours (a long-idle session).
std::vector<double> residency_buckets() {
  return {0.001, 0.01, 0.1, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0};
}
std::vector<double> token_buckets() {
  return {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000};
}

void render_histogram(std::string& out, const std::string& name, const std::string& help,
                      const std::string& labels, const Histogram& h) {
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cum = 0;
  for (size_t i = 0; i < h.bounds().size(); ++i) {
    cum += h.counts()[i];
    out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, h.bounds()[i], cum);
  }
  cum += h.counts().back();
  out += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n", name, labels, cum);
  out += fmt::format("{}_sum{{{}}} {}\n{}_count{{{}}} {}\n", name, labels, h.sum(), name, labels,
                     h.count());
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  const size_t i =
      static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  ++counts_[i];
  sum_ += v;
  ++count_;
}

EngineMetrics::EngineMetrics()
    : time_to_first_token_(latency_buckets()),
      inter_token_latency_(latency_buckets()),
      e2e_request_latency_(latency_buckets()),
      request_queue_time_(latency_buckets()),
      request_prefill_time_(latency_buckets()),
      request_decode_time_(latency_buckets()),
      request_prompt_tokens_(token_buckets()),
      request_generation_tokens_(token_buckets()),
      kv_block_lifetime_(residency_buckets()),
      kv_block_idle_before_evict_(residency_buckets()),
      kv_block_reuse_gap_(residency_buckets()) {}

void EngineMetrics::observe_kv_residency(const std::vector<double>& lifetime,
                                         const std::vector<double>& idle_before_evict,
                                         const std::vector<double>& reuse_gap) {
  if (lifetime.empty() && idle_before_evict.empty() && reuse_gap.empty()) return;
  std::lock_guard lock(mu_);
  for (double v : lifetime) kv_block_lifetime_.observe(v);
  for (double v : idle_before_evict) kv_block_idle_before_evict_.observe(v);
  for (double v : reuse_gap) kv_block_reuse_gap_.observe(v);
}

void EngineMetrics::set_scheduler_state(int64_t running, int64_t waiting, double kv_usage,
                                        int64_t pc_queries, int64_t pc_hits, int64_t preemptions) {
  std::lock_guard lock(mu_);
  s_.num_requests_running = running;
  s_.num_requests_waiting = waiting;
  s_.kv_cache_usage_perc = kv_usage;
  s_.prefix_cache_queries = pc_queries;
  s_.prefix_cache_hits = pc_hits;
  s_.num_preemptions_total = preemptions;
}

void EngineMetrics::add_generation_tokens(int64_t n) {
  std::lock_guard lock(mu_);
  s_.generation_tokens_total += n;
}

void EngineMetrics::observe_inter_token_latency(double seconds) {
  std::lock_guard lock(mu_);
  inter_token_latency_.observe(seconds);
}

void EngineMetrics::observe_ttft(double seconds) {
  std::lock_guard lock(mu_);
  time_to_first_token_.observe(seconds);
}

void EngineMetrics::record_finished(const FinishedRequest& r) {
  std::lock_guard lock(mu_);
  ++s_.request_success_total[r.finished_reason];
  s_.prompt_tokens_total += r.prompt_tokens;
  request_prompt_tokens_.observe(static_cast<double>(r.prompt_tokens));
  request_generation_tokens_.observe(static_cast<double>(r.generation_tokens));
  if (r.e2e >= 0) e2e_request_latency_.observe(r.e2e);
  if (r.queue_time >= 0) request_queue_time_.observe(r.queue_time);
  if (r.prefill_time >= 0) request_prefill_time_.observe(r.prefill_time);
  if (r.decode_time >= 0) request_decode_time_.observe(r.decode_time);
}

MetricsSnapshot EngineMetrics::snapshot() const {
  std::lock_guard lock(mu_);
  return s_;
}

std::string EngineMetrics::render_prometheus(const std::string& model_name) const {
  std::lock_guard lock(mu_);
  const std::string labels = fmt::format("model_name=\"{}\"", model_name);
  std::string out;
  auto gauge = [&](const char* name, const char* help, double v) {
    out += fmt::format("# HELP moeserve:{} {}\n# TYPE moeserve:{} gauge\nmoeserve:{}{{{}}} {}\n",
                       name, help, name, name, labels, v);
  };
  auto counter = [&](const char* name, const char* help, int64_t v) {
    out += fmt::format("# HELP moeserve:{} {}\n# TYPE moeserve:{} counter\nmoeserve:{}{{{}}} {}\n",
                       name, help, name, name, labels, v);
  };
  gauge("num_requests_running", "Requests in the running batch.",
        static_cast<double>(s_.num_requests_running));
  gauge("num_requests_waiting", "Requests waiting to be scheduled.",
        static_cast<double>(s_.num_requests_waiting));
  gauge("kv_cache_usage_perc", "Fraction of global KV blocks in use (0..1).",
        s_.kv_cache_usage_perc);
  counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
          s_.prefix_cache_queries);
  counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.", s_.prefix_cache_hits);
  counter("prompt_tokens_total", "Prompt tokens of finished requests.", s_.prompt_tokens_total);
  counter("generation_tokens_total", "Generated tokens.", s_.generation_tokens_total);
  counter("num_preemptions_total", "Preemptions (recompute).", s_.num_preemptions_total);
  out +=
      "# HELP moeserve:request_success_total Finished requests by reason.\n"
      "# TYPE moeserve:request_success_total counter\n";
  for (const char* reason : {"stop", "length", "abort", "error"}) {
    auto it = s_.request_success_total.find(reason);
    out += fmt::format("moeserve:request_success_total{{{},finished_reason=\"{}\"}} {}\n", labels,
                       reason, it == s_.request_success_total.end() ? 0 : it->second);
  }
  render_histogram(out, "moeserve:time_to_first_token_seconds", "Time to first token.", labels,
                   time_to_first_token_);
  render_histogram(out, "moeserve:inter_token_latency_seconds", "Time between output tokens.",
                   labels, inter_token_latency_);
  render_histogram(out, "moeserve:e2e_request_latency_seconds", "Arrival to finish.", labels,
                   e2e_request_latency_);
  render_histogram(out, "moeserve:request_queue_time_seconds", "Arrival to first schedule.", labels,
                   request_queue_time_);
  render_histogram(out, "moeserve:request_prefill_time_seconds", "First schedule to first token.",
                   labels, request_prefill_time_);
  render_histogram(out, "moeserve:request_decode_time_seconds", "First token to finish.", labels,
                   request_decode_time_);
  render_histogram(out, "moeserve:request_prompt_tokens", "Prompt tokens per request.", labels,
                   request_prompt_tokens_);
  render_histogram(out, "moeserve:request_generation_tokens", "Generated tokens per request.",
                   labels, request_generation_tokens_);
  render_histogram(out, "moeserve:kv_block_lifetime_seconds",
                   "Cached KV block: fill to eviction.", labels, kv_block_lifetime_);
  render_histogram(out, "moeserve:kv_block_idle_before_evict_seconds",
                   "Cached KV block: last access to eviction.", labels, kv_block_idle_before_evict_);
  render_histogram(out, "moeserve:kv_block_reuse_gap_seconds",
                   "Cached KV block: time between accesses (prefix hits).", labels,
                   kv_block_reuse_gap_);
  return out;
}

}  // namespace moeserve::engine
