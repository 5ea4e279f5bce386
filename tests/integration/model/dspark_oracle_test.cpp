// DSpark draft (C++, fp32) vs the numpy oracle's draft cycle on the tiny model: base logits,
// Markov-adjusted logits, greedy drafts and confidences, after oracle-mode and production-mode
// prefills; chunked commits ≡ one commit; every draft stage runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "integration/model/oracle_util.h"
#include "model/arch/dspark.h"

namespace moeserve::test {
namespace {

using arch::DeepseekV41Model;
using arch::DraftOutput;
using arch::DSparkDraft;
using arch::ForwardMode;
using arch::LogitsRows;
using arch::SequenceInput;

struct Drafted {
  DraftOutput draft;
  std::vector<float> last_logits;
};

Drafted prefill_and_draft(DeepseekV41Model& model, DSparkDraft& dspark,
                          const std::vector<int32_t>& ids, ForwardMode mode, int32_t chunk) {
  auto state = model.new_state();
  const int32_t n = static_cast<int32_t>(ids.size());
  Drafted d;
  for (int32_t s = 0; s < n; s += chunk) {
    SequenceInput in;
    in.state = state.get();
    in.tokens = std::span<const int32_t>(ids).subspan(static_cast<size_t>(s),
                                                      static_cast<size_t>(std::min(chunk, n - s)));
    in.prompt_len = n;
    auto out = model.forward({&in, 1}, mode);
    if (!out) throw std::runtime_error(out.error().to_string());
    const auto& o = out->front();
    auto st = dspark.commit(*state, o.main_hidden_positions, o.main_hidden);
    if (!st) throw std::runtime_error(st.error().to_string());
    if (!o.logits.empty()) d.last_logits = o.logits;
  }
  const int32_t anchor = static_cast<int32_t>(
      std::max_element(d.last_logits.begin(), d.last_logits.end()) - d.last_logits.begin());
  auto draft = dspark.draft(*state, anchor);
  if (!draft) throw std::runtime_error(draft.error().to_string());
  d.draft = std::move(*draft);
  return d;
}

void check_draft(ForwardMode mode, uint32_t seed) {
  TinyModel& t = shared_tiny_model();
  DeepseekV41Model& model = *t.model;
  const ModelConfig& c = model.config();
  DSparkDraft dspark(model);
  const std::vector<int32_t> ids = test_prompt(90, seed, c.vocab_size);
  const OracleDump ref =
      run_oracle(tiny_model_dir(), ids,
                 {"--draft", "--mode", mode == ForwardMode::kOracle ? "oracle" : "production"});
  const Drafted got = prefill_and_draft(model, dspark, ids, mode, 90);
  ASSERT_EQ(got.draft.anchor, ref.i64("draft_anchor").front());
  const auto pos = ref.i64("draft_positions");
  EXPECT_EQ(std::vector<int64_t>(got.draft.positions.begin(), got.draft.positions.end()), pos);
  const auto ctx = ref.i64("draft_ctx_pos");
  EXPECT_EQ(std::vector<int64_t>(got.draft.ctx_positions.begin(), got.draft.ctx_positions.end()),
            ctx);
  const int64_t b = c.dspark_block_size;
  const LogitCompare base =
      compare_logits(got.draft.base_logits, ref.f64("draft_U"), b, c.vocab_size);
  const LogitCompare adj = compare_logits(got.draft.logits, ref.f64("draft_l"), b, c.vocab_size);
  const auto want_d = ref.i64("draft_d");
  const auto want_c = ref.f64("draft_c");
  double conf_rel = 0.0, conf_max = 0.0;
  for (int64_t i = 0; i < b; ++i) {
    conf_rel = std::max(conf_rel, std::abs(got.draft.confidences[static_cast<size_t>(i)] -
                                           want_c[static_cast<size_t>(i)]));
    conf_max = std::max(conf_max, std::abs(want_c[static_cast<size_t>(i)]));
  }
  conf_rel /= conf_max;
  std::printf(
      "draft (%s): base logits rel %.3g, adjusted logits rel %.3g, confidences rel %.3g, "
      "drafts %s\n",
      mode == ForwardMode::kOracle ? "oracle" : "production", base.rel, adj.rel, conf_rel,
      std::vector<int64_t>(got.draft.tokens.begin(), got.draft.tokens.end()) == want_d ? "equal"
                                                                                       : "differ");
  EXPECT_LE(base.rel, 1e-4);
  EXPECT_LE(adj.rel, 1e-4);
  EXPECT_EQ(base.argmax_mismatches, 0);
  EXPECT_EQ(adj.argmax_mismatches, 0);
  EXPECT_LE(conf_rel, 1e-4);
  EXPECT_EQ(std::vector<int64_t>(got.draft.tokens.begin(), got.draft.tokens.end()), want_d);
}

TEST(DSparkOracle, AfterOracleModePrefill) { check_draft(ForwardMode::kOracle, 21); }

// NOTE: seed 22 straddles an MXFP8 rounding boundary (forward_oracle_test.cpp); 24 is clean.
TEST(DSparkOracle, AfterProductionPrefill) { check_draft(ForwardMode::kProduction, 24); }

TEST(DSparkOracle, ChunkedCommitsMatchOneCommit) {
  TinyModel t = load_tiny_model();
  DSparkDraft dspark(*t.model);
  const std::vector<int32_t> ids = test_prompt(90, 23, t.model->config().vocab_size);
  const Drafted one = prefill_and_draft(*t.model, dspark, ids, ForwardMode::kOracle, 90);
  const Drafted chunked = prefill_and_draft(*t.model, dspark, ids, ForwardMode::kOracle, 7);
  const LogitCompare cmp = compare_logits(
      chunked.draft.logits, std::vector<double>(one.draft.logits.begin(), one.draft.logits.end()),
      t.model->config().dspark_block_size, t.model->config().vocab_size);
  EXPECT_LE(cmp.rel, 1e-5);
  EXPECT_EQ(chunked.draft.tokens, one.draft.tokens);
  // Guard: every draft stage and the Markov head ran.
  for (size_t s = 0; s < dspark.stats().stage_calls.size(); ++s)
    EXPECT_GT(dspark.stats().stage_calls[s], 0) << "draft stage " << s << " never ran";
  EXPECT_EQ(dspark.stats().stage_calls.size(),
            static_cast<size_t>(t.model->config().num_nextn_predict_layers));
  EXPECT_GT(dspark.stats().markov_steps, 0);
}

}  // namespace
}  // namespace moeserve::test
