#include "kv/kv_storage.h"

#include "common/check.h"

namespace moeserve::kv {

KvStorage::KvStorage(KvLayout layout, int32_t num_global_blocks, int32_t num_state_slots,
                     int32_t block_tokens)
    : layout_(std::move(layout)),
      num_global_blocks_(num_global_blocks),
      num_state_slots_(num_state_slots),
      block_tokens_(block_tokens) {
  MS_CHECK(num_global_blocks_ >= 0 && num_state_slots_ >= 0 && block_tokens_ > 0);
  for (const CacheKindSpec& k : layout_.kinds) {
    const size_t count = static_cast<size_t>(k.group == CacheGroup::kGlobal ? num_global_blocks_
                                                                            : num_state_slots_);
    const size_t bytes = count * k.page_bytes;
    total_bytes_ += bytes;
    // new[] without () leaves the bytes uninitialised: pages are committed when first written.
    regions_.emplace_back(bytes > 0 ? new uint8_t[bytes] : nullptr);
  }
}

int32_t KvStorage::find_kind(CacheKind kind, int32_t layer_id) const {
  for (size_t i = 0; i < layout_.kinds.size(); ++i) {
    if (layout_.kinds[i].kind == kind && layout_.kinds[i].layer_id == layer_id)
      return static_cast<int32_t>(i);
  }
  return -1;
}

std::span<uint8_t> KvStorage::page(int32_t kind_index, int32_t id) {
  MS_CHECK(kind_index >= 0 && kind_index < static_cast<int32_t>(layout_.kinds.size()));
  const CacheKindSpec& k = layout_.kinds[static_cast<size_t>(kind_index)];
  const int32_t count = k.group == CacheGroup::kGlobal ? num_global_blocks_ : num_state_slots_;
  MS_CHECK_MSG(id >= 0 && id < count, "{} page {} outside [0, {})", cache_kind_name(k.kind), id,
               count);
  return {regions_[static_cast<size_t>(kind_index)].get() + static_cast<size_t>(id) * k.page_bytes,
          k.page_bytes};
}

}  // namespace moeserve::kv
