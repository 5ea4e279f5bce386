// `moeserve bench eplb`: simulates decode-step routing for the target (384 experts, top-6) and the
// draft (128 experts, top-3) at a given EP size, re-plans expert placement every K steps from the
// last W steps, and reports balance without EPLB, with EPLB and under uniform routing (JSON via
// BenchResult, optional PNG via tools/plot_eplb.py). Also times the planner at full model size.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "app/commands.h"
#include "bench/bench_result.h"
#include "common/logging.h"
#include "parallel/eplb/placement.h"
#include "parallel/eplb/routing.h"
#include "parallel/eplb/simulator.h"

namespace moeserve::app {

namespace {

using parallel::EplbBalance;
using parallel::EplbSimConfig;
using parallel::EplbSimResult;
using parallel::PlannerConfig;
using parallel::PopularityConfig;
using parallel::RoutingShape;
using parallel::RoutingSource;

struct ModelOptions {
  std::string name;
  int32_t num_experts = 0;
  int32_t top_k = 0;
  int32_t num_layers = 0;   // simulated layers
  int32_t full_layers = 0;  // layers of the real model, for the planner timing
  int32_t num_redundant = 32;
  int32_t tokens_per_request = 1;
  double zipf_exponent = 1.0;
  std::string replay;  // routing trace to replay instead of synthetic routing
};

struct BenchEplbOptions {
  std::string models = "both";
  ModelOptions target{"target", 384, 6, 4, 40, 32, 1, 0.82, ""};
  ModelOptions draft{"draft", 128, 3, 3, 3, 32, 1, 0.97, ""};
  int32_t num_ranks = 32;
  int32_t requests_per_rank = 72;
  int32_t num_steps = 3000;
  int32_t window_steps = 1000;
  int32_t rebalance_interval = 1000;
  std::string mode = "global";
  int32_t num_nodes = 1;
  int32_t num_groups = 1;
  bool no_refine = false;
  std::string replica_rule = "rank-round-robin";
  double layer_jitter = 0.1;
  int32_t drift_every = 0;
  int32_t drift_swaps = 4;
  int32_t hot_set = 32;
  uint64_t seed = 1;
  int32_t timeline_bucket = 10;
  int32_t timing_repeats = 5;
  std::string record_prefix;
  std::string output = "eplb_result.json";
  std::string plot;
  std::string plot_script = "tools/plot_eplb.py";
};

// Passes steps through from another source and writes each to a routing trace.
class RecordingSource final : public RoutingSource {
 public:
  RecordingSource(RoutingSource& inner, std::unique_ptr<parallel::RoutingTraceWriter> writer)
      : inner_(inner), writer_(std::move(writer)) {}
  const RoutingShape& shape() const override { return inner_.shape(); }
  Result<bool> next_step(std::span<int32_t> out) override {
    MS_ASSIGN_OR_RETURN(const bool more, inner_.next_step(out));
    if (more) MS_RETURN_IF_ERROR(writer_->write_step(out));
    return more;
  }
  Status close() { return writer_->close(); }

