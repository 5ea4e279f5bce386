#include "tokenizer/stream_detokenizer.h"

#include "tokenizer/utf8.h"

namespace moeserve::tokenizer {

std::string StreamDetokenizer::push(int32_t id) {
  if (!tokenizer_->is_known(id)) return {};
  if (skip_special_tokens_ && tokenizer_->is_special(id)) return {};
  pending_ += tokenizer_->token_bytes(id);
  const size_t stable = utf8_stable_prefix(pending_);
  if (stable == 0) return {};
  std::string out = utf8_lossy(std::string_view(pending_).substr(0, stable));
  pending_.erase(0, stable);
  return out;
}

std::string StreamDetokenizer::finish() {
  std::string out = utf8_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace moeserve::tokenizer
