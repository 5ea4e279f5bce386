#include "kv/block_pool.h"

#include <chrono>

#include "common/check.h"

namespace moeserve::kv {

int32_t FreeBlockQueue::pop_front() {
  MS_CHECK(head_ >= 0);
  const int32_t id = head_;
  remove(id);
  return id;
}

void FreeBlockQueue::push_back(int32_t block_id) {
  KvBlock& b = (*blocks_)[static_cast<size_t>(block_id)];
  MS_DCHECK(!b.in_free_queue);
  b.prev_free = tail_;
  b.next_free = -1;
  b.in_free_queue = true;
  if (tail_ >= 0) {
    (*blocks_)[static_cast<size_t>(tail_)].next_free = block_id;
  } else {
    head_ = block_id;
  }
  tail_ = block_id;
  ++size_;
}

void FreeBlockQueue::remove(int32_t block_id) {
  KvBlock& b = (*blocks_)[static_cast<size_t>(block_id)];
  MS_DCHECK(b.in_free_queue);
  if (b.prev_free >= 0) {
    (*blocks_)[static_cast<size_t>(b.prev_free)].next_free = b.next_free;
  } else {
    head_ = b.next_free;
  }
  if (b.next_free >= 0) {
    (*blocks_)[static_cast<size_t>(b.next_free)].prev_free = b.prev_free;
  } else {
    tail_ = b.prev_free;
  }
  b.prev_free = b.next_free = -1;
  b.in_free_queue = false;
  --size_;
}

std::vector<int32_t> FreeBlockQueue::to_vector() const {
  std::vector<int32_t> ids;
  ids.reserve(static_cast<size_t>(size_));
  for (int32_t id = head_; id >= 0; id = (*blocks_)[static_cast<size_t>(id)].next_free) {
    ids.push_back(id);
    if (ids.size() > blocks_->size()) break;  // a cycle; check_invariants reports it
  }
  return ids;
}

BlockPool::BlockPool(int32_t num_blocks, bool enable_caching)
    : blocks_(static_cast<size_t>(num_blocks)),
      free_queue_(&blocks_),
      enable_caching_(enable_caching) {
  MS_CHECK(num_blocks >= 0);
  for (int32_t i = 0; i < num_blocks; ++i) {
    blocks_[static_cast<size_t>(i)].block_id = i;
    free_queue_.push_back(i);
  }
  cached_.reserve(static_cast<size_t>(num_blocks));
}

double BlockPool::usage() const {
  if (blocks_.empty()) return 0.0;
  return 1.0 - static_cast<double>(num_free_blocks()) / static_cast<double>(blocks_.size());
}

void BlockPool::evict_hash(KvBlock& block) {
  if (!block.has_hash) return;
  auto it = cached_.find(block.hash);
  MS_DCHECK(it != cached_.end() && it->second == block.block_id);
  cached_.erase(it);
  if (emit_events_)
    events_.push_back(KvEvent{KvEventType::kBlockRemoved, block.hash, block.block_id});
  block.has_hash = false;
  block.hash = BlockHash{};
}

double BlockPool::now() const {
  if (clock_) return clock_();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void BlockPool::get_new_blocks(int32_t n, std::vector<int32_t>& out) {
  MS_CHECK_LE(n, num_free_blocks());
  if (n <= 0) return;
  const double t = now();
  for (int32_t i = 0; i < n; ++i) {
    const int32_t id = free_queue_.pop_front();
    KvBlock& b = blocks_[static_cast<size_t>(id)];
    MS_DCHECK(b.ref_cnt == 0);
    if (b.has_hash) {
      // A cached block loses its contents: that ends its residency.
      residency_.lifetime.push_back(t - b.filled_at);
      residency_.idle_before_evict.push_back(t - b.last_access);
    }
    evict_hash(b);
    b.ref_cnt = 1;
    b.filled_at = t;
    b.last_access = t;
    out.push_back(id);
  }
}

void BlockPool::touch(std::span<const int32_t> block_ids) {
  if (block_ids.empty()) return;
  const double t = now();
  for (int32_t id : block_ids) {
    KvBlock& b = blocks_[static_cast<size_t>(id)];
    if (b.ref_cnt == 0) free_queue_.remove(id);
    ++b.ref_cnt;
    if (b.last_access >= 0.0) residency_.reuse_gap.push_back(t - b.last_access);
    b.last_access = t;
  }
}

void BlockPool::free_blocks(std::span<const int32_t> block_ids) {
  if (block_ids.empty()) return;
  const double t = now();
  for (int32_t id : block_ids) {
    KvBlock& b = blocks_[static_cast<size_t>(id)];
    MS_CHECK_MSG(b.ref_cnt > 0, "double free of block {}", id);
    if (--b.ref_cnt == 0) {
      free_queue_.push_back(id);
      b.last_access = t;
    }
  }
}

KvResidencySamples BlockPool::take_residency_samples() {
  KvResidencySamples out;
  std::swap(out, residency_);
  return out;
}

bool BlockPool::cache_block(int32_t block_id, const BlockHash& hash) {
  if (!enable_caching_) return false;
  KvBlock& b = blocks_[static_cast<size_t>(block_id)];
  if (b.has_hash) return b.hash == hash;
  auto [it, inserted] = cached_.try_emplace(hash, block_id);
  if (!inserted) return false;
  b.has_hash = true;
  b.hash = hash;
  if (emit_events_) events_.push_back(KvEvent{KvEventType::kBlockStored, hash, block_id});
  return true;
}

std::optional<int32_t> BlockPool::lookup(const BlockHash& hash) const {
  auto it = cached_.find(hash);
  if (it == cached_.end()) return std::nullopt;
  return it->second;
}

std::vector<KvEvent> BlockPool::take_events() {
  std::vector<KvEvent> out;
  out.swap(events_);
  return out;
}

Status BlockPool::check_invariants(std::span<const int32_t> expected_refs) const {
  if (expected_refs.size() != blocks_.size()) {
    return make_error(ErrorCode::kInternal, "expected_refs has {} entries for {} blocks",
                      expected_refs.size(), blocks_.size());
  }
  int32_t num_zero = 0;
  for (const KvBlock& b : blocks_) {
    const int32_t want = expected_refs[static_cast<size_t>(b.block_id)];
    if (b.ref_cnt != want) {
      return make_error(ErrorCode::kInternal, "block {}: ref_cnt {} but {} block-table refs",
                        b.block_id, b.ref_cnt, want);
    }
    if ((b.ref_cnt == 0) != b.in_free_queue) {
      return make_error(ErrorCode::kInternal, "block {}: ref_cnt {} but in_free_queue={}",
                        b.block_id, b.ref_cnt, b.in_free_queue);
    }
    if (b.ref_cnt == 0) ++num_zero;
    if (b.has_hash) {
      auto it = cached_.find(b.hash);
      if (it == cached_.end() || it->second != b.block_id) {
        return make_error(ErrorCode::kInternal, "block {} has a hash the map does not point at",
                          b.block_id);
      }
    }
  }
  for (const auto& [hash, id] : cached_) {
    if (id < 0 || id >= num_blocks()) {
      return make_error(ErrorCode::kInternal, "hash map points at bad block {}", id);
    }
    const KvBlock& b = blocks_[static_cast<size_t>(id)];
    if (!b.has_hash || !(b.hash == hash)) {
      return make_error(ErrorCode::kInternal, "hash map entry for block {} is stale", id);
    }
  }
  if (!enable_caching_ && !cached_.empty()) {
    return make_error(ErrorCode::kInternal, "caching is off but {} blocks are cached",
                      cached_.size());
  }
  const std::vector<int32_t> order = free_queue_.to_vector();
  if (static_cast<int32_t>(order.size()) != free_queue_.size() || free_queue_.size() != num_zero) {
    return make_error(ErrorCode::kInternal, "free queue walk {} / size {} / ref==0 blocks {}",
                      order.size(), free_queue_.size(), num_zero);
  }
  int32_t prev = -1;
  for (int32_t id : order) {
    const KvBlock& b = blocks_[static_cast<size_t>(id)];
    if (!b.in_free_queue || b.prev_free != prev) {
      return make_error(ErrorCode::kInternal, "free queue links broken at block {}", id);
    }
    prev = id;
  }
  return ok_status();
}

}  // namespace moeserve::kv
