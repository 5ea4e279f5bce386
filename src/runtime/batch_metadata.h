// BatchMetadata: the flattened inputs of one step that a forward pass consumes, built by the
// ModelRunner from a SchedulerOutput and its own per-request state. Rows are grouped by request in
// scheduled order; request i owns rows [query_start, query_start + query_len).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/result.h"
#include "kv/block_hash.h"
#include "kv/kv_cache_manager.h"
#include "sched/request.h"

namespace moeserve::runtime {

struct BatchRequest {
  sched::RequestId id = 0;
  int32_t query_start = 0;  // first row of this request
  int32_t query_len = 0;    // rows this step
  int32_t context_len = 0;  // tokens before the first row (num_computed_tokens)
  int32_t num_replay = 0;   // leading rows that only rebuild SWA state (global KV exists)
  int32_t state_slot = -1;  // SWA ring / compressor / DSpark / Engram slot
  int32_t logits_row = -1;  // row in the logits output, -1 if it does not sample
  bool is_new = false;      // first step of this request since admission (reset its state)
  int32_t prefill_len = 0;  // tokens known at admission (production bounded replay's P)
  const std::vector<int32_t>* block_table = nullptr;  // global blocks, 256 tokens each
  const std::vector<int32_t>* token_ids = nullptr;    // every token the runner knows
};

struct BatchMetadata {
  std::vector<int32_t> token_ids;     // [T]
  std::vector<int32_t> positions;     // [T]
  std::vector<int32_t> slot_mapping;  // [T] global slot = block_id * 256 + position % 256
  std::vector<BatchRequest> requests;
  int32_t num_logits = 0;
  int32_t block_tokens = kv::kBlockTokens;

  void clear() {
    token_ids.clear();
    positions.clear();
    slot_mapping.clear();
    requests.clear();
    num_logits = 0;
  }
};

// What a forward pass implements to serve behind the ModelRunner: fill `logits` [num_logits, V]
// (row order = BatchRequest::logits_row) and write the caches of every row.
class ForwardModel {
 public:
  virtual ~ForwardModel() = default;
  [[nodiscard]] virtual int32_t vocab_size() const = 0;
  [[nodiscard]] virtual Status forward(const BatchMetadata& batch, std::span<float> logits) = 0;
  // The request left the batch (finished, aborted or preempted): its state slot is no longer its.
  virtual void release_request(sched::RequestId /*id*/) {}
  // Called once before the first step with the pools the KV manager hands out (block ids index
  // `num_global_blocks`, state slots `num_state_slots`): allocate the cache memory here.
  [[nodiscard]] virtual Status initialize_kv_cache(const kv::KvCacheConfig& /*config*/) {
    return ok_status();
  }
};

}  // namespace moeserve::runtime
