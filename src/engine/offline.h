// Offline API: run a set of requests to completion through an EngineCore on the calling thread
// (continuous batching: requests join as they arrive and leave as they finish).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"
#include "engine/engine_core.h"

namespace moeserve::engine {

struct Completion {
  RequestId id = 0;
  std::vector<int32_t> token_ids;
  std::string text;
  std::vector<sched::TokenLogprob> logprobs;
  FinishReason finish_reason = FinishReason::kNone;
  std::string stop_reason;
  Usage usage;
};

// `arrival_steps[i]` (optional, non-decreasing not required): the engine step at which request i
// is added. Completions come back in request order.
[[nodiscard]] Result<std::vector<Completion>> generate(EngineCore& core,
                                                       std::vector<EngineRequest> requests,
                                                       std::span<const int32_t> arrival_steps = {});

}  // namespace moeserve::engine
