// Plain data crossing the scheduler → runner → scheduler boundary (one step). SchedulerOutput
// says which requests advance by how many tokens and which blocks they gained; ModelRunnerOutput
// carries the sampled tokens back; SchedulerUpdate is what the engine turns into stream outputs.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "sched/request.h"
#include "sched/sampling_params.h"

namespace moeserve::sched {

// First time the runner sees a request (or again after a preemption): everything it needs.
struct NewRequestData {
  RequestId id = 0;
  std::vector<int32_t> token_ids;  // every token known now (prompt + outputs so far)
  int32_t num_prompt_tokens = 0;
  SamplingParams params;
  int32_t eos_token_id = -1;
  int32_t state_slot = -1;  // SWA rings, compressor state, DSpark ring, Engram history
};

struct ScheduledRequest {
  RequestId id = 0;
  int32_t epoch = 0;
  bool is_new = false;              // its NewRequestData is in SchedulerOutput::new_requests
  int32_t num_computed_tokens = 0;  // position of the first scheduled token
  int32_t num_scheduled_tokens = 0;
  // The first num_replay_tokens scheduled tokens already have global KV (prefix-cache hit): run
  // them through the encoder only to rebuild SWA rings / compressor state (model.md §2.6).
  int32_t num_replay_tokens = 0;
  bool samples = false;  // the last scheduled token is the sequence end: sample from its logits
  std::vector<int32_t> new_block_ids;  // appended to the runner's block table
  std::vector<int32_t> spec_token_ids;
};

struct SchedulerOutput {
  int64_t step_id = 0;
  std::vector<ScheduledRequest> requests;
  std::vector<NewRequestData> new_requests;
  int32_t total_num_scheduled_tokens = 0;
  std::vector<RequestId> finished_req_ids;   // since the previous step: drop runner state
  std::vector<RequestId> preempted_req_ids;  // this step: drop runner state (resent as new)

  [[nodiscard]] bool empty() const { return requests.empty(); }
};

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
  int32_t rank = 0;                            // 1 = the most likely token
  std::vector<std::pair<int32_t, float>> top;  // top-n (token id, logprob), most likely first
};

struct SampledTokens {
  RequestId id = 0;
  std::vector<int32_t> token_ids;      // 1 + accepted spec tokens
  std::vector<TokenLogprob> logprobs;  // empty unless requested
};

struct ModelRunnerOutput {
  std::vector<SampledTokens> outputs;  // one per ScheduledRequest with samples == true
};

// One request's progress in one step.
struct RequestUpdate {
  RequestId id = 0;
  std::vector<int32_t> new_token_ids;
  std::vector<TokenLogprob> logprobs;
  FinishReason finish_reason = FinishReason::kNone;
  int32_t stop_token_id = -1;
  int32_t num_prompt_tokens = 0;
  int32_t num_output_tokens = 0;
  int32_t num_cached_tokens = 0;

  [[nodiscard]] bool finished() const { return finish_reason != FinishReason::kNone; }
};

}  // namespace moeserve::sched
