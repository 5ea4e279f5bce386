// `moeserve bench scheduler`: CPU cost of the engine's per-step host work with N running requests
// of mixed context lengths: Scheduler::schedule(), ModelRunner::execute() over a no-op forward
// (batch metadata + greedy sampling over a 16-token vocabulary) and
// Scheduler::update_from_output(). Goal (issue 5): schedule + batch preparation < 1 ms per step at
// 256 requests.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "app/commands.h"
#include "bench/bench_result.h"
#include "common/logging.h"
#include "runtime/model_runner.h"
#include "sched/scheduler.h"

namespace moeserve::app {
namespace {

struct BenchSchedulerOptions {
  std::vector<int32_t> num_requests = {256, 1024};
  int32_t steps = 500;
  int32_t min_context = 64;
  int32_t max_context = 8192;
  int32_t max_num_batched_tokens = 8192;
  uint64_t seed = 1;
  std::string output = "scheduler_result.json";
};

// Batch preparation only: the forward is not part of this benchmark. A 16-token vocabulary keeps
// the (greedy) sampling of the runner negligible next to the batch preparation it measures.
class NoForward final : public runtime::ForwardModel {
 public:
  [[nodiscard]] int32_t vocab_size() const override { return 16; }
  [[nodiscard]] Status forward(const runtime::BatchMetadata&, std::span<float>) override {
    return ok_status();
  }
};

double thread_cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
}

struct Stat {
  double mean = 0, p50 = 0, p99 = 0;
};
Stat summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  Stat s;
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(std::max<size_t>(1, v.size()));
  s.p50 = v[v.size() / 2];
  s.p99 = v[std::min(v.size() - 1, v.size() * 99 / 100)];
  return s;
}

Result<nlohmann::json> run_one(const BenchSchedulerOptions& opt, int32_t n) {
  std::mt19937_64 rng(opt.seed + static_cast<uint64_t>(n));
  std::uniform_int_distribution<int32_t> ctx(opt.min_context, opt.max_context);
  std::vector<int32_t> lens(static_cast<size_t>(n));
  int64_t total = 0;
  for (int32_t& l : lens) total += (l = ctx(rng));
  // Requests decode during the warm-up too: size the pool so that nothing is ever preempted.
  const int64_t warm_bound = total / opt.max_num_batched_tokens + 2;
  int64_t blocks = 0;
  for (int32_t l : lens) {
    blocks += (l + opt.steps + warm_bound + 2 * kv::kBlockTokens) / kv::kBlockTokens;
  }
  sched::SchedulerConfig sc;
  sc.max_num_batched_tokens = opt.max_num_batched_tokens;
  sc.max_num_seqs = n;
  sc.replay_window = 128;
  kv::KvCacheConfig kc;
  kc.num_global_blocks = static_cast<int32_t>(blocks);
  kc.num_state_slots = n;
  kc.check_invariants = false;  // measure the release code path even in debug builds
  sched::Scheduler scheduler(sc, kc);
  runtime::ModelRunner runner(std::make_unique<NoForward>(), 1);
  for (int32_t i = 0; i < n; ++i) {
    std::vector<int32_t> prompt(static_cast<size_t>(lens[static_cast<size_t>(i)]));
    for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 129000);
    sched::SamplingParams p;
    p.temperature = 0;
    p.max_tokens = 1 << 20;
    p.ignore_eos = true;
    MS_RETURN_IF_ERROR(scheduler.add_request(
        std::make_unique<sched::Request>(i, std::move(prompt), p, /*eos=*/1)));
  }
  // Warm up: prefill everything (chunked under the budget) until every request decodes.
  int32_t warm_steps = 0;
  for (;; ++warm_steps) {
    sched::SchedulerOutput so = scheduler.schedule();
    MS_ASSIGN_OR_RETURN(sched::ModelRunnerOutput out, runner.execute(so));
    (void)scheduler.update_from_output(so, out);
    if (scheduler.num_running() == n && so.total_num_scheduled_tokens == n) break;
    if (warm_steps > 100000) return make_error(ErrorCode::kInternal, "warm-up did not converge");
  }
  std::vector<double> sched_us, prep_us, update_us, total_us;
  for (int32_t s = 0; s < opt.steps; ++s) {
    const double t0 = thread_cpu_us();
    sched::SchedulerOutput so = scheduler.schedule();
    const double t1 = thread_cpu_us();
    MS_ASSIGN_OR_RETURN(sched::ModelRunnerOutput out, runner.execute(so));
    const double t2 = thread_cpu_us();
    const double t3 = t2;
    (void)scheduler.update_from_output(so, out);
    const double t4 = thread_cpu_us();
    if (static_cast<int32_t>(so.requests.size()) != n) {
      return make_error(ErrorCode::kInternal, "step {} scheduled {} of {} requests", s,
                        so.requests.size(), n);
    }
    sched_us.push_back(t1 - t0);
    prep_us.push_back(t2 - t1);
    update_us.push_back(t4 - t3);
    total_us.push_back(t2 - t0);
  }
  const Stat a = summarize(sched_us), b = summarize(prep_us), c = summarize(update_us),
             d = summarize(total_us);
  fmt::print(
      "{:>6} requests: schedule {:7.1f} us, prepare {:7.1f} us, schedule+prepare {:7.1f} us "
      "(p99 {:7.1f}), update {:7.1f} us  [warm-up {} steps, {} KV blocks]\n",
      n, a.mean, b.mean, d.mean, d.p99, c.mean, warm_steps, blocks);
  auto j = [](const Stat& s) {
    return nlohmann::json{{"mean", s.mean}, {"p50", s.p50}, {"p99", s.p99}};
  };
  return nlohmann::json{{"num_requests", n},
                        {"schedule_us", j(a)},
                        {"prepare_batch_us", j(b)},
                        {"schedule_plus_prepare_us", j(d)},
                        {"update_from_output_us", j(c)},
                        {"kv_blocks", blocks},
                        {"meets_1ms_goal", d.mean < 1000.0}};
}

