// KvLayout: the V4.1 cache kinds and their byte sizes (model.md §2.3, §2.6, §2.7), grouped by
// lifetime. Group kGlobal holds the token-proportional, prefix-cacheable kinds (main entries and
// index keys of each KV-source layer); group kState holds the fixed-size per-request kinds (SWA
// rings, compressor partial state, DSpark ring, Engram history), never prefix-cached. Each kind has
// its own page size and its own region; a group's block id indexes every region of that group.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"
#include "kv/block_hash.h"
#include "model/config.h"

namespace moeserve::kv {

enum class CacheGroup : uint8_t { kGlobal, kState };

enum class CacheKind : uint8_t {
  kGlobalMain,       // FP4 main entries, 288 B each (hd 512)
  kGlobalIndex,      // FP4 index keys, 68 B each (ID 128)
  kSwaRing,          // FP8 window rows of every layer, W × 528 B per layer
  kCompressorState,  // FP32 partial group (kvc, gate) of a ratio>1 KV-source layer
  kDsparkRing,       // DSpark context rings, one per draft stage (SWA row format)
  kEngramHistory,    // last max_ngram-1 token ids
};
[[nodiscard]] const char* cache_kind_name(CacheKind kind);

struct CacheKindSpec {
  CacheKind kind = CacheKind::kGlobalMain;
  CacheGroup group = CacheGroup::kGlobal;
  int32_t layer_id = -1;          // -1: all layers (SWA, DSpark, Engram)
  int32_t entries_per_block = 0;  // global kinds: 256 / ratio entries per 256-token block
  size_t entry_bytes = 0;
  size_t page_bytes = 0;  // bytes per block (global) or per request (state)
};

struct KvLayout {
  std::vector<CacheKindSpec> kinds;

  // Bytes one 256-token block costs across every global kind.
  [[nodiscard]] size_t global_block_bytes() const;
  // Bytes one request's state slot costs across every state kind.
  [[nodiscard]] size_t state_slot_bytes() const;

  // `block_tokens`: tokens per logical block (a multiple of every compression ratio).
  [[nodiscard]] static KvLayout from_model_config(const ModelConfig& config,
                                                  int32_t block_tokens = kBlockTokens);
  // Tests and benches without a model: one global and one state kind of the given sizes.
  [[nodiscard]] static KvLayout uniform(size_t global_block_bytes, size_t state_slot_bytes);
};

// Checks that `block_tokens` is a positive multiple of every KV-source layer's compression ratio
// and returns the lcm of those ratios (the alignment a replay start needs).
[[nodiscard]] Result<int32_t> check_block_tokens(const ModelConfig& config, int32_t block_tokens);

struct KvMemoryPlan {
  int32_t num_global_blocks = 0;
  int32_t num_state_slots = 0;
  size_t global_bytes = 0;
  size_t state_bytes = 0;
};

// Splits a byte budget: one state slot per possible running request (max_num_seqs) first, the rest
// into global blocks. Fails when fewer than `min_global_blocks` blocks fit.
[[nodiscard]] Result<KvMemoryPlan> plan_kv_memory(const KvLayout& layout, size_t budget_bytes,
                                                  int32_t max_num_seqs,
                                                  int32_t min_global_blocks = 1);

}  // namespace moeserve::kv
