// Percentiles, throughput, interactivity, error rate and cost on hand-built request records.
#include "bench/serve_metrics.h"

#include <gtest/gtest.h>

namespace moeserve::bench {
namespace {

RequestRecord make(double start, double ttft, double end, int64_t in, int64_t out, bool ok = true) {
  RequestRecord r;
  r.ok = ok;
  r.start_s = start;
  r.first_token_s = start + ttft;
  r.end_s = end;
  r.prompt_tokens = in;
  r.completion_tokens = out;
  return r;
}

TEST(Percentile, LinearInterpolationLikeNumpy) {
  const std::vector<double> v = {5, 1, 4, 2, 3, 10, 7, 9, 6, 8};  // 1..10
  EXPECT_DOUBLE_EQ(percentile(v, 50), 5.5);
  EXPECT_DOUBLE_EQ(percentile(v, 90), 9.1);
  EXPECT_NEAR(percentile(v, 99), 9.91, 1e-12);
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 10);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0);
  EXPECT_DOUBLE_EQ(percentile({3.0}, 90), 3.0);
  const Percentiles p = summarize(v);
  EXPECT_DOUBLE_EQ(p.mean, 5.5);
  EXPECT_EQ(p.count, 10);
  EXPECT_DOUBLE_EQ(p.min, 1);
  EXPECT_DOUBLE_EQ(p.max, 10);
}

TEST(Summary, CountsTheWayInferenceXDoes) {
  std::vector<RequestRecord> recs;
  // Four requests from t=1 to t=5: 4 s window.
  recs.push_back(make(1.0, 0.5, 3.0, 1000, 11));  // e2e 2.0, tpot (3-1.5)/10 = 0.15
  recs.push_back(make(1.5, 0.2, 2.5, 2000, 5));   // e2e 1.0, tpot 0.8/4 = 0.2
  recs.push_back(make(2.0, 1.0, 5.0, 500, 21));   // e2e 3.0, tpot 2.0/20 = 0.1
  recs.push_back(make(2.0, 0.1, 4.0, 500, 3));    // e2e 2.0, tpot 1.9/2 = 0.95
  recs[0].server_cached_tokens = 640;
  recs[0].trace_cached_tokens = 640;
  recs[0].itl_s = {0.1, 0.2};
  recs[1].itl_s = {0.3};
  RequestRecord warm = make(0.0, 0.1, 100.0, 99999, 99999);
  warm.warmup = true;
  recs.push_back(warm);
  RequestRecord bad = make(3.0, 0.0, 3.1, 0, 0, false);
  bad.first_token_s = -1;
  recs.push_back(bad);

  const ServeSummary s = summarize_records(recs, {2, 1.95});
  EXPECT_EQ(s.num_requests, 5);
  EXPECT_EQ(s.num_ok, 4);
  EXPECT_EQ(s.num_errors, 1);
  EXPECT_DOUBLE_EQ(s.error_rate, 0.2);
  EXPECT_DOUBLE_EQ(s.duration_s, 4.0);
  EXPECT_EQ(s.input_tokens, 4000);
  EXPECT_EQ(s.output_tokens, 40);
  EXPECT_EQ(s.cached_tokens, 640);
  EXPECT_EQ(s.trace_cached_tokens, 640);
  EXPECT_DOUBLE_EQ(s.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(s.total_throughput, 1010.0);
  EXPECT_DOUBLE_EQ(s.total_tok_s_per_gpu, 505.0);
  EXPECT_DOUBLE_EQ(s.output_tok_s_per_gpu, 5.0);
  // E2E / OSL = {2/11, 1/5, 3/21, 2/3}; P90 by interpolation.
  const double p90 = percentile({2.0 / 11, 1.0 / 5, 3.0 / 21, 2.0 / 3}, 90);
  EXPECT_DOUBLE_EQ(s.interactivity_p90, 1.0 / p90);
  EXPECT_DOUBLE_EQ(s.ttft.p50, percentile({0.5, 0.2, 1.0, 0.1}, 50));
  EXPECT_DOUBLE_EQ(s.tpot.p50, percentile({0.15, 0.2, 0.1, 0.95}, 50));
  EXPECT_DOUBLE_EQ(s.decode_tok_s_per_user_p50, 1.0 / s.tpot.p50);
  EXPECT_EQ(s.itl.count, 3);
  EXPECT_DOUBLE_EQ(s.itl.p50, 0.2);
  EXPECT_DOUBLE_EQ(s.e2e.p99, percentile({2.0, 1.0, 3.0, 2.0}, 99));
  // $ per 1M = price / (tok/s/GPU * 3600 / 1e6).
  EXPECT_DOUBLE_EQ(s.cost_per_1m_total, 1.95 / (505.0 * 3600 / 1e6));
  EXPECT_DOUBLE_EQ(s.cost_per_1m_output, 1.95 / (5.0 * 3600 / 1e6));
}

TEST(Cost, SpecExample) {
  // serving.md §2.3: 954,000 tok/s/GPU at $2.652/GPU/hr is about $0.00077 per 1M tokens.
  EXPECT_NEAR(cost_per_million(2.652, 954000), 0.00077, 0.000005);
  EXPECT_EQ(cost_per_million(0.0, 100), 0.0);
  EXPECT_EQ(cost_per_million(1.0, 0.0), 0.0);
}

TEST(Summary, EmptyAndAllFailed) {
  EXPECT_EQ(summarize_records({}, {}).num_requests, 0);
  std::vector<RequestRecord> recs(3);
  const ServeSummary s = summarize_records(recs, {});
  EXPECT_EQ(s.num_errors, 3);
  EXPECT_DOUBLE_EQ(s.error_rate, 1.0);
  EXPECT_EQ(s.total_throughput, 0.0);
}

}  // namespace
}  // namespace moeserve::bench
