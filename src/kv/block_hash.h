// Prefix-cache block hashes (serving.md §4.7): hash_i = XXH3-128(hash_{i-1}, tokens of block i,
// extra keys). The per-request cache_salt is an extra key of the first block only, so every block
// of a salted chain differs from the unsalted one. Only full 256-token blocks are hashed.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

namespace moeserve::kv {

// Logical block = 256 tokens (model.md §2.7, serving.md §4.10): prefix hits land on these.
inline constexpr int32_t kBlockTokens = 256;

struct BlockHash {
  uint64_t low = 0;
  uint64_t high = 0;

  bool operator==(const BlockHash&) const = default;
};

struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const noexcept { return static_cast<size_t>(h.low); }
};

// Hash of one full block. `parent` is nullptr for the first block; `extra_keys` (e.g. the salt,
// later LoRA ids or multimodal hashes) are mixed in after the tokens.
[[nodiscard]] BlockHash hash_block(const BlockHash* parent, std::span<const int32_t> tokens,
                                   std::string_view extra_keys);

// Extends `hashes` with the hashes of every full block of `tokens` not hashed yet.
void extend_block_hashes(std::vector<BlockHash>& hashes, std::span<const int32_t> tokens,
                         std::string_view cache_salt, int32_t block_tokens = kBlockTokens);

}  // namespace moeserve::kv
