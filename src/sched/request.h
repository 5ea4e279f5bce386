// Request: one generation request as the scheduler sees it. It advances num_computed_tokens
// toward num_tokens() (+ in-flight placeholders) under the token budget; prefill, decode, replay
// and spec tokens are all that one motion. Owned by the Scheduler (one thread).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kv/block_hash.h"
#include "kv/kv_cache_manager.h"
#include "sched/sampling_params.h"

namespace moeserve::sched {

using RequestId = kv::RequestId;

enum class RequestStatus : uint8_t { kWaiting, kRunning, kPreempted, kFinished };
enum class FinishReason : uint8_t { kNone, kStop, kLength, kAbort, kError };
[[nodiscard]] const char* request_status_name(RequestStatus s);
[[nodiscard]] const char* finish_reason_name(FinishReason r);  // "stop", "length", "abort", "error"

class Request {
 public:
  Request(RequestId id, std::vector<int32_t> prompt_token_ids, SamplingParams params,
          int32_t eos_token_id, std::string cache_salt = {}, double arrival_time = 0.0,
          int32_t block_tokens = kv::kBlockTokens);

  [[nodiscard]] RequestId id() const { return id_; }
  [[nodiscard]] const SamplingParams& params() const { return params_; }
  [[nodiscard]] const std::string& cache_salt() const { return cache_salt_; }
  [[nodiscard]] int32_t eos_token_id() const { return eos_token_id_; }
  [[nodiscard]] double arrival_time() const { return arrival_time_; }

  [[nodiscard]] const std::vector<int32_t>& all_token_ids() const { return all_token_ids_; }
  [[nodiscard]] int32_t num_tokens() const { return static_cast<int32_t>(all_token_ids_.size()); }
  [[nodiscard]] int32_t num_prompt_tokens() const { return num_prompt_tokens_; }
  [[nodiscard]] int32_t num_output_tokens() const { return num_tokens() - num_prompt_tokens_; }
  [[nodiscard]] const std::vector<kv::BlockHash>& block_hashes() const { return block_hashes_; }

  // Appends a sampled token (and hashes any block it completes).
  void append_output_token(int32_t token);

  RequestStatus status = RequestStatus::kWaiting;
  FinishReason finish_reason = FinishReason::kNone;
  int32_t stop_token_id = -1;  // the stop token that finished it, if any
  int32_t num_computed_tokens = 0;
  int32_t num_cached_tokens = -1;  // prefix-cache hit of the latest admission (-1: not admitted)
  int32_t replay_end = 0;          // tokens [.., replay_end) already have global KV: replay only
  int32_t num_output_placeholders = 0;  // tokens in flight (async scheduling)
  std::vector<int32_t> spec_token_ids;  // draft tokens to verify next step
  int32_t num_blocks_sent = 0;          // block-table prefix the runner already has
  int32_t epoch = 0;  // bumped on preemption: in-flight outputs of older epochs are void
  int32_t num_preemptions = 0;
  bool sent_to_runner = false;

 private:
  RequestId id_;
  SamplingParams params_;
  int32_t eos_token_id_;
  std::string cache_salt_;
  double arrival_time_;
  int32_t num_prompt_tokens_;
  std::vector<int32_t> all_token_ids_;
  std::vector<kv::BlockHash> block_hashes_;
  int32_t block_tokens_ = kv::kBlockTokens;  // prefix-cache block size the hashes are over
};

}  // namespace moeserve::sched
