#include "runtime/model_runner.h"

#include "common/check.h"

namespace moeserve::runtime {

ModelRunner::ModelRunner(std::unique_ptr<ForwardModel> model, uint64_t sampler_seed)
    : model_(std::move(model)), sampler_(sampler_seed) {
  MS_CHECK(model_ != nullptr);
}

Status ModelRunner::initialize_kv_cache(const kv::KvCacheConfig& config) {
  batch_.block_tokens = config.block_tokens;
  return model_->initialize_kv_cache(config);
}

void ModelRunner::drop(sched::RequestId id) {
  if (requests_.erase(id) != 0) model_->release_request(id);
}

Status ModelRunner::prepare_batch(const sched::SchedulerOutput& so, BatchMetadata& batch) {
  for (sched::RequestId id : so.finished_req_ids) drop(id);
  for (sched::RequestId id : so.preempted_req_ids) drop(id);
  for (const sched::NewRequestData& d : so.new_requests) {
    drop(d.id);
    CachedRequest& c = requests_[d.id];
    c.token_ids = d.token_ids;
    c.num_prompt_tokens = d.num_prompt_tokens;
    c.prefill_len = static_cast<int32_t>(d.token_ids.size());
    c.params = d.params;
    c.eos_token_id = d.eos_token_id;
    c.state_slot = d.state_slot;
    c.has_penalties = needs_penalty_state(d.params);
    if (c.has_penalties) {
      const std::span<const int32_t> all(c.token_ids);
      c.penalties.init(all.first(static_cast<size_t>(c.num_prompt_tokens)),
                       all.subspan(static_cast<size_t>(c.num_prompt_tokens)), model_->vocab_size());
    }
  }
  batch.clear();
  batch.token_ids.reserve(static_cast<size_t>(so.total_num_scheduled_tokens));
  batch.positions.reserve(static_cast<size_t>(so.total_num_scheduled_tokens));
  batch.slot_mapping.reserve(static_cast<size_t>(so.total_num_scheduled_tokens));
  batch.requests.reserve(so.requests.size());
  const int32_t bt = batch.block_tokens;
  for (const sched::ScheduledRequest& s : so.requests) {
    auto it = requests_.find(s.id);
    if (it == requests_.end()) {
      return make_error(ErrorCode::kInternal, "runner has no state for request {}", s.id);
    }
    CachedRequest& c = it->second;
    c.block_table.insert(c.block_table.end(), s.new_block_ids.begin(), s.new_block_ids.end());
    BatchRequest br;
    br.id = s.id;
    br.query_start = static_cast<int32_t>(batch.token_ids.size());
    br.query_len = s.num_scheduled_tokens;
    br.context_len = s.num_computed_tokens;
    br.num_replay = s.num_replay_tokens;
    br.state_slot = c.state_slot;
    br.is_new = s.is_new;
    br.prefill_len = c.prefill_len;
    br.block_table = &c.block_table;
    br.token_ids = &c.token_ids;
    const int32_t num_known = static_cast<int32_t>(c.token_ids.size());
    for (int32_t k = 0; k < s.num_scheduled_tokens; ++k) {
      const int32_t pos = s.num_computed_tokens + k;
      const int32_t spec_index = pos - num_known;
      int32_t tok = 0;
      if (spec_index < 0) {
        tok = c.token_ids[static_cast<size_t>(pos)];
      } else if (spec_index < static_cast<int32_t>(s.spec_token_ids.size())) {
        tok = s.spec_token_ids[static_cast<size_t>(spec_index)];
      } else {
        return make_error(ErrorCode::kInternal, "request {}: position {} beyond {} known tokens",
                          s.id, pos, num_known);
      }
      const int32_t block_index = pos / bt;
      if (block_index >= static_cast<int32_t>(c.block_table.size())) {
        return make_error(ErrorCode::kInternal, "request {}: position {} has no block", s.id, pos);
      }
      batch.token_ids.push_back(tok);
      batch.positions.push_back(pos);
      batch.slot_mapping.push_back(c.block_table[static_cast<size_t>(block_index)] * bt + pos % bt);
    }
    if (s.samples) br.logits_row = batch.num_logits++;
    batch.requests.push_back(br);
  }
  return ok_status();
}

Result<sched::ModelRunnerOutput> ModelRunner::execute(const sched::SchedulerOutput& so) {
  MS_RETURN_IF_ERROR(prepare_batch(so, batch_));
  sched::ModelRunnerOutput out;
  if (batch_.requests.empty()) return out;
  const int32_t vocab = model_->vocab_size();
  logits_.resize(static_cast<size_t>(batch_.num_logits) * static_cast<size_t>(vocab));
  MS_RETURN_IF_ERROR(model_->forward(batch_, logits_));
  out.outputs.reserve(static_cast<size_t>(batch_.num_logits));
  for (const BatchRequest& br : batch_.requests) {
    if (br.logits_row < 0) continue;
    CachedRequest& c = requests_.at(br.id);
    SampleInput in;
    in.params = &c.params;
    in.eos_token_id = c.eos_token_id;
    in.num_output_tokens = static_cast<int32_t>(c.token_ids.size()) - c.num_prompt_tokens;
    in.penalties = c.has_penalties ? &c.penalties : nullptr;
    std::span<float> row(logits_.data() + static_cast<size_t>(br.logits_row) * vocab,
                         static_cast<size_t>(vocab));
    SampleResult r = sampler_.sample(row, in);
    sched::SampledTokens st;
    st.id = br.id;
    st.token_ids.push_back(r.token_id);
    if (r.has_logprobs) st.logprobs.push_back(std::move(r.logprob));
    // The runner's own copy advances now: the next step's decode input is this token.
    c.token_ids.push_back(r.token_id);
    if (c.has_penalties) c.penalties.add_output(r.token_id, vocab);
    out.outputs.push_back(std::move(st));
  }
  return out;
}

}  // namespace moeserve::runtime
