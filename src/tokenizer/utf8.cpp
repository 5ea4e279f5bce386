#include "tokenizer/utf8.h"

namespace moeserve::tokenizer {
namespace {

// For a lead byte: the number of continuation bytes and the allowed range of the first one
// (Unicode Table 3-7, well-formed UTF-8 byte sequences). need < 0: not a lead byte.
struct LeadInfo {
  int need;
  uint8_t lo;
  uint8_t hi;
};

LeadInfo lead_info(uint8_t b) {
  if (b < 0x80) return {0, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {1, 0x80, 0xBF};
  if (b == 0xE0) return {2, 0xA0, 0xBF};
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {2, 0x80, 0xBF};
  if (b == 0xED) return {2, 0x80, 0x9F};
  if (b == 0xF0) return {3, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {3, 0x80, 0xBF};
  if (b == 0xF4) return {3, 0x80, 0x8F};
  return {-1, 0, 0};
}

enum class SeqKind { kValid, kInvalid, kTruncated };

// Classifies the sequence at bytes[pos]: its length when valid, the length of the maximal invalid
// subpart when invalid, or the length of the incomplete tail when the input ends inside it.
SeqKind classify(std::string_view bytes, size_t pos, size_t& len) {
  const auto lead = static_cast<uint8_t>(bytes[pos]);
  const LeadInfo info = lead_info(lead);
  if (info.need == 0) {
    len = 1;
    return SeqKind::kValid;
  }
  if (info.need < 0) {
    len = 1;
    return SeqKind::kInvalid;
  }
  size_t i = 1;
  for (; i <= static_cast<size_t>(info.need); ++i) {
    if (pos + i >= bytes.size()) {
      len = i;
      return SeqKind::kTruncated;
    }
    const auto b = static_cast<uint8_t>(bytes[pos + i]);
    const uint8_t lo = i == 1 ? info.lo : 0x80;
    const uint8_t hi = i == 1 ? info.hi : 0xBF;
    if (b < lo || b > hi) {
      len = i;
      return SeqKind::kInvalid;
    }
  }
  len = i;
  return SeqKind::kValid;
}

ByteLevelAlphabet make_alphabet() {
  ByteLevelAlphabet a;
  a.cp_to_byte.fill(-1);
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    const uint32_t cp = printable ? static_cast<uint32_t>(b) : next++;
    a.byte_to_cp[b] = cp;
    append_utf8(cp, a.byte_to_utf8[b]);
    a.cp_to_byte[cp] = static_cast<int16_t>(b);
  }
  return a;
}

}  // namespace

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

uint32_t next_code_point(std::string_view text, size_t& pos) {
  const auto b0 = static_cast<uint8_t>(text[pos]);
  if (b0 < 0x80) {
    ++pos;
    return b0;
  }
  int extra = b0 >= 0xF0 ? 3 : b0 >= 0xE0 ? 2 : 1;
  uint32_t cp = b0 & (0x3F >> extra);
  ++pos;
  for (int i = 0; i < extra && pos < text.size(); ++i, ++pos) {
    cp = (cp << 6) | (static_cast<uint8_t>(text[pos]) & 0x3F);
  }
  return cp;
}

bool is_valid_utf8(std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    if (static_cast<uint8_t>(bytes[pos]) < 0x80) {
      ++pos;
      continue;
    }
    size_t len = 0;
    if (classify(bytes, pos, len) != SeqKind::kValid) return false;
    pos += len;
  }
  return true;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t len = 0;
    if (classify(bytes, pos, len) == SeqKind::kValid) {
      out.append(bytes.substr(pos, len));
    } else {
      out.append(kReplacementChar);
    }
    pos += len;
  }
  return out;
}

size_t utf8_stable_prefix(std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t len = 0;
    if (classify(bytes, pos, len) == SeqKind::kTruncated) return pos;
    pos += len;
  }
  return pos;
}

const ByteLevelAlphabet& byte_level_alphabet() {
  static const ByteLevelAlphabet alphabet = make_alphabet();
  return alphabet;
}

}  // namespace moeserve::tokenizer
