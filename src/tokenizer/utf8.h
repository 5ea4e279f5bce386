// UTF-8 helpers shared by the tokenizer: validation, lossy decoding that replaces each maximal
// invalid subpart with U+FFFD (what Rust's String::from_utf8_lossy and Python's errors="replace"
// do), the streaming-safe prefix length, and the GPT-2 byte-level alphabet.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace moeserve::tokenizer {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Appends the UTF-8 encoding of `cp` (must be a scalar value) to `out`.
void append_utf8(uint32_t cp, std::string& out);

// Decodes the code point at `text[pos]` (text must be valid UTF-8) and advances `pos`.
uint32_t next_code_point(std::string_view text, size_t& pos);

[[nodiscard]] bool is_valid_utf8(std::string_view bytes);

// Bytes → valid UTF-8, each maximal invalid subpart replaced by one U+FFFD.
[[nodiscard]] std::string utf8_lossy(std::string_view bytes);

// Length of the longest prefix of `bytes` that ends neither inside nor at the end of an incomplete
// (but so far well-formed) multi-byte sequence: lossy-decoding that prefix now gives the same text
// as lossy-decoding it later with more bytes appended.
[[nodiscard]] size_t utf8_stable_prefix(std::string_view bytes);

// The GPT-2 byte-level alphabet: every byte maps to one printable code point.
struct ByteLevelAlphabet {
  std::array<uint32_t, 256> byte_to_cp{};
  std::array<std::string, 256> byte_to_utf8{};
  std::array<int16_t, 324> cp_to_byte{};  // -1 where the code point is not in the alphabet
};
[[nodiscard]] const ByteLevelAlphabet& byte_level_alphabet();

}  // namespace moeserve::tokenizer
