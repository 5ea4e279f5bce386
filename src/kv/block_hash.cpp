#include "kv/block_hash.h"

#include <xxh3.h>

#include "common/check.h"

namespace moeserve::kv {

BlockHash hash_block(const BlockHash* parent, std::span<const int32_t> tokens,
                     std::string_view extra_keys) {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  // NOTE: a one-byte tag separates "no parent" from a parent hash of all zeros.
  const uint8_t has_parent = parent != nullptr ? 1 : 0;
  XXH3_128bits_update(&state, &has_parent, 1);
  if (parent != nullptr) XXH3_128bits_update(&state, parent, sizeof(BlockHash));
  XXH3_128bits_update(&state, tokens.data(), tokens.size_bytes());
  const uint64_t extra_len = extra_keys.size();
  XXH3_128bits_update(&state, &extra_len, sizeof(extra_len));
  XXH3_128bits_update(&state, extra_keys.data(), extra_keys.size());
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  return BlockHash{h.low64, h.high64};
}

void extend_block_hashes(std::vector<BlockHash>& hashes, std::span<const int32_t> tokens,
                         std::string_view cache_salt, int32_t block_tokens) {
  MS_CHECK(block_tokens > 0);
  const size_t bt = static_cast<size_t>(block_tokens);
  while ((hashes.size() + 1) * bt <= tokens.size()) {
    const size_t i = hashes.size();
    const BlockHash* parent = i == 0 ? nullptr : &hashes[i - 1];
    hashes.push_back(hash_block(parent, tokens.subspan(i * bt, bt), i == 0 ? cache_salt : ""));
  }
}

}  // namespace moeserve::kv
