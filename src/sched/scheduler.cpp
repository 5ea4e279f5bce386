#include "sched/scheduler.h"

#include <algorithm>

#include "common/check.h"

namespace moeserve::sched {

Scheduler::Scheduler(const SchedulerConfig& config, const kv::KvCacheConfig& kv_config)
    : config_(config), kv_(kv_config) {
  MS_CHECK(config.max_num_batched_tokens > 0);
  MS_CHECK(config.max_num_seqs > 0);
  running_.reserve(static_cast<size_t>(config.max_num_seqs));
}

Status Scheduler::add_request(std::unique_ptr<Request> request) {
  MS_CHECK(request != nullptr);
  MS_RETURN_IF_ERROR(request->params().validate());
  if (request->num_prompt_tokens() == 0) {
    return make_error(ErrorCode::kInvalidArgument, "request {}: empty prompt", request->id());
  }
  if (request->num_prompt_tokens() >= config_.max_model_len) {
    return make_error(ErrorCode::kInvalidArgument,
                      "request {}: prompt of {} tokens does not fit max_model_len {}",
                      request->id(), request->num_prompt_tokens(), config_.max_model_len);
  }
  const int32_t blocks_needed =
      (request->num_prompt_tokens() + 1 + kv_.block_tokens() - 1) / kv_.block_tokens();
  if (blocks_needed > kv_.num_global_blocks()) {
    return make_error(ErrorCode::kResourceExhausted,
                      "request {}: prompt of {} tokens needs {} KV blocks, the pool has {}",
                      request->id(), request->num_prompt_tokens(), blocks_needed,
                      kv_.num_global_blocks());
  }
  const RequestId id = request->id();
  auto [it, inserted] = requests_.try_emplace(id, std::move(request));
  if (!inserted) return make_error(ErrorCode::kInvalidArgument, "duplicate request id {}", id);
  it->second->status = RequestStatus::kWaiting;
  waiting_.push_back(it->second.get());
  return ok_status();
}

const Request* Scheduler::find(RequestId id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : it->second.get();
}

SchedulerStats Scheduler::stats() const {
  return SchedulerStats{num_running(),         num_waiting(),      kv_.usage(),
                        prefix_cache_queries_, prefix_cache_hits_, num_preemptions_};
}

void Scheduler::preempt(Request& r) {
  kv_.free(r.id());
  r.status = RequestStatus::kPreempted;
  r.num_computed_tokens = 0;
  r.num_output_placeholders = 0;
  r.spec_token_ids.clear();
  r.num_blocks_sent = 0;
  r.sent_to_runner = false;
  r.replay_end = 0;
  ++r.epoch;
  ++r.num_preemptions;
  ++num_preemptions_;
  waiting_.push_front(&r);
}

void Scheduler::emit_scheduled(Request& r, int32_t num_new, SchedulerOutput& out) {
  ScheduledRequest s;
  s.id = r.id();
  s.epoch = r.epoch;
  s.num_computed_tokens = r.num_computed_tokens;
  s.num_scheduled_tokens = num_new;
  s.num_replay_tokens = std::clamp(r.replay_end - r.num_computed_tokens, 0, num_new);
  const int32_t end = r.num_computed_tokens + num_new;
  const int32_t num_spec = static_cast<int32_t>(r.spec_token_ids.size());
  s.samples = end >= r.num_tokens() + r.num_output_placeholders;
  if (num_spec > 0 && s.samples) s.spec_token_ids = r.spec_token_ids;
  const std::vector<int32_t>& table = kv_.block_table(r.id());
  s.new_block_ids.assign(table.begin() + r.num_blocks_sent, table.end());
  r.num_blocks_sent = static_cast<int32_t>(table.size());
  if (!r.sent_to_runner) {
    s.is_new = true;
    r.sent_to_runner = true;
    NewRequestData d;
    d.id = r.id();
    d.token_ids = r.all_token_ids();
    d.num_prompt_tokens = r.num_prompt_tokens();
    d.params = r.params();
    d.eos_token_id = r.eos_token_id();
    d.state_slot = kv_.state_slot(r.id());
    out.new_requests.push_back(std::move(d));
  }
  // Only blocks computed by earlier steps become hittable: a request admitted in this same step
  // must not read a block this step is still writing. (Earlier steps may still be in flight with
  // async scheduling; they execute first.)
  kv_.cache_blocks(r.id(), r.block_hashes(), std::min(r.num_computed_tokens, r.num_tokens()));
  r.num_computed_tokens = end;
  if (s.samples) ++r.num_output_placeholders;
  out.total_num_scheduled_tokens += num_new;
  out.requests.push_back(std::move(s));
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  out.step_id = step_id_++;
  out.finished_req_ids.swap(finished_since_last_step_);
  int32_t budget = config_.max_num_batched_tokens;
  bool preempted_this_step = false;

  // ---- running requests, oldest first
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Request& r = *running_[i];
    const int32_t target =
        r.num_tokens() + r.num_output_placeholders + static_cast<int32_t>(r.spec_token_ids.size());
    int32_t n = target - r.num_computed_tokens;
    // Async: the last in-flight token already reaches max_tokens, nothing left to compute.
    if (r.num_output_placeholders > 0 &&
        r.num_output_tokens() + r.num_output_placeholders >= r.params().max_tokens) {
      n = 0;
    }
    if (config_.long_prefill_token_threshold > 0) {
      n = std::min(n, config_.long_prefill_token_threshold);
    }
    n = std::min({n, budget, config_.max_model_len - r.num_computed_tokens});
    if (n <= 0) {
      ++i;
      continue;
    }
    bool scheduled = true;
    while (!kv_.allocate_slots(r.id(), r.num_computed_tokens + n + config_.num_lookahead_tokens)) {
      // Out of KV: recompute the newest running request later.
      Request* victim = running_.back();
      running_.pop_back();
      preempt(*victim);
      out.preempted_req_ids.push_back(victim->id());
      preempted_this_step = true;
      if (victim == &r) {
        scheduled = false;
        // Alone and still out of KV: it can never fit, end it instead of looping.
        if (running_.empty()) finish_request(r.id(), FinishReason::kLength);
        break;
      }
    }
    if (!scheduled) break;
    emit_scheduled(r, n, out);
    budget -= n;
    ++i;
  }

