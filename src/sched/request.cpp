#include "sched/request.h"

namespace moeserve::sched {

const char* request_status_name(RequestStatus s) {
  switch (s) {
    case RequestStatus::kWaiting:
      return "waiting";
    case RequestStatus::kRunning:
      return "running";
    case RequestStatus::kPreempted:
      return "preempted";
    case RequestStatus::kFinished:
      return "finished";
  }
  return "?";
}

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
  }
  return "?";
}

Request::Request(RequestId id, std::vector<int32_t> prompt_token_ids, SamplingParams params,
                 int32_t eos_token_id, std::string cache_salt, double arrival_time,
                 int32_t block_tokens)
    : id_(id),
      params_(std::move(params)),
      eos_token_id_(eos_token_id),
      cache_salt_(std::move(cache_salt)),
      arrival_time_(arrival_time),
      num_prompt_tokens_(static_cast<int32_t>(prompt_token_ids.size())),
      all_token_ids_(std::move(prompt_token_ids)),
      block_tokens_(block_tokens) {
  all_token_ids_.reserve(all_token_ids_.size() + static_cast<size_t>(params_.max_tokens));
  kv::extend_block_hashes(block_hashes_, all_token_ids_, cache_salt_, block_tokens_);
}

void Request::append_output_token(int32_t token) {
  all_token_ids_.push_back(token);
  if (all_token_ids_.size() % static_cast<size_t>(block_tokens_) == 0) {
    kv::extend_block_hashes(block_hashes_, all_token_ids_, cache_salt_, block_tokens_);
  }
}

}  // namespace moeserve::sched
