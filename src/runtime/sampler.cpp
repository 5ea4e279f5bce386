#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "common/check.h"

namespace moeserve::runtime {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// log-sum-exp of a row (finite entries only).
double log_sum_exp(std::span<const float> x) {
  float m = kNegInf;
  for (float v : x) m = std::max(m, v);
  if (m == kNegInf) return kNegInf;
  double s = 0.0;
  for (float v : x) s += std::exp(static_cast<double>(v) - m);
  return m + std::log(s);
}

}  // namespace

void PenaltyState::init(std::span<const int32_t> prompt, std::span<const int32_t> outputs,
                        int32_t vocab_size) {
  output_counts.clear();
  seen.assign(static_cast<size_t>(vocab_size), 0);
  for (int32_t t : prompt) {
    if (t >= 0 && t < vocab_size) seen[static_cast<size_t>(t)] = 1;
  }
  for (int32_t t : outputs) add_output(t, vocab_size);
}

void PenaltyState::add_output(int32_t token, int32_t vocab_size) {
  if (token < 0 || token >= vocab_size) return;
  ++output_counts[token];
  if (!seen.empty()) seen[static_cast<size_t>(token)] = 1;
}

bool needs_penalty_state(const sched::SamplingParams& p) {
  return p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f || p.repetition_penalty != 1.0f;
}

Sampler::Sampler(uint64_t unseeded_seed) : unseeded_rng_(unseeded_seed) {}

SampleResult Sampler::sample(std::span<float> logits, const SampleInput& in) {
  MS_CHECK(in.params != nullptr);
  const sched::SamplingParams& p = *in.params;
  const int32_t vocab = static_cast<int32_t>(logits.size());
  SampleResult result;
  if (p.logprobs >= 0) raw_.assign(logits.begin(), logits.end());

  // ---- penalties
  if (in.penalties != nullptr) {
    const PenaltyState& ps = *in.penalties;
    if (p.repetition_penalty != 1.0f && !ps.seen.empty()) {
      for (int32_t t = 0; t < vocab; ++t) {
        if (!ps.seen[static_cast<size_t>(t)]) continue;
        float& l = logits[static_cast<size_t>(t)];
        l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
      }
    }
    for (const auto& [t, count] : ps.output_counts) {
      if (t < 0 || t >= vocab) continue;
      logits[static_cast<size_t>(t)] -=
          p.frequency_penalty * static_cast<float>(count) + p.presence_penalty;
    }
  }
  // ---- min_tokens: EOS and stop tokens cannot end the output early
  if (in.num_output_tokens < p.min_tokens) {
    if (!p.ignore_eos && in.eos_token_id >= 0 && in.eos_token_id < vocab) {
      logits[static_cast<size_t>(in.eos_token_id)] = kNegInf;
    }
    for (int32_t t : p.stop_token_ids) {
      if (t >= 0 && t < vocab) logits[static_cast<size_t>(t)] = kNegInf;
    }
  }

  int32_t token = 0;
  if (p.greedy()) {
    token = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  } else {
    // ---- temperature → probabilities
    for (float& l : logits) l /= p.temperature;
    float m = *std::max_element(logits.begin(), logits.end());
    std::vector<double> pr(static_cast<size_t>(vocab));
    double sum = 0.0;
    for (int32_t t = 0; t < vocab; ++t) {
      const double e = std::exp(static_cast<double>(logits[static_cast<size_t>(t)]) - m);
      pr[static_cast<size_t>(t)] = e;
      sum += e;
    }
    for (double& v : pr) v /= sum;
    // ---- min-p: drop tokens below min_p × the top probability
    if (p.min_p > 0.0f) {
      const double top = *std::max_element(pr.begin(), pr.end());
      for (double& v : pr) {
        if (v < p.min_p * top) v = 0.0;
      }
    }
    // ---- top-k and top-p over the sorted order
    const bool use_top_k = p.top_k > 0 && p.top_k < vocab;
    if (use_top_k || p.top_p < 1.0f) {
      order_.resize(static_cast<size_t>(vocab));
      std::iota(order_.begin(), order_.end(), 0);
      auto by_prob = [&](int32_t a, int32_t b) {
        const double pa = pr[static_cast<size_t>(a)], pb = pr[static_cast<size_t>(b)];
        return pa != pb ? pa > pb : a < b;
      };
      const int32_t k = use_top_k ? p.top_k : vocab;
      std::partial_sort(order_.begin(), order_.begin() + k, order_.end(), by_prob);
      double kept_mass = 0.0;
      for (int32_t i = 0; i < k; ++i)
        kept_mass += pr[static_cast<size_t>(order_[static_cast<size_t>(i)])];
      // Keep the smallest prefix whose (renormalised) mass reaches top_p; always keep the first.
      int32_t keep = k;
      if (p.top_p < 1.0f && kept_mass > 0.0) {
        double cum = 0.0;
        for (int32_t i = 0; i < k; ++i) {
          cum += pr[static_cast<size_t>(order_[static_cast<size_t>(i)])] / kept_mass;
          if (cum >= p.top_p) {
            keep = i + 1;
            break;
          }
        }
      }
      for (int32_t i = keep; i < vocab; ++i)
        pr[static_cast<size_t>(order_[static_cast<size_t>(i)])] = 0.0;
    }
    double total = 0.0;
    for (double v : pr) total += v;
    // ---- draw
    double u = 0.0;
    if (p.seed.has_value()) {
      std::mt19937_64 rng(
          splitmix64(*p.seed ^ splitmix64(static_cast<uint64_t>(in.num_output_tokens))));
      u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    } else {
      u = std::uniform_real_distribution<double>(0.0, 1.0)(unseeded_rng_);
    }
    const double target = u * total;
    double cum = 0.0;
    token = -1;
    int32_t last_nonzero = 0;
    for (int32_t t = 0; t < vocab; ++t) {
      const double v = pr[static_cast<size_t>(t)];
      if (v <= 0.0) continue;
      last_nonzero = t;
      cum += v;
      if (cum > target) {
        token = t;
        break;
      }
    }
    if (token < 0) token = last_nonzero;
  }

  // ---- logprobs of the raw logits
  if (p.logprobs >= 0) {
    const double lse = log_sum_exp(raw_);
    result.has_logprobs = true;
    sched::TokenLogprob& lp = result.logprob;
    lp.token_id = token;
    const float tok_logit = raw_[static_cast<size_t>(token)];
    lp.logprob = static_cast<float>(tok_logit - lse);
    int32_t rank = 1;
    for (float v : raw_) rank += v > tok_logit ? 1 : 0;
    lp.rank = rank;
    const int32_t n = std::min(p.logprobs, vocab);
    if (n > 0) {
      order_.resize(static_cast<size_t>(vocab));
      std::iota(order_.begin(), order_.end(), 0);
      std::partial_sort(
          order_.begin(), order_.begin() + n, order_.end(), [&](int32_t a, int32_t b) {
            const float la = raw_[static_cast<size_t>(a)], lb = raw_[static_cast<size_t>(b)];
            return la != lb ? la > lb : a < b;
          });
      for (int32_t i = 0; i < n; ++i) {
        const int32_t t = order_[static_cast<size_t>(i)];
        lp.top.emplace_back(t, static_cast<float>(raw_[static_cast<size_t>(t)] - lse));
      }
    }
    raw_.clear();
  }
  result.token_id = token;
  return result;
}

}  // namespace moeserve::runtime
