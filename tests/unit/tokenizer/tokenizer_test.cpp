// Tokenizer: loading (incl. malformed files), encode/decode on the bundled tokenizer, merge forms,
// the UTF-8 helpers and streaming detokenization at every split point.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include "tokenizer/normalizer.h"
#include "tokenizer/stream_detokenizer.h"
#include "tokenizer/utf8.h"

namespace moeserve::tokenizer {
namespace {

const std::string kAssets = std::string(MOESERVE_SOURCE_DIR) + "/assets/tokenizer";

const Tokenizer& bundled() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    auto t = Tokenizer::load(kAssets);
    EXPECT_TRUE(t.has_value()) << t.error().to_string();
    return std::move(*t);
  }();
  return *tok;
}

TEST(TokenizerTest, EncodesLikeHuggingFace) {
  // Ids from HF tokenizers 0.23 on assets/tokenizer/tokenizer.json.
  const std::vector<int32_t> want = {57, 3981, 238, 5,   104, 289, 333, 6,   238, 34,  35, 36,
                                     37, 38,   238, 178, 139, 272, 179, 116, 139, 238, 3};
  EXPECT_EQ(bundled().encode("Hello <think>world</think> 12345 你好 <｜User｜>"), want);
  const std::vector<int32_t> with_bos = bundled().encode("Hello", /*add_special_tokens=*/true);
  ASSERT_FALSE(with_bos.empty());
  EXPECT_EQ(with_bos.front(), 0);
  EXPECT_EQ(bundled().vocab_size(), 4096);
}

TEST(TokenizerTest, DecodesAndSkipsSpecialTokens) {
  const Tokenizer& tok = bundled();
  const std::string text = "<｜begin▁of▁sentence｜>Hi <think>x</think> 你好<｜end▁of▁sentence｜>";
  const auto ids = tok.encode(text);
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_EQ(tok.decode(ids, /*skip_special_tokens=*/true), "Hi <think>x</think> 你好");
  EXPECT_EQ(tok.token_to_id("<｜User｜>"), 3);
  EXPECT_EQ(tok.id_to_token(3), "<｜User｜>");
  EXPECT_TRUE(tok.is_special(0));
  EXPECT_FALSE(tok.is_special(5));  // <think> stays in decoded text
  EXPECT_EQ(tok.decode(std::vector<int32_t>{-1, 999999}), "");
}

TEST(TokenizerTest, InvalidUtf8InputIsReplaced) {
  const Tokenizer& tok = bundled();
  EXPECT_EQ(tok.decode(tok.encode("a\xff"
                                  "b")),
            "a\xEF\xBF\xBD"
            "b");
}

std::string tiny_json(const std::string& merges, const std::string& extra = "") {
  return R"({"added_tokens": [], "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "decoder": {"type": "ByteLevel"}, )" +
         extra + R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4,
    "Ġ": 5}, "merges": )" +
         merges + "}}";
}

TEST(TokenizerTest, BothMergeFormsLoad) {
  auto strings = Tokenizer::from_json(tiny_json(R"(["a b", "ab c"])"), "strings");
  auto arrays = Tokenizer::from_json(tiny_json(R"([["a", "b"], ["ab", "c"]])"), "arrays");
  ASSERT_TRUE(strings.has_value()) << strings.error().to_string();
  ASSERT_TRUE(arrays.has_value()) << arrays.error().to_string();
  EXPECT_EQ((*strings)->encode("abc ab"), (std::vector<int32_t>{4, 5, 3}));
  EXPECT_EQ((*arrays)->encode("abc ab"), (std::vector<int32_t>{4, 5, 3}));
}

void expect_error(std::string_view json, std::string_view needle) {
  auto tok = Tokenizer::from_json(json, "test.json");
  ASSERT_FALSE(tok.has_value()) << "loaded although " << needle;
  EXPECT_NE(tok.error().message.find(needle), std::string::npos) << tok.error().message;
}

