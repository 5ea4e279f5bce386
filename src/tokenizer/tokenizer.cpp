#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <queue>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"

namespace moeserve::tokenizer {

// Word → ids cache, sharded so concurrent encoders rarely contend.
struct WordCache {
  static constexpr size_t kShards = 16;
  static constexpr size_t kMaxEntriesPerShard = size_t{1} << 16;
  static constexpr size_t kMaxWordBytes = 256;
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> map;
  };
  std::array<Shard, kShards> shards;
};

namespace {

constexpr uint8_t kKnown = 1;
constexpr uint8_t kSpecial = 2;

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

bool is_word_char(uint32_t cp) {
  return cp < 0x80 && (std::isalnum(static_cast<int>(cp)) || cp == '_');
}

// The bytes a token stands for under the ByteLevel decoder: every code point maps back to a byte
// when all of them are in the alphabet; otherwise the token's own UTF-8 text.
std::string token_to_bytes(const std::string& token) {
  const ByteLevelAlphabet& alphabet = byte_level_alphabet();
  std::string bytes;
  size_t pos = 0;
  while (pos < token.size()) {
    const uint32_t cp = next_code_point(token, pos);
    if (cp >= alphabet.cp_to_byte.size() || alphabet.cp_to_byte[cp] < 0) return token;
    bytes.push_back(static_cast<char>(alphabet.cp_to_byte[cp]));
  }
  return bytes;
}

Result<std::vector<int32_t>> special_ids(const nlohmann::json& specials, const std::string& name,
                                         const std::string& where) {
  if (!specials.is_object() || !specials.contains(name) || !specials[name].is_object() ||
      !specials[name].contains("ids") || !specials[name]["ids"].is_array()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: special token \"{}\" is not listed with its ids in special_tokens",
                      where, name);
  }
  std::vector<int32_t> ids;
  for (const auto& id : specials[name]["ids"]) {
    if (!id.is_number_integer()) {
      return make_error(ErrorCode::kInvalidArgument, "{}: ids of \"{}\" must be integers", where,
                        name);
    }
    ids.push_back(id.get<int32_t>());
  }
  return ids;
}

// Reads a post-processor into the ids it puts before and after a single sequence.
Status parse_post_processor(const nlohmann::json& spec, const std::string& where,
                            std::vector<int32_t>& prefix, std::vector<int32_t>& suffix) {
  if (spec.is_null()) return ok_status();
  if (!spec.is_object() || !spec.contains("type") || !spec["type"].is_string()) {
    return make_error(ErrorCode::kInvalidArgument, "{}: expected an object with a string \"type\"",
                      where);
  }
  const std::string type = spec["type"].get<std::string>();
  if (type == "ByteLevel") return ok_status();  // only adjusts offsets
  if (type == "Sequence") {
    const auto& steps = spec.value("processors", nlohmann::json::array());
    for (size_t i = 0; i < steps.size(); ++i) {
      MS_RETURN_IF_ERROR(parse_post_processor(steps[i], fmt::format("{}.processors[{}]", where, i),
                                              prefix, suffix));
    }
    return ok_status();
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    const auto& cls = spec.value("cls", nlohmann::json());
    const auto& sep = spec.value("sep", nlohmann::json());
    if (!cls.is_array() || cls.size() != 2 || !sep.is_array() || sep.size() != 2) {
      return make_error(ErrorCode::kInvalidArgument, "{}: cls and sep must be [token, id]", where);
    }
    prefix.push_back(cls[1].get<int32_t>());
    suffix.push_back(sep[1].get<int32_t>());
    return ok_status();
  }
  if (type == "TemplateProcessing") {
    const auto& single = spec.value("single", nlohmann::json());
    if (!single.is_array()) {
      return make_error(ErrorCode::kInvalidArgument, "{}.single: expected an array", where);
    }
    bool seen_sequence = false;
    for (size_t i = 0; i < single.size(); ++i) {
      const auto& piece = single[i];
      if (piece.contains("Sequence")) {
        seen_sequence = true;
      } else if (piece.contains("SpecialToken") && piece["SpecialToken"].contains("id") &&
                 piece["SpecialToken"]["id"].is_string()) {
        MS_ASSIGN_OR_RETURN(auto ids,
                            special_ids(spec.value("special_tokens", nlohmann::json()),
                                        piece["SpecialToken"]["id"].get<std::string>(), where));
        auto& dst = seen_sequence ? suffix : prefix;
        dst.insert(dst.end(), ids.begin(), ids.end());
      } else {
        return make_error(ErrorCode::kInvalidArgument,
                          "{}.single[{}]: expected {{Sequence}} or {{SpecialToken: {{id}}}}", where,
                          i);
      }
    }
    return ok_status();
  }
  return make_error(ErrorCode::kUnimplemented, "{}: post-processor type \"{}\" is not supported",
                    where, type);
}

}  // namespace

