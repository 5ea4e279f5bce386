// KV events: which block hashes entered or left the prefix cache, in order, for cache-aware
// routing (serving.md §4.7: the router must use the same hash, block size and salt namespace).
#pragma once

#include <cstdint>
#include <optional>

#include "kv/block_hash.h"

namespace moeserve::kv {

enum class KvEventType : uint8_t { kBlockStored, kBlockRemoved };

struct KvEvent {
  KvEventType type = KvEventType::kBlockStored;
  BlockHash hash;
  int32_t block_id = -1;

  bool operator==(const KvEvent&) const = default;
};

}  // namespace moeserve::kv
