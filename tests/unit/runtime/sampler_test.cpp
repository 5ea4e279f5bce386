#include "runtime/sampler.h"

#include <cmath>
#include <map>
#include <set>

#include <gtest/gtest.h>

namespace moeserve::runtime {
namespace {

using sched::SamplingParams;

std::vector<float> logits8() { return {1.0f, 3.0f, 2.5f, -1.0f, 0.0f, 2.9f, -4.0f, 0.5f}; }

int32_t draw(Sampler& s, const SamplingParams& p, int32_t out_index = 0,
             const PenaltyState* pen = nullptr, std::vector<float> l = logits8()) {
  SampleInput in{&p, 7, out_index, pen};
  return s.sample(l, in).token_id;
}

TEST(Sampler, GreedyAndTopK1) {
  Sampler s(1);
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(draw(s, p), 1);
  p.temperature = 1.3f;
  p.top_k = 1;
  for (int i = 0; i < 20; ++i) EXPECT_EQ(draw(s, p, i), 1);
}

TEST(Sampler, SeededIsReproducibleAndIndexDependent) {
  Sampler a(1), b(999);
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  std::vector<int32_t> ta, tb;
  for (int i = 0; i < 64; ++i) {
    ta.push_back(draw(a, p, i));
    tb.push_back(draw(b, p, i));
  }
  EXPECT_EQ(ta, tb);
  EXPECT_GT(std::set<int32_t>(ta.begin(), ta.end()).size(), 2u);
  p.seed = 43;
  std::vector<int32_t> tc;
  for (int i = 0; i < 64; ++i) tc.push_back(draw(a, p, i));
  EXPECT_NE(ta, tc);
}

TEST(Sampler, TopPAndMinPRestrictSupport) {
  Sampler s(3);
  SamplingParams p;
  p.temperature = 1.0f;
  // softmax of logits8: tokens 1 (3.0), 5 (2.9), 2 (2.5) hold ~0.30+0.27+0.18 = 0.75.
  p.top_p = 0.7f;
  for (int i = 0; i < 300; ++i) {
    const int32_t t = draw(s, p, i);
    EXPECT_TRUE(t == 1 || t == 5 || t == 2) << t;
  }
  p.top_p = 1.0f;
  p.min_p = 0.8f;  // keep tokens with prob >= 0.8 * p(1): tokens 1 and 5
  std::set<int32_t> seen;
  for (int i = 0; i < 300; ++i) seen.insert(draw(s, p, i));
  EXPECT_EQ(seen, (std::set<int32_t>{1, 5}));
}

TEST(Sampler, PenaltiesFollowOpenAi) {
  Sampler s(4);
  SamplingParams p;
  p.temperature = 0;
  PenaltyState pen;
  const std::vector<int32_t> prompt = {5};
  const std::vector<int32_t> out = {1, 1};
  // frequency: logit[1] = 3.0 - 2 * 0.3 = 2.4 < 2.9 → token 5.
  p.frequency_penalty = 0.3f;
  pen.init(prompt, out, 8);
  EXPECT_EQ(draw(s, p, 2, &pen), 5);
  // presence: subtracted once: 3.0 - 0.05 = 2.95 > 2.9 → token 1 stays.
  p.frequency_penalty = 0;
  p.presence_penalty = 0.05f;
  EXPECT_EQ(draw(s, p, 2, &pen), 1);
  // repetition (prompt + output): 1 → 3.0/1.3 = 2.31, 5 → 2.9/1.3 = 2.23; 2 (2.5) wins.
  p.presence_penalty = 0;
  p.repetition_penalty = 1.3f;
  EXPECT_EQ(draw(s, p, 2, &pen), 2);
  // A negative logit is multiplied: token 3 (-1.0) in the prompt gets more negative.
  std::vector<float> l = {-1.0f, -1.1f};
  PenaltyState pen2;
  pen2.init(std::vector<int32_t>{0}, {}, 2);
  SampleInput in{&p, -1, 0, &pen2};
  EXPECT_EQ(s.sample(l, in).token_id, 1);
  EXPECT_FLOAT_EQ(l[0], -1.3f);
}

TEST(Sampler, MinTokensMasksEosAndStopTokens) {
  Sampler s(5);
  SamplingParams p;
  p.temperature = 0;
  p.min_tokens = 2;
  p.stop_token_ids = {5};
  std::vector<float> l = logits8();
  l[7] = 10.0f;  // EOS (7 here) would win
  SampleInput in{&p, 7, 1, nullptr};
  EXPECT_EQ(s.sample(l, in).token_id, 1);  // EOS and 5 masked
  l = logits8();
  l[7] = 10.0f;
  in.num_output_tokens = 2;
  EXPECT_EQ(s.sample(l, in).token_id, 7);
}

TEST(Sampler, LogprobsAreRawWithRankAndTopN) {
  Sampler s(6);
  SamplingParams p;
  p.temperature = 0.5f;
  p.seed = 1;
  p.logprobs = 3;
  std::vector<float> l = logits8();
  const std::vector<float> raw = l;
  SampleInput in{&p, -1, 0, nullptr};
  SampleResult r = s.sample(l, in);
  ASSERT_TRUE(r.has_logprobs);
  double lse = 0;
  for (float v : raw) lse += std::exp(v);
  lse = std::log(lse);
  EXPECT_NEAR(r.logprob.logprob, raw[static_cast<size_t>(r.token_id)] - lse, 1e-5);
  ASSERT_EQ(r.logprob.top.size(), 3u);
  EXPECT_EQ(r.logprob.top[0].first, 1);
  EXPECT_EQ(r.logprob.top[1].first, 5);
  EXPECT_EQ(r.logprob.top[2].first, 2);
  EXPECT_NEAR(r.logprob.top[0].second, 3.0 - lse, 1e-5);
}

TEST(SamplingParams, Validate) {
  SamplingParams p;
  EXPECT_TRUE(p.validate().has_value());
  p.top_p = 0;
  EXPECT_FALSE(p.validate().has_value());
  p = {};
  p.min_tokens = 20;
  p.max_tokens = 10;
  EXPECT_FALSE(p.validate().has_value());
}

}  // namespace
}  // namespace moeserve::runtime
