#include "engine/engine_config.h"

#include <algorithm>

namespace moeserve::engine {

Result<EngineSizing> size_engine(const ModelConfig& model, const EngineOptions& opt) {
  size_t budget = opt.kv_cache_memory_bytes;
  if (budget == 0) {
    if (!(opt.kv_cache_memory_fraction > 0.0 && opt.kv_cache_memory_fraction <= 1.0)) {
      return make_error(ErrorCode::kInvalidArgument,
                        "--kv-cache-memory-fraction must be in (0, 1], got {}",
                        opt.kv_cache_memory_fraction);
    }
    if (opt.available_memory_bytes == 0) {
      return make_error(ErrorCode::kInvalidArgument,
                        "give --kv-cache-memory-bytes (free memory is unknown)");
    }
    budget = static_cast<size_t>(static_cast<double>(opt.available_memory_bytes) *
                                 opt.kv_cache_memory_fraction);
  }
  MS_ASSIGN_OR_RETURN(const int32_t align, kv::check_block_tokens(model, opt.block_tokens));
  EngineSizing s;
  s.layout = kv::KvLayout::from_model_config(model, opt.block_tokens);
  MS_ASSIGN_OR_RETURN(s.plan, kv::plan_kv_memory(s.layout, budget, opt.max_num_seqs));
  sched::SchedulerConfig& sc = s.core.scheduler;
  sc.max_num_batched_tokens = opt.max_num_batched_tokens;
  sc.max_num_seqs = opt.max_num_seqs;
  sc.long_prefill_token_threshold = opt.long_prefill_token_threshold;
  sc.max_model_len =
      opt.max_model_len > 0
          ? opt.max_model_len
          : static_cast<int32_t>(std::min<int64_t>(model.max_position_embeddings, INT32_MAX));
  if (opt.prefix_replay_tokens < 0) {
    return make_error(ErrorCode::kInvalidArgument, "--prefix-replay-tokens must be >= 0, got {}",
                      opt.prefix_replay_tokens);
  }
  sc.replay_window =
      opt.prefix_replay_tokens > 0 ? opt.prefix_replay_tokens : model.sliding_window;
  sc.replay_align = align;
  s.core.kv.num_global_blocks = s.plan.num_global_blocks;
  s.core.kv.num_state_slots = s.plan.num_state_slots;
  s.core.kv.enable_prefix_caching = opt.enable_prefix_caching;
  s.core.kv.block_tokens = opt.block_tokens;
  s.core.async_scheduling = opt.async_scheduling;
  s.core.eos_token_id = model.eos_token_id;
  return s;
}

}  // namespace moeserve::engine
