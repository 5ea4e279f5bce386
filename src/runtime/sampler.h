// Sampler: one logits row → one token, with OpenAI/vLLM semantics. Order: repetition penalty
// (prompt + output tokens: positive logits divided, negative multiplied), frequency and presence
// penalties (output tokens), min_tokens masking of EOS/stop tokens, then greedy argmax or
// temperature → min-p → top-k → top-p → draw. Logprobs are of the raw logits (vLLM's default
// raw_logprobs). A seeded request draws from mt19937_64 seeded by (seed, output index), so its
// tokens do not depend on batching, step boundaries or preemption.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "sched/sampling_params.h"
#include "sched/scheduler_output.h"

namespace moeserve::runtime {

// Per-request token statistics the penalties need; the runner keeps one per request.
struct PenaltyState {
  std::unordered_map<int32_t, int32_t> output_counts;
  std::vector<uint8_t> seen;  // [vocab] 1 if the token is in prompt or output (repetition)

  void init(std::span<const int32_t> prompt, std::span<const int32_t> outputs, int32_t vocab_size);
  void add_output(int32_t token, int32_t vocab_size);
};

struct SampleInput {
  const sched::SamplingParams* params = nullptr;
  int32_t eos_token_id = -1;
  int32_t num_output_tokens = 0;            // before this token
  const PenaltyState* penalties = nullptr;  // nullptr: no penalties configured
};

struct SampleResult {
  int32_t token_id = 0;
  bool has_logprobs = false;
  sched::TokenLogprob logprob;
};

class Sampler {
 public:
  explicit Sampler(uint64_t unseeded_seed = std::random_device{}());
  // `logits` is modified in place (penalties, temperature, filters).
  [[nodiscard]] SampleResult sample(std::span<float> logits, const SampleInput& input);

 private:
  std::mt19937_64 unseeded_rng_;
  std::vector<float> raw_;
  std::vector<int32_t> order_;
};

// True if any penalty is active (the runner then keeps a PenaltyState).
[[nodiscard]] bool needs_penalty_state(const sched::SamplingParams& params);

}  // namespace moeserve::runtime
