// EngineOptions: the user-facing engine knobs (the server/app map --max-num-batched-tokens,
// --max-num-seqs, --long-prefill-token-threshold, --kv-cache-memory-bytes,
// --kv-cache-memory-fraction, --enable-prefix-caching, --async-scheduling onto it) and their
// translation into an EngineCoreConfig for one model (KV pools sized from ModelConfig).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/result.h"
#include "engine/engine_core.h"
#include "kv/kv_layout.h"
#include "model/config.h"

namespace moeserve::engine {

struct EngineOptions {
  int32_t max_num_batched_tokens = 8192;
  int32_t max_num_seqs = 256;
  int32_t long_prefill_token_threshold = 0;
  int32_t max_model_len = 0;              // 0: the model's max_position_embeddings
  size_t kv_cache_memory_bytes = 0;       // 0: use the fraction below
  double kv_cache_memory_fraction = 0.9;  // of `available_memory_bytes`
  size_t available_memory_bytes = 0;      // free device/host memory after weights
  bool enable_prefix_caching = true;
  int32_t block_tokens = kv::kBlockTokens;  // --block-size: tokens per prefix-cache block
  // --prefix-replay-tokens: tokens replayed before a prefix hit to rebuild the SWA rings
  // (model.md §2.6); 0 = the model's sliding_window. Longer is closer to a miss, up to exact when
  // it covers the hit.
  int32_t prefix_replay_tokens = 0;
  bool async_scheduling = false;
};

struct EngineSizing {
  EngineCoreConfig core;
  kv::KvLayout layout;
  kv::KvMemoryPlan plan;
};

[[nodiscard]] Result<EngineSizing> size_engine(const ModelConfig& model, const EngineOptions& opt);

}  // namespace moeserve::engine
