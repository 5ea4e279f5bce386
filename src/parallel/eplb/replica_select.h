// Replica selection: which of a logical expert's replicas a routed token goes to. Both rules are
// deterministic per token and need no communication:
// - kHash: stateless, hash(token sequence number, expert) mod replica_count; splits like random
//   sampling.
// - kRankRoundRobin: on each source rank, the j-th token of the step routed to expert e goes to
//   replica (j + rank + e) mod replica_count. The dispatch layout already computes j (the token's
//   position in the per-expert send list), so it is free in the kernel, and it splits an
//   expert's tokens over its replicas to within one token per source rank (less noise than
//   hashing, which matters for the hot, many-replica experts). See docs/eplb.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"

namespace moeserve::parallel {

enum class ReplicaRule { kHash, kRankRoundRobin };

[[nodiscard]] std::string replica_rule_name(ReplicaRule rule);
[[nodiscard]] Result<ReplicaRule> replica_rule_from_name(const std::string& name);

// Index in [0, replica_count) for token `token_index`: a sequence number that keeps growing across
// steps (e.g. the request's id mixed with its position), not the token's slot in the batch,
// which would split each expert's tokens by the same fixed, biased shares every step.
[[nodiscard]] inline int32_t hash_replica(uint64_t token_index, int32_t expert,
                                          int32_t replica_count) {
  uint64_t h =
      token_index * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(expert) * 0xC2B2AE3D27D4EB4Full;
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  // Multiply-high maps the top 32 bits onto [0, replica_count) without a division.
  return static_cast<int32_t>(((h >> 32) * static_cast<uint64_t>(replica_count)) >> 32);
}

// Round-robin state of one source rank for one step (reset with begin()).
class RankRoundRobinSelector final {
 public:
  explicit RankRoundRobinSelector(int32_t num_logical);

  void begin(int32_t source_rank);
  [[nodiscard]] int32_t select(int32_t expert, int32_t replica_count);

 private:
  int32_t source_rank_ = 0;
  std::vector<int32_t> seen_;     // tokens routed to each expert so far this step
  std::vector<int32_t> touched_;  // experts with seen_ > 0, to reset cheaply
};

}  // namespace moeserve::parallel
