// Per-request records of a serving benchmark and the summary the field reports from them
// (spec/serving.md §2.3 and §3, InferenceX/AgentX conventions): throughput per GPU counting cached
// + uncached input + output tokens, TTFT/TPOT/ITL/E2E percentiles, E2E-normalised interactivity 1 /
// P90(E2EL / OSL), error rate, and $ per 1M tokens. Pure arithmetic; no I/O.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moeserve::bench {

struct RequestRecord {
  int64_t index = 0;
  std::string session_id;
  int32_t turn = 0;
  int32_t lane = 0;
  int32_t dp_rank = 0;
  bool warmup = false;
  bool ok = false;
  int32_t http_status = 0;
  std::string error;
  // Seconds from the benchmark start.
  double start_s = 0.0;
  double first_token_s = -1.0;  // first chunk carrying generated text; < 0 if none
  double end_s = 0.0;
  std::vector<double> itl_s;  // gaps between successive content chunks
  // Requested lengths (trace / ISL-OSL).
  int32_t target_input_len = 0;
  int32_t target_output_len = 0;
  // Server-reported usage (stream_options.include_usage); usage_from_server = false if absent,
  // then the target lengths are used.
  bool usage_from_server = false;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t server_cached_tokens = 0;  // usage.prompt_tokens_details.cached_tokens
  int64_t trace_cached_tokens = 0;   // idealised infinite cache over the trace's hash ids

  [[nodiscard]] double ttft() const { return first_token_s >= 0 ? first_token_s - start_s : -1; }
  [[nodiscard]] double e2e() const { return end_s - start_s; }
  // (E2E - TTFT) / (output - 1); < 0 when undefined (one token or no first token).
  [[nodiscard]] double tpot() const;
};

[[nodiscard]] nlohmann::json to_json(const RequestRecord& r);

struct Percentiles {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, min = 0, max = 0;
  int64_t count = 0;
};
// Linear interpolation between closest ranks (numpy's default); empty input gives all zeros.
[[nodiscard]] double percentile(std::vector<double> values, double q);
[[nodiscard]] Percentiles summarize(const std::vector<double>& values);
[[nodiscard]] nlohmann::json to_json(const Percentiles& p, double scale = 1.0);

struct CostInputs {
  int32_t num_gpus = 1;
  double gpu_hour_price = 0.0;  // $/GPU/hr; 0 = no cost figures
};

struct ServeSummary {
  int64_t num_requests = 0;  // measured (warm-up excluded)
  int64_t num_ok = 0;
  int64_t num_errors = 0;
  double error_rate = 0.0;
  double duration_s = 0.0;    // last end - first start over measured successful requests
  int64_t input_tokens = 0;   // prompt tokens incl. cached
  int64_t cached_tokens = 0;  // server-reported
  int64_t trace_cached_tokens = 0;
  int64_t output_tokens = 0;
  double request_throughput = 0.0;  // req/s
  double input_throughput = 0.0;    // tok/s (whole deployment)
  double output_throughput = 0.0;
  double total_throughput = 0.0;
  double total_tok_s_per_gpu = 0.0;
  double input_tok_s_per_gpu = 0.0;
  double output_tok_s_per_gpu = 0.0;
  Percentiles ttft, tpot, itl, e2e;
  Percentiles e2e_per_output_token;         // E2EL_i / OSL_i
  double interactivity_p90 = 0.0;           // 1 / P90(E2EL / OSL), tok/s per user
  double decode_tok_s_per_user_p50 = 0.0;   // 1 / P50(TPOT)
  double decode_tok_s_per_user_mean = 0.0;  // mean over requests of 1 / TPOT_i
  double inv_itl_p50 = 0.0;                 // 1 / P50(ITL)
  double cost_per_1m_total = 0.0;           // $ per 1M tokens; 0 if no price
  double cost_per_1m_input = 0.0;
  double cost_per_1m_output = 0.0;
};

// $ per 1M tokens = ($/GPU/hr) / (tok/s/GPU * 3600 / 1e6); 0 when either side is 0.
[[nodiscard]] double cost_per_million(double gpu_hour_price, double tok_s_per_gpu);
[[nodiscard]] ServeSummary summarize_records(const std::vector<RequestRecord>& records,
                                             const CostInputs& cost);
[[nodiscard]] nlohmann::json to_json(const ServeSummary& s);

}  // namespace moeserve::bench
