#include "engine/engine_core.h"

#include <algorithm>

#include "common/check.h"

namespace moeserve::engine {
namespace {

double seconds_between(std::chrono::steady_clock::time_point a,
                       std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// vLLM's check_stop_strings: search only where the new text could complete a stop string.
// Returns the index to truncate at (npos: no match), sets `matched`.
size_t find_stop(const std::string& text, size_t new_bytes, const std::vector<std::string>& stop,
                 bool include_stop, std::string& matched) {
  for (const std::string& s : stop) {
    const size_t from =
        text.size() > new_bytes + s.size() - 1 ? text.size() - new_bytes - s.size() + 1 : 0;
    const size_t at = text.find(s, from);
    if (at == std::string::npos) continue;
    matched = s;
    return include_stop ? std::min(text.size(), at + s.size()) : at;
  }
  return std::string::npos;
}

}  // namespace

EngineCore::EngineCore(const EngineCoreConfig& config,
                       std::unique_ptr<runtime::ModelExecutor> executor,
                       DetokenizerFactory detokenizer)
    : config_(config),
      executor_(std::move(executor)),
      detokenizer_factory_(std::move(detokenizer)),
      scheduler_(config.scheduler, config.kv),
      worker_(executor_.get(), config.async_scheduling) {
  // The executor allocates the cache memory behind the pools the scheduler hands out.
  const Status kv_status = executor_->initialize_kv_cache(config.kv);
  MS_CHECK_MSG(kv_status.has_value(), "KV cache initialisation failed: {}",
               kv_status.error().to_string());
}

EngineCore::~EngineCore() {
  // Let in-flight steps finish before the worker and executor go away.
  for (InFlight& f : in_flight_) f.result.wait();
}

Result<RequestId> EngineCore::add_request(EngineRequest req) {
  MS_RETURN_IF_ERROR(req.params.validate());
  if (!req.params.stop.empty() && !detokenizer_factory_) {
    return make_error(ErrorCode::kInvalidArgument,
                      "stop strings need a detokenizer (none was given to the engine)");
  }
  const RequestId id = req.id >= 0 ? req.id : next_id_;
  next_id_ = std::max(next_id_, id + 1);
  if (streams_.count(id) != 0) {
    return make_error(ErrorCode::kInvalidArgument, "request id {} is already in use", id);
  }
  StreamState st;
  st.arrival = Clock::now();
  st.stop = req.params.stop;
  st.include_stop_str = req.params.include_stop_str_in_output;
  if (!st.include_stop_str) {
    for (const std::string& s : st.stop)
      st.stop_holdback = std::max(st.stop_holdback, s.size() - 1);
  }
  if (detokenizer_factory_) st.detokenizer = detokenizer_factory_(req.prompt_token_ids);
  auto request =
      std::make_unique<sched::Request>(id, std::move(req.prompt_token_ids), std::move(req.params),
                                       config_.eos_token_id, std::move(req.cache_salt),
                                       /*arrival_time=*/0.0, config_.kv.block_tokens);
  MS_RETURN_IF_ERROR(scheduler_.add_request(std::move(request)));
  streams_.emplace(id, std::move(st));
  return id;
}

void EngineCore::abort_request(RequestId id) {
  scheduler_.finish_request(id, FinishReason::kAbort);
}

bool EngineCore::has_unfinished_requests() const {
  return scheduler_.has_unfinished_requests() || scheduler_.has_finished_updates() ||
         !in_flight_.empty();
}

void EngineCore::finish_stream(RequestId id, const RequestOutput& o) {
  auto it = streams_.find(id);
  if (it == streams_.end()) return;
  StreamState& st = it->second;
  const Clock::time_point now = Clock::now();
  EngineMetrics::FinishedRequest f;
  f.finished_reason = sched::finish_reason_name(o.finish_reason);
  f.prompt_tokens = o.usage.prompt_tokens;
  f.generation_tokens = o.usage.completion_tokens;
  f.e2e = seconds_between(st.arrival, now);
  if (st.scheduled) f.queue_time = seconds_between(st.arrival, st.first_scheduled);
  if (st.scheduled && st.has_token) {
    f.prefill_time = seconds_between(st.first_scheduled, st.first_token);
    f.decode_time = seconds_between(st.first_token, now);
  }
  metrics_.record_finished(f);
  streams_.erase(it);
}

void EngineCore::process_updates(std::vector<sched::RequestUpdate>& updates,
                                 std::vector<RequestOutput>& out) {
  const Clock::time_point now = Clock::now();
  int64_t new_tokens = 0;
  for (sched::RequestUpdate& u : updates) {
    auto it = streams_.find(u.id);
    if (it == streams_.end()) continue;
    StreamState& st = it->second;
    RequestOutput o;
    o.id = u.id;
    o.new_token_ids = std::move(u.new_token_ids);
    o.logprobs = std::move(u.logprobs);
    o.finish_reason = u.finish_reason;
    o.usage = Usage{u.num_prompt_tokens, u.num_output_tokens, u.num_cached_tokens};
    if (u.stop_token_id >= 0) o.stop_reason = std::to_string(u.stop_token_id);
    new_tokens += static_cast<int64_t>(o.new_token_ids.size());
    if (!o.new_token_ids.empty()) {
      if (!st.has_token) {
        st.has_token = true;
        st.first_token = now;
        metrics_.observe_ttft(seconds_between(st.arrival, now));
      } else {
        metrics_.observe_inter_token_latency(seconds_between(st.last_token, now));
      }
      st.last_token = now;
    }
    if (st.detokenizer) {
      for (size_t k = 0; k < o.new_token_ids.size(); ++k) {
        const int32_t tok = o.new_token_ids[k];
        // The EOS / stop token that ended the request is not part of the text.
        const bool is_last = k + 1 == o.new_token_ids.size();
        if (is_last && u.finish_reason == FinishReason::kStop) break;
        const std::string delta = st.detokenizer->append(tok);
        st.text += delta;
        if (!st.stop.empty() && !delta.empty()) {
          std::string matched;
          const size_t cut =
              find_stop(st.text, delta.size(), st.stop, st.include_stop_str, matched);
          if (cut != std::string::npos) {
            st.text.resize(cut);
            o.finish_reason = FinishReason::kStop;
            o.stop_reason = matched;
            o.new_token_ids.resize(k + 1);
            if (o.logprobs.size() > k + 1) o.logprobs.resize(k + 1);
            // Silent: this output already carries the finish.
            scheduler_.finish_request(u.id, FinishReason::kStop);
            (void)scheduler_.take_finished_updates();
            break;
          }
        }
      }
      o.finished = o.finish_reason != FinishReason::kNone;
      const size_t sendable =
          o.finished ? st.text.size()
                     : (st.text.size() > st.stop_holdback ? st.text.size() - st.stop_holdback : 0);
      if (sendable > st.text_sent) {
        o.new_text = st.text.substr(st.text_sent, sendable - st.text_sent);
        st.text_sent = sendable;
      }
    }
    o.finished = o.finish_reason != FinishReason::kNone;
    const RequestId id = o.id;
    out.push_back(std::move(o));
    if (out.back().finished) finish_stream(id, out.back());
  }
  if (new_tokens > 0) metrics_.add_generation_tokens(new_tokens);
}

Result<std::vector<RequestOutput>> EngineCore::step() {
  std::vector<RequestOutput> out;
  std::vector<sched::RequestUpdate> aborted = scheduler_.take_finished_updates();
  process_updates(aborted, out);

  const size_t depth = config_.async_scheduling ? 2 : 1;
  bool submitted = false;
  if (in_flight_.size() < depth && scheduler_.has_unfinished_requests()) {
    auto so = std::make_shared<sched::SchedulerOutput>(scheduler_.schedule());
    const Clock::time_point now = Clock::now();
    for (const sched::ScheduledRequest& s : so->requests) {
      if (!s.is_new) continue;
      auto it = streams_.find(s.id);
      if (it != streams_.end() && !it->second.scheduled) {
        it->second.scheduled = true;
        it->second.first_scheduled = now;
      }
    }
    if (so->empty()) {
      carry_finished_.insert(carry_finished_.end(), so->finished_req_ids.begin(),
                             so->finished_req_ids.end());
      carry_finished_.insert(carry_finished_.end(), so->preempted_req_ids.begin(),
                             so->preempted_req_ids.end());
    } else {
      so->finished_req_ids.insert(so->finished_req_ids.end(), carry_finished_.begin(),
                                  carry_finished_.end());
      carry_finished_.clear();
      in_flight_.push_back(InFlight{so, worker_.submit(so)});
      submitted = true;
    }
    // Newly finished (preempted alone and unfittable) requests.
    std::vector<sched::RequestUpdate> finished = scheduler_.take_finished_updates();
    process_updates(finished, out);
  }
  // Pipeline not full yet: return and schedule the next step before waiting on this one.
  if (in_flight_.empty() || (submitted && in_flight_.size() < depth)) {
    const sched::SchedulerStats s = scheduler_.stats();
    metrics_.set_scheduler_state(s.num_running, s.num_waiting, s.kv_usage, s.prefix_cache_queries,
                                 s.prefix_cache_hits, s.num_preemptions);
    return out;
  }
  InFlight oldest = std::move(in_flight_.front());
  in_flight_.pop_front();
  StepResult result = oldest.result.get();
  if (!result) return tl::unexpected(result.error());
  std::vector<sched::RequestUpdate> updates = scheduler_.update_from_output(*oldest.step, *result);
  process_updates(updates, out);
  const kv::KvResidencySamples residency = scheduler_.kv().take_residency_samples();
  metrics_.observe_kv_residency(residency.lifetime, residency.idle_before_evict,
                                residency.reuse_gap);
  const sched::SchedulerStats s = scheduler_.stats();
  metrics_.set_scheduler_state(s.num_running, s.num_waiting, s.kv_usage, s.prefix_cache_queries,
                               s.prefix_cache_hits, s.num_preemptions);
  return out;
}

}  // namespace moeserve::engine
