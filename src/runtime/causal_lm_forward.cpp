#include "runtime/causal_lm_forward.h"

#include <algorithm>
#include <cstring>

#include "common/check.h"

namespace moeserve::runtime {

CausalLmForwardModel::CausalLmForwardModel(std::unique_ptr<arch::CausalLm> model,
                                           arch::ForwardMode mode)
    : model_(std::move(model)), mode_(mode) {
  MS_CHECK(model_ != nullptr);
}

int32_t CausalLmForwardModel::vocab_size() const { return model_->config().vocab_size; }

Status CausalLmForwardModel::forward(const BatchMetadata& batch, std::span<float> logits) {
  inputs_.clear();
  inputs_.reserve(batch.requests.size());
  for (const BatchRequest& r : batch.requests) {
    std::unique_ptr<arch::SequenceState>& state = states_[r.id];
    if (r.is_new || state == nullptr) {
      state = model_->new_state();
      if (r.context_len > 0) {
        // Prefix hit: rebuild the state from the tokens (see the header NOTE).
        arch::SequenceInput warm;
        warm.state = state.get();
        warm.tokens =
            std::span<const int32_t>(*r.token_ids).first(static_cast<size_t>(r.context_len));
        warm.prompt_len = r.prefill_len;
        warm.logits = arch::LogitsRows::kNone;
        warm.want_main_hidden = false;
        MS_ASSIGN_OR_RETURN(auto ignored, model_->forward({&warm, 1}, mode_));
        (void)ignored;
      }
    }
    if (state->num_tokens() != r.context_len) {
      return make_error(ErrorCode::kInternal, "request {}: state at {} tokens, step starts at {}",
                        r.id, state->num_tokens(), r.context_len);
    }
    arch::SequenceInput in;
    in.state = state.get();
    in.tokens = std::span<const int32_t>(batch.token_ids)
                    .subspan(static_cast<size_t>(r.query_start), static_cast<size_t>(r.query_len));
    in.prompt_len = r.prefill_len;
    in.logits = r.logits_row >= 0 ? arch::LogitsRows::kLast : arch::LogitsRows::kNone;
    in.want_main_hidden = false;
    inputs_.push_back(in);
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
