#include "parallel/eplb/replica_select.h"

#include "common/check.h"

namespace moeserve::parallel {

std::string replica_rule_name(ReplicaRule rule) {
  switch (rule) {
    case ReplicaRule::kHash:
      return "hash";
    case ReplicaRule::kRankRoundRobin:
      return "rank-round-robin";
  }
  return "unknown";
}

Result<ReplicaRule> replica_rule_from_name(const std::string& name) {
  if (name == "hash") return ReplicaRule::kHash;
  if (name == "rank-round-robin" || name == "rr") return ReplicaRule::kRankRoundRobin;
  return make_error(ErrorCode::kInvalidArgument,
                    "unknown replica rule '{}' (hash|rank-round-robin)", name);
}

RankRoundRobinSelector::RankRoundRobinSelector(int32_t num_logical)
    : seen_(static_cast<size_t>(num_logical), 0) {
  touched_.reserve(static_cast<size_t>(num_logical));
}

void RankRoundRobinSelector::begin(int32_t source_rank) {
  source_rank_ = source_rank;
  for (int32_t e : touched_) seen_[e] = 0;
  touched_.clear();
}

int32_t RankRoundRobinSelector::select(int32_t expert, int32_t replica_count) {
  MS_DCHECK(expert >= 0 && expert < static_cast<int32_t>(seen_.size()) && replica_count > 0);
  if (replica_count == 1) return 0;
  const int32_t j = seen_[expert]++;
  if (j == 0) touched_.push_back(expert);
  return static_cast<int32_t>((static_cast<int64_t>(j) + source_rank_ + expert) % replica_count);
}

}  // namespace moeserve::parallel
