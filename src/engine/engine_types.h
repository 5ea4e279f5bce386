// Typed engine-edge data: what a client submits (EngineRequest), what streams back per step
// (RequestOutput: token deltas, text deltas, finish reason, usage), and the detokenizer callback
// the server/app injects (the engine sits below tokenizer/ in the module order).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sched/request.h"
#include "sched/sampling_params.h"
#include "sched/scheduler_output.h"

namespace moeserve::engine {

using RequestId = sched::RequestId;
using sched::FinishReason;

struct EngineRequest {
  RequestId id = -1;  // -1: the engine assigns one
  std::vector<int32_t> prompt_token_ids;
  sched::SamplingParams params;
  std::string cache_salt;
};

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_tokens = 0;  // prefix-cache hit of the (last) admission
};

struct RequestOutput {
  RequestId id = 0;
  std::vector<int32_t> new_token_ids;
  std::string new_text;  // empty without a detokenizer
  std::vector<sched::TokenLogprob> logprobs;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::string stop_reason;  // the stop string, or the stop token id as text
  std::string error;        // set with FinishReason::kError
  Usage usage;
};

// Incremental detokenizer of one request (UTF-8 safe): returns the text that became final.
class IncrementalDetokenizer {
 public:
  virtual ~IncrementalDetokenizer() = default;
  [[nodiscard]] virtual std::string append(int32_t token_id) = 0;
};
using DetokenizerFactory =
    std::function<std::unique_ptr<IncrementalDetokenizer>(std::span<const int32_t> prompt)>;

}  // namespace moeserve::engine
