// KvCacheManager: per-request block tables over the global pool (prefix-cached) and one state slot
// per running request from the state pool (SWA rings etc., never cached). Every mutation plans
// first (counts what it needs) and applies only when everything fits, so a failed allocation
// changes nothing. Invariants (check_invariants, run after every mutation in debug builds): each
// block's ref count equals the number of block tables holding it; each state slot is held by at
// most one request; the pools' own invariants hold.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/result.h"
#include "kv/block_hash.h"
#include "kv/block_pool.h"
#include "kv/kv_events.h"

namespace moeserve::kv {

using RequestId = int64_t;

#ifdef NDEBUG
inline constexpr bool kCheckKvInvariantsByDefault = false;
#else
inline constexpr bool kCheckKvInvariantsByDefault = true;
#endif

struct KvCacheConfig {
  int32_t num_global_blocks = 0;
  int32_t num_state_slots = 0;
  bool enable_prefix_caching = true;
  int32_t block_tokens = kBlockTokens;
  // Run check_invariants() after every mutation (on by default in debug builds; O(blocks)).
  bool check_invariants = kCheckKvInvariantsByDefault;
};

struct PrefixHit {
  std::vector<int32_t> block_ids;  // cached blocks, in order; not yet referenced
  int32_t num_tokens = 0;          // = block_ids.size() * block_tokens
};

class KvCacheManager {
 public:
  explicit KvCacheManager(const KvCacheConfig& config);
  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  // Longest run of cached blocks matching `hashes`, capped so that at least one of `num_tokens`
  // tokens is left to compute (the step that produces logits).
  [[nodiscard]] PrefixHit find_prefix_hit(std::span<const BlockHash> hashes,
                                          int32_t num_tokens) const;

  // Makes the request's block table cover `num_tokens` tokens (computed + newly scheduled +
  // lookahead). On the request's first call `hit` (from find_prefix_hit) is referenced first and
  // a state slot is taken. Returns false and changes nothing if the pools cannot cover it.
  [[nodiscard]] bool allocate_slots(RequestId id, int32_t num_tokens,
                                    const PrefixHit* hit = nullptr);
  // Registers the full blocks among the first `num_tokens` tokens in the prefix cache.
  void cache_blocks(RequestId id, std::span<const BlockHash> hashes, int32_t num_tokens);
  // Releases everything the request holds (finish, abort, preemption); no-op for unknown ids.
  void free(RequestId id);

  [[nodiscard]] bool has_request(RequestId id) const { return requests_.count(id) != 0; }
  [[nodiscard]] const std::vector<int32_t>& block_table(RequestId id) const;
  [[nodiscard]] int32_t state_slot(RequestId id) const;
  // Blocks a request would need beyond what it holds to cover `num_tokens`.
  [[nodiscard]] int32_t num_blocks_needed(RequestId id, int32_t num_tokens) const;

  [[nodiscard]] int32_t num_free_blocks() const { return global_.num_free_blocks(); }
  [[nodiscard]] int32_t num_global_blocks() const { return global_.num_blocks(); }
  [[nodiscard]] int32_t num_free_state_slots() const { return state_.num_free_blocks(); }
  [[nodiscard]] int32_t num_state_slots() const { return state_.num_blocks(); }
  [[nodiscard]] double usage() const { return global_.usage(); }
  [[nodiscard]] int32_t block_tokens() const { return config_.block_tokens; }
  [[nodiscard]] bool prefix_caching_enabled() const { return config_.enable_prefix_caching; }
  [[nodiscard]] const BlockPool& global_pool() const { return global_; }

  [[nodiscard]] std::vector<KvEvent> take_events() { return global_.take_events(); }
  [[nodiscard]] KvResidencySamples take_residency_samples() {
    return global_.take_residency_samples();
  }
  void set_clock(std::function<double()> clock) { global_.set_clock(std::move(clock)); }
  [[nodiscard]] Status check_invariants() const;

 private:
  struct RequestKv {
    std::vector<int32_t> block_table;
    int32_t num_cached_blocks = 0;  // leading blocks already registered in the prefix cache
    int32_t state_slot = -1;
  };
  void maybe_check();

  KvCacheConfig config_;
  BlockPool global_;
  BlockPool state_;
  std::unordered_map<RequestId, RequestKv> requests_;
  std::vector<int32_t> scratch_;
};

}  // namespace moeserve::kv
