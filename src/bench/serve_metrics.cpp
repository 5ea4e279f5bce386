#include "bench/serve_metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace moeserve::bench {

using nlohmann::json;

double RequestRecord::tpot() const {
  if (first_token_s < 0 || completion_tokens < 2) return -1.0;
  return (end_s - first_token_s) / static_cast<double>(completion_tokens - 1);
}

json to_json(const RequestRecord& r) {
  json j{{"index", r.index},
         {"session_id", r.session_id},
         {"turn", r.turn},
         {"lane", r.lane},
         {"dp_rank", r.dp_rank},
         {"warmup", r.warmup},
         {"ok", r.ok},
         {"http_status", r.http_status},
         {"start_s", r.start_s},
         {"ttft_s", r.ttft()},
         {"e2e_s", r.e2e()},
         {"tpot_s", r.tpot()},
         {"num_chunks", r.itl_s.size() + (r.first_token_s >= 0 ? 1 : 0)},
         {"target_input_len", r.target_input_len},
         {"target_output_len", r.target_output_len},
         {"usage_from_server", r.usage_from_server},
         {"prompt_tokens", r.prompt_tokens},
         {"completion_tokens", r.completion_tokens},
         {"server_cached_tokens", r.server_cached_tokens},
         {"trace_cached_tokens", r.trace_cached_tokens}};
  if (!r.error.empty()) j["error"] = r.error;
  return j;
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double pos = std::clamp(q, 0.0, 100.0) / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

Percentiles summarize(const std::vector<double>& v) {
  Percentiles p;
  p.count = static_cast<int64_t>(v.size());
  if (v.empty()) return p;
  double sum = 0;
  for (double x : v) sum += x;
  p.mean = sum / static_cast<double>(v.size());
  p.p50 = percentile(v, 50);
  p.p90 = percentile(v, 90);
  p.p99 = percentile(v, 99);
  p.min = *std::min_element(v.begin(), v.end());
  p.max = *std::max_element(v.begin(), v.end());
  return p;
}

json to_json(const Percentiles& p, double scale) {
  return json{{"mean", p.mean * scale}, {"p50", p.p50 * scale}, {"p90", p.p90 * scale},
              {"p99", p.p99 * scale},   {"min", p.min * scale}, {"max", p.max * scale},
              {"count", p.count}};
}

double cost_per_million(double gpu_hour_price, double tok_s_per_gpu) {
  if (gpu_hour_price <= 0 || tok_s_per_gpu <= 0) return 0.0;
  return gpu_hour_price / (tok_s_per_gpu * 3600.0 / 1e6);
}

ServeSummary summarize_records(const std::vector<RequestRecord>& records, const CostInputs& cost) {
  ServeSummary s;
  double first_start = std::numeric_limits<double>::infinity();
  double last_end = -std::numeric_limits<double>::infinity();
  std::vector<double> ttft, tpot, itl, e2e, e2e_per_tok, inv_tpot;
  for (const auto& r : records) {
    if (r.warmup) continue;
    ++s.num_requests;
    if (!r.ok) {
      ++s.num_errors;
      continue;
    }
    ++s.num_ok;
    first_start = std::min(first_start, r.start_s);
    last_end = std::max(last_end, r.end_s);
    s.input_tokens += r.prompt_tokens;
    s.output_tokens += r.completion_tokens;
    s.cached_tokens += r.server_cached_tokens;
    s.trace_cached_tokens += r.trace_cached_tokens;
    if (r.ttft() >= 0) ttft.push_back(r.ttft());
    if (r.tpot() > 0) {
      tpot.push_back(r.tpot());
      inv_tpot.push_back(1.0 / r.tpot());
    }
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
    e2e.push_back(r.e2e());
    if (r.completion_tokens > 0) e2e_per_tok.push_back(r.e2e() / r.completion_tokens);
  }
  s.error_rate = s.num_requests > 0 ? static_cast<double>(s.num_errors) / s.num_requests : 0.0;
  s.duration_s = s.num_ok > 0 ? last_end - first_start : 0.0;
  if (s.duration_s > 0) {
    const double gpus = std::max(1, cost.num_gpus);
    s.request_throughput = s.num_ok / s.duration_s;
    s.input_throughput = s.input_tokens / s.duration_s;
    s.output_throughput = s.output_tokens / s.duration_s;
    s.total_throughput = s.input_throughput + s.output_throughput;
    s.total_tok_s_per_gpu = s.total_throughput / gpus;
    s.input_tok_s_per_gpu = s.input_throughput / gpus;
    s.output_tok_s_per_gpu = s.output_throughput / gpus;
  }
  s.ttft = summarize(ttft);
  s.tpot = summarize(tpot);
  s.itl = summarize(itl);
  s.e2e = summarize(e2e);
  s.e2e_per_output_token = summarize(e2e_per_tok);
  if (s.e2e_per_output_token.p90 > 0) s.interactivity_p90 = 1.0 / s.e2e_per_output_token.p90;
  if (s.tpot.p50 > 0) s.decode_tok_s_per_user_p50 = 1.0 / s.tpot.p50;
  s.decode_tok_s_per_user_mean = summarize(inv_tpot).mean;
  if (s.itl.p50 > 0) s.inv_itl_p50 = 1.0 / s.itl.p50;
  s.cost_per_1m_total = cost_per_million(cost.gpu_hour_price, s.total_tok_s_per_gpu);
  s.cost_per_1m_input = cost_per_million(cost.gpu_hour_price, s.input_tok_s_per_gpu);
  s.cost_per_1m_output = cost_per_million(cost.gpu_hour_price, s.output_tok_s_per_gpu);
  return s;
}

json to_json(const ServeSummary& s) {
  return json{
      {"num_requests", s.num_requests},
      {"num_ok", s.num_ok},
      {"num_errors", s.num_errors},
      {"error_rate", s.error_rate},
      {"duration_s", s.duration_s},
      {"input_tokens", s.input_tokens},
      {"cached_tokens", s.cached_tokens},
      {"trace_cached_tokens", s.trace_cached_tokens},
      {"output_tokens", s.output_tokens},
      {"total_tokens", s.input_tokens + s.output_tokens},
      {"request_throughput", s.request_throughput},
      {"input_throughput", s.input_throughput},
      {"output_throughput", s.output_throughput},
      {"total_throughput", s.total_throughput},
      {"total_tok_s_per_gpu", s.total_tok_s_per_gpu},
      {"input_tok_s_per_gpu", s.input_tok_s_per_gpu},
      {"output_tok_s_per_gpu", s.output_tok_s_per_gpu},
      {"ttft_ms", to_json(s.ttft, 1e3)},
      {"tpot_ms", to_json(s.tpot, 1e3)},
      {"itl_ms", to_json(s.itl, 1e3)},
      {"e2e_ms", to_json(s.e2e, 1e3)},
      {"e2e_per_output_token_ms", to_json(s.e2e_per_output_token, 1e3)},
      {"interactivity_p90", s.interactivity_p90},
      {"decode_tok_s_per_user_p50", s.decode_tok_s_per_user_p50},
      {"decode_tok_s_per_user_mean", s.decode_tok_s_per_user_mean},
      {"inv_itl_p50", s.inv_itl_p50},
      {"cost_per_1m_total", s.cost_per_1m_total},
      {"cost_per_1m_input", s.cost_per_1m_input},
      {"cost_per_1m_output", s.cost_per_1m_output},
  };
}

}  // namespace moeserve::bench