Tokenizer::Tokenizer() : cache_(std::make_unique<WordCache>()) {}
Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::string& path) {
  std::filesystem::path file(path);
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec)) file /= "tokenizer.json";
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    return make_error(ErrorCode::kNotFound, "cannot open tokenizer file {}", file.string());
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  return from_json(buffer.str(), file.string());
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_json(std::string_view json_text,
                                                        const std::string& origin) {
  nlohmann::json root = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return make_error(ErrorCode::kInvalidArgument, "{}: not valid JSON", origin);
  }
  if (!root.is_object()) {
    return make_error(ErrorCode::kInvalidArgument, "{}: the top level must be an object", origin);
  }
  std::unique_ptr<Tokenizer> tok(new Tokenizer());

  // --- model ---
  if (!root.contains("model") || !root["model"].is_object()) {
    return make_error(ErrorCode::kInvalidArgument, "{}: missing \"model\" object", origin);
  }
  const auto& model = root["model"];
  if (model.contains("type") && model["type"] != "BPE") {
    return make_error(ErrorCode::kUnimplemented, "{}: model.type {} is not supported (only BPE)",
                      origin, model["type"].dump());
  }
  if (model.value("byte_fallback", false)) {
    return make_error(ErrorCode::kUnimplemented, "{}: model.byte_fallback is not supported",
                      origin);
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model[key].is_null() && model[key] != "") {
      return make_error(ErrorCode::kUnimplemented, "{}: model.{} is not supported", origin, key);
    }
  }
  tok->ignore_merges_ = model.value("ignore_merges", false);
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return make_error(ErrorCode::kInvalidArgument, "{}: model.vocab must be an object", origin);
  }
  int32_t max_id = -1;
  for (const auto& [token, id] : model["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      return make_error(ErrorCode::kInvalidArgument,
                        "{}: model.vocab[\"{}\"] must be a non-negative 32-bit integer", origin,
                        token);
    }
    tok->token_to_id_[token] = id.get<int32_t>();
    max_id = std::max(max_id, id.get<int32_t>());
  }

  // --- added tokens ---
  const auto& added = root.value("added_tokens", nlohmann::json::array());
  if (!added.is_array()) {
    return make_error(ErrorCode::kInvalidArgument, "{}: added_tokens must be an array", origin);
  }
  for (size_t i = 0; i < added.size(); ++i) {
    const auto& a = added[i];
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
        !a.contains("content") || !a["content"].is_string() || a["content"] == "") {
      return make_error(ErrorCode::kInvalidArgument,
                        "{}: added_tokens[{}] needs an integer \"id\" and a non-empty \"content\"",
                        origin, i);
    }
    AddedToken t;
    t.id = a["id"].get<int32_t>();
    t.content = a["content"].get<std::string>();
    t.special = a.value("special", false);
    t.single_word = a.value("single_word", false);
    t.lstrip = a.value("lstrip", false);
    t.rstrip = a.value("rstrip", false);
    t.normalized = a.value("normalized", !t.special);
    if (t.id < 0) {
      return make_error(ErrorCode::kInvalidArgument, "{}: added_tokens[{}].id is negative", origin,
                        i);
    }
    max_id = std::max(max_id, t.id);
    tok->has_normalized_added_ |= t.normalized;
    tok->added_tokens_.push_back(std::move(t));
  }

  // --- id tables ---
  tok->id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  tok->id_flags_.assign(static_cast<size_t>(max_id + 1), 0);
  for (const auto& [token, id] : tok->token_to_id_) {
    tok->id_to_token_[id] = token;
    tok->id_flags_[id] |= kKnown;
  }
  for (const AddedToken& t : tok->added_tokens_) {
    tok->id_to_token_[t.id] = t.content;
    tok->id_flags_[t.id] |= kKnown;
    if (t.special) tok->id_flags_[t.id] |= kSpecial;
    tok->token_to_id_[t.content] = t.id;
  }
  tok->id_to_bytes_.resize(tok->id_to_token_.size());
  for (size_t id = 0; id < tok->id_to_token_.size(); ++id) {
    tok->id_to_bytes_[id] = token_to_bytes(tok->id_to_token_[id]);
  }
  for (size_t i = 0; i < tok->added_tokens_.size(); ++i) {
    tok->added_by_first_byte_[static_cast<uint8_t>(tok->added_tokens_[i].content[0])].push_back(
        static_cast<int32_t>(i));
  }
  for (auto& list : tok->added_by_first_byte_) {
    std::stable_sort(list.begin(), list.end(), [&](int32_t x, int32_t y) {
      return tok->added_tokens_[x].content.size() > tok->added_tokens_[y].content.size();
    });
  }
  const ByteLevelAlphabet& alphabet = byte_level_alphabet();
  for (int b = 0; b < 256; ++b) {
    auto it = tok->token_to_id_.find(alphabet.byte_to_utf8[b]);
    tok->byte_id_[b] = it == tok->token_to_id_.end() ? -1 : it->second;
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    auto it = tok->token_to_id_.find(model["unk_token"].get<std::string>());
    if (it == tok->token_to_id_.end()) {
      return make_error(ErrorCode::kInvalidArgument, "{}: model.unk_token {} is not in the vocab",
                        origin, model["unk_token"].dump());
    }
    for (int32_t& id : tok->byte_id_) {
      if (id < 0) id = it->second;
    }
  }

  // --- merges ---
  const auto& merges = model.value("merges", nlohmann::json::array());
  if (!merges.is_array()) {
    return make_error(ErrorCode::kInvalidArgument, "{}: model.merges must be an array", origin);
  }
  tok->merges_.reserve(merges.size() * 2);
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& m = merges[rank];
    std::string left;
    std::string right;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return make_error(ErrorCode::kInvalidArgument,
                          "{}: model.merges[{}] \"{}\" must be two tokens separated by one space",
                          origin, rank, s);
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return make_error(ErrorCode::kInvalidArgument,
                        "{}: model.merges[{}] must be \"a b\" or [\"a\", \"b\"], got {}", origin,
                        rank, m.dump());
    }
    const auto a = tok->token_to_id_.find(left);
    const auto b = tok->token_to_id_.find(right);
    const auto c = tok->token_to_id_.find(left + right);
    for (const auto& [it, name] :
         {std::pair{a, left}, std::pair{b, right}, std::pair{c, left + right}}) {
      if (it == tok->token_to_id_.end()) {
        return make_error(ErrorCode::kInvalidArgument,
                          "{}: model.merges[{}] uses \"{}\", which is not in model.vocab", origin,
                          rank, name);
      }
    }
    tok->merges_.try_emplace(pair_key(a->second, b->second),
                             MergeRule{static_cast<int32_t>(rank), c->second});
  }

  // --- pipeline ---
  auto normalizer = make_normalizer(root.value("normalizer", nlohmann::json()), "normalizer");
  if (!normalizer) {
    return make_error(normalizer.error().code, "{}: {}", origin, normalizer.error().message);
  }
  tok->normalizer_ = std::move(*normalizer);
  auto pre = make_pre_tokenizer(root.value("pre_tokenizer", nlohmann::json()), "pre_tokenizer");
  if (!pre) return make_error(pre.error().code, "{}: {}", origin, pre.error().message);
  tok->pre_tokenizer_ = std::move(*pre);
  if (!tok->pre_tokenizer_ || !tok->pre_tokenizer_->has_byte_level()) {
    return make_error(ErrorCode::kUnimplemented,
                      "{}: pre_tokenizer has no ByteLevel stage; only byte-level BPE is supported",
                      origin);
  }
  const auto& decoder = root.value("decoder", nlohmann::json());
  const bool byte_level_decoder =
      decoder.is_object() &&
      (decoder.value("type", "") == "ByteLevel" ||
       (decoder.value("type", "") == "Sequence" && decoder.contains("decoders") &&
        decoder["decoders"].is_array() && decoder["decoders"].size() == 1 &&
        decoder["decoders"][0].value("type", "") == "ByteLevel"));
  if (!byte_level_decoder) {
    return make_error(ErrorCode::kUnimplemented,
                      "{}: decoder {} is not supported (expected ByteLevel)", origin,
                      decoder.dump());
  }
  MS_RETURN_IF_ERROR(parse_post_processor(root.value("post_processor", nlohmann::json()),
                                          "post_processor", tok->template_prefix_,
                                          tok->template_suffix_)
                         .map_error([&](Error e) {
                           e.message = origin + ": " + e.message;
                           return e;
                         }));
  return tok;
}

