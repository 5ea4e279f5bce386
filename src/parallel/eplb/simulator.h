// EPLB balance simulator: replays decode steps of routing decisions through three placements and
// reports the balance (mean rank load / max rank load) of each:
// - none:    the contiguous placement, no redundant experts (expert e on rank e / (E / ranks));
// - eplb:    E + redundant slots, re-planned every `rebalance_interval` steps from the last
//            `window_steps` steps of recorded per-slot load (ExpertLoadWindow + planner);
// - uniform: the same batch routed uniformly at random (the reference a perfect balancer nears).
// Scores count only the steps after the first plan, i.e. each plan is judged on the steps that
// follow it, never on the window it was planned from (that in-window estimate is reported apart).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"
#include "parallel/eplb/placement.h"
#include "parallel/eplb/replica_select.h"
#include "parallel/eplb/routing.h"

namespace moeserve::parallel {

struct EplbSimConfig {
  int32_t num_ranks = 32;
  int32_t tokens_per_rank = 72;  // requests per rank x tokens per request
  int32_t num_redundant = 32;
  int32_t window_steps = 1000;
  int32_t rebalance_interval = 1000;
  int32_t num_steps = 3000;
  PlacementMode mode = PlacementMode::kGlobal;
  int32_t num_nodes = 1;
  int32_t num_groups = 1;
  bool refine = true;
  ReplicaRule replica_rule = ReplicaRule::kRankRoundRobin;
  int32_t timeline_bucket = 10;  // steps per timeline point
};

struct EplbRebalanceEvent {
  int64_t step = 0;            // first step served by the new plan
  double planner_ms = 0.0;     // all layers
  double window_before = 0.0;  // mean per-step balance of the window, placement in use
  double window_after = 0.0;   // same window re-expressed in the new plan (in-window estimate)
  double next_steps = 0.0;     // mean per-step balance actually seen until the next plan
  int64_t next_steps_count = 0;
};

struct EplbBalance {
  double none = 0.0;
  double eplb = 0.0;
  double uniform = 0.0;
  // (eplb - none) / (uniform - none): share of the gap to uniform routing that EPLB recovers.
  [[nodiscard]] double recovered() const {
    return uniform - none != 0.0 ? (eplb - none) / (uniform - none) : 0.0;
  }
};

struct EplbSimResult {
  int64_t steps_run = 0;
  int64_t eval_steps = 0;  // steps after the first plan (the scored ones)
  int64_t first_plan_step = 0;
  // Mean over scored steps and layers of the per-step balance.
  EplbBalance step_balance;
  // Balance of rank loads summed over all scored steps (sampling noise averaged out).
  EplbBalance aggregate_balance;
  std::vector<EplbBalance> layer_step_balance;  // [num_layers]
  // Timeline: one point per `timeline_bucket` steps, averaged over layers and the bucket.
  std::vector<int64_t> timeline_step;
  std::vector<double> timeline_none, timeline_eplb, timeline_uniform;
  std::vector<EplbRebalanceEvent> rebalances;
  double planner_ms_max = 0.0;
};

// `skewed` drives none and eplb; `uniform` (same shape) drives the uniform reference. Stops at
// num_steps or when `skewed` runs out.
[[nodiscard]] Result<EplbSimResult> run_eplb_simulation(const EplbSimConfig& config,
                                                        RoutingSource& skewed,
                                                        RoutingSource& uniform);

}  // namespace moeserve::parallel
