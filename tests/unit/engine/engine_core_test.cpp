// EngineCore end to end over the FakeForwardModel: prefix hit ≡ miss (with replay), cache_salt
// isolation, preemption ≡ none, continuous batching ≡ alone, async ≡ sync, abort frees all,
// stop conditions and stop strings, seeded sampling across batch shapes.
#include "engine/engine_core.h"

#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "engine/engine_client.h"
#include "engine/offline.h"
#include "runtime/model_runner.h"
#include "unit/engine/fake_forward_model.h"

namespace moeserve::engine {
namespace {

using testing::FakeForwardModel;

constexpr int32_t kVocab = 64;
constexpr int32_t kEos = 1;

struct Setup {
  int32_t num_blocks = 64;
  int32_t max_num_seqs = 16;
  int32_t budget = 512;
  int32_t window = 16;
  int32_t long_prefill_threshold = 0;
  bool async = false;
  bool prefix_caching = true;
};

struct Harness {
  std::unique_ptr<EngineCore> core;
  FakeForwardModel* fake = nullptr;
};

// Detokenizer for tests: token t → one letter.
class LetterDetokenizer final : public IncrementalDetokenizer {
 public:
  std::string append(int32_t t) override { return std::string(1, static_cast<char>('a' + t % 26)); }
};

Harness make_engine(const Setup& s) {
  auto fake = std::make_unique<FakeForwardModel>(kVocab, s.num_blocks, s.max_num_seqs, s.window);
  Harness h;
  h.fake = fake.get();
  EngineCoreConfig cfg;
  cfg.scheduler.max_num_batched_tokens = s.budget;
  cfg.scheduler.max_num_seqs = s.max_num_seqs;
  cfg.scheduler.replay_window = s.window;
  cfg.scheduler.long_prefill_token_threshold = s.long_prefill_threshold;
  cfg.kv.num_global_blocks = s.num_blocks;
  cfg.kv.num_state_slots = s.max_num_seqs;
  cfg.kv.enable_prefix_caching = s.prefix_caching;
  cfg.kv.check_invariants = true;
  cfg.async_scheduling = s.async;
  cfg.eos_token_id = kEos;
  h.core = std::make_unique<EngineCore>(
      cfg, std::make_unique<runtime::ModelRunner>(std::move(fake), 1234),
      [](std::span<const int32_t>) { return std::make_unique<LetterDetokenizer>(); });
  return h;
}

std::vector<int32_t> random_tokens(std::mt19937& rng, int32_t n) {
  std::uniform_int_distribution<int32_t> d(2, kVocab - 1);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = d(rng);
  return t;
}

EngineRequest greedy_request(std::vector<int32_t> prompt, int32_t max_tokens,
                             std::string salt = {}) {
  EngineRequest r;
  r.prompt_token_ids = std::move(prompt);
  r.params.temperature = 0.0f;
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  r.cache_salt = std::move(salt);
  return r;
}

std::vector<Completion> run(Harness& h, std::vector<EngineRequest> reqs,
                            std::vector<int32_t> arrivals = {}) {
  auto out = generate(*h.core, std::move(reqs), arrivals);
  EXPECT_TRUE(out.has_value()) << (out ? "" : out.error().message);
  return out ? *out : std::vector<Completion>{};
}

void expect_pool_idle(Harness& h) {
  const kv::KvCacheManager& kv = h.core->scheduler().kv();
  EXPECT_EQ(kv.num_free_blocks(), kv.num_global_blocks());
  EXPECT_EQ(kv.num_free_state_slots(), kv.num_state_slots());
  EXPECT_TRUE(kv.check_invariants().has_value());
}

TEST(EngineCore, PrefixHitEqualsMissWithReplay) {
  std::mt19937 rng(1);
  const std::vector<int32_t> prompt = random_tokens(rng, 700);
  Harness cold = make_engine({});
  const auto miss = run(cold, {greedy_request(prompt, 24)});
  ASSERT_EQ(miss[0].token_ids.size(), 24u);
  EXPECT_EQ(miss[0].usage.cached_tokens, 0);

  Harness warm = make_engine({});
  (void)run(warm, {greedy_request(prompt, 3)});
  const int64_t replayed_before = warm.fake->num_replayed_rows;
  const auto hit = run(warm, {greedy_request(prompt, 24)});
  EXPECT_EQ(hit[0].usage.cached_tokens, 512);  // 2 full blocks; ≥ 1 token left to compute
  EXPECT_EQ(warm.fake->num_replayed_rows - replayed_before, 16);  // the replay window
  EXPECT_EQ(hit[0].token_ids, miss[0].token_ids);

  // A shared 512-token prefix with a different tail hits too, and matches its own cold run.
  std::vector<int32_t> other(prompt.begin(), prompt.begin() + 512);
  const std::vector<int32_t> tail = random_tokens(rng, 77);
  other.insert(other.end(), tail.begin(), tail.end());
  const auto other_hit = run(warm, {greedy_request(other, 12)});
  EXPECT_EQ(other_hit[0].usage.cached_tokens, 512);
  Harness cold2 = make_engine({});
  EXPECT_EQ(run(cold2, {greedy_request(other, 12)})[0].token_ids, other_hit[0].token_ids);
  expect_pool_idle(warm);
}

TEST(EngineCore, HitWithoutReplayWindowIsDetected) {
  // The fake insists on a full SWA window at every sample: replay_window 0 must fail loudly,
  // which is what makes the replay test above meaningful.
  std::mt19937 rng(2);
  const std::vector<int32_t> prompt = random_tokens(rng, 260);  // tail 4 < window 16
  auto fake = std::make_unique<FakeForwardModel>(kVocab, 16, 4, 16);
  EngineCoreConfig cfg;
  cfg.scheduler.max_num_seqs = 4;
  cfg.scheduler.replay_window = 0;
  cfg.kv.num_global_blocks = 16;
  cfg.kv.num_state_slots = 4;
  EngineCore core(cfg, std::make_unique<runtime::ModelRunner>(std::move(fake), 1));
  ASSERT_TRUE(generate(core, {greedy_request(prompt, 2)}).has_value());
  EXPECT_FALSE(generate(core, {greedy_request(prompt, 2)}).has_value());
}

TEST(EngineCore, CacheSaltNeverShares) {
  std::mt19937 rng(3);
  const std::vector<int32_t> prompt = random_tokens(rng, 600);
  Harness h = make_engine({});
  (void)run(h, {greedy_request(prompt, 2, "tenant-a")});
  EXPECT_EQ(run(h, {greedy_request(prompt, 2, "tenant-b")})[0].usage.cached_tokens, 0);
  EXPECT_EQ(run(h, {greedy_request(prompt, 2)})[0].usage.cached_tokens, 0);
  EXPECT_EQ(run(h, {greedy_request(prompt, 2, "tenant-a")})[0].usage.cached_tokens, 512);
}

std::vector<EngineRequest> mixed_requests(uint32_t seed, int32_t n) {
  std::mt19937 rng(seed);
  std::vector<EngineRequest> reqs;
  const std::vector<int32_t> shared = random_tokens(rng, 300);
  for (int32_t i = 0; i < n; ++i) {
    std::vector<int32_t> prompt;
    if (i % 3 == 0) prompt = shared;  // some share a prefix (hits + replay under batching)
    const std::vector<int32_t> own = random_tokens(rng, 5 + static_cast<int32_t>(rng() % 500));
    prompt.insert(prompt.end(), own.begin(), own.end());
    EngineRequest r = greedy_request(prompt, 4 + static_cast<int32_t>(rng() % 40));
    if (i % 4 == 1) r.params.ignore_eos = false;  // may stop at EOS
    if (i % 5 == 2) {
      r.params.temperature = 0.8f;  // seeded sampling must not depend on the batch
      r.params.top_p = 0.9f;
      r.params.seed = 1000 + static_cast<uint64_t>(i);
    }
    reqs.push_back(std::move(r));
  }
  return reqs;
}

std::vector<std::vector<int32_t>> run_alone(const std::vector<EngineRequest>& reqs) {
  std::vector<std::vector<int32_t>> out;
  for (const EngineRequest& r : reqs) {
    Harness h = make_engine({.prefix_caching = false});
    out.push_back(run(h, {r})[0].token_ids);
  }
  return out;
}

TEST(EngineCore, StaggeredContinuousBatchingEqualsAlone) {
  const std::vector<EngineRequest> reqs = mixed_requests(7, 50);
  const auto alone = run_alone(reqs);
  std::mt19937 rng(8);
  std::vector<int32_t> arrivals;
  for (int32_t i = 0; i < 50; ++i) arrivals.push_back(static_cast<int32_t>(rng() % 120));
  for (bool async : {false, true}) {
    Harness h = make_engine({.num_blocks = 128, .max_num_seqs = 24, .budget = 384, .async = async});
    const auto batched = run(h, reqs, arrivals);
    ASSERT_EQ(batched.size(), reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(batched[i].token_ids, alone[i]) << "request " << i << " async=" << async;
    }
    expect_pool_idle(h);
  }
}

TEST(EngineCore, PreemptionRecomputeEqualsNoPreemption) {
  const std::vector<EngineRequest> reqs = mixed_requests(11, 16);
  const auto alone = run_alone(reqs);
  for (bool async : {false, true}) {
    // 12 blocks for 16 requests of up to ~3 blocks each: constant preemption.
    Harness h = make_engine({.num_blocks = 12, .max_num_seqs = 8, .budget = 256, .async = async});
    const auto batched = run(h, reqs);
    EXPECT_GT(h.core->scheduler().stats().num_preemptions, 0);
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(batched[i].token_ids, alone[i]) << "request " << i << " async=" << async;
    }
    expect_pool_idle(h);
  }
}

TEST(EngineCore, ChunkedPrefillThresholdEqualsOneShot) {
  const std::vector<EngineRequest> reqs = mixed_requests(12, 8);
  const auto alone = run_alone(reqs);
  Harness h = make_engine({.budget = 97, .long_prefill_threshold = 33});
  const auto out = run(h, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(out[i].token_ids, alone[i]);
}

TEST(EngineCore, AbortAtAnyPointFreesEverything) {
  std::mt19937 rng(5);
  for (int32_t abort_after_steps : {0, 1, 2, 6, 40}) {
    for (bool async : {false, true}) {
      Harness h = make_engine({.budget = 128, .async = async});
      std::vector<RequestId> ids;
      for (int32_t i = 0; i < 4; ++i) {
        auto id = h.core->add_request(greedy_request(random_tokens(rng, 600), 50));
        ASSERT_TRUE(id.has_value());
        ids.push_back(*id);
      }
      for (int32_t s = 0; s < abort_after_steps; ++s) ASSERT_TRUE(h.core->step().has_value());
      for (RequestId id : ids) h.core->abort_request(id);
      int32_t aborted = 0;
      while (h.core->has_unfinished_requests()) {
        auto outs = h.core->step();
        ASSERT_TRUE(outs.has_value());
        for (const RequestOutput& o : *outs) aborted += o.finish_reason == FinishReason::kAbort;
      }
      EXPECT_EQ(aborted, 4) << "after " << abort_after_steps << " steps";
      expect_pool_idle(h);
    }
  }
}

TEST(EngineCore, StopConditions) {
  std::mt19937 rng(6);
  const std::vector<int32_t> prompt = random_tokens(rng, 40);
  Harness h = make_engine({});
  const auto base = run(h, {greedy_request(prompt, 30)})[0];
  ASSERT_EQ(base.finish_reason, FinishReason::kLength);
  ASSERT_EQ(base.token_ids.size(), 30u);
  // stop_token_ids: ends at the first occurrence after min_tokens, the token is included.
  const int32_t stop_tok = base.token_ids[5];
  EngineRequest r = greedy_request(prompt, 30);
  r.params.stop_token_ids = {stop_tok};
  auto c = run(h, {r})[0];
  const size_t first = static_cast<size_t>(
      std::find(base.token_ids.begin(), base.token_ids.end(), stop_tok) - base.token_ids.begin());
  EXPECT_EQ(c.finish_reason, FinishReason::kStop);
  EXPECT_EQ(c.stop_reason, std::to_string(stop_tok));
  EXPECT_EQ(c.token_ids.size(), first + 1);
  // Stop strings: the text is cut before the match (or after it with include_stop_str_in_output).
  std::string text;
  for (int32_t t : base.token_ids) text += static_cast<char>('a' + t % 26);
  const std::string stop = text.substr(10, 3);
  const size_t at = text.find(stop);
  EngineRequest s = greedy_request(prompt, 30);
  s.params.stop = {stop};
  c = run(h, {s})[0];
  EXPECT_EQ(c.finish_reason, FinishReason::kStop);
  EXPECT_EQ(c.stop_reason, stop);
  EXPECT_EQ(c.text, text.substr(0, at));
  EXPECT_EQ(c.token_ids.size(), at + stop.size());
  s.params.include_stop_str_in_output = true;
  EXPECT_EQ(run(h, {s})[0].text, text.substr(0, at + stop.size()));
  // Without a stop the full text streams out.
  EXPECT_EQ(base.text, text);
  expect_pool_idle(h);
}

TEST(EngineCore, EosRespectsMinTokensAndIgnoreEos) {
  std::mt19937 rng(9);
  Harness h = make_engine({});
  int32_t stopped_by_eos = 0;
  for (int32_t i = 0; i < 30; ++i) {
    EngineRequest r = greedy_request(random_tokens(rng, 20), 200);
    r.params.ignore_eos = false;
    r.params.min_tokens = 10;
    const auto c = run(h, {r})[0];
    if (c.finish_reason == FinishReason::kStop) {
      ++stopped_by_eos;
      EXPECT_EQ(c.token_ids.back(), kEos);
      EXPECT_GE(c.token_ids.size(), 11u);
    }
    for (size_t k = 0; k + 1 < c.token_ids.size(); ++k) EXPECT_NE(c.token_ids[k], kEos);
  }
  EXPECT_GT(stopped_by_eos, 0);
}

TEST(EngineClient, ThreadedStreamsMatchOffline) {
  const std::vector<EngineRequest> reqs = mixed_requests(21, 12);
  const auto alone = run_alone(reqs);
  Harness h = make_engine({.async = true});
  EngineClient client(std::move(h.core));
  std::vector<std::vector<int32_t>> got(reqs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < reqs.size(); ++i) {
    threads.emplace_back([&, i] {
      auto stream = client.add_request(reqs[i]);
      while (auto o = stream->next()) {
        got[i].insert(got[i].end(), o->new_token_ids.begin(), o->new_token_ids.end());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i], alone[i]) << i;
  const std::string metrics = client.render_metrics("tiny");
  EXPECT_NE(metrics.find("moeserve:generation_tokens_total{model_name=\"tiny\"}"),
            std::string::npos);
  EXPECT_NE(metrics.find("moeserve:time_to_first_token_seconds_bucket"), std::string::npos);
  EXPECT_NE(metrics.find("finished_reason=\"length\""), std::string::npos);
}

TEST(EngineClient, AbortAndValidationErrors) {
  Harness h = make_engine({});
  kv::KvCacheManager* kv = &h.core->scheduler().kv();
  EngineClient client(std::move(h.core));
  EngineRequest bad = greedy_request({5, 6, 7}, 4);
  bad.params.top_p = 0.0f;
  auto s = client.add_request(bad);
  auto o = s->next();
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->finish_reason, FinishReason::kError);
  EXPECT_NE(o->error.find("top_p"), std::string::npos);
  EXPECT_FALSE(s->next().has_value());

  std::mt19937 rng(4);
  auto long_req = client.add_request(greedy_request(random_tokens(rng, 100), 10000));
  auto first = long_req->next();
  ASSERT_TRUE(first.has_value());
  client.abort(long_req->id());
  FinishReason last = FinishReason::kNone;
  while (auto x = long_req->next()) last = x->finish_reason;
  EXPECT_EQ(last, FinishReason::kAbort);
  client.shutdown();
  EXPECT_EQ(kv->num_free_blocks(), kv->num_global_blocks());
}

}  // namespace
}  // namespace moeserve::engine

namespace moeserve::engine {
namespace {

TEST(EngineClient, CallbackOutputsMatchOffline) {
  const std::vector<EngineRequest> reqs = mixed_requests(31, 6);
  const auto alone = run_alone(reqs);
  Harness h = make_engine({});
  EngineClient client(std::move(h.core));
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<int32_t>> got(reqs.size());
  size_t finished = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    (void)client.add_request(reqs[i], [&, i](RequestOutput o) {
      std::lock_guard lock(mu);
      got[i].insert(got[i].end(), o.new_token_ids.begin(), o.new_token_ids.end());
      if (o.finished) ++finished;
      cv.notify_all();
    });
  }
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return finished == reqs.size(); });
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i], alone[i]) << i;
}

}  // namespace
}  // namespace moeserve::engine
