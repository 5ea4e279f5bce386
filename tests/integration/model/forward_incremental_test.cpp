// Incremental forward on the tiny model: chunked prefill ≡ one-shot prefill, prefill + decode ≡
// a longer prefill, production bounded replay vs oracle mode, 40 decode steps stay finite, and a
// guard that every layer mode / Engram layer / compressor path ran.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include "integration/model/oracle_util.h"
#include "model/arch/deepseek_v41.h"

namespace moeserve::test {
namespace {

using arch::DeepseekV41Model;
using arch::ForwardMode;
using arch::ForwardTrace;
using arch::LogitsRows;
using arch::SequenceInput;
using arch::SequenceState;

struct RunResult {
  std::unique_ptr<SequenceState> state;
  std::vector<int32_t> positions;
  std::vector<float> logits;  // [positions, V]
  std::vector<float> last_logits;
  ForwardTrace trace;  // of the first chunk
};

// Feeds `ids` in chunks of `chunk` (0 = whole) and collects the logits of every computed row.
RunResult run_chunks(DeepseekV41Model& model, const std::vector<int32_t>& ids, int32_t chunk,
                     ForwardMode mode, int32_t prompt_len = -1) {
  RunResult r;
  r.state = model.new_state();
  const int32_t n = static_cast<int32_t>(ids.size());
  if (chunk <= 0) chunk = n;
  for (int32_t s = 0; s < n; s += chunk) {
    SequenceInput in;
    in.state = r.state.get();
    in.tokens = std::span<const int32_t>(ids).subspan(static_cast<size_t>(s),
                                                      static_cast<size_t>(std::min(chunk, n - s)));
    in.prompt_len = prompt_len < 0 ? n : prompt_len;
    in.logits = LogitsRows::kAll;
    if (s == 0) in.trace = &r.trace;
    auto out = model.forward({&in, 1}, mode);
    if (!out) throw std::runtime_error(out.error().to_string());
    const auto& o = out->front();
    r.positions.insert(r.positions.end(), o.logit_positions.begin(), o.logit_positions.end());
    r.logits.insert(r.logits.end(), o.logits.begin(), o.logits.end());
  }
  const size_t v = static_cast<size_t>(model.config().vocab_size);
  if (r.logits.size() >= v)
    r.last_logits.assign(r.logits.end() - static_cast<std::ptrdiff_t>(v), r.logits.end());
  return r;
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

std::vector<uint8_t> cache_bytes(SequenceState& s, int32_t layer) {
  std::vector<uint8_t> out;
  for (int64_t j = 0; j < s.num_global_entries(layer); ++j) {
    auto m = s.main_entry(layer, j);
    auto i = s.index_key(layer, j);
    out.insert(out.end(), m.begin(), m.end());
    out.insert(out.end(), i.begin(), i.end());
  }
  return out;
}

TEST(Incremental, ChunkedPrefillMatchesOneShot) {
  DeepseekV41Model& model = *shared_tiny_model().model;
  const ModelConfig& c = model.config();
  const std::vector<int32_t> ids = test_prompt(90, 11, c.vocab_size);
  const RunResult whole = run_chunks(model, ids, 0, ForwardMode::kOracle);
  for (int32_t chunk : {1, 2, 7, 37, 90}) {
    const RunResult part = run_chunks(model, ids, chunk, ForwardMode::kOracle);
    ASSERT_EQ(part.positions, whole.positions) << "chunk " << chunk;
    const LogitCompare cmp = compare_logits(part.logits, to_double(whole.logits), 90, c.vocab_size);
    std::printf("chunk %2d: logits rel diff vs one-shot %.3g, argmax mismatches %ld\n", chunk,
                cmp.rel, static_cast<long>(cmp.argmax_mismatches));
    EXPECT_LE(cmp.rel, 1e-5) << "chunk " << chunk;
    EXPECT_EQ(cmp.argmax_mismatches, 0) << "chunk " << chunk;
    for (int32_t l : c.kv_source_layer_ids) {
      EXPECT_EQ(part.state->num_global_entries(l), whole.state->num_global_entries(l));
      const auto a = cache_bytes(*part.state, l), b = cache_bytes(*whole.state, l);
      int64_t diff = 0;
      for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) diff += a[i] != b[i];
      EXPECT_EQ(diff, 0) << "global cache bytes of layer " << l << " with chunk " << chunk;
    }
  }
}

TEST(Incremental, PrefillThenDecodeMatchesLongerPrefill) {
  DeepseekV41Model& model = *shared_tiny_model().model;
  const ModelConfig& c = model.config();
  const std::vector<int32_t> ids = test_prompt(90, 12, c.vocab_size);
  const RunResult whole = run_chunks(model, ids, 0, ForwardMode::kOracle);
  const OracleDump ref = run_oracle(tiny_model_dir(), ids, {});
  const std::vector<double> ref_logits = ref.f64("logits");
  for (int32_t prefill : {81, 85}) {
    const std::vector<int32_t> head(ids.begin(), ids.begin() + prefill);
    RunResult r = run_chunks(model, head, 0, ForwardMode::kOracle);
    for (int32_t p = prefill; p < 90; ++p) {
      SequenceInput in;
      in.state = r.state.get();
      in.tokens = std::span<const int32_t>(ids).subspan(static_cast<size_t>(p), 1);
      in.logits = LogitsRows::kLast;
      auto out = model.forward({&in, 1}, ForwardMode::kOracle);
      ASSERT_TRUE(out.has_value()) << out.error().to_string();
      ASSERT_EQ(out->front().logit_positions, std::vector<int32_t>{p});
      const size_t v = static_cast<size_t>(c.vocab_size);
      const std::vector<float>& got = out->front().logits;
      const std::vector<double> want(
          whole.logits.begin() + static_cast<std::ptrdiff_t>(p * v),
          whole.logits.begin() + static_cast<std::ptrdiff_t>((p + 1) * v));
      const LogitCompare self = compare_logits(got, want, 1, c.vocab_size);
      EXPECT_LE(self.rel, 1e-5) << "decode at " << p << " vs prefill";
      EXPECT_EQ(self.argmax_mismatches, 0);
      const std::vector<double> oracle(
          ref_logits.begin() + static_cast<std::ptrdiff_t>(p * v),
          ref_logits.begin() + static_cast<std::ptrdiff_t>((p + 1) * v));
      const LogitCompare vs_ref = compare_logits(got, oracle, 1, c.vocab_size);
      std::printf("prefill %d, decode at %d: rel vs prefill %.3g, vs oracle %.3g\n", prefill, p,
                  self.rel, vs_ref.rel);
      EXPECT_LE(vs_ref.rel, 1e-4) << "decode at " << p << " vs oracle";
      EXPECT_EQ(vs_ref.argmax_mismatches, 0);
    }
  }
}

TEST(Production, IdenticalToOracleModeWithinWindow) {
  DeepseekV41Model& model = *shared_tiny_model().model;
  const ModelConfig& c = model.config();
  for (int32_t n : {5, c.sliding_window}) {
    const std::vector<int32_t> ids = test_prompt(n, 13, c.vocab_size);
    const RunResult o = run_chunks(model, ids, 0, ForwardMode::kOracle);
    const RunResult p = run_chunks(model, ids, 0, ForwardMode::kProduction);
    EXPECT_EQ(p.logits, o.logits) << "prompt " << n << " <= window must give identical logits";
  }
}

TEST(Production, EncoderAndCandidateCachesMatchOracleMode) {
  DeepseekV41Model& model = *shared_tiny_model().model;
  const ModelConfig& c = model.config();
  const int32_t cand = c.candidate_source_layer_id;
  for (int32_t n : {40, 90}) {
    const std::vector<int32_t> ids = test_prompt(n, 14, c.vocab_size);
    const RunResult o = run_chunks(model, ids, 0, ForwardMode::kOracle);
    const RunResult p = run_chunks(model, ids, 0, ForwardMode::kProduction);
    EXPECT_EQ(p.trace.encoder_out, o.trace.encoder_out) << "encoder outputs";
    for (int32_t l : c.kv_source_layer_ids)
      EXPECT_EQ(cache_bytes(*p.state, l), cache_bytes(*o.state, l)) << "global cache of " << l;
    EXPECT_GT(p.state->num_global_entries(cand), 0);
    // Logits of the last row: bounded replay is approximate beyond the window; report it.
    const LogitCompare cmp =
        compare_logits(p.last_logits, to_double(o.last_logits), 1, c.vocab_size);
    std::printf(
        "prompt %d (> window %d): production vs oracle-mode last logits: max|diff| %.4g, "
        "rel %.4g, argmax %s\n",
        n, c.sliding_window, cmp.max_abs_diff, cmp.rel,
        cmp.argmax_mismatches == 0 ? "same" : "differs");
    EXPECT_EQ(p.positions.size(), static_cast<size_t>(c.sliding_window));
  }
}

TEST(Production, ChunkedProductionMatchesOneShotAndOracle) {
  DeepseekV41Model& model = *shared_tiny_model().model;
  const ModelConfig& c = model.config();
  // NOTE: seed 15 straddles an MXFP8 rounding boundary (forward_oracle_test.cpp); 18 is clean.
  const std::vector<int32_t> ids = test_prompt(90, 18, c.vocab_size);
  const RunResult whole = run_chunks(model, ids, 0, ForwardMode::kProduction);
  const OracleDump ref = run_oracle(tiny_model_dir(), ids, {"--mode", "production"});
  const LogitCompare vs_ref =
      compare_logits(whole.logits, ref.f64("logits"), c.sliding_window, c.vocab_size);
  std::printf("production one-shot vs oracle production: rel %.3g\n", vs_ref.rel);
  EXPECT_LE(vs_ref.rel, 1e-4);
  EXPECT_EQ(vs_ref.argmax_mismatches, 0);
  for (int32_t chunk : {1, 7, 37}) {
    const RunResult part = run_chunks(model, ids, chunk, ForwardMode::kProduction, 90);
    ASSERT_EQ(part.positions, whole.positions) << "chunk " << chunk;
    const LogitCompare cmp =
        compare_logits(part.logits, to_double(whole.logits),
                       static_cast<int64_t>(whole.positions.size()), c.vocab_size);
    EXPECT_LE(cmp.rel, 1e-5) << "chunk " << chunk;
    EXPECT_EQ(cmp.argmax_mismatches, 0) << "chunk " << chunk;
  }
}

TEST(Decode, FortyRandomStepsStayFinite) {
  DeepseekV41Model& model = *shared_tiny_model().model;
  const ModelConfig& c = model.config();
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> dist(0, c.vocab_size - 1);
  for (ForwardMode mode : {ForwardMode::kOracle, ForwardMode::kProduction}) {
    RunResult r = run_chunks(model, test_prompt(83, 16, c.vocab_size), 0, mode);
    for (int32_t step = 0; step < 40; ++step) {
      const int32_t tok = dist(rng);
      SequenceInput in;
      in.state = r.state.get();
      in.tokens = {&tok, 1};
      auto out = model.forward({&in, 1}, mode);
      ASSERT_TRUE(out.has_value());
      for (float v : out->front().logits) ASSERT_TRUE(std::isfinite(v)) << "step " << step;
      for (float v : out->front().main_hidden) ASSERT_TRUE(std::isfinite(v)) << "step " << step;
    }
    EXPECT_EQ(r.state->num_tokens(), 123);
  }
}

TEST(Guard, EveryLayerModeEngramLayerAndCompressorPathRuns) {
  TinyModel t = load_tiny_model();
  DeepseekV41Model& model = *t.model;
  const ModelConfig& c = model.config();
  const std::vector<int32_t> ids = test_prompt(90, 17, c.vocab_size);
  (void)run_chunks(model, ids, 7, ForwardMode::kOracle);
  (void)run_chunks(model, ids, 37, ForwardMode::kProduction, 90);
  const arch::ForwardStats& s = model.stats();
  for (LayerMode m :
       {LayerMode::kSwaOnly, LayerMode::kFull, LayerMode::kReuse, LayerMode::kReindex})
    EXPECT_GT(s.layer_mode_calls[static_cast<size_t>(m)], 0) << layer_mode_name(m) << " never ran";
  EXPECT_GT(s.candidate_source_calls, 0);
  EXPECT_GT(s.compressor_groups_ratio1, 0);
  EXPECT_GT(s.compressor_groups_ratio2, 0);
  EXPECT_GT(s.compressor_partial_carries, 0) << "no ratio-2 group straddled a chunk boundary";
  EXPECT_GT(s.narrowed_calls, 0) << "bounded replay never skipped rows";
  ASSERT_EQ(s.engram_calls.size(), c.engram_layers.size());
  for (size_t i = 0; i < s.engram_calls.size(); ++i)
    EXPECT_GT(s.engram_calls[i], 0) << "Engram layer " << c.engram_layers[i].layer_id;
  // The tiny prompt exceeds every bound the spec asks to exercise.
  EXPECT_GT(90, c.sliding_window);
  EXPECT_GT(90, c.candidate_topk_blocks * c.candidate_block_size);
  EXPECT_GT(90 / 2, c.index_topk);
}

}  // namespace
}  // namespace moeserve::test
