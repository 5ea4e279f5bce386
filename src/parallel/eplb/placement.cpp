#include "parallel/eplb/placement.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/check.h"

namespace moeserve::parallel {

Result<ExpertPlacement> ExpertPlacement::from_phy_to_log(int32_t num_logical, int32_t num_ranks,
                                                         std::vector<int32_t> phy_to_log) {
  const auto num_slots = static_cast<int64_t>(phy_to_log.size());
  if (num_logical <= 0 || num_ranks <= 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "placement needs num_logical > 0 and num_ranks > 0 (got {}, {})", num_logical,
                      num_ranks);
  }
  if (num_slots == 0 || num_slots % num_ranks != 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "num_slots ({}) must be a positive multiple of num_ranks ({})", num_slots,
                      num_ranks);
  }
  ExpertPlacement p;
  p.num_logical_ = num_logical;
  p.num_ranks_ = num_ranks;
  p.slots_per_rank_ = static_cast<int32_t>(num_slots / num_ranks);
  p.log_offsets_.assign(static_cast<size_t>(num_logical) + 1, 0);
  for (int64_t s = 0; s < num_slots; ++s) {
    const int32_t e = phy_to_log[s];
    if (e < 0 || e >= num_logical) {
      return make_error(ErrorCode::kOutOfRange, "slot {} maps to logical expert {} (of {})", s, e,
                        num_logical);
    }
    ++p.log_offsets_[e + 1];
  }
  std::partial_sum(p.log_offsets_.begin(), p.log_offsets_.end(), p.log_offsets_.begin());
  p.log_to_phy_.assign(static_cast<size_t>(num_slots), -1);
  std::vector<int32_t> fill(p.log_offsets_.begin(), p.log_offsets_.end() - 1);
  for (int32_t s = 0; s < static_cast<int32_t>(num_slots); ++s) {
    p.log_to_phy_[fill[phy_to_log[s]]++] = s;
  }
  p.phy_to_log_ = std::move(phy_to_log);
  return p;
}

Result<ExpertPlacement> ExpertPlacement::contiguous(int32_t num_logical, int32_t num_slots,
                                                    int32_t num_ranks) {
  if (num_logical <= 0 || num_slots < num_logical) {
    return make_error(ErrorCode::kInvalidArgument, "num_slots ({}) must be >= num_logical ({}) > 0",
                      num_slots, num_logical);
  }
  std::vector<int32_t> phy_to_log(static_cast<size_t>(num_slots));
  for (int32_t s = 0; s < num_slots; ++s) phy_to_log[s] = s % num_logical;
  return from_phy_to_log(num_logical, num_ranks, std::move(phy_to_log));
}

int32_t ExpertPlacement::max_replica_count() const {
  int32_t m = 0;
  for (int32_t e = 0; e < num_logical_; ++e) m = std::max(m, replica_count(e));
  return m;
}

std::vector<int32_t> ExpertPlacement::padded_log_to_phy(int32_t max_replicas) const {
  MS_CHECK_GE(max_replicas, max_replica_count());
  std::vector<int32_t> out(static_cast<size_t>(num_logical_) * max_replicas, -1);
  for (int32_t e = 0; e < num_logical_; ++e) {
    const auto reps = replicas(e);
    std::copy(reps.begin(), reps.end(), out.begin() + static_cast<int64_t>(e) * max_replicas);
  }
  return out;
}

Status ExpertPlacement::validate() const {
  if (num_ranks_ <= 0 || slots_per_rank_ <= 0 ||
      static_cast<int64_t>(slots_per_rank_) * num_ranks_ != num_slots()) {
    return make_error(ErrorCode::kInternal, "placement: {} slots do not split into {} ranks",
                      num_slots(), num_ranks_);
  }
  for (int32_t e = 0; e < num_logical_; ++e) {
    if (replica_count(e) < 1) {
      return make_error(ErrorCode::kInternal, "placement: logical expert {} has no replica", e);
    }
    for (int32_t s : replicas(e)) {
      if (s < 0 || s >= num_slots() || phy_to_log_[s] != e) {
        return make_error(ErrorCode::kInternal, "placement: maps disagree at expert {} slot {}", e,
                          s);
      }
    }
  }
  if (log_offsets_.back() != num_slots()) {
    return make_error(ErrorCode::kInternal, "placement: log_to_phy covers {} of {} slots",
                      log_offsets_.back(), num_slots());
  }
  return ok_status();
}

