#include "runtime/causal_lm_forward.h"

#include <algorithm>
#include <cstring>

#include "common/check.h"
#include "kv/paged_sequence_state.h"

namespace moeserve::runtime {

CausalLmForwardModel::CausalLmForwardModel(std::unique_ptr<arch::CausalLm> model,
                                           arch::ForwardMode mode)
    : model_(std::move(model)), mode_(mode) {
  MS_CHECK(model_ != nullptr);
}

int32_t CausalLmForwardModel::vocab_size() const { return model_->config().vocab_size; }

Status CausalLmForwardModel::initialize_kv_cache(const kv::KvCacheConfig& config) {
  const ModelConfig& mc = model_->config();
  MS_RETURN_IF_ERROR(kv::check_block_tokens(mc, config.block_tokens));
  states_.clear();
  storage_ = std::make_unique<kv::KvStorage>(kv::KvLayout::from_model_config(mc, config.block_tokens),
                                             config.num_global_blocks, config.num_state_slots,
                                             config.block_tokens);
  return ok_status();
}

Result<arch::SequenceState*> CausalLmForwardModel::admit(const BatchRequest& r) {
  std::unique_ptr<arch::SequenceState>& state = states_[r.id];
  if (storage_ == nullptr) {
    state = model_->new_state();
    if (r.context_len > 0) {
      // No pools: rebuild the state from the tokens (exact, no savings).
      arch::SequenceInput warm;
      warm.state = state.get();
      warm.tokens = std::span<const int32_t>(*r.token_ids).first(static_cast<size_t>(r.context_len));
      warm.prompt_len = r.prefill_len;
      warm.logits = arch::LogitsRows::kNone;
      warm.want_main_hidden = false;
      MS_ASSIGN_OR_RETURN(auto ignored, model_->forward({&warm, 1}, mode_));
      num_computed_tokens_ += r.context_len;
      (void)ignored;
    }
    return state.get();
  }
  if (r.state_slot < 0 || r.block_table == nullptr) {
    return make_error(ErrorCode::kInternal, "request {}: no state slot or block table", r.id);
  }
  auto paged = std::make_unique<kv::PagedSequenceState>(*storage_, model_->config(), r.state_slot,
                                                        r.block_table);
  // The scheduler restarts a hit of C tokens at C - num_replay: [context_len, C) is replayed.
  const int32_t cached = r.context_len + r.num_replay;
  if (cached > 0) {
    MS_RETURN_IF_ERROR(paged->adopt_prefix(cached, r.context_len));
    if (mode_ == arch::ForwardMode::kProduction) {
      paged->set_replay_start(std::max(0, r.prefill_len - model_->config().sliding_window));
    }
    model_->restore_history(
        *paged, std::span<const int32_t>(*r.token_ids).first(static_cast<size_t>(r.context_len)));
  }
  state = std::move(paged);
  return state.get();
}

Status CausalLmForwardModel::forward(const BatchMetadata& batch, std::span<float> logits) {
  inputs_.clear();
  inputs_.reserve(batch.requests.size());
  for (const BatchRequest& r : batch.requests) {
    arch::SequenceState* state = nullptr;
    auto it = states_.find(r.id);
    if (r.is_new || it == states_.end() || it->second == nullptr) {
      MS_ASSIGN_OR_RETURN(state, admit(r));
    } else {
      state = it->second.get();
      // The runner's block table may have been reallocated by a grow; point at it again.
      if (auto* paged = dynamic_cast<kv::PagedSequenceState*>(state)) {
        paged->set_block_table(r.block_table);
      }
    }
    if (state->num_tokens() != r.context_len) {
      return make_error(ErrorCode::kInternal, "request {}: state at {} tokens, step starts at {}",
                        r.id, state->num_tokens(), r.context_len);
    }
    arch::SequenceInput in;
    in.state = state;
    in.tokens = std::span<const int32_t>(batch.token_ids)
                    .subspan(static_cast<size_t>(r.query_start), static_cast<size_t>(r.query_len));
    in.prompt_len = r.prefill_len;
    in.logits = r.logits_row >= 0 ? arch::LogitsRows::kLast : arch::LogitsRows::kNone;
    in.want_main_hidden = false;
    inputs_.push_back(in);
    num_computed_tokens_ += r.query_len;
  }
  MS_ASSIGN_OR_RETURN(std::vector<arch::SequenceOutput> outs, model_->forward(inputs_, mode_));
  if (outs.size() != batch.requests.size()) {
    return make_error(ErrorCode::kInternal, "forward returned {} outputs for {} sequences",
                      outs.size(), batch.requests.size());
  }
  const size_t vocab = static_cast<size_t>(vocab_size());
  for (size_t i = 0; i < outs.size(); ++i) {
    const BatchRequest& r = batch.requests[i];
    if (r.logits_row < 0) continue;
    if (outs[i].logits.size() < vocab) {
      return make_error(ErrorCode::kInternal, "request {}: no logits returned", r.id);
    }
    std::memcpy(logits.data() + static_cast<size_t>(r.logits_row) * vocab,
                outs[i].logits.data() + outs[i].logits.size() - vocab, vocab * sizeof(float));
  }
  return ok_status();
}

}  // namespace moeserve::runtime
