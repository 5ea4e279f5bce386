// SamplingParams: what one request asks of the sampler and of the stop checks (OpenAI/vLLM
// semantics). Validated at the engine edge; plain data afterwards.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"

namespace moeserve::sched {

struct SamplingParams {
  float temperature = 1.0f;         // 0: greedy
  float top_p = 1.0f;               // (0, 1]
  int32_t top_k = 0;                // 0 or -1: off
  float min_p = 0.0f;               // [0, 1]
  float presence_penalty = 0.0f;    // [-2, 2], output tokens
  float frequency_penalty = 0.0f;   // [-2, 2], output tokens
  float repetition_penalty = 1.0f;  // > 0, prompt + output tokens (HF/vLLM)
  std::optional<uint64_t> seed;     // per-request, reproducible across batching and preemption
  int32_t max_tokens = 16;
  int32_t min_tokens = 0;
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop;  // stop strings (need a detokenizer)
  bool include_stop_str_in_output = false;
  bool ignore_eos = false;
  int32_t logprobs = -1;  // -1: none; n >= 0: sampled token's logprob + top-n

  [[nodiscard]] bool greedy() const { return temperature < 1e-5f; }
  [[nodiscard]] Status validate() const;
};

}  // namespace moeserve::sched