Status PlannerConfig::validate() const {
  if (num_logical <= 0 || num_ranks <= 0 || num_nodes <= 0 || num_groups <= 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "planner: num_logical ({}), num_ranks ({}), num_nodes ({}) and num_groups "
                      "({}) must be positive",
                      num_logical, num_ranks, num_nodes, num_groups);
  }
  if (num_slots < num_logical) {
    return make_error(ErrorCode::kInvalidArgument,
                      "planner: num_slots ({}) must be >= num_logical ({})", num_slots,
                      num_logical);
  }
  if (num_slots % num_ranks != 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "planner: num_slots ({} = {} experts + {} redundant) must be a multiple of "
                      "num_ranks ({}) so every rank holds the same number of slots",
                      num_slots, num_logical, num_redundant(), num_ranks);
  }
  if (num_ranks % num_nodes != 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "planner: num_ranks ({}) must be a multiple of num_nodes ({})", num_ranks,
                      num_nodes);
  }
  if (mode == PlacementMode::kHierarchical) {
    if (num_logical % num_groups != 0 || num_groups % num_nodes != 0) {
      return make_error(ErrorCode::kInvalidArgument,
                        "planner: hierarchical mode needs num_groups ({}) to divide num_logical "
                        "({}) and num_nodes ({}) to divide num_groups; use global mode",
                        num_groups, num_logical, num_nodes);
    }
  }
  return ok_status();
}

namespace {

// Items packed onto bins with exactly `per_bin` items each; greedy largest-first onto the
// lightest bin that has room (ties: lower bin). Returns the bin of each item.
std::vector<int32_t> balanced_packing(std::span<const double> weight, int32_t num_bins) {
  const auto n = static_cast<int32_t>(weight.size());
  MS_CHECK(num_bins > 0 && n % num_bins == 0);
  const int32_t per_bin = n / num_bins;
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return weight[a] > weight[b]; });
  std::vector<double> bin_load(static_cast<size_t>(num_bins), 0.0);
  std::vector<int32_t> bin_count(static_cast<size_t>(num_bins), 0);
  std::vector<int32_t> bin_of(static_cast<size_t>(n), -1);
  for (int32_t item : order) {
    int32_t best = -1;
    for (int32_t b = 0; b < num_bins; ++b) {
      if (bin_count[b] < per_bin && (best < 0 || bin_load[b] < bin_load[best])) best = b;
    }
    bin_of[item] = best;
    bin_load[best] += weight[item];
    ++bin_count[best];
  }
  return bin_of;
}

struct Replica {
  int32_t expert;  // logical id
  double weight;   // expected load of this replica (expert load / replica count)
};

