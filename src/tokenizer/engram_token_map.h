// Engram's compressed token map (spec/model.md §4 step 1): every token id maps to a dense id
// shared by all tokens whose decoded text normalises to the same key (NFKC → NFD → strip Mn →
// lowercase → [ \t\r\n]+ to " " → strip, a lone " " kept). Tokens whose text holds U+FFFD are
// keyed by their raw vocabulary string; an empty normalised text falls back to the decoded text.
// Dense ids are handed out in first-seen order over ids 0..vocab_size-1.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace moeserve::tokenizer {

struct EngramTokenMap {
  std::vector<int32_t> compressed;  // size vocab_size: token id → compressed id
  int32_t num_compressed = 0;
};

[[nodiscard]] std::string engram_normalize(std::string_view text);
[[nodiscard]] EngramTokenMap build_engram_token_map(const Tokenizer& tokenizer);

}  // namespace moeserve::tokenizer