 private:
  RoutingSource& inner_;
  std::unique_ptr<parallel::RoutingTraceWriter> writer_;
};

nlohmann::json balance_json(const EplbBalance& b) {
  return {{"none", b.none}, {"eplb", b.eplb}, {"uniform", b.uniform}, {"recovered", b.recovered()}};
}

struct PlannerTiming {
  double min_ms = 0;  // wall clock (inflated when other processes share the cores)
  double median_ms = 0;
  double cpu_min_ms = 0;  // this thread's CPU time
  double cpu_median_ms = 0;
};

double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

// Plans `layers` layers of Zipf-shaped loads `repeats` times.
Result<PlannerTiming> time_planner(const PlannerConfig& config, std::span<const double> loads,
                                   int32_t layers, int32_t repeats) {
  std::vector<double> ms, cpu;
  for (int32_t i = 0; i < std::max(1, repeats); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = thread_cpu_ms();
    MS_ASSIGN_OR_RETURN(auto plan, parallel::plan_model_placement(loads, layers, config));
    cpu.push_back(thread_cpu_ms() - c0);
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if (plan.layers.size() != static_cast<size_t>(layers)) {
      return make_error(ErrorCode::kInternal, "planner returned {} layers", plan.layers.size());
    }
  }
  std::sort(ms.begin(), ms.end());
  std::sort(cpu.begin(), cpu.end());
  return PlannerTiming{ms.front(), ms[ms.size() / 2], cpu.front(), cpu[cpu.size() / 2]};
}

Result<nlohmann::json> run_model(const BenchEplbOptions& opt, const ModelOptions& m,
                                 uint64_t seed) {
  EplbSimConfig sim;
  sim.num_ranks = opt.num_ranks;
  sim.num_redundant = m.num_redundant;
  sim.window_steps = opt.window_steps;
  sim.rebalance_interval = opt.rebalance_interval;
  sim.num_steps = opt.num_steps;
  MS_ASSIGN_OR_RETURN(sim.mode, parallel::placement_mode_from_name(opt.mode));
  sim.num_nodes = opt.num_nodes;
  sim.num_groups = opt.num_groups;
  sim.refine = !opt.no_refine;
  MS_ASSIGN_OR_RETURN(sim.replica_rule, parallel::replica_rule_from_name(opt.replica_rule));
  sim.timeline_bucket = opt.timeline_bucket;

  PopularityConfig pop;
  pop.zipf_exponent = m.zipf_exponent;
  pop.layer_jitter = opt.layer_jitter;
  pop.drift_every = opt.drift_every;
  pop.drift_swaps = opt.drift_swaps;
  pop.hot_set = opt.hot_set;

  std::unique_ptr<RoutingSource> skewed;
  RoutingShape shape;
  if (!m.replay.empty()) {
    MS_ASSIGN_OR_RETURN(auto reader, parallel::RoutingTraceReader::open(m.replay));
    shape = reader->shape();
    if (shape.tokens_per_step % opt.num_ranks != 0) {
      return make_error(ErrorCode::kInvalidArgument,
                        "{}: {} tokens per step do not split over {} ranks", m.replay,
                        shape.tokens_per_step, opt.num_ranks);
    }
    skewed = std::move(reader);
  } else {
    shape.num_experts = m.num_experts;
    shape.top_k = m.top_k;
    shape.num_layers = m.num_layers;
    shape.tokens_per_step = opt.num_ranks * opt.requests_per_rank * m.tokens_per_request;
    skewed = std::make_unique<parallel::SkewedRouting>(shape, pop, seed);
  }
  sim.tokens_per_rank = shape.tokens_per_step / opt.num_ranks;
  PopularityConfig flat;
  flat.zipf_exponent = 0.0;
  parallel::SkewedRouting uniform(shape, flat, seed ^ 0xA5A5A5A5ull);

  std::unique_ptr<RecordingSource> recorder;
  RoutingSource* source = skewed.get();
  if (!opt.record_prefix.empty()) {
    const std::string path = fmt::format("{}-{}.jsonl", opt.record_prefix, m.name);
    MS_ASSIGN_OR_RETURN(auto writer, parallel::RoutingTraceWriter::open(path, shape));
    recorder = std::make_unique<RecordingSource>(*skewed, std::move(writer));
    source = recorder.get();
  }
  const auto t0 = std::chrono::steady_clock::now();
  MS_ASSIGN_OR_RETURN(EplbSimResult r, parallel::run_eplb_simulation(sim, *source, uniform));
  const double sim_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (recorder) MS_RETURN_IF_ERROR(recorder->close());

  nlohmann::json out;
  out["shape"] = {{"num_experts", shape.num_experts},
                  {"top_k", shape.top_k},
                  {"num_layers", shape.num_layers},
                  {"tokens_per_step", shape.tokens_per_step},
                  {"tokens_per_rank", sim.tokens_per_rank},
                  {"num_slots", shape.num_experts + m.num_redundant},
                  {"zipf_exponent", m.replay.empty() ? nlohmann::json(m.zipf_exponent) : nullptr},
                  {"replay", m.replay}};
  out["steps_run"] = r.steps_run;
  out["eval_steps"] = r.eval_steps;
  out["first_plan_step"] = r.first_plan_step;
  out["simulation_s"] = sim_s;
  out["step_balance"] = balance_json(r.step_balance);
  out["aggregate_balance"] = balance_json(r.aggregate_balance);
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& lb : r.layer_step_balance) layers.push_back(balance_json(lb));
  out["per_layer"] = layers;
  out["timeline"] = {{"step", r.timeline_step},
                     {"none", r.timeline_none},
                     {"eplb", r.timeline_eplb},
                     {"uniform", r.timeline_uniform}};
  nlohmann::json events = nlohmann::json::array();
  double in_window = 0, out_of_window = 0;
  for (const auto& e : r.rebalances) {
    events.push_back({{"step", e.step},
                      {"planner_ms", e.planner_ms},
                      {"window_before", e.window_before},
                      {"window_after", e.window_after},
                      {"next_steps", e.next_steps},
                      {"next_steps_count", e.next_steps_count}});
    in_window += e.window_after / static_cast<double>(r.rebalances.size());
    if (e.next_steps_count > 0) out_of_window += e.next_steps * e.next_steps_count;
  }
  out["rebalances"] = events;
  // The plan judged on the window it was planned from (even split over replicas), versus on the
  // steps that follow it (what step_balance.eplb reports).
  out["eplb_in_window"] = in_window;
  out["eplb_out_of_window"] =
      out_of_window / static_cast<double>(std::max<int64_t>(1, r.eval_steps));