// Replicates `experts` (their loads in `load`, indexed by position) into num_local_slots replicas
// and packs them onto num_local_ranks ranks with equal slot counts. Returns, per local rank, its
// replicas' logical ids.
std::vector<std::vector<int32_t>> replicate_and_pack(std::span<const int32_t> experts,
                                                     std::span<const double> load,
                                                     int32_t num_local_slots,
                                                     int32_t num_local_ranks, bool refine) {
  const auto n = static_cast<int32_t>(experts.size());
  MS_CHECK(num_local_slots >= n && num_local_slots % num_local_ranks == 0);
  const int32_t per_rank = num_local_slots / num_local_ranks;

  // 1. Replicate: each redundant slot goes to the expert with the largest load per replica
  //    (ties: fewer replicas, then lower position, so zero loads spread one per expert).
  std::vector<int32_t> count(static_cast<size_t>(n), 1);
  for (int32_t r = n; r < num_local_slots; ++r) {
    int32_t best = 0;
    double best_w = load[0] / count[0];
    for (int32_t i = 1; i < n; ++i) {
      const double w = load[i] / count[i];
      if (w > best_w || (w == best_w && count[i] < count[best])) {
        best = i;
        best_w = w;
      }
    }
    ++count[best];
  }

  // 2. Pack replicas, heaviest first, onto the lightest rank with room. With `refine`, a rank
  //    that already holds the expert is skipped when another has room (a second replica on the
  //    same rank balances nothing).
  std::vector<Replica> items;
  items.reserve(static_cast<size_t>(num_local_slots));
  for (int32_t i = 0; i < n; ++i) {
    for (int32_t c = 0; c < count[i]; ++c) items.push_back({experts[i], load[i] / count[i]});
  }
  std::stable_sort(items.begin(), items.end(), [](const Replica& a, const Replica& b) {
    if (a.weight != b.weight) return a.weight > b.weight;
    return a.expert < b.expert;
  });
  std::vector<std::vector<Replica>> bins(static_cast<size_t>(num_local_ranks));
  std::vector<double> bin_load(static_cast<size_t>(num_local_ranks), 0.0);
  auto holds = [&](int32_t b, int32_t expert) {
    return std::any_of(bins[b].begin(), bins[b].end(),
                       [&](const Replica& x) { return x.expert == expert; });
  };
  for (const Replica& item : items) {
    int32_t best = -1;
    bool best_holds = true;
    for (int32_t b = 0; b < num_local_ranks; ++b) {
      if (static_cast<int32_t>(bins[b].size()) >= per_rank) continue;
      if (!refine) {
        if (best < 0 || bin_load[b] < bin_load[best]) best = b;
        continue;
      }
      // Only look up affinity when it can change the choice.
      if (best >= 0 && !best_holds && bin_load[b] >= bin_load[best]) continue;
      const bool h = item.weight > 0.0 && holds(b, item.expert);
      if (best < 0 || (best_holds && !h) || (h == best_holds && bin_load[b] < bin_load[best])) {
        best = b;
        best_holds = h;
      }
    }
    bins[best].push_back(item);
    bin_load[best] += item.weight;
  }

  // 3. Refine: move load off the heaviest rank by swapping one of its replicas with a lighter
  //    replica elsewhere, choosing the swap that minimises the larger of the two new loads.
  //    Each accepted swap lowers the heaviest load of the pair; bounded rounds keep it cheap.
  if (refine && num_local_ranks > 1) {
    const int32_t max_rounds = 4 * num_local_ranks;
    for (int32_t round = 0; round < max_rounds; ++round) {
      const auto h = static_cast<int32_t>(std::max_element(bin_load.begin(), bin_load.end()) -
                                          bin_load.begin());
      const double peak = bin_load[h];
      double best_peak = peak * (1.0 - 1e-12);
      int32_t best_r = -1, best_a = -1, best_b = -1;
      for (int32_t r = 0; r < num_local_ranks; ++r) {
        if (r == h) continue;
        for (int32_t a = 0; a < per_rank; ++a) {
          const Replica& ra = bins[h][a];
          for (int32_t b = 0; b < per_rank; ++b) {
            const Replica& rb = bins[r][b];
            const double d = ra.weight - rb.weight;
            if (d <= 0.0) continue;
            const double new_peak = std::max(peak - d, bin_load[r] + d);
            if (new_peak >= best_peak) continue;
            if (ra.expert != rb.expert && (holds(r, ra.expert) || holds(h, rb.expert))) continue;
            best_peak = new_peak;
            best_r = r;
            best_a = a;
            best_b = b;
          }
        }
      }
      if (best_r < 0) break;
      const double d = bins[h][best_a].weight - bins[best_r][best_b].weight;
      std::swap(bins[h][best_a], bins[best_r][best_b]);
      bin_load[h] -= d;
      bin_load[best_r] += d;
    }
  }

  std::vector<std::vector<int32_t>> out(static_cast<size_t>(num_local_ranks));
  for (int32_t b = 0; b < num_local_ranks; ++b) {
    for (const Replica& x : bins[b]) out[b].push_back(x.expert);
    std::sort(out[b].begin(), out[b].end());
  }
  return out;
}

}  // namespace

Result<ExpertPlacement> plan_expert_placement(std::span<const double> logical_load,
                                              const PlannerConfig& config) {
  MS_RETURN_IF_ERROR(config.validate());
  if (static_cast<int64_t>(logical_load.size()) != config.num_logical) {
    return make_error(ErrorCode::kInvalidArgument, "planner: {} loads for {} logical experts",
                      logical_load.size(), config.num_logical);
  }
  for (double w : logical_load) {
    if (!(w >= 0.0) || !std::isfinite(w)) {
      return make_error(ErrorCode::kInvalidArgument,
                        "planner: loads must be finite and non-negative (got {})", w);
    }
  }
  const bool hierarchical =
      config.mode == PlacementMode::kHierarchical ||
      (config.mode == PlacementMode::kAuto && config.num_nodes > 1 &&
       config.num_logical % config.num_groups == 0 && config.num_groups % config.num_nodes == 0);
  const int32_t num_nodes = hierarchical ? config.num_nodes : 1;
  const int32_t ranks_per_node = config.num_ranks / num_nodes;
  const int32_t slots_per_node = config.num_slots / num_nodes;

  // Experts of each node: all of them in global mode; whole groups packed by load otherwise.
  std::vector<std::vector<int32_t>> node_experts(static_cast<size_t>(num_nodes));
  if (!hierarchical) {
    node_experts[0].resize(static_cast<size_t>(config.num_logical));
    std::iota(node_experts[0].begin(), node_experts[0].end(), 0);
  } else {
    const int32_t group_size = config.num_logical / config.num_groups;
    std::vector<double> group_load(static_cast<size_t>(config.num_groups), 0.0);
    for (int32_t e = 0; e < config.num_logical; ++e) group_load[e / group_size] += logical_load[e];
    const std::vector<int32_t> node_of_group = balanced_packing(group_load, num_nodes);
    for (int32_t g = 0; g < config.num_groups; ++g) {
      for (int32_t i = 0; i < group_size; ++i) {
        node_experts[node_of_group[g]].push_back(g * group_size + i);
      }
    }
  }

  std::vector<int32_t> phy_to_log;
  phy_to_log.reserve(static_cast<size_t>(config.num_slots));
  std::vector<double> local_load;
  for (int32_t node = 0; node < num_nodes; ++node) {
    const auto& experts = node_experts[node];
    local_load.resize(experts.size());
    for (size_t i = 0; i < experts.size(); ++i) local_load[i] = logical_load[experts[i]];
    const auto ranks =
        replicate_and_pack(experts, local_load, slots_per_node, ranks_per_node, config.refine);
    for (const auto& rank_experts : ranks) {
      phy_to_log.insert(phy_to_log.end(), rank_experts.begin(), rank_experts.end());
    }
  }
  MS_ASSIGN_OR_RETURN(ExpertPlacement placement,
                      ExpertPlacement::from_phy_to_log(config.num_logical, config.num_ranks,
                                                       std::move(phy_to_log)));
  MS_RETURN_IF_ERROR(placement.validate());
  return placement;
}

