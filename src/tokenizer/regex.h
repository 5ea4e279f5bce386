// Regex: one compiled PCRE2 pattern (UTF + UCP, JIT when available), immutable after compile and
// safe to use from many threads (match data is per thread). Used by the Split pre-tokenizer and
// the Replace normalizer; `\p{..}` classes and lookahead behave as in HF tokenizers' Oniguruma.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/result.h"

namespace moeserve::tokenizer {

class Regex final {
 public:
  // literal: match `pattern` as a plain string (HF's {"String": ...} patterns).
  [[nodiscard]] static Result<Regex> compile(std::string_view pattern, bool literal = false);

  // Appends the [begin, end) byte ranges of all non-overlapping matches in `subject` (valid UTF-8)
  // to `out`, leftmost first; an empty match advances by one character.
  void find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>>& out) const;

  [[nodiscard]] const std::string& pattern() const { return pattern_; }

 private:
  struct CodeDeleter {
    void operator()(void* code) const;
  };
  std::string pattern_;
  std::shared_ptr<void> code_;  // pcre2_code_8*
  bool jit_ = false;
};

}  // namespace moeserve::tokenizer
