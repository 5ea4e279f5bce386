// `moeserve bench serve`: drives an OpenAI-compatible server over streaming /v1/completions or
// /v1/chat/completions with a fixed-length random workload or a JSONL trace, in session lanes
// (--concurrency) or Poisson arrivals (--request-rate), scrapes /metrics once a second, and
// summarises per-request records the way InferenceX/AgentX count them (serve_metrics.h).
// Every loop is bounded by a request count and a deadline.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_result.h"
#include "bench/serve_metrics.h"
#include "common/result.h"

namespace moeserve::bench {

struct ServeBenchConfig {
  std::string base_url = "http://127.0.0.1:8000";
  std::string model;                     // empty: the first id of GET /v1/models
  std::string endpoint = "completions";  // completions | chat
  std::string api_key;
  // Workload: a trace file, else fixed-length random prompts.
  std::string trace;
  int32_t isl = 1024;
  int32_t osl = 128;
  // Load: concurrency lanes, or Poisson arrivals of sessions at request_rate/s (0 = lanes) with at
  // most max_concurrency in flight.
  int32_t concurrency = 1;
  double request_rate = 0.0;
  int32_t max_concurrency = 256;
  int32_t warmup = 0;  // warm-up requests per lane, excluded from the summary
  // AgentX: each lane's first session starts at a uniformly random 25-75% point of its turns.
  bool random_lane_start = false;
  double duration_s = 600.0;
  int64_t max_requests = 200;  // measured requests (per DP rank)
  double request_timeout_s = 600.0;
  double max_idle_s = 300.0;  // per-trajectory idle cap (AgentX)
  double idle_scale = 1.0;    // multiplies trace idle gaps (0 = no idle)
  bool ignore_eos = true;     // ignore_eos + min_tokens = max_tokens: exact output lengths
  double temperature = 0.0;
  int32_t token_lo = 32;  // token-id prompts draw ids from [token_lo, token_hi)
  int32_t token_hi = 127;
  uint64_t seed = 0;
  bool cache_bust = true;  // salt prompts per run so a rerun does not hit the previous run's cache
  // Cost and normalisation.
  int32_t num_gpus = 1;
  double gpu_hour_price = 0.0;
  // /metrics scrape period; 0 disables scraping.
  double metrics_interval_s = 1.0;
  // DP replays (seed.md): identical requests on every rank, all at once (mirror) or rank r starting
  // r * lag_seconds later (lag). Rank r is addressed with the X-data-parallel-rank header.
  std::string dp_replay = "none";  // none | mirror | lag
  int32_t dp_size = 1;
  double lag_seconds = 5.0;
  // Output.
  std::string output_json;
  bool save_requests = true;
  double max_error_rate = 0.10;
};

[[nodiscard]] Status validate(const ServeBenchConfig& config);
[[nodiscard]] nlohmann::json to_json(const ServeBenchConfig& config);

struct PrefixCacheScrape {
  bool available = false;
  double queries = 0, hits = 0;                     // deltas over the run
  double prompt_tokens = 0, generation_tokens = 0;  // server counters' deltas (if exposed)
  bool has_token_counters = false;
  std::vector<std::array<double, 3>> samples;  // (t_s, queries, hits) cumulative
  [[nodiscard]] double hit_ratio() const { return queries > 0 ? hits / queries : 0.0; }
};

struct ServeBenchOutput {
  BenchResult result;
  nlohmann::json json;  // result.to_json() + server info + per-request records
  ServeSummary summary;
  std::vector<RequestRecord> records;
  PrefixCacheScrape scrape;
  bool failed = false;  // error rate above max_error_rate, or no successful request
};

[[nodiscard]] Result<ServeBenchOutput> run_serve_bench(const ServeBenchConfig& config);
[[nodiscard]] std::string format_summary_table(const ServeBenchOutput& output);

// Sums the samples of the named metrics (any labels) in Prometheus text; nullopt if none appear.
[[nodiscard]] std::optional<double> prometheus_sum(std::string_view text,
                                                   const std::vector<std::string>& names);

}  // namespace moeserve::bench
