// Serving-benchmark workloads: a trace is a list of requests grouped into sessions (agentic
// trajectories). Each request carries one hash id per 64-token KV block; a block's prompt tokens
// are a pure function of (hash id, salt), so equal hash-id prefixes are equal token prefixes and a
// prefix cache on the server sees real shared prefixes. Format: one JSON object per line (JSONL).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "common/result.h"

namespace moeserve::bench {

inline constexpr int32_t kTraceBlockTokens = 64;

struct TraceRequest {
  std::string session_id;
  std::string parent_session_id;  // non-empty for a sub-agent session forked from a parent
  int32_t turn = 0;               // 0-based position in the session
  double arrival_s = 0.0;         // recorded issue time, seconds from the session start
  double idle_s = 0.0;  // recorded gap between the previous turn's end and this turn (tool time)
  int32_t input_len = 0;
  int32_t output_len = 0;
  std::vector<uint64_t> hash_ids;  // ceil(input_len / 64) ids, one per 64-token block
};

struct TraceSession {
  std::string session_id;
  std::string parent_session_id;
  std::vector<TraceRequest> turns;
};

[[nodiscard]] Result<std::vector<TraceRequest>> read_trace_jsonl(const std::string& path);
[[nodiscard]] Status write_trace_jsonl(const std::string& path,
                                       const std::vector<TraceRequest>& requests);
// Groups requests by session (first-appearance order; sub-agent sessions stay where they first
// appear, which make-trace puts right after the parent turn they fork from); turns sorted.
[[nodiscard]] std::vector<TraceSession> group_sessions(const std::vector<TraceRequest>& requests);

// Fixed-length random workload: `num_requests` single-turn sessions of isl/osl with fresh hash ids.
[[nodiscard]] std::vector<TraceRequest> make_random_workload(int32_t num_requests, int32_t isl,
                                                             int32_t osl, uint64_t seed);

struct AgenticTraceConfig {
  int32_t num_sessions = 16;
  int32_t min_turns = 8;
  int32_t max_turns = 24;
  int32_t system_prompt_tokens = 2048;  // shared by every session (same tool definitions)
  int32_t first_user_tokens = 1024;     // the task description
  int32_t min_append_tokens = 64;       // tool results + previous answer appended per turn
  int32_t max_append_tokens = 1024;
  int32_t min_output_tokens = 16;  // one model call inside a tool loop: short
  int32_t max_output_tokens = 256;
  double subagent_probability = 0.1;  // per turn: fork a sub-agent from the current prefix
  int32_t subagent_turns = 4;
  double mean_idle_s = 2.0;  // exponential tool/think gap between turns
  double max_idle_s = 30.0;
  int32_t max_input_tokens = 131072;
  uint64_t seed = 1;
};

// Synthetic agentic sessions: each turn's prompt is the previous prompt + the previous output +
// a new tool result, so turn k shares all but its appended blocks with turn k-1.
[[nodiscard]] std::vector<TraceRequest> make_agentic_trace(const AgenticTraceConfig& config);

// Idealised infinite prefix cache over 64-token blocks (AgentX convention): the cached prefix of a
// request is the longest run of leading hash ids already seen. `observe` returns cached tokens
// (capped at input_len) and then records every block of the request.
class IdealPrefixCache {
 public:
  int64_t observe(const std::vector<uint64_t>& salted_hash_ids, int32_t input_len);

 private:
  std::unordered_set<uint64_t> seen_;
};

struct TraceCacheStats {
  int64_t input_tokens = 0;
  int64_t cached_tokens = 0;
  [[nodiscard]] double hit_ratio() const {
    return input_tokens > 0 ? static_cast<double>(cached_tokens) / input_tokens : 0.0;
  }
};
// Replays the trace in file order through an IdealPrefixCache.
[[nodiscard]] TraceCacheStats ideal_cache_stats(const std::vector<TraceRequest>& requests);

// Deterministic prompt tokens: block b of a request gets 64 ids from mix(hash_ids[b], salt),
// each in [token_lo, token_hi); the last block is cut to input_len.
[[nodiscard]] uint64_t salt_hash(uint64_t hash_id, uint64_t salt);
[[nodiscard]] std::vector<int32_t> prompt_token_ids(const TraceRequest& request, uint64_t salt,
                                                    int32_t token_lo, int32_t token_hi);
// Text for chat prompts: one common English word (" the", " cat", ...) per token, same blocks.
[[nodiscard]] std::string prompt_text(const TraceRequest& request, uint64_t salt);

[[nodiscard]] uint64_t splitmix64(uint64_t x);

}  // namespace moeserve::bench