  // Planner time at the real model's size (all layers), on this run's first-layer popularity.
  PlannerConfig pc;
  pc.num_logical = shape.num_experts;
  pc.num_slots = shape.num_experts + m.num_redundant;
  pc.num_ranks = opt.num_ranks;
  pc.num_nodes = opt.num_nodes;
  pc.num_groups = opt.num_groups;
  pc.mode = sim.mode;
  pc.refine = sim.refine;
  parallel::SkewedRouting timing_pop(RoutingShape{shape.num_experts, shape.top_k, m.full_layers, 0},
                                     pop, seed + 17);
  std::vector<double> loads;
  for (int32_t l = 0; l < m.full_layers; ++l) {
    for (double w : timing_pop.popularity(l)) {
      loads.push_back(w * shape.tokens_per_step * shape.top_k * opt.window_steps);
    }
  }
  MS_ASSIGN_OR_RETURN(auto timing, time_planner(pc, loads, m.full_layers, opt.timing_repeats));
  out["planner_full_model"] = {{"layers", m.full_layers},
                               {"min_ms", timing.min_ms},
                               {"median_ms", timing.median_ms},
                               {"cpu_min_ms", timing.cpu_min_ms},
                               {"cpu_median_ms", timing.cpu_median_ms},
                               {"repeats", opt.timing_repeats}};

  fmt::print(
      "{:<7} E={:<4} k={} L={} tok/rank={:<4} slots={:<4} | balance none {:.3f}  eplb {:.3f}  "
      "uniform {:.3f}  recovered {:.1f}% | in-window {:.3f} | aggregate none {:.3f} eplb {:.3f} "
      "| planner {} layers {:.2f} ms wall, {:.2f} ms cpu (median) | sim {:.1f} s\n",
      m.name, shape.num_experts, shape.top_k, shape.num_layers, sim.tokens_per_rank,
      shape.num_experts + m.num_redundant, r.step_balance.none, r.step_balance.eplb,
      r.step_balance.uniform, 100.0 * r.step_balance.recovered(), in_window,
      r.aggregate_balance.none, r.aggregate_balance.eplb, m.full_layers, timing.median_ms,
      timing.cpu_median_ms, sim_s);
  return out;
}

nlohmann::json model_config(const ModelOptions& m) {
  return {{"num_experts", m.num_experts},     {"top_k", m.top_k},
          {"num_layers", m.num_layers},       {"full_layers", m.full_layers},
          {"num_redundant", m.num_redundant}, {"tokens_per_request", m.tokens_per_request},
          {"zipf_exponent", m.zipf_exponent}, {"replay", m.replay}};
}

int run_bench_eplb(const BenchEplbOptions& opt) {
  bench::BenchResult result;
  result.benchmark = "eplb";
  result.config = {{"models", opt.models},
                   {"target", model_config(opt.target)},
                   {"draft", model_config(opt.draft)},
                   {"num_ranks", opt.num_ranks},
                   {"requests_per_rank", opt.requests_per_rank},
                   {"num_steps", opt.num_steps},
                   {"window_steps", opt.window_steps},
                   {"rebalance_interval", opt.rebalance_interval},
                   {"mode", opt.mode},
                   {"num_nodes", opt.num_nodes},
                   {"num_groups", opt.num_groups},
                   {"refine", !opt.no_refine},
                   {"replica_rule", opt.replica_rule},
                   {"layer_jitter", opt.layer_jitter},
                   {"drift_every", opt.drift_every},
                   {"drift_swaps", opt.drift_swaps},
                   {"hot_set", opt.hot_set},
                   {"seed", opt.seed}};
  result.roofline_note =
      "not applicable: a CPU simulation of routing balance (no device work to bound)";
  std::vector<const ModelOptions*> models;
  if (opt.models == "both" || opt.models == "target") models.push_back(&opt.target);
  if (opt.models == "both" || opt.models == "draft") models.push_back(&opt.draft);
  if (models.empty()) {
    MS_LOG_ERROR("bench eplb: --models must be target, draft or both (got '{}')", opt.models);
    return 2;
  }
  uint64_t seed = opt.seed;
  for (const ModelOptions* m : models) {
    auto r = run_model(opt, *m, seed);
    seed = seed * 0x9E3779B97F4A7C15ull + 1;
    if (!r) {
      MS_LOG_ERROR("bench eplb ({}): {}", m->name, r.error().to_string());
      return 1;
    }
    result.results[m->name] = std::move(*r);
  }
  if (auto st = result.write(opt.output); !st) {
    MS_LOG_ERROR("bench eplb: {}", st.error().to_string());
    return 1;
  }
  fmt::print("wrote {}\n", opt.output);
  if (!opt.plot.empty()) {
    const std::string cmd =
        fmt::format("python3 '{}' '{}' '{}'", opt.plot_script, opt.output, opt.plot);
    if (std::system(cmd.c_str()) != 0) {
      MS_LOG_ERROR("bench eplb: plotting failed: {} (needs matplotlib)", cmd);
      return 1;
    }
    fmt::print("wrote {}\n", opt.plot);
  }
  return 0;
}

void add_model_options(CLI::App* cmd, ModelOptions& m) {
  const std::string p = "--" + m.name + "-";
  cmd->add_option(p + "experts", m.num_experts, "routed experts")->capture_default_str();
  cmd->add_option(p + "topk", m.top_k, "experts per token")->capture_default_str();
  cmd->add_option(p + "layers", m.num_layers, "MoE layers simulated")->capture_default_str();
  cmd->add_option(p + "full-layers", m.full_layers, "MoE layers for the planner timing")
      ->capture_default_str();
  cmd->add_option(p + "redundant", m.num_redundant, "redundant expert slots")
      ->capture_default_str();
  cmd->add_option(p + "tokens-per-request", m.tokens_per_request,
                  "tokens per request per step (1 plain decode; 6 = 1 + 5 DSpark draft tokens "
                  "verified by the target; 5 = the draft's block)")
      ->capture_default_str();
  cmd->add_option(p + "zipf", m.zipf_exponent, "Zipf exponent of expert popularity")
      ->capture_default_str();
  cmd->add_option(p + "replay", m.replay, "replay a routing trace (JSONL, see docs/eplb.md)");
}

}  // namespace

