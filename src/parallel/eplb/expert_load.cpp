#include "parallel/eplb/expert_load.h"

#include <algorithm>
#include <numeric>

#include "common/check.h"

namespace moeserve::parallel {

namespace {
template <typename T>
double balance_impl(std::span<const T> rank_load) {
  if (rank_load.empty()) return 1.0;
  double total = 0.0, peak = 0.0;
  for (T x : rank_load) {
    total += static_cast<double>(x);
    peak = std::max(peak, static_cast<double>(x));
  }
  if (peak <= 0.0) return 1.0;
  return total / static_cast<double>(rank_load.size()) / peak;
}
}  // namespace

double balance_of(std::span<const int64_t> rank_load) { return balance_impl(rank_load); }
double balance_of(std::span<const double> rank_load) { return balance_impl(rank_load); }

void slot_to_rank_load(std::span<const int32_t> slot_load, int32_t slots_per_rank,
                       std::span<int64_t> rank_load) {
  MS_CHECK_EQ(static_cast<int64_t>(slot_load.size()),
              static_cast<int64_t>(rank_load.size()) * slots_per_rank);
  for (size_t r = 0; r < rank_load.size(); ++r) {
    int64_t sum = 0;
    for (int32_t i = 0; i < slots_per_rank; ++i) sum += slot_load[r * slots_per_rank + i];
    rank_load[r] = sum;
  }
}

ExpertLoadWindow::ExpertLoadWindow(int32_t num_layers, int32_t num_slots, int32_t num_ranks,
                                   int32_t window_steps)
    : num_layers_(num_layers),
      num_slots_(num_slots),
      num_ranks_(num_ranks),
      window_steps_(window_steps),
      slots_per_rank_(num_ranks > 0 ? num_slots / num_ranks : 0) {
  MS_CHECK(num_layers > 0 && num_slots > 0 && num_ranks > 0 && window_steps > 0);
  MS_CHECK_MSG(num_slots % num_ranks == 0, "{} slots over {} ranks", num_slots, num_ranks);
  ring_.assign(static_cast<size_t>(window_steps) * num_layers * num_slots, 0);
  sum_.assign(static_cast<size_t>(num_layers) * num_slots, 0);
  step_balance_.assign(static_cast<size_t>(window_steps) * num_layers, 0.0);
  balance_sum_.assign(static_cast<size_t>(num_layers), 0.0);
  rank_scratch_.assign(static_cast<size_t>(num_ranks), 0);
}

double ExpertLoadWindow::step_balance(const int32_t* slots) {
  slot_to_rank_load(std::span<const int32_t>(slots, static_cast<size_t>(num_slots_)),
                    slots_per_rank_, rank_scratch_);
  return balance_of(std::span<const int64_t>(rank_scratch_));
}

void ExpertLoadWindow::record_step(std::span<const int32_t> slot_load) {
  MS_CHECK_EQ(static_cast<int64_t>(slot_load.size()),
              static_cast<int64_t>(num_layers_) * num_slots_);
  const bool evict = size_ == window_steps_;
  for (int32_t l = 0; l < num_layers_; ++l) {
    int32_t* old = step_slots(head_, l);
    const int32_t* fresh = slot_load.data() + static_cast<int64_t>(l) * num_slots_;
    int64_t* sum = sum_.data() + static_cast<int64_t>(l) * num_slots_;
    double& old_balance = step_balance_[static_cast<size_t>(head_) * num_layers_ + l];
    if (evict) balance_sum_[l] -= old_balance;
    for (int32_t s = 0; s < num_slots_; ++s) {
      sum[s] += fresh[s] - (evict ? old[s] : 0);
      old[s] = fresh[s];
    }
    old_balance = step_balance(fresh);
    balance_sum_[l] += old_balance;
  }
  head_ = (head_ + 1) % window_steps_;
  size_ = std::min(size_ + 1, window_steps_);
  ++steps_recorded_;
}

std::span<const int64_t> ExpertLoadWindow::window_sum(int32_t layer) const {
  MS_CHECK(layer >= 0 && layer < num_layers_);
  return std::span<const int64_t>(sum_).subspan(static_cast<size_t>(layer) * num_slots_,
                                                static_cast<size_t>(num_slots_));
}

std::vector<double> ExpertLoadWindow::logical_load(int32_t layer,
                                                   const ExpertPlacement& placement) const {
  MS_CHECK_EQ(placement.num_slots(), num_slots_);
  std::vector<double> out(static_cast<size_t>(placement.num_logical()), 0.0);
  const auto sum = window_sum(layer);
  for (int32_t s = 0; s < num_slots_; ++s) {
    out[placement.logical_of(s)] += static_cast<double>(sum[s]);
  }
  return out;
}

double ExpertLoadWindow::last_step_balance(int32_t layer) const {
  MS_CHECK(layer >= 0 && layer < num_layers_);
  if (size_ == 0) return 1.0;
  const int32_t last = (head_ + window_steps_ - 1) % window_steps_;
  return step_balance_[static_cast<size_t>(last) * num_layers_ + layer];
}

double ExpertLoadWindow::mean_step_balance(int32_t layer) const {
  MS_CHECK(layer >= 0 && layer < num_layers_);
  return size_ == 0 ? 1.0 : balance_sum_[layer] / size_;
}

double ExpertLoadWindow::window_balance(int32_t layer) const {
  std::vector<int64_t> rank_load(static_cast<size_t>(num_ranks_), 0);
  const auto sum = window_sum(layer);
  for (int32_t s = 0; s < num_slots_; ++s) rank_load[s / slots_per_rank_] += sum[s];
  return balance_of(std::span<const int64_t>(rank_load));
}

void ExpertLoadWindow::remap(int32_t layer, const ExpertPlacement& from,
                             const ExpertPlacement& to) {
  MS_CHECK(layer >= 0 && layer < num_layers_);
  MS_CHECK_EQ(from.num_slots(), num_slots_);
  MS_CHECK_EQ(to.num_slots(), num_slots_);
  MS_CHECK_EQ(from.num_logical(), to.num_logical());
  std::vector<int64_t> logical(static_cast<size_t>(from.num_logical()));
  int64_t* sum = sum_.data() + static_cast<int64_t>(layer) * num_slots_;
  std::fill(sum, sum + num_slots_, 0);
  balance_sum_[layer] = 0.0;
  for (int32_t i = 0; i < size_; ++i) {
    const int32_t idx = (head_ + window_steps_ - size_ + i) % window_steps_;
    int32_t* slots = step_slots(idx, layer);
    std::fill(logical.begin(), logical.end(), 0);
    for (int32_t s = 0; s < num_slots_; ++s) logical[from.logical_of(s)] += slots[s];
    for (int32_t e = 0; e < to.num_logical(); ++e) {
      const auto reps = to.replicas(e);
      const auto n = static_cast<int64_t>(reps.size());
      for (int64_t j = 0; j < n; ++j) {
        slots[reps[j]] = static_cast<int32_t>(logical[e] / n + (j < logical[e] % n ? 1 : 0));
      }
    }
    for (int32_t s = 0; s < num_slots_; ++s) sum[s] += slots[s];
    double& b = step_balance_[static_cast<size_t>(idx) * num_layers_ + layer];
    b = step_balance(slots);
    balance_sum_[layer] += b;
  }
}

void ExpertLoadWindow::clear() {
  std::fill(ring_.begin(), ring_.end(), 0);
  std::fill(sum_.begin(), sum_.end(), 0);
  std::fill(step_balance_.begin(), step_balance_.end(), 0.0);
  std::fill(balance_sum_.begin(), balance_sum_.end(), 0.0);
  head_ = 0;
  size_ = 0;
}

}  // namespace moeserve::parallel
