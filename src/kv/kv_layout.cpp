#include "kv/kv_layout.h"

#include <numeric>

#include "common/check.h"
#include "kv/block_hash.h"

namespace moeserve::kv {

const char* cache_kind_name(CacheKind kind) {
  switch (kind) {
    case CacheKind::kGlobalMain:
      return "global_main";
    case CacheKind::kGlobalIndex:
      return "global_index";
    case CacheKind::kSwaRing:
      return "swa_ring";
    case CacheKind::kCompressorState:
      return "compressor_state";
    case CacheKind::kDsparkRing:
      return "dspark_ring";
    case CacheKind::kEngramHistory:
      return "engram_history";
  }
  return "?";
}

size_t KvLayout::global_block_bytes() const {
  size_t total = 0;
  for (const CacheKindSpec& k : kinds) {
    if (k.group == CacheGroup::kGlobal) total += k.page_bytes;
  }
  return total;
}

size_t KvLayout::state_slot_bytes() const {
  size_t total = 0;
  for (const CacheKindSpec& k : kinds) {
    if (k.group == CacheGroup::kState) total += k.page_bytes;
  }
  return total;
}

KvLayout KvLayout::from_model_config(const ModelConfig& config, int32_t block_tokens) {
  KvLayout layout;
  for (int32_t l : config.kv_source_layer_ids) {
    const int32_t ratio = config.compress_ratios[static_cast<size_t>(l)];
    MS_CHECK_MSG(ratio > 0 && block_tokens % ratio == 0, "layer {} ratio {} vs block {}", l, ratio,
                 block_tokens);
    const int32_t entries = block_tokens / ratio;
    const size_t main_b = config.main_entry_bytes();
    const size_t index_b = config.index_entry_bytes();
    layout.kinds.push_back({CacheKind::kGlobalMain, CacheGroup::kGlobal, l, entries, main_b,
                            main_b * static_cast<size_t>(entries)});
    layout.kinds.push_back({CacheKind::kGlobalIndex, CacheGroup::kGlobal, l, entries, index_b,
                            index_b * static_cast<size_t>(entries)});
  }
  const size_t window = static_cast<size_t>(config.sliding_window);
  layout.kinds.push_back({CacheKind::kSwaRing, CacheGroup::kState, -1, 0, config.swa_row_bytes(),
                          config.swa_ring_bytes_per_request()});
  for (int32_t l : config.kv_source_layer_ids) {
    const int32_t ratio = config.compress_ratios[static_cast<size_t>(l)];
    if (ratio <= 1) continue;
    // ≤ ratio-1 buffered tokens of (kvc, gate), fp32 each [hd].
    const size_t bytes =
        static_cast<size_t>(ratio - 1) * 2 * static_cast<size_t>(config.head_dim) * 4;
    layout.kinds.push_back({CacheKind::kCompressorState, CacheGroup::kState, l, 0, bytes, bytes});
  }
  if (config.num_nextn_predict_layers > 0) {
    // One context ring per draft stage, rows in the SWA format (model.md §6.1).
    const size_t row = config.swa_row_bytes();
    layout.kinds.push_back({CacheKind::kDsparkRing, CacheGroup::kState, -1, 0, row,
                            row * window * static_cast<size_t>(config.num_nextn_predict_layers)});
  }
  if (!config.engram_layer_ids.empty()) {
    const size_t bytes = static_cast<size_t>(config.engram_max_ngram_size - 1) * sizeof(int32_t);
    layout.kinds.push_back(
        {CacheKind::kEngramHistory, CacheGroup::kState, -1, 0, sizeof(int32_t), bytes});
  }
  return layout;
}

Result<int32_t> check_block_tokens(const ModelConfig& config, int32_t block_tokens) {
  if (block_tokens <= 0) {
    return make_error(ErrorCode::kInvalidArgument, "--block-size must be > 0, got {}",
                      block_tokens);
  }
  int32_t align = 1;
  for (int32_t l : config.kv_source_layer_ids) {
    const int32_t ratio = config.compress_ratios[static_cast<size_t>(l)];
    if (ratio <= 0 || block_tokens % ratio != 0) {
      return make_error(ErrorCode::kInvalidArgument,
                        "--block-size {} is not a multiple of layer {}'s compression ratio {}",
                        block_tokens, l, ratio);
    }
    align = std::lcm(align, ratio);
  }
  return align;
}

KvLayout KvLayout::uniform(size_t global_block_bytes, size_t state_slot_bytes) {
  KvLayout layout;
  layout.kinds.push_back({CacheKind::kGlobalMain, CacheGroup::kGlobal, -1, kBlockTokens,
                          global_block_bytes / kBlockTokens, global_block_bytes});
  layout.kinds.push_back(
      {CacheKind::kSwaRing, CacheGroup::kState, -1, 0, state_slot_bytes, state_slot_bytes});
  return layout;
}

Result<KvMemoryPlan> plan_kv_memory(const KvLayout& layout, size_t budget_bytes,
                                    int32_t max_num_seqs, int32_t min_global_blocks) {
  if (max_num_seqs <= 0) {
    return make_error(ErrorCode::kInvalidArgument, "max_num_seqs must be > 0, got {}",
                      max_num_seqs);
  }
  const size_t block_bytes = layout.global_block_bytes();
  if (block_bytes == 0) return make_error(ErrorCode::kInvalidArgument, "layout has no global kind");
  KvMemoryPlan plan;
  plan.num_state_slots = max_num_seqs;
  plan.state_bytes = layout.state_slot_bytes() * static_cast<size_t>(max_num_seqs);
  if (plan.state_bytes >= budget_bytes) {
    return make_error(ErrorCode::kResourceExhausted,
                      "KV budget {} B does not cover the per-request state of {} sequences ({} B); "
                      "raise --kv-cache-memory-bytes or lower --max-num-seqs",
                      budget_bytes, max_num_seqs, plan.state_bytes);
  }
  const size_t blocks = (budget_bytes - plan.state_bytes) / block_bytes;
  if (blocks < static_cast<size_t>(min_global_blocks)) {
    return make_error(ErrorCode::kResourceExhausted,
                      "KV budget {} B leaves {} global blocks of {} B (need {})", budget_bytes,
                      blocks, block_bytes, min_global_blocks);
  }
  plan.num_global_blocks = static_cast<int32_t>(std::min<size_t>(blocks, INT32_MAX / 2));
  plan.global_bytes = static_cast<size_t>(plan.num_global_blocks) * block_bytes;
  return plan;
}

}  // namespace moeserve::kv
