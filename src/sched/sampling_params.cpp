#include "sched/sampling_params.h"

namespace moeserve::sched {

Status SamplingParams::validate() const {
  if (!(temperature >= 0.0f)) {
    return make_error(ErrorCode::kInvalidArgument, "temperature must be >= 0, got {}", temperature);
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return make_error(ErrorCode::kInvalidArgument, "top_p must be in (0, 1], got {}", top_p);
  }
  if (top_k < -1)
    return make_error(ErrorCode::kInvalidArgument, "top_k must be >= -1, got {}", top_k);
  if (!(min_p >= 0.0f && min_p <= 1.0f)) {
    return make_error(ErrorCode::kInvalidArgument, "min_p must be in [0, 1], got {}", min_p);
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return make_error(ErrorCode::kInvalidArgument, "presence_penalty must be in [-2, 2], got {}",
                      presence_penalty);
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return make_error(ErrorCode::kInvalidArgument, "frequency_penalty must be in [-2, 2], got {}",
                      frequency_penalty);
  }
  if (!(repetition_penalty > 0.0f && repetition_penalty <= 2.0f)) {
    return make_error(ErrorCode::kInvalidArgument, "repetition_penalty must be in (0, 2], got {}",
                      repetition_penalty);
  }
  if (max_tokens < 1) {
    return make_error(ErrorCode::kInvalidArgument, "max_tokens must be >= 1, got {}", max_tokens);
  }
  if (min_tokens < 0 || min_tokens > max_tokens) {
    return make_error(ErrorCode::kInvalidArgument,
                      "min_tokens must be in [0, max_tokens={}], got {}", max_tokens, min_tokens);
  }
  for (const std::string& s : stop) {
    if (s.empty()) return make_error(ErrorCode::kInvalidArgument, "stop strings must not be empty");
  }
  if (logprobs > 20) {
    return make_error(ErrorCode::kInvalidArgument, "logprobs must be <= 20, got {}", logprobs);
  }
  return ok_status();
}

}  // namespace moeserve::sched
