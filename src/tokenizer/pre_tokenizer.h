// PreTokenizer: the tokenizer.json "pre_tokenizer" stage (Split with a PCRE2 regex or a literal,
// ByteLevel, Sequence). Pieces are views into the input text or into `storage` (for pieces a stage
// synthesises, e.g. ByteLevel's prefix space). Immutable after construction; thread-safe.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace moeserve::tokenizer {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces each piece with the pieces this stage splits it into (empty pieces are dropped).
  virtual void split(std::vector<std::string_view>& pieces,
                     std::deque<std::string>& storage) const = 0;
  // True when the stage (or a stage inside a Sequence) is a ByteLevel pre-tokenizer.
  [[nodiscard]] virtual bool has_byte_level() const { return false; }
};

// Builds the pre-tokenizer described by a tokenizer.json "pre_tokenizer" value; nullptr for null.
[[nodiscard]] Result<std::unique_ptr<PreTokenizer>> make_pre_tokenizer(const nlohmann::json& spec,
                                                                       const std::string& where);

}  // namespace moeserve::tokenizer
