// Normalizer: the tokenizer.json "normalizer" stage (NFC/NFD/NFKC/NFKD, Lowercase, StripAccents,
// Strip, Replace, Prepend, Sequence), applied to text before pre-tokenization. Unicode work goes
// through utf8proc. Immutable after construction; safe to share across threads.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace moeserve::tokenizer {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // `text` is valid UTF-8 on entry and on exit.
  virtual void normalize(std::string& text) const = 0;
};

// Builds the normalizer described by a tokenizer.json "normalizer" value; nullptr for JSON null.
// `where` names the JSON location for error messages.
[[nodiscard]] Result<std::unique_ptr<Normalizer>> make_normalizer(const nlohmann::json& spec,
                                                                  const std::string& where);

// Unicode helpers shared with the Engram token map (utf8proc underneath).
enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
[[nodiscard]] std::string unicode_normalize(const std::string& text, NormalForm form);
[[nodiscard]] std::string strip_nonspacing_marks(const std::string& text);  // drops category Mn
[[nodiscard]] std::string to_lower_simple(const std::string& text);  // per code point lowercase
[[nodiscard]] bool is_unicode_white_space(uint32_t cp);              // the White_Space property
[[nodiscard]] std::string strip_white_space(const std::string& text, bool left, bool right);

}  // namespace moeserve::tokenizer