void Tokenizer::split_added(std::string_view text, bool normalized_pass,
                            std::vector<Segment>& out) const {
  size_t plain_start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const auto& candidates = added_by_first_byte_[static_cast<uint8_t>(text[pos])];
    const AddedToken* found = nullptr;
    for (int32_t index : candidates) {
      const AddedToken& t = added_tokens_[index];
      if (t.normalized != normalized_pass) continue;
      if (text.substr(pos, t.content.size()) == t.content) {
        found = &t;
        break;
      }
    }
    if (found == nullptr) {
      ++pos;
      continue;
    }
    size_t start = pos;
    size_t stop = pos + found->content.size();
    pos = stop;
    if (found->single_word) {
      bool left_ok = true;
      if (start > 0) {
        size_t p = start - 1;
        while (p > 0 && (static_cast<uint8_t>(text[p]) & 0xC0) == 0x80) --p;
        left_ok = !is_word_char(next_code_point(text, p));
      }
      size_t q = stop;
      const bool right_ok = stop >= text.size() || !is_word_char(next_code_point(text, q));
      if (!left_ok || !right_ok) continue;
    }
    if (found->lstrip) {
      while (start > plain_start) {
        size_t p = start - 1;
        while (p > plain_start && (static_cast<uint8_t>(text[p]) & 0xC0) == 0x80) --p;
        size_t probe = p;
        if (!is_unicode_white_space(next_code_point(text, probe))) break;
        start = p;
      }
    }
    if (found->rstrip) {
      while (stop < text.size()) {
        size_t probe = stop;
        if (!is_unicode_white_space(next_code_point(text, probe))) break;
        stop = probe;
      }
      pos = stop;
    }
    if (start > plain_start) out.push_back({plain_start, start, -1});
    out.push_back({start, stop, found->id});
    plain_start = stop;
  }
  if (plain_start < text.size()) out.push_back({plain_start, text.size(), -1});
}

