#include "parallel/eplb/simulator.h"

#include <algorithm>
#include <chrono>

#include "parallel/eplb/expert_load.h"

namespace moeserve::parallel {

namespace {

// Balance of one layer-step under a placement with one slot per expert (none, uniform).
double contiguous_balance(const int32_t* ids, int64_t count, int32_t experts_per_rank,
                          std::vector<int64_t>& rank_load) {
  std::fill(rank_load.begin(), rank_load.end(), 0);
  for (int64_t i = 0; i < count; ++i) ++rank_load[ids[i] / experts_per_rank];
  return balance_of(std::span<const int64_t>(rank_load));
}

}  // namespace

Result<EplbSimResult> run_eplb_simulation(const EplbSimConfig& config, RoutingSource& skewed,
                                          RoutingSource& uniform) {
  const RoutingShape shape = skewed.shape();
  const RoutingShape& ushape = uniform.shape();
  if (shape.num_experts != ushape.num_experts || shape.top_k != ushape.top_k ||
      shape.num_layers != ushape.num_layers || shape.tokens_per_step != ushape.tokens_per_step) {
    return make_error(ErrorCode::kInvalidArgument,
                      "simulator: skewed and uniform routing sources differ in shape");
  }
  const int32_t ranks = config.num_ranks;
  if (ranks <= 0 || shape.num_experts % ranks != 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "simulator: {} experts do not split evenly over {} ranks (needed by the "
                      "no-EPLB placement)",
                      shape.num_experts, ranks);
  }
  if (shape.tokens_per_step != static_cast<int64_t>(ranks) * config.tokens_per_rank) {
    return make_error(ErrorCode::kInvalidArgument,
                      "simulator: {} tokens per step is not {} ranks x {} tokens per rank",
                      shape.tokens_per_step, ranks, config.tokens_per_rank);
  }
  if (config.window_steps <= 0 || config.rebalance_interval <= 0 || config.num_steps <= 0 ||
      config.timeline_bucket <= 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "simulator: window, interval, steps and timeline bucket must be positive");
  }
  PlannerConfig planner;
  planner.num_logical = shape.num_experts;
  planner.num_slots = shape.num_experts + config.num_redundant;
  planner.num_ranks = ranks;
  planner.num_nodes = config.num_nodes;
  planner.num_groups = config.num_groups;
  planner.mode = config.mode;
  planner.refine = config.refine;
  MS_RETURN_IF_ERROR(planner.validate());

  const int32_t layers = shape.num_layers;
  const int32_t k = shape.top_k;
  const int64_t per_layer = static_cast<int64_t>(shape.tokens_per_step) * k;
  const int32_t experts_per_rank = shape.num_experts / ranks;

  std::vector<ExpertPlacement> placement;
  for (int32_t l = 0; l < layers; ++l) {
    MS_ASSIGN_OR_RETURN(auto p,
                        ExpertPlacement::contiguous(shape.num_experts, planner.num_slots, ranks));
    placement.push_back(std::move(p));
  }
  ExpertLoadWindow window(layers, planner.num_slots, ranks, config.window_steps);

  std::vector<int32_t> skewed_ids(static_cast<size_t>(shape.step_size()));
  std::vector<int32_t> uniform_ids(static_cast<size_t>(shape.step_size()));
  std::vector<int32_t> slot_load(static_cast<size_t>(layers) * planner.num_slots);
  std::vector<int64_t> rank_load(static_cast<size_t>(ranks));
  std::vector<int64_t> eplb_rank_load(static_cast<size_t>(ranks));
  // Rank loads summed over scored steps, per layer, for the aggregate balance.
  std::vector<int64_t> agg_none(static_cast<size_t>(layers) * ranks, 0);
  std::vector<int64_t> agg_eplb(agg_none.size(), 0), agg_uniform(agg_none.size(), 0);
  RankRoundRobinSelector round_robin(shape.num_experts);

  EplbSimResult result;
  result.layer_step_balance.assign(static_cast<size_t>(layers), EplbBalance{});
  result.first_plan_step = config.window_steps;
  double bucket_none = 0, bucket_eplb = 0, bucket_uniform = 0;
  int64_t bucket_count = 0;
  double since_plan_sum = 0;
  int64_t since_plan_count = 0;

  for (int64_t step = 0; step < config.num_steps; ++step) {
    MS_ASSIGN_OR_RETURN(const bool more, skewed.next_step(skewed_ids));
    if (!more) break;
    MS_ASSIGN_OR_RETURN(const bool umore, uniform.next_step(uniform_ids));
    if (!umore) return make_error(ErrorCode::kInternal, "simulator: uniform source ran out");
    const bool scored = step >= result.first_plan_step;

    std::fill(slot_load.begin(), slot_load.end(), 0);
    double step_none = 0, step_eplb = 0, step_uniform = 0;
    for (int32_t l = 0; l < layers; ++l) {
      const int32_t* ids = skewed_ids.data() + l * per_layer;
      const int32_t* uids = uniform_ids.data() + l * per_layer;
      const double b_none = contiguous_balance(ids, per_layer, experts_per_rank, rank_load);
      if (scored) {
        for (int32_t r = 0; r < ranks; ++r) agg_none[l * ranks + r] += rank_load[r];
      }
      const double b_uniform = contiguous_balance(uids, per_layer, experts_per_rank, rank_load);
      if (scored) {
        for (int32_t r = 0; r < ranks; ++r) agg_uniform[l * ranks + r] += rank_load[r];
      }
      // EPLB: route every token to one replica of each of its experts.
      const ExpertPlacement& p = placement[l];
      // Global token sequence number: a fixed per-step index would give every (expert,
      // replica) pair the same fixed share each step, a bias that never averages out.
      const auto token_base = static_cast<uint64_t>(step) * shape.tokens_per_step;
      int32_t* slots = slot_load.data() + static_cast<int64_t>(l) * planner.num_slots;
      for (int32_t t = 0; t < shape.tokens_per_step; ++t) {
        const int32_t source_rank = t / config.tokens_per_rank;
        if (config.replica_rule == ReplicaRule::kRankRoundRobin &&
            t % config.tokens_per_rank == 0) {
          round_robin.begin(source_rank);
        }
        for (int32_t j = 0; j < k; ++j) {
          const int32_t e = ids[static_cast<int64_t>(t) * k + j];
          const int32_t count = p.replica_count(e);
          const int32_t rep = config.replica_rule == ReplicaRule::kHash
                                  ? hash_replica(token_base + static_cast<uint64_t>(t), e, count)
                                  : round_robin.select(e, count);
          ++slots[p.replicas(e)[rep]];
        }
      }
      slot_to_rank_load(std::span<const int32_t>(slots, static_cast<size_t>(planner.num_slots)),
                        p.slots_per_rank(), eplb_rank_load);
      const double b_eplb = balance_of(std::span<const int64_t>(eplb_rank_load));
      if (scored) {
        for (int32_t r = 0; r < ranks; ++r) agg_eplb[l * ranks + r] += eplb_rank_load[r];
        EplbBalance& lb = result.layer_step_balance[l];
        lb.none += b_none;
        lb.eplb += b_eplb;
        lb.uniform += b_uniform;
      }
      step_none += b_none;
      step_eplb += b_eplb;
      step_uniform += b_uniform;
    }
    window.record_step(slot_load);
    ++result.steps_run;
    if (scored) {
      ++result.eval_steps;
      since_plan_sum += step_eplb / layers;
      ++since_plan_count;
    }
    bucket_none += step_none / layers;
    bucket_eplb += step_eplb / layers;
    bucket_uniform += step_uniform / layers;
    if (++bucket_count == config.timeline_bucket) {
      result.timeline_step.push_back(step + 1 - bucket_count);
      result.timeline_none.push_back(bucket_none / bucket_count);
      result.timeline_eplb.push_back(bucket_eplb / bucket_count);
      result.timeline_uniform.push_back(bucket_uniform / bucket_count);
      bucket_none = bucket_eplb = bucket_uniform = 0;
      bucket_count = 0;
    }

    // Re-plan once the first window is full, then every rebalance_interval steps.
    const int64_t next = step + 1;
    if (next >= config.window_steps && next < config.num_steps &&
        (next - config.window_steps) % config.rebalance_interval == 0) {
      if (!result.rebalances.empty()) {
        result.rebalances.back().next_steps =
            since_plan_sum / std::max<int64_t>(1, since_plan_count);
        result.rebalances.back().next_steps_count = since_plan_count;
      }
      since_plan_sum = 0;
      since_plan_count = 0;
      EplbRebalanceEvent event;
      event.step = next;
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<ExpertPlacement> planned;
      planned.reserve(static_cast<size_t>(layers));
      for (int32_t l = 0; l < layers; ++l) {
        const std::vector<double> load = window.logical_load(l, placement[l]);
        MS_ASSIGN_OR_RETURN(auto p, plan_expert_placement(load, planner));
        planned.push_back(std::move(p));
      }
      event.planner_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      for (int32_t l = 0; l < layers; ++l) {
        event.window_before += window.mean_step_balance(l) / layers;
        window.remap(l, placement[l], planned[l]);
        event.window_after += window.mean_step_balance(l) / layers;
      }
      placement = std::move(planned);
      result.planner_ms_max = std::max(result.planner_ms_max, event.planner_ms);
      result.rebalances.push_back(event);
    }
  }
  if (!result.rebalances.empty() && since_plan_count > 0) {
    result.rebalances.back().next_steps = since_plan_sum / since_plan_count;
    result.rebalances.back().next_steps_count = since_plan_count;
  }
  if (result.eval_steps == 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "simulator: {} steps ran, none after the first plan at step {} (raise "
                      "--steps above --window)",
                      result.steps_run, result.first_plan_step);
  }
  const auto n = static_cast<double>(result.eval_steps);
  for (int32_t l = 0; l < layers; ++l) {
    EplbBalance& lb = result.layer_step_balance[l];
    lb.none /= n;
    lb.eplb /= n;
    lb.uniform /= n;
    result.step_balance.none += lb.none / layers;
    result.step_balance.eplb += lb.eplb / layers;
    result.step_balance.uniform += lb.uniform / layers;
    auto agg = [&](const std::vector<int64_t>& v) {
      return balance_of(std::span<const int64_t>(v).subspan(static_cast<size_t>(l) * ranks,
                                                            static_cast<size_t>(ranks))) /
             layers;
    };
    result.aggregate_balance.none += agg(agg_none);
    result.aggregate_balance.eplb += agg(agg_eplb);
    result.aggregate_balance.uniform += agg(agg_uniform);
  }
  return result;
}

}  // namespace moeserve::parallel
