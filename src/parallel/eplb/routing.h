// Sources of MoE routing decisions for the EPLB simulator: synthetic skewed popularity (Zipf with
// per-layer differences and drifting hot sets; exponent 0 = uniform routing) and replay of a
// recorded routing trace (JSONL, format in docs/eplb.md). A step is [num_layers, tokens, top_k]
// logical expert ids; each token's top_k experts are distinct, as in real top-k routing.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"

namespace moeserve::parallel {

struct RoutingShape {
  int32_t num_experts = 0;
  int32_t top_k = 0;
  int32_t num_layers = 0;
  int32_t tokens_per_step = 0;  // all ranks; token t belongs to rank t / (tokens_per_step / ranks)

  [[nodiscard]] int64_t step_size() const {
    return static_cast<int64_t>(num_layers) * tokens_per_step * top_k;
  }
};

class RoutingSource {
 public:
  virtual ~RoutingSource() = default;
  [[nodiscard]] virtual const RoutingShape& shape() const = 0;
  // Fills `out` ([num_layers, tokens, top_k]); false when the source has no more steps.
  [[nodiscard]] virtual Result<bool> next_step(std::span<int32_t> out) = 0;
};

// splitmix64: small, fast, good enough for simulation; deterministic per seed.
class SplitMix64 final {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // In [0, n).
  uint32_t below(uint32_t n) { return static_cast<uint32_t>(((next() >> 32) * n) >> 32); }

 private:
  uint64_t state_;
};

struct PopularityConfig {
  // Expert at popularity rank i (0 = hottest) has weight 1 / (i + 1)^exponent; 0 = uniform.
  double zipf_exponent = 1.0;
  // Layer l uses exponent * (1 + layer_jitter * u_l), u_l uniform in [-1, 1]; every layer also
  // gets its own random assignment of popularity ranks to expert ids.
  double layer_jitter = 0.0;
  // Every drift_every steps (0 = never), each layer swaps drift_swaps random hot experts (ranks
  // below hot_set) with random experts: the hot set drifts.
  int32_t drift_every = 0;
  int32_t drift_swaps = 0;
  int32_t hot_set = 32;
};

class SkewedRouting final : public RoutingSource {
 public:
  SkewedRouting(const RoutingShape& shape, const PopularityConfig& popularity, uint64_t seed);

  [[nodiscard]] const RoutingShape& shape() const override { return shape_; }
  [[nodiscard]] Result<bool> next_step(std::span<int32_t> out) override;
  // Current per-expert weights of a layer (sum 1), for tests and the bench's config dump.
  [[nodiscard]] std::vector<double> popularity(int32_t layer) const;

 private:
  struct Layer {
    std::vector<int32_t> expert_at_rank;  // popularity rank -> expert id
    std::vector<double> rank_weight;      // popularity rank -> weight (normalised)
    std::vector<double> alias_prob;       // Vose alias table over expert ids
    std::vector<int32_t> alias;
  };
  void build_alias(Layer& layer);
  int32_t sample(const Layer& layer);

  RoutingShape shape_;
  PopularityConfig popularity_;
  SplitMix64 rng_;
  int64_t step_ = 0;
  std::vector<Layer> layers_;
};

// Routing trace, JSON Lines: a header line
//   {"format":"moeserve-routing","version":1,"num_experts":E,"top_k":K,"num_layers":L,
//    "tokens_per_step":T}
// then, per step and layer in order, {"step":s,"layer":l,"experts":[T*K ids, token-major]}.
class RoutingTraceWriter final {
 public:
  [[nodiscard]] static Result<std::unique_ptr<RoutingTraceWriter>> open(const std::string& path,
                                                                        const RoutingShape& shape);
  [[nodiscard]] Status write_step(std::span<const int32_t> step);
  [[nodiscard]] Status close();

 private:
  RoutingShape shape_;
  std::ofstream out_;
  std::string path_;
  int64_t step_ = 0;
};

class RoutingTraceReader final : public RoutingSource {
 public:
  [[nodiscard]] static Result<std::unique_ptr<RoutingTraceReader>> open(const std::string& path);
  [[nodiscard]] const RoutingShape& shape() const override { return shape_; }
  [[nodiscard]] Result<bool> next_step(std::span<int32_t> out) override;

 private:
  RoutingShape shape_;
  std::ifstream in_;
  std::string path_;
  int64_t line_ = 1;
  int64_t step_ = 0;
};

}  // namespace moeserve::parallel