void register_bench_eplb(CLI::App& bench) {
  auto opt = std::make_shared<BenchEplbOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "eplb", "Simulate expert load balancing: balance without EPLB, with EPLB, uniform routing");
  cmd->add_option("--models", opt->models, "target|draft|both")->capture_default_str();
  add_model_options(cmd, opt->target);
  add_model_options(cmd, opt->draft);
  cmd->add_option("--ranks", opt->num_ranks, "EP ranks (DEPn)")->capture_default_str();
  cmd->add_option("--requests-per-rank", opt->requests_per_rank, "decode requests per rank")
      ->capture_default_str();
  cmd->add_option("--steps", opt->num_steps, "decode steps simulated")->capture_default_str();
  cmd->add_option("--window", opt->window_steps, "EPLB window W (steps)")->capture_default_str();
  cmd->add_option("--interval", opt->rebalance_interval, "re-plan every K steps")
      ->capture_default_str();
  cmd->add_option("--mode", opt->mode, "planner mode: global|hierarchical|auto")
      ->capture_default_str();
  cmd->add_option("--nodes", opt->num_nodes, "nodes (hierarchical mode)")->capture_default_str();
  cmd->add_option("--groups", opt->num_groups, "expert groups (hierarchical mode)")
      ->capture_default_str();
  cmd->add_flag("--no-refine", opt->no_refine,
                "plain published algorithm (no replica anti-affinity, no swap refinement)");
  cmd->add_option("--replica-rule", opt->replica_rule, "hash|rank-round-robin")
      ->capture_default_str();
  cmd->add_option("--layer-jitter", opt->layer_jitter,
                  "per-layer Zipf exponent spread (exponent x (1 +- jitter))")
      ->capture_default_str();
  cmd->add_option("--drift-every", opt->drift_every, "steps between hot-set drifts (0: static)")
      ->capture_default_str();
  cmd->add_option("--drift-swaps", opt->drift_swaps, "hot experts swapped per drift and layer")
      ->capture_default_str();
  cmd->add_option("--hot-set", opt->hot_set, "popularity ranks that count as hot for drift")
      ->capture_default_str();
  cmd->add_option("--seed", opt->seed, "random seed")->capture_default_str();
  cmd->add_option("--timeline-bucket", opt->timeline_bucket, "steps per timeline point")
      ->capture_default_str();
  cmd->add_option("--timing-repeats", opt->timing_repeats, "planner timing repeats")
      ->capture_default_str();
  cmd->add_option("--record", opt->record_prefix,
                  "write the skewed routing to <prefix>-<model>.jsonl (large: keep --steps low)");
  cmd->add_option("-o,--output", opt->output, "result JSON")->capture_default_str();
  cmd->add_option("--plot", opt->plot, "also write a PNG plot here (tools/plot_eplb.py)");
  cmd->add_option("--plot-script", opt->plot_script, "path to plot_eplb.py")->capture_default_str();
  cmd->callback([opt] { exit_code() = run_bench_eplb(*opt); });
}

}  // namespace moeserve::app
