#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace moeserve::tokenizer {
namespace {

// One match-data block per thread, shared by every pattern: only the whole-match offsets are read.
struct ThreadMatchData {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  ~ThreadMatchData() { pcre2_match_data_free(data); }
};

pcre2_match_data* thread_match_data() {
  thread_local ThreadMatchData holder;
  return holder.data;
}

}  // namespace

void Regex::CodeDeleter::operator()(void* code) const {
  pcre2_code_free(static_cast<pcre2_code*>(code));
}

Result<Regex> Regex::compile(std::string_view pattern, bool literal) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK;
  if (literal) options |= PCRE2_LITERAL;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return make_error(ErrorCode::kInvalidArgument, "regex '{}' does not compile at offset {}: {}",
                      pattern, error_offset, reinterpret_cast<const char*>(message));
  }
  Regex regex;
  regex.pattern_ = std::string(pattern);
  regex.jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  regex.code_ = std::shared_ptr<void>(code, CodeDeleter{});
  return regex;
}

void Regex::find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>>& out) const {
  auto* code = static_cast<pcre2_code*>(code_.get());
  pcre2_match_data* md = thread_match_data();
  const auto* data = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t start = 0;
  while (start <= subject.size()) {
    const int rc =
        jit_ ? pcre2_jit_match(code, data, subject.size(), start, 0, md, nullptr)
             : pcre2_match(code, data, subject.size(), start, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0) break;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t begin = ov[0];
    const size_t end = ov[1];
    if (end == begin) {
      // Empty match: skip one whole character so the next search starts on a boundary.
      if (begin >= subject.size()) break;
      size_t next = begin + 1;
      while (next < subject.size() && (static_cast<uint8_t>(subject[next]) & 0xC0) == 0x80) ++next;
      start = next;
      continue;
    }
    out.emplace_back(begin, end);
    start = end;
  }
}

}  // namespace moeserve::tokenizer
