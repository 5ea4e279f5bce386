#include "tokenizer/pre_tokenizer.h"

#include <utility>

#include "tokenizer/regex.h"

namespace moeserve::tokenizer {
namespace {

// GPT-2's pattern, used by ByteLevel when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Span {
  size_t begin;
  size_t end;
  bool is_match;
};

// Splits `piece` by `regex` into alternating gap/match spans and applies `behavior` the way HF's
// NormalizedString::split does.
void split_piece(std::string_view piece, const Regex& regex, SplitBehavior behavior, bool invert,
                 std::vector<std::pair<size_t, size_t>>& scratch, std::vector<Span>& spans,
                 std::vector<std::string_view>& out) {
  scratch.clear();
  regex.find_all(piece, scratch);
  spans.clear();
  size_t last = 0;
  for (const auto& [b, e] : scratch) {
    if (b > last) spans.push_back({last, b, invert});
    spans.push_back({b, e, !invert});
    last = e;
  }
  if (last < piece.size()) spans.push_back({last, piece.size(), invert});

  auto emit = [&](size_t b, size_t e) {
    if (e > b) out.push_back(piece.substr(b, e - b));
  };
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Span& s : spans) {
        if (!s.is_match) emit(s.begin, s.end);
      }
      return;
    case SplitBehavior::kIsolated:
      for (const Span& s : spans) emit(s.begin, s.end);
      return;
    case SplitBehavior::kMergedWithPrevious:
    case SplitBehavior::kContiguous: {
      // A match joins the piece before it (MergedWithPrevious); in Contiguous mode runs of spans
      // with the same flag join (which, with alternating spans, never happens except at the start).
      std::vector<std::pair<size_t, size_t>> merged;
      bool previous_match = false;
      for (const Span& s : spans) {
        const bool join = behavior == SplitBehavior::kContiguous ? s.is_match == previous_match
                                                                 : s.is_match && !previous_match;
        if (join && !merged.empty()) {
          merged.back().second = s.end;
        } else {
          merged.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      for (const auto& [b, e] : merged) emit(b, e);
      return;
    }
    case SplitBehavior::kMergedWithNext: {
      std::vector<std::pair<size_t, size_t>> merged;
      bool previous_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !merged.empty()) {
          merged.back().first = it->begin;
        } else {
          merged.emplace_back(it->begin, it->end);
        }
        previous_match = it->is_match;
      }
      for (auto it = merged.rbegin(); it != merged.rend(); ++it) emit(it->first, it->second);
      return;
    }
  }
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(Regex regex, SplitBehavior behavior, bool invert)
      : regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}

  void split(std::vector<std::string_view>& pieces, std::deque<std::string>&) const override {
    std::vector<std::string_view> out;
    out.reserve(pieces.size() * 2);
    std::vector<std::pair<size_t, size_t>> scratch;
    std::vector<Span> spans;
    for (std::string_view piece : pieces) {
      split_piece(piece, regex_, behavior_, invert_, scratch, spans, out);
    }
    pieces = std::move(out);
  }

 private:
  Regex regex_;
  SplitBehavior behavior_;
  bool invert_;
};

// ByteLevel as a pre-tokenizer: optional GPT-2 split and prefix space. The byte → alphabet mapping
// itself happens inside the BPE model, which works on raw bytes.
class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<SplitPreTokenizer> gpt2)
      : add_prefix_space_(add_prefix_space), gpt2_(std::move(gpt2)) {}

  void split(std::vector<std::string_view>& pieces,
             std::deque<std::string>& storage) const override {
    if (add_prefix_space_) {
      for (std::string_view& piece : pieces) {
        if (!piece.empty() && piece.front() != ' ') {
          storage.push_back(" " + std::string(piece));
          piece = storage.back();
        }
      }
    }
    if (gpt2_) gpt2_->split(pieces, storage);
  }
  [[nodiscard]] bool has_byte_level() const override { return true; }

 private:
  bool add_prefix_space_;
  std::unique_ptr<SplitPreTokenizer> gpt2_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void split(std::vector<std::string_view>& pieces,
             std::deque<std::string>& storage) const override {
    for (const auto& step : steps_) step->split(pieces, storage);
  }
  [[nodiscard]] bool has_byte_level() const override {
    for (const auto& step : steps_) {
      if (step->has_byte_level()) return true;
    }
    return false;
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

Result<SplitBehavior> parse_behavior(const nlohmann::json& value, const std::string& where) {
  if (!value.is_string()) {
    return make_error(ErrorCode::kInvalidArgument, "{}.behavior: expected a string", where);
  }
  const std::string b = value.get<std::string>();
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return make_error(ErrorCode::kInvalidArgument, "{}.behavior: unknown split behavior \"{}\"",
                    where, b);
}

}  // namespace

Result<std::unique_ptr<PreTokenizer>> make_pre_tokenizer(const nlohmann::json& spec,
                                                         const std::string& where) {
  if (spec.is_null()) return std::unique_ptr<PreTokenizer>();
  if (!spec.is_object() || !spec.contains("type") || !spec["type"].is_string()) {
    return make_error(ErrorCode::kInvalidArgument, "{}: expected an object with a string \"type\"",
                      where);
  }
  const std::string type = spec["type"].get<std::string>();
  if (type == "Split") {
    const auto pattern = spec.value("pattern", nlohmann::json());
    const bool literal = pattern.is_object() && pattern.contains("String");
    const nlohmann::json value = !pattern.is_object() ? nlohmann::json()
                                 : literal            ? pattern["String"]
                                                      : pattern.value("Regex", nlohmann::json());
    if (!value.is_string()) {
      return make_error(ErrorCode::kInvalidArgument,
                        "{}.pattern: expected {{\"Regex\": string}} or {{\"String\": string}}",
                        where);
    }
    auto regex = Regex::compile(value.get<std::string>(), literal);
    if (!regex) {
      return make_error(regex.error().code, "{}.pattern: {}", where, regex.error().message);
    }
    MS_ASSIGN_OR_RETURN(SplitBehavior behavior,
                        parse_behavior(spec.value("behavior", nlohmann::json()), where));
    return std::unique_ptr<PreTokenizer>(
        new SplitPreTokenizer(std::move(*regex), behavior, spec.value("invert", false)));
  }
  if (type == "ByteLevel") {
    std::unique_ptr<SplitPreTokenizer> gpt2;
    if (spec.value("use_regex", true)) {
      auto regex = Regex::compile(kGpt2Pattern);
      if (!regex) return tl::unexpected(regex.error());
      gpt2 =
          std::make_unique<SplitPreTokenizer>(std::move(*regex), SplitBehavior::kIsolated, false);
    }
    return std::unique_ptr<PreTokenizer>(
        new ByteLevelPreTokenizer(spec.value("add_prefix_space", false), std::move(gpt2)));
  }
  if (type == "Sequence") {
    if (!spec.contains("pretokenizers") || !spec["pretokenizers"].is_array()) {
      return make_error(ErrorCode::kInvalidArgument, "{}: Sequence needs a \"pretokenizers\" array",
                        where);
    }
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < spec["pretokenizers"].size(); ++i) {
      auto step = make_pre_tokenizer(spec["pretokenizers"][i],
                                     fmt::format("{}.pretokenizers[{}]", where, i));
      if (!step) return tl::unexpected(step.error());
      if (*step) steps.push_back(std::move(*step));
    }
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(steps)));
  }
  return make_error(ErrorCode::kUnimplemented, "{}: pre-tokenizer type \"{}\" is not supported",
                    where, type);
}

}  // namespace moeserve::tokenizer
