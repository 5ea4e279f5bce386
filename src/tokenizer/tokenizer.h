// Tokenizer: a Hugging Face tokenizer.json byte-level BPE (the format DeepSeek checkpoints ship).
// Owns the vocabulary, the merge ranks, added/special tokens, the normalizer and pre-tokenizer
// chain, the template post-processor and a word cache. Encoding matches HF `tokenizers` id for id;
// decoding matches its ByteLevel decoder (lossy UTF-8). Immutable after load except for the
// internally locked word cache, so one instance may serve many threads.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/result.h"

namespace moeserve::tokenizer {

class Normalizer;
class PreTokenizer;
struct WordCache;

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;      // dropped by skip_special_tokens
  bool single_word = false;  // only matches between non-word characters
  bool lstrip = false;       // the match swallows whitespace on its left
  bool rstrip = false;       // ... and on its right
  bool normalized = false;   // matched on normalized text instead of raw text
};

class Tokenizer final {
 public:
  // Loads `path`: a tokenizer.json file or a folder holding one. Errors name the file and the JSON
  // location that is wrong.
  [[nodiscard]] static Result<std::unique_ptr<Tokenizer>> load(const std::string& path);
  // Parses tokenizer.json text (`origin` names it in error messages).
  [[nodiscard]] static Result<std::unique_ptr<Tokenizer>> from_json(std::string_view json_text,
                                                                    const std::string& origin);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Text → ids. Invalid UTF-8 is first replaced by U+FFFD (HF only accepts valid strings).
  // add_special_tokens applies the post-processor template (e.g. a leading BOS).
  [[nodiscard]] std::vector<int32_t> encode(std::string_view text,
                                            bool add_special_tokens = false) const;
  // Ids → text; unknown ids are skipped, as HF does.
  [[nodiscard]] std::string decode(std::span<const int32_t> ids,
                                   bool skip_special_tokens = false) const;

  [[nodiscard]] std::optional<int32_t> token_to_id(std::string_view token) const;
  // The vocabulary string of `id` (byte-level alphabet for model tokens); nullopt if unknown.
  [[nodiscard]] std::optional<std::string_view> id_to_token(int32_t id) const;
  // The raw bytes `id` contributes to decoded text (may be part of a UTF-8 sequence).
  [[nodiscard]] std::string_view token_bytes(int32_t id) const;
  [[nodiscard]] bool is_special(int32_t id) const;
  [[nodiscard]] bool is_known(int32_t id) const;
  // One past the largest id (model vocabulary and added tokens together).
  [[nodiscard]] int32_t vocab_size() const { return static_cast<int32_t>(id_to_token_.size()); }
  [[nodiscard]] const std::vector<AddedToken>& added_tokens() const { return added_tokens_; }

 private:
  Tokenizer();
  struct MergeRule {
    int32_t rank;
    int32_t new_id;
  };
  // Finds added tokens in `text`; returns alternating (text span, added-token id or -1) segments.
  struct Segment {
    size_t begin;
    size_t end;
    int32_t added_id;  // -1: ordinary text
  };
  void split_added(std::string_view text, bool normalized_pass, std::vector<Segment>& out) const;
  void encode_plain(std::string_view text, std::vector<int32_t>& ids) const;
  void bpe_word(std::string_view word, std::vector<int32_t>& ids) const;

  std::unordered_map<std::string, int32_t> token_to_id_;
  std::vector<std::string> id_to_token_;  // "" where no token has that id
  std::vector<std::string> id_to_bytes_;  // decoded bytes per id
  std::vector<uint8_t> id_flags_;         // bit 0: known, bit 1: special
  std::unordered_map<uint64_t, MergeRule> merges_;
  std::array<int32_t, 256> byte_id_{};  // id of each byte's alphabet token, -1 if absent
  std::vector<AddedToken> added_tokens_;
  std::array<std::vector<int32_t>, 256> added_by_first_byte_{};  // indices, longest first
  bool has_normalized_added_ = false;
  bool ignore_merges_ = false;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::vector<int32_t> template_prefix_;  // post-processor ids before / after the sequence
  std::vector<int32_t> template_suffix_;
  std::unique_ptr<WordCache> cache_;
};

}  // namespace moeserve::tokenizer
