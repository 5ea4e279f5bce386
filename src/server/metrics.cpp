#include "server/metrics.h"

#include <cmath>

#include <fmt/format.h>

namespace moeserve::server {
namespace {

std::vector<double> latency_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,
          0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0};
}

std::vector<double> token_buckets() {
  return {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000};
}

std::string format_double(double v) {
  if (std::isinf(v)) return "+Inf";
  return fmt::format("{}", v);
}

constexpr std::array<const char*, 4> kFinishNames = {"stop", "length", "abort", "error"};

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)),
      buckets_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size())) {
  for (size_t i = 0; i < bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::observe(double value) {
  if (!(value >= 0.0)) value = 0.0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (value <= bounds_[i]) {
      buckets_[i].fetch_add(1, std::memory_order_relaxed);
      break;
    }
  }
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_micros_.fetch_add(static_cast<uint64_t>(std::llround(value * 1e6)),
                        std::memory_order_relaxed);
}

void Histogram::render(const std::string& name, const std::string& labels, std::string& out) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += buckets_[i].load(std::memory_order_relaxed);
    out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, format_double(bounds_[i]),
                       cumulative);
  }
  const uint64_t count = count_.load(std::memory_order_relaxed);
  out += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n", name, labels, count);
  out += fmt::format("{}_sum{{{}}} {}\n", name, labels,
                     static_cast<double>(sum_micros_.load(std::memory_order_relaxed)) / 1e6);
  out += fmt::format("{}_count{{{}}} {}\n", name, labels, count);
}

ServerMetrics::ServerMetrics(std::string model_name)
    : labels_(fmt::format("model_name=\"{}\"", model_name)),
      ttft_(latency_buckets()),
      itl_(latency_buckets()),
      e2e_(latency_buckets()),
      request_prompt_tokens_(token_buckets()),
      request_generation_tokens_(token_buckets()) {}

void ServerMetrics::record_finished(FinishReason reason, double e2e_seconds, int64_t prompt_tokens,
                                    int64_t generation_tokens) {
  size_t idx = 3;
  switch (reason) {
    case FinishReason::kStop:
      idx = 0;
      break;
    case FinishReason::kLength:
      idx = 1;
      break;
    case FinishReason::kAbort:
      idx = 2;
      break;
    default:
      idx = 3;
  }
  finished_[idx].fetch_add(1, std::memory_order_relaxed);
  e2e_.observe(e2e_seconds);
  request_prompt_tokens_.observe(static_cast<double>(prompt_tokens));
  request_generation_tokens_.observe(static_cast<double>(generation_tokens));
}

void ServerMetrics::record_http_status(int status) {
  size_t idx = 5;
  if (status < 400) {
    idx = 0;
  } else if (status == 401) {
    idx = 2;
  } else if (status == 404) {
    idx = 3;
  } else if (status < 500 && status != 400) {
    idx = 4;
  } else if (status == 400) {
    idx = 1;
  }
  http_status_[idx].fetch_add(1, std::memory_order_relaxed);
}

std::string ServerMetrics::render(const EngineStats& engine, const std::string& engine_text) const {
  std::string out = engine_text;
  out.reserve(8192);
  const std::string& l = labels_;
  auto gauge = [&](const char* name, const char* help, double v) {
    out += fmt::format("# HELP moeserve:{} {}\n# TYPE moeserve:{} gauge\nmoeserve:{}{{{}}} {}\n",
                       name, help, name, name, l, v);
  };
  auto counter = [&](const char* name, const char* help, double v) {
    out += fmt::format("# HELP moeserve:{} {}\n# TYPE moeserve:{} counter\nmoeserve:{}{{{}}} {}\n",
                       name, help, name, name, l, v);
  };
  auto histogram = [&](const char* name, const char* help, const Histogram& h) {
    out += fmt::format("# HELP moeserve:{} {}\n# TYPE moeserve:{} histogram\n", name, help, name,
                       name);
    h.render(fmt::format("moeserve:{}", name), l, out);
  };
  if (engine_text.empty()) {
    gauge("num_requests_running", "Requests in model execution batches.",
          engine.num_requests_running);
    gauge("num_requests_waiting", "Requests waiting to be processed.", engine.num_requests_waiting);
    gauge("kv_cache_usage_perc", "KV-cache usage (1 means 100 percent).", engine.kv_cache_usage);
    gauge("kv_cache_blocks_total", "KV-cache blocks in the pool.",
          static_cast<double>(engine.kv_blocks_total));
    gauge("kv_cache_blocks_free", "Free KV-cache blocks.",
          static_cast<double>(engine.kv_blocks_free));
    counter("prefix_cache_queries", "Prefix-cache queries, in tokens.",
            static_cast<double>(engine.prefix_cache_queries));
    counter("prefix_cache_hits", "Prefix-cache hits, in tokens.",
            static_cast<double>(engine.prefix_cache_hits));
    counter("num_preemptions_total", "Cumulative number of preemptions.",
            static_cast<double>(engine.num_preemptions));
    counter("prompt_tokens_total", "Prefill tokens processed.",
            static_cast<double>(prompt_tokens_.load(std::memory_order_relaxed)));
    counter("generation_tokens_total", "Generation tokens processed.",
            static_cast<double>(generation_tokens_.load(std::memory_order_relaxed)));
    out +=
        "# HELP moeserve:request_success_total Finished requests by finish reason.\n"
        "# TYPE moeserve:request_success_total counter\n";
    for (size_t i = 0; i < kFinishNames.size(); ++i) {
      out += fmt::format("moeserve:request_success_total{{{},finished_reason=\"{}\"}} {}\n", l,
                         kFinishNames[i], finished_[i].load(std::memory_order_relaxed));
    }
    histogram("time_to_first_token_seconds", "Time to first token.", ttft_);
    histogram("inter_token_latency_seconds", "Time between generated tokens.", itl_);
    histogram("e2e_request_latency_seconds", "End-to-end request latency.", e2e_);
    histogram("request_prompt_tokens", "Prompt tokens per request.", request_prompt_tokens_);
    histogram("request_generation_tokens", "Generated tokens per request.",
              request_generation_tokens_);
  }
  gauge("http_connections_open", "Open HTTP connections.",
        static_cast<double>(open_connections_.load(std::memory_order_relaxed)));
  gauge("http_streams_active", "Streaming (SSE) responses in progress.",
        static_cast<double>(active_streams_.load(std::memory_order_relaxed)));
  counter("http_client_disconnects_total", "Requests aborted because the client went away.",
          static_cast<double>(client_disconnects_.load(std::memory_order_relaxed)));
  static constexpr std::array<const char*, 6> kStatus = {"2xx", "400", "401", "404", "4xx", "5xx"};
  out +=
      "# HELP moeserve:http_responses_total HTTP responses by status class.\n"
      "# TYPE moeserve:http_responses_total counter\n";
  for (size_t i = 0; i < kStatus.size(); ++i) {
    out += fmt::format("moeserve:http_responses_total{{{},status=\"{}\"}} {}\n", l, kStatus[i],
                       http_status_[i].load(std::memory_order_relaxed));
  }
  return out;
}

}  // namespace moeserve::server
