#include "kv/kv_cache_manager.h"

#include <algorithm>

#include "common/check.h"

namespace moeserve::kv {

KvCacheManager::KvCacheManager(const KvCacheConfig& config)
    : config_(config),
      global_(config.num_global_blocks, config.enable_prefix_caching),
      state_(config.num_state_slots, /*enable_caching=*/false) {
  MS_CHECK(config.block_tokens > 0);
  state_.set_emit_events(false);
  requests_.reserve(static_cast<size_t>(std::max(config.num_state_slots, 1)) * 2);
}

PrefixHit KvCacheManager::find_prefix_hit(std::span<const BlockHash> hashes,
                                          int32_t num_tokens) const {
  PrefixHit hit;
  if (!config_.enable_prefix_caching || num_tokens <= 0) return hit;
  const size_t max_blocks =
      static_cast<size_t>((num_tokens - 1) / config_.block_tokens);  // keep ≥ 1 token to compute
  const size_t n = std::min(hashes.size(), max_blocks);
  for (size_t i = 0; i < n; ++i) {
    std::optional<int32_t> id = global_.lookup(hashes[i]);
    if (!id) break;
    hit.block_ids.push_back(*id);
  }
  hit.num_tokens = static_cast<int32_t>(hit.block_ids.size()) * config_.block_tokens;
  return hit;
}

int32_t KvCacheManager::num_blocks_needed(RequestId id, int32_t num_tokens) const {
  const int32_t want = (num_tokens + config_.block_tokens - 1) / config_.block_tokens;
  auto it = requests_.find(id);
  const int32_t have =
      it == requests_.end() ? 0 : static_cast<int32_t>(it->second.block_table.size());
  return std::max(0, want - have);
}

bool KvCacheManager::allocate_slots(RequestId id, int32_t num_tokens, const PrefixHit* hit) {
  // ---- plan
  auto it = requests_.find(id);
  const bool is_new = it == requests_.end();
  const int32_t want = (num_tokens + config_.block_tokens - 1) / config_.block_tokens;
  int32_t have = is_new ? 0 : static_cast<int32_t>(it->second.block_table.size());
  int32_t hit_free = 0;  // hit blocks that touching takes out of the free queue
  const bool use_hit = is_new && hit != nullptr && !hit->block_ids.empty();
  if (use_hit) {
    for (int32_t b : hit->block_ids) hit_free += global_.block(b).ref_cnt == 0 ? 1 : 0;
    have = static_cast<int32_t>(hit->block_ids.size());
  }
  const int32_t new_blocks = std::max(0, want - have);
  if (new_blocks + hit_free > global_.num_free_blocks()) return false;
  const bool need_slot = is_new || it->second.state_slot < 0;
  if (need_slot && state_.num_free_blocks() == 0) return false;
  // ---- apply
  RequestKv& req = is_new ? requests_[id] : it->second;
  if (use_hit) {
    global_.touch(hit->block_ids);
    req.block_table = hit->block_ids;
    req.num_cached_blocks = static_cast<int32_t>(hit->block_ids.size());
  }
  if (need_slot) {
    scratch_.clear();
    state_.get_new_blocks(1, scratch_);
    req.state_slot = scratch_[0];
  }
  if (new_blocks > 0) global_.get_new_blocks(new_blocks, req.block_table);
  maybe_check();
  return true;
}

void KvCacheManager::cache_blocks(RequestId id, std::span<const BlockHash> hashes,
                                  int32_t num_tokens) {
  if (!config_.enable_prefix_caching) return;
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  RequestKv& req = it->second;
  const int32_t full =
      std::min<int32_t>({num_tokens / config_.block_tokens, static_cast<int32_t>(hashes.size()),
                         static_cast<int32_t>(req.block_table.size())});
  for (int32_t i = req.num_cached_blocks; i < full; ++i) {
    // A duplicate (another request computed the same block first) stays uncached.
    (void)global_.cache_block(req.block_table[static_cast<size_t>(i)],
                              hashes[static_cast<size_t>(i)]);
  }
  req.num_cached_blocks = std::max(req.num_cached_blocks, full);
  maybe_check();
}

void KvCacheManager::free(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  RequestKv& req = it->second;
  // Tail first: the request's last blocks are the least likely to be shared, evict them first.
  scratch_.assign(req.block_table.rbegin(), req.block_table.rend());
  global_.free_blocks(scratch_);
  if (req.state_slot >= 0) {
    const int32_t slot = req.state_slot;
    state_.free_blocks(std::span<const int32_t>(&slot, 1));
  }
  requests_.erase(it);
  maybe_check();
}

const std::vector<int32_t>& KvCacheManager::block_table(RequestId id) const {
  static const std::vector<int32_t> kEmpty;
  auto it = requests_.find(id);
  return it == requests_.end() ? kEmpty : it->second.block_table;
}

int32_t KvCacheManager::state_slot(RequestId id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? -1 : it->second.state_slot;
}

Status KvCacheManager::check_invariants() const {
  std::vector<int32_t> refs(static_cast<size_t>(global_.num_blocks()), 0);
  std::vector<int32_t> slot_refs(static_cast<size_t>(state_.num_blocks()), 0);
  for (const auto& [id, req] : requests_) {
    for (int32_t b : req.block_table) {
      if (b < 0 || b >= global_.num_blocks()) {
        return make_error(ErrorCode::kInternal, "request {} holds bad block {}", id, b);
      }
      ++refs[static_cast<size_t>(b)];
    }
    if (req.state_slot >= 0) ++slot_refs[static_cast<size_t>(req.state_slot)];
    if (req.num_cached_blocks > static_cast<int32_t>(req.block_table.size())) {
      return make_error(ErrorCode::kInternal, "request {}: {} cached blocks > table size {}", id,
                        req.num_cached_blocks, req.block_table.size());
    }
  }
  for (int32_t r : slot_refs) {
    if (r > 1) return make_error(ErrorCode::kInternal, "a state slot is held twice");
  }
  MS_RETURN_IF_ERROR(global_.check_invariants(refs));
  return state_.check_invariants(slot_refs);
}

void KvCacheManager::maybe_check() {
  if (!config_.check_invariants) return;
  Status st = check_invariants();
  MS_CHECK_MSG(st.has_value(), "KV invariant broken: {}", st.error().message);
}

}  // namespace moeserve::kv