Result<ModelPlacement> plan_model_placement(std::span<const double> loads, int32_t num_layers,
                                            const PlannerConfig& config) {
  MS_RETURN_IF_ERROR(config.validate());
  if (num_layers < 0 ||
      static_cast<int64_t>(loads.size()) != static_cast<int64_t>(num_layers) * config.num_logical) {
    return make_error(ErrorCode::kInvalidArgument,
                      "planner: {} loads for {} layers x {} logical experts", loads.size(),
                      num_layers, config.num_logical);
  }
  ModelPlacement model;
  model.config = config;
  model.layers.reserve(static_cast<size_t>(num_layers));
  for (int32_t l = 0; l < num_layers; ++l) {
    MS_ASSIGN_OR_RETURN(
        auto layer, plan_expert_placement(loads.subspan(static_cast<size_t>(l) * config.num_logical,
                                                        config.num_logical),
                                          config));
    model.layers.push_back(std::move(layer));
  }
  return model;
}

Result<HeterogeneousPlacement> plan_heterogeneous_placement(
    std::span<const double> target_loads, int32_t target_layers, const PlannerConfig& target,
    std::span<const double> draft_loads, int32_t draft_layers, const PlannerConfig& draft) {
  if (target.num_ranks != draft.num_ranks) {
    return make_error(ErrorCode::kInvalidArgument,
                      "target ({} ranks) and draft ({} ranks) must share the EP ranks",
                      target.num_ranks, draft.num_ranks);
  }
  HeterogeneousPlacement out;
  MS_ASSIGN_OR_RETURN(out.target, plan_model_placement(target_loads, target_layers, target));
  MS_ASSIGN_OR_RETURN(out.draft, plan_model_placement(draft_loads, draft_layers, draft));
  return out;
}

std::vector<double> expected_rank_load(const ExpertPlacement& placement,
                                       std::span<const double> logical_load) {
  MS_CHECK_EQ(static_cast<int64_t>(logical_load.size()),
              static_cast<int64_t>(placement.num_logical()));
  std::vector<double> rank_load(static_cast<size_t>(placement.num_ranks()), 0.0);
  for (int32_t s = 0; s < placement.num_slots(); ++s) {
    const int32_t e = placement.logical_of(s);
    rank_load[placement.rank_of_slot(s)] += logical_load[e] / placement.replica_count(e);
  }
  return rank_load;
}

std::string placement_mode_name(PlacementMode mode) {
  switch (mode) {
    case PlacementMode::kAuto:
      return "auto";
    case PlacementMode::kGlobal:
      return "global";
    case PlacementMode::kHierarchical:
      return "hierarchical";
  }
  return "unknown";
}

Result<PlacementMode> placement_mode_from_name(const std::string& name) {
  if (name == "auto") return PlacementMode::kAuto;
  if (name == "global") return PlacementMode::kGlobal;
  if (name == "hierarchical") return PlacementMode::kHierarchical;
  return make_error(ErrorCode::kInvalidArgument,
                    "unknown placement mode '{}' (auto|global|hierarchical)", name);
}

}  // namespace moeserve::parallel
