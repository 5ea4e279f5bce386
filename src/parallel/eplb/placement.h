// Expert placement for one MoE layer and the EPLB planner that computes it (our implementation of
// DeepSeek's replicate-then-pack algorithm, with two refinements, see docs/eplb.md). A placement
// maps num_slots physical expert slots (num_slots / num_ranks per rank, slot s on rank
// s / slots_per_rank) to logical experts; every logical expert has at least one replica and the
// physical->logical and logical->physical maps are mutually inverse.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"

namespace moeserve::parallel {

class ExpertPlacement final {
 public:
  ExpertPlacement() = default;
  // Builds the inverse maps from phy_to_log; checks shapes (not that every expert is present:
  // call validate() for that).
  [[nodiscard]] static Result<ExpertPlacement> from_phy_to_log(int32_t num_logical,
                                                               int32_t num_ranks,
                                                               std::vector<int32_t> phy_to_log);
  // The placement without EPLB: logical expert e in slot e (contiguous blocks per rank); the
  // redundant slots (num_slots > num_logical) repeat experts 0, 1, ... in order.
  [[nodiscard]] static Result<ExpertPlacement> contiguous(int32_t num_logical, int32_t num_slots,
                                                          int32_t num_ranks);

  [[nodiscard]] int32_t num_logical() const { return num_logical_; }
  [[nodiscard]] int32_t num_slots() const { return static_cast<int32_t>(phy_to_log_.size()); }
  [[nodiscard]] int32_t num_ranks() const { return num_ranks_; }
  [[nodiscard]] int32_t slots_per_rank() const { return slots_per_rank_; }
  [[nodiscard]] int32_t rank_of_slot(int32_t slot) const { return slot / slots_per_rank_; }

  [[nodiscard]] std::span<const int32_t> phy_to_log() const { return phy_to_log_; }
  [[nodiscard]] int32_t logical_of(int32_t slot) const { return phy_to_log_[slot]; }
  // Replicas (physical slots, ascending) of logical expert e.
  [[nodiscard]] std::span<const int32_t> replicas(int32_t e) const {
    return std::span<const int32_t>(log_to_phy_)
        .subspan(log_offsets_[e], log_offsets_[e + 1] - log_offsets_[e]);
  }
  [[nodiscard]] int32_t replica_count(int32_t e) const {
    return log_offsets_[e + 1] - log_offsets_[e];
  }
  [[nodiscard]] int32_t max_replica_count() const;
  // DeepSeek/vLLM layout: [num_logical, max_replicas] slot ids, padded with -1.
  [[nodiscard]] std::vector<int32_t> padded_log_to_phy(int32_t max_replicas) const;

  // Every logical expert has >= 1 replica, maps are inverse, ranks hold equal slot counts.
  [[nodiscard]] Status validate() const;

  bool operator==(const ExpertPlacement& other) const = default;

 private:
  int32_t num_logical_ = 0;
  int32_t num_ranks_ = 0;
  int32_t slots_per_rank_ = 0;
  std::vector<int32_t> phy_to_log_;   // [num_slots]
  std::vector<int32_t> log_offsets_;  // [num_logical + 1] CSR offsets into log_to_phy_
  std::vector<int32_t> log_to_phy_;   // [num_slots] replicas grouped by logical expert
};

enum class PlacementMode {
  kAuto,          // hierarchical when num_nodes divides num_groups (and > 1 node), else global
  kGlobal,        // replicate over all slots, pack over all ranks (large decode EP)
  kHierarchical,  // expert groups -> nodes, replicate within node, pack onto the node's GPUs
};

struct PlannerConfig {
  int32_t num_logical = 0;  // routed experts of the model (384 target, 128 draft)
  int32_t num_slots = 0;    // physical slots = num_logical + redundant
  int32_t num_ranks = 0;    // EP size (GPUs)
  int32_t num_nodes = 1;    // for hierarchical mode; must divide num_ranks
  int32_t num_groups = 1;   // expert groups for hierarchical mode; must divide num_logical
  PlacementMode mode = PlacementMode::kAuto;
  // moeserve refinements over the published algorithm: spread replicas of one expert over
  // distinct ranks when a choice exists, and improve the greedy packing by pairwise swaps off
  // the heaviest rank. Off = the published algorithm.
  bool refine = true;

  [[nodiscard]] int32_t num_redundant() const { return num_slots - num_logical; }
  [[nodiscard]] Status validate() const;
};

// Plans one layer from per-logical-expert load (tokens over the window; any non-negative scale).
// Deterministic: ties go to the lower index.
[[nodiscard]] Result<ExpertPlacement> plan_expert_placement(std::span<const double> logical_load,
                                                            const PlannerConfig& config);

// All MoE layers of one model.
struct ModelPlacement {
  PlannerConfig config;
  std::vector<ExpertPlacement> layers;
};

// Plans every layer; loads is [num_layers * num_logical], layer-major.
[[nodiscard]] Result<ModelPlacement> plan_model_placement(std::span<const double> loads,
                                                          int32_t num_layers,
                                                          const PlannerConfig& config);

// Target and draft are planned separately: different expert counts (384 vs 128), top-k and,
// usually, redundant slots; both live on the same EP ranks.
struct HeterogeneousPlacement {
  ModelPlacement target;
  ModelPlacement draft;
};

[[nodiscard]] Result<HeterogeneousPlacement> plan_heterogeneous_placement(
    std::span<const double> target_loads, int32_t target_layers, const PlannerConfig& target,
    std::span<const double> draft_loads, int32_t draft_layers, const PlannerConfig& draft);

// Expected per-rank load of a placement when each expert's load splits evenly over its replicas.
[[nodiscard]] std::vector<double> expected_rank_load(const ExpertPlacement& placement,
                                                     std::span<const double> logical_load);

[[nodiscard]] std::string placement_mode_name(PlacementMode mode);
[[nodiscard]] Result<PlacementMode> placement_mode_from_name(const std::string& name);

}  // namespace moeserve::parallel
