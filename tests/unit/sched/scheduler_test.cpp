#include "sched/scheduler.h"

#include <gtest/gtest.h>

namespace moeserve::sched {
namespace {

std::unique_ptr<Request> make_request(RequestId id, int32_t prompt_len, int32_t max_tokens = 8) {
  std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
  for (int32_t i = 0; i < prompt_len; ++i)
    prompt[static_cast<size_t>(i)] = (i * 7 + static_cast<int32_t>(id)) % 50 + 2;
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return std::make_unique<Request>(id, std::move(prompt), p, /*eos=*/1);
}

kv::KvCacheConfig kv_config(int32_t blocks, int32_t slots = 8) {
  kv::KvCacheConfig c;
  c.num_global_blocks = blocks;
  c.num_state_slots = slots;
  c.check_invariants = true;
  return c;
}

// Samples token 5 for every request that asked for a sample.
ModelRunnerOutput fake_output(const SchedulerOutput& so) {
  ModelRunnerOutput out;
  for (const ScheduledRequest& s : so.requests) {
    if (s.samples) out.outputs.push_back(SampledTokens{s.id, {5}, {}});
  }
  return out;
}

TEST(Scheduler, TokenBudgetChunksPrefillAndMixesDecode) {
  SchedulerConfig cfg;
  cfg.max_num_batched_tokens = 100;
  Scheduler s(cfg, kv_config(16));
  ASSERT_TRUE(s.add_request(make_request(1, 30)).has_value());
  ASSERT_TRUE(s.add_request(make_request(2, 150)).has_value());
  SchedulerOutput so = s.schedule();
  ASSERT_EQ(so.requests.size(), 2u);
  EXPECT_EQ(so.requests[0].num_scheduled_tokens, 30);
  EXPECT_TRUE(so.requests[0].samples);
  EXPECT_EQ(so.requests[1].num_scheduled_tokens, 70);  // chunked
  EXPECT_FALSE(so.requests[1].samples);
  EXPECT_EQ(so.total_num_scheduled_tokens, 100);
  EXPECT_EQ(so.new_requests.size(), 2u);
  (void)s.update_from_output(so, fake_output(so));
  so = s.schedule();
  // Decode of 1 (1 token) and the rest of 2's prefill (80) share one step.
  ASSERT_EQ(so.requests.size(), 2u);
  EXPECT_EQ(so.requests[0].num_scheduled_tokens, 1);
  EXPECT_EQ(so.requests[1].num_scheduled_tokens, 80);
  EXPECT_TRUE(so.requests[1].samples);
  EXPECT_TRUE(so.new_requests.empty());
}

TEST(Scheduler, LongPrefillThresholdAndMaxNumSeqs) {
  SchedulerConfig cfg;
  cfg.max_num_batched_tokens = 1000;
  cfg.long_prefill_token_threshold = 64;
  cfg.max_num_seqs = 2;
  Scheduler s(cfg, kv_config(32));
  for (RequestId i = 0; i < 3; ++i) ASSERT_TRUE(s.add_request(make_request(i, 200)).has_value());
  SchedulerOutput so = s.schedule();
  ASSERT_EQ(so.requests.size(), 2u);
  EXPECT_EQ(so.requests[0].num_scheduled_tokens, 64);
  EXPECT_EQ(s.num_waiting(), 1);
}

TEST(Scheduler, PrefixHitSchedulesReplayWindow) {
  SchedulerConfig cfg;
  cfg.replay_window = 128;
  Scheduler s(cfg, kv_config(16));
  ASSERT_TRUE(s.add_request(make_request(1, 600, 1)).has_value());
  SchedulerOutput so = s.schedule();
  (void)s.update_from_output(so, fake_output(so));
  ASSERT_EQ(s.num_running(), 0);
  // Same prompt again: 512 cached tokens; computation restarts at 512 - 128 = 384 with 128 replay.
  ASSERT_TRUE(s.add_request(make_request(1 + 0, 600, 1)).has_value());
  so = s.schedule();
  ASSERT_EQ(so.requests.size(), 1u);
  EXPECT_EQ(so.requests[0].num_computed_tokens, 384);
  EXPECT_EQ(so.requests[0].num_replay_tokens, 128);
  EXPECT_EQ(so.requests[0].num_scheduled_tokens, 600 - 384);
  EXPECT_EQ(s.stats().prefix_cache_hits, 512);
}

TEST(Scheduler, PreemptsNewestFirstAndRecomputes) {
  SchedulerConfig cfg;
  cfg.max_num_batched_tokens = 2048;
  Scheduler s(cfg, kv_config(4));
  // Three requests of 255 prompt tokens each fill 3 blocks; decoding past 256 needs a new block.
  for (RequestId i = 0; i < 4; ++i)
    ASSERT_TRUE(s.add_request(make_request(i, 255, 300)).has_value());
  SchedulerOutput so = s.schedule();
  EXPECT_EQ(so.requests.size(), 4u);
  (void)s.update_from_output(so, fake_output(so));
  so = s.schedule();  // every request's 256th token: all fit in their first block
  (void)s.update_from_output(so, fake_output(so));
  so = s.schedule();  // token 257 needs a second block each: the newest (3, then 2, 1) go
  ASSERT_FALSE(so.preempted_req_ids.empty());
  EXPECT_EQ(so.preempted_req_ids.front(), 3);
  EXPECT_EQ(s.num_running() + s.num_waiting(), 4);
  EXPECT_TRUE(s.kv().check_invariants().has_value());
  // Run to completion: never deadlocks, everything freed at the end.
  for (int step = 0; step < 5000 && s.has_unfinished_requests(); ++step) {
    (void)s.update_from_output(so, fake_output(so));
    so = s.schedule();
  }
  (void)s.update_from_output(so, fake_output(so));
  EXPECT_FALSE(s.has_unfinished_requests());
  EXPECT_GT(s.stats().num_preemptions, 0);
  EXPECT_EQ(s.kv().num_free_blocks(), 4);
}

TEST(Scheduler, RequestThatCanNeverFitEndsWithLength) {
  Scheduler s(SchedulerConfig{}, kv_config(2));
  ASSERT_TRUE(s.add_request(make_request(1, 500, 100)).has_value());
  for (int i = 0; i < 200 && s.has_unfinished_requests(); ++i) {
    SchedulerOutput so = s.schedule();
    (void)s.update_from_output(so, fake_output(so));
  }
  EXPECT_FALSE(s.has_unfinished_requests());
  EXPECT_EQ(s.kv().num_free_blocks(), 2);
  // A prompt larger than the whole pool is rejected up front.
  EXPECT_FALSE(s.add_request(make_request(2, 600)).has_value());
}

TEST(Scheduler, AsyncPlaceholdersScheduleAheadAndRespectMaxTokens) {
  Scheduler s(SchedulerConfig{}, kv_config(8));
  ASSERT_TRUE(s.add_request(make_request(1, 10, 3)).has_value());
  SchedulerOutput s0 = s.schedule();
  SchedulerOutput s1 = s.schedule();  // before s0's token is known
  ASSERT_EQ(s1.requests.size(), 1u);
  EXPECT_EQ(s1.requests[0].num_computed_tokens, 10);
  EXPECT_TRUE(s1.requests[0].samples);
  SchedulerOutput s2 = s.schedule();
  ASSERT_EQ(s2.requests.size(), 1u);  // third token in flight: max_tokens 3 reached
  EXPECT_TRUE(s.schedule().empty());
  (void)s.update_from_output(s0, fake_output(s0));
  (void)s.update_from_output(s1, fake_output(s1));
  auto u = s.update_from_output(s2, fake_output(s2));
  ASSERT_EQ(u.size(), 1u);
  EXPECT_EQ(u[0].finish_reason, FinishReason::kLength);
  EXPECT_EQ(u[0].num_output_tokens, 3);
  EXPECT_FALSE(s.has_unfinished_requests());
}

TEST(Scheduler, AbortFreesAtAnyState) {
  SchedulerConfig cfg;
  cfg.max_num_batched_tokens = 64;
  Scheduler s(cfg, kv_config(8));
  ASSERT_TRUE(s.add_request(make_request(1, 300)).has_value());
  ASSERT_TRUE(s.add_request(make_request(2, 10)).has_value());
  s.finish_request(2, FinishReason::kAbort);  // waiting
  SchedulerOutput so = s.schedule();          // 1 is mid-prefill
  s.finish_request(1, FinishReason::kAbort);
  auto u = s.update_from_output(so, fake_output(so));
  ASSERT_EQ(u.size(), 2u);
  EXPECT_EQ(u[0].finish_reason, FinishReason::kAbort);
  EXPECT_EQ(s.kv().num_free_blocks(), 8);
  EXPECT_EQ(s.schedule().finished_req_ids, std::vector<RequestId>{1});
}

}  // namespace
}  // namespace moeserve::sched