  // ---- waiting requests, FCFS (not in a step that had to preempt)
  while (!preempted_this_step && !waiting_.empty() && budget > 0 &&
         static_cast<int32_t>(running_.size()) < config_.max_num_seqs) {
    Request& r = *waiting_.front();
    kv::PrefixHit hit = kv_.find_prefix_hit(r.block_hashes(), r.num_tokens());
    // A hit of C tokens restarts computation at C - W: those tokens are replayed (encoder only)
    // to rebuild the SWA rings, which are not prefix-cached.
    const int32_t align = std::max(1, config_.replay_align);
    const int32_t window = (config_.replay_window + align - 1) / align * align;
    const int32_t replay = std::min(hit.num_tokens, window);
    const int32_t start = hit.num_tokens - replay;
    int32_t n = r.num_tokens() - start;
    if (config_.long_prefill_token_threshold > 0) {
      n = std::min(n, config_.long_prefill_token_threshold);
    }
    n = std::min(n, budget);
    if (!kv_.allocate_slots(r.id(), start + n + config_.num_lookahead_tokens, &hit)) break;
    waiting_.pop_front();
    prefix_cache_queries_ += r.num_tokens();
    prefix_cache_hits_ += hit.num_tokens;
    r.num_cached_tokens = hit.num_tokens;
    r.num_computed_tokens = start;
    r.replay_end = hit.num_tokens;
    r.status = RequestStatus::kRunning;
    running_.push_back(&r);
    emit_scheduled(r, n, out);
    budget -= n;
  }
  return out;
}

bool Scheduler::check_stop(Request& r, int32_t token) const {
  const SamplingParams& p = r.params();
  // The token just appended is output number num_output_tokens (1-based); as in vLLM, EOS and
  // stop tokens end the request once min_tokens outputs exist (the sampler masks them before).
  const bool past_min = r.num_output_tokens() >= p.min_tokens;
  if (past_min) {
    if (!p.ignore_eos && token == r.eos_token_id()) {
      r.finish_reason = FinishReason::kStop;
      return true;
    }
    if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) !=
        p.stop_token_ids.end()) {
      r.finish_reason = FinishReason::kStop;
      r.stop_token_id = token;
      return true;
    }
  }
  if (r.num_output_tokens() >= p.max_tokens || r.num_tokens() >= config_.max_model_len) {
    r.finish_reason = FinishReason::kLength;
    return true;
  }
  return false;
}

