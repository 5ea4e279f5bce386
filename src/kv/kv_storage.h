// KvStorage: the bytes behind the KV pools (host memory on the CPU backend). Every cache kind of a
// KvLayout gets one region: global kinds [num_blocks, page_bytes] indexed by the global pool's
// block id, state kinds [num_slots, page_bytes] indexed by the state pool's slot id. The
// KvCacheManager decides which ids a request holds; this class only maps (kind, id) to bytes.
// Memory is allocated uninitialised (untouched pages cost nothing until written).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kv/kv_layout.h"

namespace moeserve::kv {

class KvStorage {
 public:
  KvStorage(KvLayout layout, int32_t num_global_blocks, int32_t num_state_slots,
            int32_t block_tokens);
  KvStorage(const KvStorage&) = delete;
  KvStorage& operator=(const KvStorage&) = delete;

  [[nodiscard]] const KvLayout& layout() const { return layout_; }
  [[nodiscard]] int32_t num_global_blocks() const { return num_global_blocks_; }
  [[nodiscard]] int32_t num_state_slots() const { return num_state_slots_; }
  [[nodiscard]] int32_t block_tokens() const { return block_tokens_; }
  [[nodiscard]] size_t total_bytes() const { return total_bytes_; }

  // Index of the kind (kind, layer_id) in layout().kinds, -1 if absent.
  [[nodiscard]] int32_t find_kind(CacheKind kind, int32_t layer_id = -1) const;
  // The page of block/slot `id` of kind number `kind_index`.
  [[nodiscard]] std::span<uint8_t> page(int32_t kind_index, int32_t id);

 private:
  KvLayout layout_;
  int32_t num_global_blocks_ = 0;
  int32_t num_state_slots_ = 0;
  int32_t block_tokens_ = 0;
  size_t total_bytes_ = 0;
  std::vector<std::unique_ptr<uint8_t[]>> regions_;  // parallel to layout_.kinds
};

}  // namespace moeserve::kv