TEST(TokenizerTest, MalformedFilesNameTheProblem) {
  expect_error("{not json", "not valid JSON");
  expect_error("{}", "missing \"model\"");
  expect_error(tiny_json(R"(["a b c"])"), "model.merges[0]");
  expect_error(tiny_json(R"(["a x"])"), "\"x\", which is not in model.vocab");
  expect_error(tiny_json(R"([42])"), "model.merges[0] must be");
  expect_error(tiny_json("[]", R"("post_processor": {"type": "Nope"}, )"), "post-processor type");
  expect_error(R"({"model": {"vocab": {"a": -1}}})", "model.vocab[\"a\"]");
  expect_error(R"({"model": {"vocab": {}}, "pre_tokenizer": {"type": "Split",
      "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}})",
               "pre_tokenizer.pattern");
  expect_error(R"({"model": {"vocab": {}}, "normalizer": {"type": "Precompiled"}})",
               "normalizer type \"Precompiled\"");
  expect_error(R"({"model": {"vocab": {}}, "added_tokens": [{"id": 1}]})", "added_tokens[0]");
  auto missing = Tokenizer::load("/nonexistent/dir");
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.error().message.find("/nonexistent/dir"), std::string::npos);
}

TEST(Utf8Test, LossyReplacesMaximalSubparts) {
  EXPECT_EQ(utf8_lossy("ok"), "ok");
  EXPECT_EQ(utf8_lossy("\xE4\xBD"), std::string(kReplacementChar));  // truncated
  EXPECT_EQ(utf8_lossy("\xE4\xBD"
                       "a"),
            std::string(kReplacementChar) + "a");  // one per subpart
  EXPECT_EQ(utf8_lossy("\xC0\x80"), std::string(kReplacementChar) + std::string(kReplacementChar));
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), std::string(kReplacementChar) +
                                            std::string(kReplacementChar) +
                                            std::string(kReplacementChar));  // surrogate
  EXPECT_EQ(utf8_stable_prefix("ab\xF0\x9F\x98"), 2u);
  EXPECT_EQ(utf8_stable_prefix("ab\xF0\x9F\x98\x80"), 6u);
  EXPECT_EQ(utf8_stable_prefix("ab\xFF"), 3u);
}

TEST(StreamDetokenizerTest, EqualsFullDecodeAtEverySplit) {
  const Tokenizer& tok = bundled();
  const std::string text =
      "Ünïcödé 你好，世界！ 👨‍👩‍👧‍👦 emoji 🚀 and <｜User｜>special<think> "
      "tokens</think> "
      "e\xCC\x81 "
      "ᚠᛇᚻ 12345";
  const auto ids = tok.encode(text);
  for (bool skip : {false, true}) {
    const std::string full = tok.decode(ids, skip);
    // Streaming one id at a time: every chunk is valid UTF-8 and the running text is a prefix.
    StreamDetokenizer stream(tok, skip);
    std::string running;
    for (int32_t id : ids) {
      const std::string chunk = stream.push(id);
      EXPECT_TRUE(is_valid_utf8(chunk));
      running += chunk;
      EXPECT_EQ(full.compare(0, running.size(), running), 0);
    }
    running += stream.finish();
    EXPECT_EQ(running, full);
    // A stream cut at every split point and finished there decodes like the prefix of ids.
    for (size_t split = 0; split <= ids.size(); ++split) {
      StreamDetokenizer cut(tok, skip);
      std::string out;
      for (size_t i = 0; i < split; ++i) out += cut.push(ids[i]);
      out += cut.finish();
      EXPECT_EQ(out, tok.decode(std::span<const int32_t>(ids).first(split), skip)) << split;
    }
  }
}

TEST(StreamDetokenizerTest, ByteTokensNeverEmitPartialCharacters) {
  const Tokenizer& tok = bundled();
  // "你" is three byte tokens in this vocabulary: nothing may come out before the third.
  const auto ids = tok.encode("你");
  ASSERT_EQ(ids.size(), 3u);
  StreamDetokenizer stream(tok);
  EXPECT_EQ(stream.push(ids[0]), "");
  EXPECT_EQ(stream.push(ids[1]), "");
  EXPECT_EQ(stream.push(ids[2]), "你");
  EXPECT_EQ(stream.push(ids[0]), "");
  EXPECT_EQ(stream.finish(), std::string(kReplacementChar));
}

TEST(NormalizerTest, UnicodeHelpers) {
  EXPECT_EQ(unicode_normalize("e\xCC\x81", NormalForm::kNfc), "\xC3\xA9");
  EXPECT_EQ(unicode_normalize("\xEF\xAC\x81", NormalForm::kNfkc), "fi");  // ﬁ ligature
  EXPECT_EQ(strip_nonspacing_marks(unicode_normalize("é", NormalForm::kNfd)), "e");
  EXPECT_EQ(to_lower_simple("ÀBΣ"), "àbσ");
  EXPECT_EQ(strip_white_space("\xE3\x80\x80 a \n", true, true), "a");
}

}  // namespace
}  // namespace moeserve::tokenizer