RequestUpdate Scheduler::make_update(const Request& r) const {
  RequestUpdate u;
  u.id = r.id();
  u.finish_reason = r.finish_reason;
  u.stop_token_id = r.stop_token_id;
  u.num_prompt_tokens = r.num_prompt_tokens();
  u.num_output_tokens = r.num_output_tokens();
  u.num_cached_tokens = std::max(0, r.num_cached_tokens);
  return u;
}

void Scheduler::free_request(Request& r, FinishReason reason) {
  kv_.free(r.id());
  if (r.finish_reason == FinishReason::kNone) r.finish_reason = reason;
  if (r.status == RequestStatus::kRunning) running_has_finished_ = true;
  if (r.status == RequestStatus::kWaiting || r.status == RequestStatus::kPreempted) {
    auto it = std::find(waiting_.begin(), waiting_.end(), &r);
    if (it != waiting_.end()) waiting_.erase(it);
  }
  r.status = RequestStatus::kFinished;
  if (r.sent_to_runner) finished_since_last_step_.push_back(r.id());
}

void Scheduler::remove_finished_from_running() {
  if (!running_has_finished_) return;
  running_has_finished_ = false;
  std::vector<RequestId> done;
  for (const Request* r : running_) {
    if (r->status == RequestStatus::kFinished) done.push_back(r->id());
  }
  running_.erase(
      std::remove_if(running_.begin(), running_.end(),
                     [](const Request* r) { return r->status == RequestStatus::kFinished; }),
      running_.end());
  for (RequestId id : done) requests_.erase(id);
}

void Scheduler::finish_request(RequestId id, FinishReason reason) {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second->status == RequestStatus::kFinished) return;
  Request& r = *it->second;
  const bool was_running = r.status == RequestStatus::kRunning;
  free_request(r, reason);
  finished_updates_.push_back(make_update(r));
  if (was_running) {
    running_.erase(std::find(running_.begin(), running_.end(), &r));
  }
  requests_.erase(it);
}

std::vector<RequestUpdate> Scheduler::take_finished_updates() {
  std::vector<RequestUpdate> out;
  out.swap(finished_updates_);
  return out;
}

std::vector<RequestUpdate> Scheduler::update_from_output(const SchedulerOutput& scheduled,
                                                         const ModelRunnerOutput& output) {
  std::vector<RequestUpdate> updates = take_finished_updates();
  // Outputs are in scheduled order (only requests that sampled); walk both in step.
  size_t oi = 0;
  for (const ScheduledRequest& s : scheduled.requests) {
    const SampledTokens* sampled = nullptr;
    if (s.samples && oi < output.outputs.size() && output.outputs[oi].id == s.id) {
      sampled = &output.outputs[oi++];
    }
    auto it = requests_.find(s.id);
    if (it == requests_.end()) continue;
    Request& r = *it->second;
    // Preempted (or finished) since this step was scheduled: its tokens are void.
    if (r.epoch != s.epoch || r.status != RequestStatus::kRunning) continue;
    // This step has executed: its full blocks can be hit from now on.
    kv_.cache_blocks(r.id(), r.block_hashes(),
                     std::min(s.num_computed_tokens + s.num_scheduled_tokens, r.num_tokens()));
    if (!s.samples) continue;
    r.num_output_placeholders = std::max(0, r.num_output_placeholders - 1);
    if (sampled == nullptr || sampled->token_ids.empty()) continue;
    const int32_t num_spec = static_cast<int32_t>(s.spec_token_ids.size());
    const int32_t accepted = static_cast<int32_t>(sampled->token_ids.size()) - 1;
    r.num_computed_tokens -= std::max(0, num_spec - accepted);  // rejected draft positions
    r.spec_token_ids.clear();
    RequestUpdate u;
    bool stopped = false;
    for (size_t k = 0; k < sampled->token_ids.size() && !stopped; ++k) {
      const int32_t tok = sampled->token_ids[k];
      r.append_output_token(tok);
      u.new_token_ids.push_back(tok);
      if (k < sampled->logprobs.size()) u.logprobs.push_back(sampled->logprobs[k]);
      stopped = check_stop(r, tok);
    }
    RequestUpdate base = make_update(r);
    base.new_token_ids = std::move(u.new_token_ids);
    base.logprobs = std::move(u.logprobs);
    if (stopped) free_request(r, r.finish_reason);
    updates.push_back(std::move(base));
  }
  remove_finished_from_running();
  return updates;
}

}  // namespace moeserve::sched