std::vector<int32_t> Tokenizer::encode(std::string_view input, bool add_special_tokens) const {
  std::string repaired;
  if (!is_valid_utf8(input)) {
    repaired = utf8_lossy(input);
    input = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(input.size() / 3 + 4);
  if (add_special_tokens) ids.insert(ids.end(), template_prefix_.begin(), template_prefix_.end());

  std::vector<Segment> segments;
  split_added(input, /*normalized_pass=*/false, segments);
  std::vector<Segment> inner;
  for (const Segment& seg : segments) {
    if (seg.added_id >= 0) {
      ids.push_back(seg.added_id);
      continue;
    }
    std::string_view plain = input.substr(seg.begin, seg.end - seg.begin);
    if (!normalizer_ && !has_normalized_added_) {
      encode_plain(plain, ids);
      continue;
    }
    std::string normalized(plain);
    if (normalizer_) normalizer_->normalize(normalized);
    inner.clear();
    split_added(normalized, /*normalized_pass=*/true, inner);
    for (const Segment& s : inner) {
      if (s.added_id >= 0) {
        ids.push_back(s.added_id);
      } else {
        encode_plain(std::string_view(normalized).substr(s.begin, s.end - s.begin), ids);
      }
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), template_suffix_.begin(), template_suffix_.end());
  return ids;
}

void Tokenizer::encode_plain(std::string_view text, std::vector<int32_t>& ids) const {
  std::vector<std::string_view> pieces{text};
  std::deque<std::string> storage;
  pre_tokenizer_->split(pieces, storage);
  for (std::string_view piece : pieces) bpe_word(piece, ids);
}

void Tokenizer::bpe_word(std::string_view word, std::vector<int32_t>& ids) const {
  const bool cacheable = word.size() <= WordCache::kMaxWordBytes;
  const size_t hash = WordCache::Hash{}(word);
  WordCache::Shard& shard = cache_->shards[hash % WordCache::kShards];
  if (cacheable) {
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.map.find(word);
    if (it != shard.map.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }

  std::vector<int32_t> result;
  if (word.size() == 1) {
    if (byte_id_[static_cast<uint8_t>(word[0])] >= 0) {
      result.push_back(byte_id_[static_cast<uint8_t>(word[0])]);
    }
  } else {
    std::optional<int32_t> whole;
    if (ignore_merges_) {
      std::string mapped;
      for (char c : word) mapped += byte_level_alphabet().byte_to_utf8[static_cast<uint8_t>(c)];
      if (auto it = token_to_id_.find(mapped); it != token_to_id_.end()) whole = it->second;
    }
    if (whole) {
      result.push_back(*whole);
    } else {
      // Symbols form a linked list over the word's bytes; candidate merges sit in a min-heap
      // ordered by (rank, position), and stale entries are skipped when popped.
      struct Symbol {
        int32_t id;
        int32_t prev;
        int32_t next;
      };
      std::vector<Symbol> symbols;
      symbols.reserve(word.size());
      for (char c : word) {
        const int32_t id = byte_id_[static_cast<uint8_t>(c)];
        if (id < 0) continue;  // a byte with no token and no unk: dropped, as HF does
        const auto n = static_cast<int32_t>(symbols.size());
        symbols.push_back({id, n - 1, n + 1});
      }
      if (!symbols.empty()) symbols.back().next = -1;
      struct Candidate {
        int32_t rank;
        int32_t pos;
        int32_t left_id;
        int32_t right_id;
        int32_t new_id;
        bool operator>(const Candidate& o) const {
          return rank != o.rank ? rank > o.rank : pos > o.pos;
        }
      };
      std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
      auto push_pair = [&](int32_t left) {
        if (left < 0) return;
        const int32_t right = symbols[left].next;
        if (right < 0) return;
        auto it = merges_.find(pair_key(symbols[left].id, symbols[right].id));
        if (it == merges_.end()) return;
        heap.push({it->second.rank, left, symbols[left].id, symbols[right].id, it->second.new_id});
      };
      for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) push_pair(i);
      while (!heap.empty()) {
        const Candidate c = heap.top();
        heap.pop();
        Symbol& left = symbols[c.pos];
        if (left.id != c.left_id || left.next < 0) continue;
        Symbol& right = symbols[left.next];
        if (right.id != c.right_id) continue;
        left.id = c.new_id;
        right.id = -1;  // dead
        left.next = right.next;
        if (left.next >= 0) symbols[left.next].prev = c.pos;
        push_pair(left.prev);
        push_pair(c.pos);
      }
      for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
        result.push_back(symbols[i].id);
      }
    }
  }
  ids.insert(ids.end(), result.begin(), result.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(shard.mu);
    if (shard.map.size() >= WordCache::kMaxEntriesPerShard) shard.map.clear();
    shard.map.emplace(std::string(word), std::move(result));
  }
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (!is_known(id)) continue;
    if (skip_special_tokens && is_special(id)) continue;
    bytes += id_to_bytes_[id];
  }
  return utf8_lossy(bytes);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = token_to_id_.find(std::string(token));
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string_view> Tokenizer::id_to_token(int32_t id) const {
  if (!is_known(id)) return std::nullopt;
  return id_to_token_[id];
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  if (!is_known(id)) return {};
  return id_to_bytes_[id];
}

bool Tokenizer::is_special(int32_t id) const { return is_known(id) && (id_flags_[id] & kSpecial); }

bool Tokenizer::is_known(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < id_flags_.size() && (id_flags_[id] & kKnown);
}

}  // namespace moeserve::tokenizer