int run_bench_scheduler(const BenchSchedulerOptions& opt) {
  bench::BenchResult result;
  result.benchmark = "scheduler";
  result.config = {{"num_requests", opt.num_requests},
                   {"steps", opt.steps},
                   {"context_range", {opt.min_context, opt.max_context}},
                   {"max_num_batched_tokens", opt.max_num_batched_tokens},
                   {"device", bench::host_device_description()},
#ifdef NDEBUG
                   {"build", "release"}
#else
                   {"build", "debug"}
#endif
  };
  result.roofline_note = "host CPU time per step (thread CPU clock); no device work";
  nlohmann::json runs = nlohmann::json::array();
  for (int32_t n : opt.num_requests) {
    auto r = run_one(opt, n);
    if (!r) {
      MS_LOG_ERROR("bench scheduler: {}", r.error().message);
      return 1;
    }
    runs.push_back(*r);
  }
  result.results = {{"runs", runs}};
  if (auto st = result.write(opt.output); !st) {
    MS_LOG_ERROR("bench scheduler: {}", st.error().message);
    return 1;
  }
  fmt::print("wrote {}\n", opt.output);
  return 0;
}

}  // namespace

void register_bench_scheduler(CLI::App& bench) {
  auto opt = std::make_shared<BenchSchedulerOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "scheduler", "Host CPU time of schedule + batch preparation per step (N running requests)");
  cmd->add_option("--num-requests", opt->num_requests, "running request counts to measure")
      ->capture_default_str();
  cmd->add_option("--steps", opt->steps, "measured decode steps per count")->capture_default_str();
  cmd->add_option("--min-context", opt->min_context)->capture_default_str();
  cmd->add_option("--max-context", opt->max_context)->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", opt->max_num_batched_tokens)->capture_default_str();
  cmd->add_option("--seed", opt->seed)->capture_default_str();
  cmd->add_option("--output", opt->output, "result JSON")->capture_default_str();
  cmd->callback([opt] { exit_code() = run_bench_scheduler(*opt); });
}

}  // namespace moeserve::app
