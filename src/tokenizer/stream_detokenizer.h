// StreamDetokenizer: turns token ids into text one id at a time for streaming responses. It never
// emits part of a UTF-8 sequence: bytes of an incomplete character stay pending until the next
// token completes it (or finish() flushes them as U+FFFD). The concatenation of everything
// returned equals Tokenizer::decode of all ids.
#pragma once

#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"

namespace moeserve::tokenizer {

class StreamDetokenizer final {
 public:
  // `tokenizer` must outlive this object.
  explicit StreamDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens = false)
      : tokenizer_(&tokenizer), skip_special_tokens_(skip_special_tokens) {}

  // Adds one id; returns the text that became final (possibly empty).
  [[nodiscard]] std::string push(int32_t id);
  // Ends the stream; returns whatever was pending (an incomplete sequence becomes U+FFFD).
  [[nodiscard]] std::string finish();
  [[nodiscard]] size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;
};

}  // namespace moeserve::tokenizer
