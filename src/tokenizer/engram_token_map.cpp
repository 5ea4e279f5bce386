#include "tokenizer/engram_token_map.h"

#include <unordered_map>

#include "tokenizer/normalizer.h"
#include "tokenizer/utf8.h"

namespace moeserve::tokenizer {

std::string engram_normalize(std::string_view text) {
  std::string s = unicode_normalize(std::string(text), NormalForm::kNfkc);
  s = unicode_normalize(s, NormalForm::kNfd);
  s = strip_nonspacing_marks(s);
  s = to_lower_simple(s);
  std::string collapsed;
  collapsed.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const char c = s[i];
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
      collapsed += ' ';
      while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n')) ++i;
    } else {
      collapsed += c;
      ++i;
    }
  }
  if (collapsed == " ") return collapsed;  // a lone space survives the strip
  return strip_white_space(collapsed, /*left=*/true, /*right=*/true);
}

EngramTokenMap build_engram_token_map(const Tokenizer& tokenizer) {
  EngramTokenMap map;
  map.compressed.resize(static_cast<size_t>(tokenizer.vocab_size()));
  std::unordered_map<std::string, int32_t> key_to_id;
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    const std::string text = tokenizer.decode(std::vector<int32_t>{id});
    std::string key;
    if (text.find(kReplacementChar) != std::string::npos) {
      key = std::string(tokenizer.id_to_token(id).value_or(""));
    } else {
      key = engram_normalize(text);
      if (key.empty()) key = text;
    }
    auto [it, inserted] = key_to_id.try_emplace(std::move(key), map.num_compressed);
    if (inserted) ++map.num_compressed;
    map.compressed[id] = it->second;
  }
  return map;
}

}  // namespace moeserve::tokenizer
