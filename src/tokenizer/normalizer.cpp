#include "tokenizer/normalizer.h"

#include <utility>
#include <vector>

#include <utf8proc.h>

#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace moeserve::tokenizer {
namespace {

class FormNormalizer final : public Normalizer {
 public:
  explicit FormNormalizer(NormalForm form) : form_(form) {}
  void normalize(std::string& text) const override { text = unicode_normalize(text, form_); }

 private:
  NormalForm form_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text) const override { text = to_lower_simple(text); }
};

class StripAccentsNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text) const override { text = strip_nonspacing_marks(text); }
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    text = strip_white_space(text, left_, right_);
  }

 private:
  bool left_;
  bool right_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Regex regex, std::string content)
      : regex_(std::move(regex)), content_(std::move(content)) {}
  void normalize(std::string& text) const override {
    std::vector<std::pair<size_t, size_t>> matches;
    regex_.find_all(text, matches);
    if (matches.empty()) return;
    std::string out;
    size_t last = 0;
    for (const auto& [b, e] : matches) {
      out.append(text, last, b - last);
      out.append(content_);
      last = e;
    }
    out.append(text, last, std::string::npos);
    text = std::move(out);
  }

 private:
  Regex regex_;
  std::string content_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  void normalize(std::string& text) const override {
    for (const auto& step : steps_) step->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

std::string map_code_points(const std::string& text, uint32_t (*fn)(uint32_t)) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const uint32_t cp = next_code_point(text, pos);
    const uint32_t mapped = fn(cp);
    if (mapped != 0xFFFFFFFFu) append_utf8(mapped, out);
  }
  return out;
}

}  // namespace

std::string unicode_normalize(const std::string& text, NormalForm form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNfc:
      options |= UTF8PROC_COMPOSE;
      break;
    case NormalForm::kNfd:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormalForm::kNfkc:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalForm::kNfkd:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                          static_cast<utf8proc_ssize_t>(text.size()), &out,
                                          static_cast<utf8proc_option_t>(options));
  if (n < 0) return text;  // only on invalid UTF-8, which callers never pass
  std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  free(out);  // NOLINT: utf8proc allocates with malloc
  return result;
}

std::string strip_nonspacing_marks(const std::string& text) {
  return map_code_points(text, [](uint32_t cp) -> uint32_t {
    return utf8proc_category(static_cast<utf8proc_int32_t>(cp)) == UTF8PROC_CATEGORY_MN
               ? 0xFFFFFFFFu
               : cp;
  });
}

std::string to_lower_simple(const std::string& text) {
  return map_code_points(text, [](uint32_t cp) -> uint32_t {
    return static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp)));
  });
}

bool is_unicode_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

std::string strip_white_space(const std::string& text, bool left, bool right) {
  size_t begin = 0;
  size_t end = text.size();
  if (left) {
    while (begin < end) {
      size_t next = begin;
      if (!is_unicode_white_space(next_code_point(text, next))) break;
      begin = next;
    }
  }
  if (right) {
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
      size_t probe = start;
      if (!is_unicode_white_space(next_code_point(text, probe))) break;
      end = start;
    }
  }
  return text.substr(begin, end - begin);
}

Result<std::unique_ptr<Normalizer>> make_normalizer(const nlohmann::json& spec,
                                                    const std::string& where) {
  if (spec.is_null()) return std::unique_ptr<Normalizer>();
  if (!spec.is_object() || !spec.contains("type") || !spec["type"].is_string()) {
    return make_error(ErrorCode::kInvalidArgument, "{}: expected an object with a string \"type\"",
                      where);
  }
  const std::string type = spec["type"].get<std::string>();
  if (type == "NFC") return std::unique_ptr<Normalizer>(new FormNormalizer(NormalForm::kNfc));
  if (type == "NFD") return std::unique_ptr<Normalizer>(new FormNormalizer(NormalForm::kNfd));
  if (type == "NFKC") return std::unique_ptr<Normalizer>(new FormNormalizer(NormalForm::kNfkc));
  if (type == "NFKD") return std::unique_ptr<Normalizer>(new FormNormalizer(NormalForm::kNfkd));
  if (type == "Lowercase") return std::unique_ptr<Normalizer>(new LowercaseNormalizer());
  if (type == "StripAccents") return std::unique_ptr<Normalizer>(new StripAccentsNormalizer());
  if (type == "Strip") {
    return std::unique_ptr<Normalizer>(
        new StripNormalizer(spec.value("strip_left", true), spec.value("strip_right", true)));
  }
  if (type == "Prepend") {
    if (!spec.contains("prepend") || !spec["prepend"].is_string()) {
      return make_error(ErrorCode::kInvalidArgument, "{}: Prepend needs a string \"prepend\"",
                        where);
    }
    return std::unique_ptr<Normalizer>(new PrependNormalizer(spec["prepend"].get<std::string>()));
  }
  if (type == "Replace") {
    const auto& pattern = spec.value("pattern", nlohmann::json());
    if (!spec.contains("content") || !spec["content"].is_string() || !pattern.is_object()) {
      return make_error(ErrorCode::kInvalidArgument,
                        "{}: Replace needs \"pattern\" {{String|Regex}} and a string \"content\"",
                        where);
    }
    const bool literal = pattern.contains("String");
    const auto& value = literal ? pattern["String"] : pattern.value("Regex", nlohmann::json());
    if (!value.is_string()) {
      return make_error(ErrorCode::kInvalidArgument, "{}.pattern: expected String or Regex", where);
    }
    auto regex = Regex::compile(value.get<std::string>(), literal);
    if (!regex) return tl::unexpected(regex.error());
    return std::unique_ptr<Normalizer>(
        new ReplaceNormalizer(std::move(*regex), spec["content"].get<std::string>()));
  }
  if (type == "Sequence") {
    if (!spec.contains("normalizers") || !spec["normalizers"].is_array()) {
      return make_error(ErrorCode::kInvalidArgument, "{}: Sequence needs a \"normalizers\" array",
                        where);
    }
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < spec["normalizers"].size(); ++i) {
      auto step =
          make_normalizer(spec["normalizers"][i], fmt::format("{}.normalizers[{}]", where, i));
      if (!step) return tl::unexpected(step.error());
      if (*step) steps.push_back(std::move(*step));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(steps)));
  }
  return make_error(ErrorCode::kUnimplemented, "{}: normalizer type \"{}\" is not supported", where,
                    type);
}

}  // namespace moeserve::tokenizer
