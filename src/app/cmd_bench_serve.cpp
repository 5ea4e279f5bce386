// `moeserve bench serve | make-trace | sweep`: the serving benchmark (InferenceX/AgentX counting,
// docs/benchmarks.md), the synthetic agentic trace generator, and a concurrency sweep that plots
// with tools/plot_bench.py.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "app/commands.h"
#include "bench/serve_bench.h"
#include "bench/serve_trace.h"
#include "common/logging.h"

namespace moeserve::app {

namespace {

using bench::ServeBenchConfig;

void add_serve_options(CLI::App& cmd, ServeBenchConfig& c, bool with_concurrency) {
  cmd.add_option("--base-url", c.base_url, "Server URL (http://host:port)")->capture_default_str();
  cmd.add_option("--model", c.model, "Model name (default: first of GET /v1/models)");
  cmd.add_option("--endpoint", c.endpoint, "completions (token-id prompts, exact ISL) | chat")
      ->check(CLI::IsMember({"completions", "chat"}))
      ->capture_default_str();
  cmd.add_option("--api-key", c.api_key, "Bearer key (default: $OPENAI_API_KEY)");
  cmd.add_option("--trace", c.trace, "JSONL trace to replay (default: fixed-length random)");
  cmd.add_option("--isl", c.isl, "Random workload: input tokens")->capture_default_str();
  cmd.add_option("--osl", c.osl, "Random workload: output tokens")->capture_default_str();
  if (with_concurrency)
    cmd.add_option("--concurrency", c.concurrency, "Session lanes")->capture_default_str();
  cmd.add_option("--request-rate", c.request_rate,
                 "Poisson session arrivals per second (0: lanes, --concurrency)")
      ->capture_default_str();
  cmd.add_option("--max-concurrency", c.max_concurrency, "In-flight cap with --request-rate")
      ->capture_default_str();
  cmd.add_option("--warmup", c.warmup, "Warm-up requests per lane (not counted)")
      ->capture_default_str();
  cmd.add_flag("--random-lane-start", c.random_lane_start,
               "AgentX: each lane's first session starts at a random 25-75% point of its turns");
  cmd.add_option("--duration", c.duration_s, "Stop issuing after this many seconds")
      ->capture_default_str();
  cmd.add_option("--max-requests", c.max_requests, "Measured requests (per DP rank)")
      ->capture_default_str();
  cmd.add_option("--request-timeout", c.request_timeout_s, "Seconds per request")
      ->capture_default_str();
  cmd.add_option("--max-idle", c.max_idle_s, "Cap on a trace idle gap (s)")->capture_default_str();
  cmd.add_option("--idle-scale", c.idle_scale, "Multiplies trace idle gaps (0: none)")
      ->capture_default_str();
  cmd.add_flag("--ignore-eos,!--no-ignore-eos", c.ignore_eos,
               "Send ignore_eos + min_tokens so outputs have exactly the target length")
      ->capture_default_str();
  cmd.add_option("--temperature", c.temperature, "Sampling temperature")->capture_default_str();
  cmd.add_option("--token-lo", c.token_lo, "Token-id prompts: smallest id")->capture_default_str();
  cmd.add_option("--token-hi", c.token_hi, "Token-id prompts: one past the largest id")
      ->capture_default_str();
  cmd.add_option("--seed", c.seed, "Workload seed")->capture_default_str();
  cmd.add_flag("--cache-bust,!--no-cache-bust", c.cache_bust,
               "Salt prompts per run (a rerun does not hit the last run's prefix cache)")
      ->capture_default_str();
  cmd.add_option("--num-gpus", c.num_gpus, "GPUs of the deployment (throughput per GPU)")
      ->capture_default_str();
  cmd.add_option("--gpu-hour-price", c.gpu_hour_price, "$/GPU/hr for cost per 1M tokens")
      ->capture_default_str();
  cmd.add_option("--metrics-interval", c.metrics_interval_s,
                 "Seconds between /metrics scrapes (0: off)")
      ->capture_default_str();
  cmd.add_option("--dp-replay", c.dp_replay, "none | mirror | lag (identical requests per DP rank)")
      ->check(CLI::IsMember({"none", "mirror", "lag"}))
      ->capture_default_str();
  cmd.add_option("--dp-size", c.dp_size, "DP ranks to replay on (X-data-parallel-rank)")
      ->capture_default_str();
  cmd.add_option("--lag-seconds", c.lag_seconds, "Lag replay: rank r starts r * this later")
      ->capture_default_str();
  cmd.add_option("--max-error-rate", c.max_error_rate, "Fail (exit 1) above this error rate")
      ->capture_default_str();
  cmd.add_flag("!--no-save-requests", c.save_requests, "Leave per-request records out of the JSON");
}

// Runs one benchmark, prints the table, writes JSON. Returns the exit code.
int run_one(ServeBenchConfig c) {
  if (c.api_key.empty()) {
    if (const char* k = std::getenv("OPENAI_API_KEY")) c.api_key = k;
  }
  auto out = bench::run_serve_bench(c);
  if (!out) {
    MS_LOG_ERROR("bench serve: {}", out.error().message);
    return 2;
  }
  std::fputs(bench::format_summary_table(*out).c_str(), stdout);
  std::fflush(stdout);
  if (!c.output_json.empty()) {
    std::error_code ec;
    const auto parent = std::filesystem::path(c.output_json).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    std::ofstream f(c.output_json);
    f << out->json.dump(2) << "\n";
    if (!f) {
      MS_LOG_ERROR("cannot write {}", c.output_json);
      return 2;
    }
    std::printf("wrote %s\n", c.output_json.c_str());
  }
  if (out->failed) {
    MS_LOG_ERROR("bench serve FAILED: error rate {:.1f}% (limit {:.1f}%), {} ok",
                 out->summary.error_rate * 100, c.max_error_rate * 100, out->summary.num_ok);
    return 1;
  }
  return 0;
}

std::string find_plot_script(const std::string& given) {
  if (!given.empty()) return given;
  for (const char* p :
       {"tools/plot_bench.py", "../tools/plot_bench.py", "../../tools/plot_bench.py"})
    if (std::filesystem::exists(p)) return p;
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  for (auto dir = exe.parent_path(); !ec && !dir.empty() && dir != dir.root_path();
       dir = dir.parent_path())
    if (std::filesystem::exists(dir / "tools/plot_bench.py"))
      return (dir / "tools/plot_bench.py").string();
  return "tools/plot_bench.py";
}

}  // namespace

void register_bench_serve(CLI::App& bench_cmd) {
  // serve
  {
    auto c = std::make_shared<ServeBenchConfig>();
    CLI::App* cmd = bench_cmd.add_subcommand(
        "serve", "Serving benchmark against an OpenAI-compatible server (docs/benchmarks.md)");
    add_serve_options(*cmd, *c, true);
    cmd->add_option("--output-json,-o", c->output_json, "Result JSON path");
    cmd->callback([c] { exit_code() = run_one(*c); });
  }
  // make-trace
  {
    auto tc = std::make_shared<bench::AgenticTraceConfig>();
    auto path = std::make_shared<std::string>("agentic_trace.jsonl");
    CLI::App* cmd = bench_cmd.add_subcommand(
        "make-trace", "Synthetic agentic multi-turn trace (JSONL, one hash id per 64 tokens)");
    cmd->add_option("--output,-o", *path, "Trace path")->capture_default_str();
    cmd->add_option("--sessions", tc->num_sessions, "Top-level sessions")->capture_default_str();
    cmd->add_option("--min-turns", tc->min_turns)->capture_default_str();
    cmd->add_option("--max-turns", tc->max_turns)->capture_default_str();
    cmd->add_option("--system-tokens", tc->system_prompt_tokens, "Shared system prompt")
        ->capture_default_str();
    cmd->add_option("--first-user-tokens", tc->first_user_tokens)->capture_default_str();
    cmd->add_option("--min-append", tc->min_append_tokens, "Tokens appended per turn (min)")
        ->capture_default_str();
    cmd->add_option("--max-append", tc->max_append_tokens)->capture_default_str();
    cmd->add_option("--min-output", tc->min_output_tokens)->capture_default_str();
    cmd->add_option("--max-output", tc->max_output_tokens)->capture_default_str();
    cmd->add_option("--subagent-prob", tc->subagent_probability, "Per-turn fork probability")
        ->capture_default_str();
    cmd->add_option("--subagent-turns", tc->subagent_turns)->capture_default_str();
    cmd->add_option("--mean-idle", tc->mean_idle_s, "Mean idle gap between turns (s)")
        ->capture_default_str();
    cmd->add_option("--max-idle", tc->max_idle_s)->capture_default_str();
    cmd->add_option("--max-input", tc->max_input_tokens, "Sessions stop before this context")
        ->capture_default_str();
    cmd->add_option("--seed", tc->seed)->capture_default_str();
    cmd->callback([tc, path] {
      const auto reqs = bench::make_agentic_trace(*tc);
      if (auto st = bench::write_trace_jsonl(*path, reqs); !st) {
        MS_LOG_ERROR("{}", st.error().message);
        exit_code() = 2;
        return;
      }
      const auto stats = bench::ideal_cache_stats(reqs);
      const auto sessions = bench::group_sessions(reqs);
      int64_t out_tokens = 0, subagents = 0;
      for (const auto& r : reqs) out_tokens += r.output_len;
      for (const auto& s : sessions) subagents += s.parent_session_id.empty() ? 0 : 1;
      std::printf(
          "wrote %s: %zu requests, %zu sessions (%lld sub-agents), %lld input tokens "
          "(%.1f%% prefix hits, ideal cache), %lld output tokens\n",
          path->c_str(), reqs.size(), sessions.size(), static_cast<long long>(subagents),
          static_cast<long long>(stats.input_tokens), stats.hit_ratio() * 100,
          static_cast<long long>(out_tokens));
    });
  }
  // sweep
  {
    auto c = std::make_shared<ServeBenchConfig>();
    auto concurrencies = std::make_shared<std::vector<int32_t>>(std::vector<int32_t>{1, 2, 4, 8});
    auto out_dir = std::make_shared<std::string>("bench_results/serve_sweep");
    auto plot = std::make_shared<std::string>();
    auto no_plot = std::make_shared<bool>(false);
    CLI::App* cmd = bench_cmd.add_subcommand(
        "sweep", "Runs bench serve at each concurrency, then tools/plot_bench.py");
    add_serve_options(*cmd, *c, false);
    cmd->add_option("--concurrencies", *concurrencies, "Comma-separated list")
        ->delimiter(',')
        ->capture_default_str();
    cmd->add_option("--out-dir", *out_dir, "Folder for serve_c<N>.json and PNGs")
        ->capture_default_str();
    cmd->add_option("--plot-script", *plot, "Path to tools/plot_bench.py");
    cmd->add_flag("--no-plot", *no_plot, "Skip plotting");
    cmd->callback([=] {
      std::vector<std::string> files;
      int worst = 0;
      for (int32_t conc : *concurrencies) {
        ServeBenchConfig one = *c;
        one.concurrency = conc;
        one.output_json = fmt::format("{}/serve_c{}.json", *out_dir, conc);
        std::printf("--- concurrency %d ---\n", conc);
        const int rc = run_one(one);
        if (rc == 2) {
          exit_code() = 2;
          return;
        }
        worst = std::max(worst, rc);
        files.push_back(one.output_json);
      }
      if (!*no_plot) {
        std::string cmdline =
            fmt::format("python3 '{}' --out-dir '{}'", find_plot_script(*plot), *out_dir);
        for (const auto& f : files) cmdline += " '" + f + "'";
        std::printf("%s\n", cmdline.c_str());
        std::fflush(stdout);
        if (std::system(cmdline.c_str()) != 0) {
          MS_LOG_ERROR("plotting failed (is matplotlib installed?)");
          worst = std::max(worst, 1);
        }
      }
      exit_code() = worst;
    });
  }
}

}  // namespace moeserve::app
