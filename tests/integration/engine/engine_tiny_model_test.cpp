// EngineCore over the real CPU forward on the generated tiny model (model.md §9): continuous
// batching with staggered arrivals ≡ each request alone, prefix-cache hit ≡ miss, preemption +
// recompute ≡ none (greedy, batch-invariant GEMM).
#include <unistd.h>

#include <filesystem>
#include <random>

#include <gtest/gtest.h>

#include "backend/backend.h"
#include "engine/offline.h"
#include "model/arch/registry.h"
#include "model/config.h"
#include "model/tiny_model.h"
#include "runtime/causal_lm_forward.h"
#include "runtime/model_runner.h"

namespace moeserve::engine {
namespace {

class TinyEngine : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                     ("moeserve_engine_tiny_" + std::to_string(::getpid())));
    ASSERT_TRUE(write_generated_model(*dir_, tiny_config_json(), 5).has_value());
    auto backend = create_backend("cpu");
    ASSERT_TRUE(backend.has_value());
    backend_ = backend->release();
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
    delete backend_;
  }

  struct Options {
    int32_t num_blocks = 16;
    int32_t max_num_seqs = 8;
    int32_t budget = 96;
    bool prefix_caching = true;
    bool async = false;
  };
  std::unique_ptr<EngineCore> make(const Options& o) {
    auto lm = arch::load_causal_lm(*dir_, *backend_);
    EXPECT_TRUE(lm.has_value()) << (lm ? "" : lm.error().message);
    (*lm)->set_batch_invariant(true);
    const int32_t window = (*lm)->config().sliding_window;
    const int32_t eos = (*lm)->config().eos_token_id;
    auto fwd = std::make_unique<runtime::CausalLmForwardModel>(std::move(*lm),
                                                               arch::ForwardMode::kProduction);
    EngineCoreConfig cfg;
    cfg.scheduler.max_num_batched_tokens = o.budget;
    cfg.scheduler.max_num_seqs = o.max_num_seqs;
    cfg.scheduler.replay_window = window;
    cfg.scheduler.max_model_len = 512;
    cfg.kv.num_global_blocks = o.num_blocks;
    cfg.kv.num_state_slots = o.max_num_seqs;
    cfg.kv.enable_prefix_caching = o.prefix_caching;
    cfg.async_scheduling = o.async;
    cfg.eos_token_id = eos;
    return std::make_unique<EngineCore>(cfg,
                                        std::make_unique<runtime::ModelRunner>(std::move(fwd), 3));
  }

  static std::vector<EngineRequest> requests(uint32_t seed, int32_t n, int32_t max_len) {
    std::mt19937 rng(seed);
    std::vector<EngineRequest> out;
    for (int32_t i = 0; i < n; ++i) {
      EngineRequest r;
      const int32_t len = 3 + static_cast<int32_t>(rng() % static_cast<uint32_t>(max_len));
      for (int32_t k = 0; k < len; ++k)
        r.prompt_token_ids.push_back(3 + static_cast<int32_t>(rng() % 250));
      r.params.temperature = 0;
      r.params.max_tokens = 2 + static_cast<int32_t>(rng() % 6);
      r.params.ignore_eos = true;
      out.push_back(std::move(r));
    }
    return out;
  }

  std::vector<std::vector<int32_t>> alone(const std::vector<EngineRequest>& reqs) {
    std::vector<std::vector<int32_t>> out;
    for (const EngineRequest& r : reqs) {
      auto core = make({.prefix_caching = false});
      auto c = generate(*core, {r});
      EXPECT_TRUE(c.has_value()) << (c ? "" : c.error().message);
      out.push_back(c ? (*c)[0].token_ids : std::vector<int32_t>{});
    }
    return out;
  }

  static std::filesystem::path* dir_;
  static Backend* backend_;
};

std::filesystem::path* TinyEngine::dir_ = nullptr;
Backend* TinyEngine::backend_ = nullptr;

TEST_F(TinyEngine, StaggeredContinuousBatchingEqualsAlone) {
  const auto reqs = requests(1, 10, 120);
  const auto ref = alone(reqs);
  std::vector<int32_t> arrivals = {0, 0, 1, 2, 3, 5, 8, 8, 13, 21};
  for (bool async : {false, true}) {
    auto core = make({.async = async});
    auto got = generate(*core, reqs, arrivals);
    ASSERT_TRUE(got.has_value()) << got.error().message;
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ((*got)[i].token_ids, ref[i]) << "request " << i << " async=" << async;
    }
  }
}

TEST_F(TinyEngine, PrefixHitEqualsMiss) {
  auto reqs = requests(2, 1, 1);
  std::mt19937 rng(9);
  reqs[0].prompt_token_ids.clear();
  for (int32_t k = 0; k < 300; ++k)
    reqs[0].prompt_token_ids.push_back(3 + static_cast<int32_t>(rng() % 250));
  reqs[0].params.max_tokens = 6;
  const auto ref = alone(reqs);
  auto core = make({});
  ASSERT_TRUE(generate(*core, reqs).has_value());
  auto hit = generate(*core, reqs);
  ASSERT_TRUE(hit.has_value()) << hit.error().message;
  EXPECT_EQ((*hit)[0].usage.cached_tokens, 256);
  EXPECT_EQ((*hit)[0].token_ids, ref[0]);
}

TEST_F(TinyEngine, PreemptionEqualsNoPreemption) {
  auto reqs = requests(3, 6, 200);
  for (auto& r : reqs) r.params.max_tokens = 6;
  const auto ref = alone(reqs);
  auto core = make({.num_blocks = 4, .max_num_seqs = 6, .budget = 128});
  auto got = generate(*core, reqs);
  ASSERT_TRUE(got.has_value()) << got.error().message;
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ((*got)[i].token_ids, ref[i]) << i;
}

}  // namespace
}  // namespace moeserve::engine
