// BlockPool: a fixed set of blocks (ids 0..n-1) of one cache group, their ref counts, the free
// queue and the prefix-cache map. Invariants (check_invariants): a block is in the free queue iff
// its ref count is 0; the free queue is in eviction (LRU) order, front = evicted first; every
// cached block (one with a hash) is the map's entry for that hash and vice versa.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/result.h"
#include "kv/block_hash.h"
#include "kv/kv_events.h"

namespace moeserve::kv {

struct KvBlock {
  int32_t block_id = -1;
  int32_t ref_cnt = 0;
  bool has_hash = false;  // cached: a full block whose contents match `hash`
  BlockHash hash;
  // Intrusive free-queue links (block ids; -1 = none).
  int32_t prev_free = -1;
  int32_t next_free = -1;
  bool in_free_queue = false;
  // Residency clock readings (seconds; -1 = never): when the block got its current contents and
  // when a request last took or released it.
  double filled_at = -1.0;
  double last_access = -1.0;
};

// Residency samples of cached blocks (serving.md §4.12, KV residency), in seconds:
// lifetime = eviction - fill; idle_before_evict = eviction - last access; reuse_gap = a prefix
// hit's time since the block's previous access.
struct KvResidencySamples {
  std::vector<double> lifetime;
  std::vector<double> idle_before_evict;
  std::vector<double> reuse_gap;
};

// Doubly-linked list of free blocks threaded through KvBlock; every operation is O(1).
class FreeBlockQueue {
 public:
  explicit FreeBlockQueue(std::vector<KvBlock>* blocks) : blocks_(blocks) {}
  [[nodiscard]] int32_t size() const { return size_; }
  [[nodiscard]] int32_t front() const { return head_; }
  [[nodiscard]] int32_t pop_front();
  void push_back(int32_t block_id);
  void remove(int32_t block_id);
  // Block ids front to back (tests and invariant checks).
  [[nodiscard]] std::vector<int32_t> to_vector() const;

 private:
  std::vector<KvBlock>* blocks_;
  int32_t head_ = -1;
  int32_t tail_ = -1;
  int32_t size_ = 0;
};

class BlockPool {
 public:
  BlockPool(int32_t num_blocks, bool enable_caching);
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  [[nodiscard]] int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  // Free = ref count 0, whether or not it still holds cached contents.
  [[nodiscard]] int32_t num_free_blocks() const { return free_queue_.size(); }
  [[nodiscard]] double usage() const;
  [[nodiscard]] bool caching_enabled() const { return enable_caching_; }
  [[nodiscard]] const KvBlock& block(int32_t id) const { return blocks_[static_cast<size_t>(id)]; }
  [[nodiscard]] int32_t num_cached_blocks() const { return static_cast<int32_t>(cached_.size()); }

  // Takes `n` blocks from the front of the free queue (evicting their cached hashes) with ref 1.
  // Precondition: n <= num_free_blocks().
  void get_new_blocks(int32_t n, std::vector<int32_t>& out);
  // A prefix hit: ref++ on each block, taking it out of the free queue when it was free.
  void touch(std::span<const int32_t> block_ids);
  // ref-- on each block; blocks reaching 0 are appended to the free queue in the given order
  // (callers pass a request's blocks tail first, so its tail is evicted first).
  void free_blocks(std::span<const int32_t> block_ids);
  // Marks a full block as cached under `hash`. Returns false (block stays uncached) when another
  // block already holds that hash.
  bool cache_block(int32_t block_id, const BlockHash& hash);
  [[nodiscard]] std::optional<int32_t> lookup(const BlockHash& hash) const;

  // Moves the pending stored/removed events out.
  [[nodiscard]] std::vector<KvEvent> take_events();
  // Moves the residency samples gathered since the last call out.
  [[nodiscard]] KvResidencySamples take_residency_samples();
  // The residency clock (seconds, monotonic); default: steady_clock. Tests inject their own.
  void set_clock(std::function<double()> clock) { clock_ = std::move(clock); }
  void set_emit_events(bool on) { emit_events_ = on; }

  // `expected_refs[i]`: how many block tables hold block i. Checks every invariant above.
  [[nodiscard]] Status check_invariants(std::span<const int32_t> expected_refs) const;

 private:
  void evict_hash(KvBlock& block);
  [[nodiscard]] double now() const;

  std::vector<KvBlock> blocks_;
  FreeBlockQueue free_queue_;
  bool enable_caching_;
  bool emit_events_ = true;
  std::unordered_map<BlockHash, int32_t, BlockHashHasher> cached_;
  std::vector<KvEvent> events_;
  std::function<double()> clock_;
  KvResidencySamples residency_;
};

}  // namespace moeserve::kv
