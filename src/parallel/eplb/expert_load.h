// EPLB load statistics: per-layer, per-physical-slot token counts over a sliding window of the
// last `window_steps` decode steps, and the balance metric (mean rank load / max rank load).
// Invariant: window_sum(layer) == element-wise sum of the stored steps of that layer; recording a
// step costs O(num_layers * num_slots) whatever the window length (ring + running sums).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "parallel/eplb/placement.h"

namespace moeserve::parallel {

// mean / max of per-rank loads; 1.0 when every rank is idle.
[[nodiscard]] double balance_of(std::span<const int64_t> rank_load);
[[nodiscard]] double balance_of(std::span<const double> rank_load);
// Folds per-slot loads into per-rank loads (slot s on rank s / slots_per_rank).
void slot_to_rank_load(std::span<const int32_t> slot_load, int32_t slots_per_rank,
                       std::span<int64_t> rank_load);

class ExpertLoadWindow final {
 public:
  static constexpr int32_t kDefaultWindowSteps = 1000;

  ExpertLoadWindow(int32_t num_layers, int32_t num_slots, int32_t num_ranks,
                   int32_t window_steps = kDefaultWindowSteps);

  // One decode step: tokens per physical slot, [num_layers * num_slots] layer-major.
  void record_step(std::span<const int32_t> slot_load);

  [[nodiscard]] int32_t num_layers() const { return num_layers_; }
  [[nodiscard]] int32_t num_slots() const { return num_slots_; }
  [[nodiscard]] int32_t num_ranks() const { return num_ranks_; }
  [[nodiscard]] int32_t window_steps() const { return window_steps_; }
  // Steps currently held (min(steps recorded, window_steps)).
  [[nodiscard]] int32_t size() const { return size_; }
  [[nodiscard]] int64_t steps_recorded() const { return steps_recorded_; }

  // Token counts per slot summed over the window.
  [[nodiscard]] std::span<const int64_t> window_sum(int32_t layer) const;
  // Window loads folded onto logical experts through `placement`'s physical->logical map.
  [[nodiscard]] std::vector<double> logical_load(int32_t layer,
                                                 const ExpertPlacement& placement) const;
  // Balance of the latest step, the mean of per-step balances over the window, and the balance
  // of the window's summed rank loads (the latter is >= the former: noise averages out).
  [[nodiscard]] double last_step_balance(int32_t layer) const;
  [[nodiscard]] double mean_step_balance(int32_t layer) const;
  [[nodiscard]] double window_balance(int32_t layer) const;

  // The layer's placement changed from `from` to `to`: re-express the stored steps in the new
  // slots (each expert's tokens split evenly over its new replicas, remainder to the first
  // ones; logical totals are exact). Balances then estimate the new plan on the old window.
  void remap(int32_t layer, const ExpertPlacement& from, const ExpertPlacement& to);
  void clear();

 private:
  [[nodiscard]] int32_t* step_slots(int32_t ring_index, int32_t layer) {
    return ring_.data() + (static_cast<int64_t>(ring_index) * num_layers_ + layer) * num_slots_;
  }
  [[nodiscard]] double step_balance(const int32_t* slots);  // uses rank_scratch_

  int32_t num_layers_;
  int32_t num_slots_;
  int32_t num_ranks_;
  int32_t window_steps_;
  int32_t slots_per_rank_;
  int32_t head_ = 0;  // ring index the next step is written to
  int32_t size_ = 0;
  int64_t steps_recorded_ = 0;
  std::vector<int32_t> ring_;          // [window, layers, slots]
  std::vector<int64_t> sum_;           // [layers, slots]
  std::vector<double> step_balance_;   // [window, layers]
  std::vector<double> balance_sum_;    // [layers]
  std::vector<int64_t> rank_scratch_;  // [ranks]
};

}  // namespace moeserve::parallel
