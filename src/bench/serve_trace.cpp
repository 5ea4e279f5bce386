#include "bench/serve_trace.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

namespace moeserve::bench {

namespace {

using nlohmann::json;

// One common English word per id: BPE tokenizers encode " word" as one token, so a prompt built
// from these has about one server token per trace token.
constexpr const char* kWords[] = {
    " the",   " of",    " and",  " to",    " in",    " is",    " for",   " on",   " that",  " with",
    " as",    " it",    " be",   " at",    " by",    " this",  " from",  " or",   " an",    " are",
    " not",   " but",   " we",   " can",   " all",   " one",   " has",   " more", " if",    " will",
    " new",   " time",  " code", " file",  " line",  " test",  " data",  " run",  " call",  " list",
    " map",   " set",   " get",  " type",  " name",  " value", " error", " case", " user",  " path",
    " read",  " write", " open", " close", " start", " end",   " next",  " last", " first", " left",
    " right", " up",    " down", " out"};
constexpr int32_t kNumWords = static_cast<int32_t>(sizeof(kWords) / sizeof(kWords[0]));

json to_json(const TraceRequest& r) {
  json j{{"session_id", r.session_id}, {"turn", r.turn},           {"arrival_s", r.arrival_s},
         {"idle_s", r.idle_s},         {"input_len", r.input_len}, {"output_len", r.output_len},
         {"hash_ids", r.hash_ids}};
  if (!r.parent_session_id.empty()) j["parent_session_id"] = r.parent_session_id;
  return j;
}

int32_t num_blocks(int32_t tokens) { return (tokens + kTraceBlockTokens - 1) / kTraceBlockTokens; }

}  // namespace

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t salt_hash(uint64_t hash_id, uint64_t salt) {
  return salt == 0 ? hash_id : splitmix64(hash_id ^ splitmix64(salt));
}

Result<std::vector<TraceRequest>> read_trace_jsonl(const std::string& path) {
  std::ifstream in(path);
  if (!in) return make_error(ErrorCode::kIo, "cannot open trace {}", path);
  std::vector<TraceRequest> out;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object())
      return make_error(ErrorCode::kInvalidArgument, "{}:{}: not a JSON object", path, line_no);
    TraceRequest r;
    try {
      const json& sid = j.at("session_id");
      r.session_id = sid.is_string() ? sid.get<std::string>() : sid.dump();
      if (j.contains("parent_session_id") && !j["parent_session_id"].is_null()) {
        const json& p = j["parent_session_id"];
        r.parent_session_id = p.is_string() ? p.get<std::string>() : p.dump();
      }
      r.turn = j.value("turn", 0);
      r.arrival_s = j.value("arrival_s", 0.0);
      r.idle_s = j.value("idle_s", 0.0);
      r.input_len = j.at("input_len").get<int32_t>();
      r.output_len = j.at("output_len").get<int32_t>();
      if (j.contains("hash_ids")) r.hash_ids = j["hash_ids"].get<std::vector<uint64_t>>();
    } catch (const json::exception& e) {
      return make_error(ErrorCode::kInvalidArgument, "{}:{}: {}", path, line_no, e.what());
    }
    if (r.input_len <= 0 || r.output_len <= 0)
      return make_error(ErrorCode::kInvalidArgument, "{}:{}: input_len and output_len must be > 0",
                        path, line_no);
    if (static_cast<int32_t>(r.hash_ids.size()) < num_blocks(r.input_len)) {
      // Missing blocks get ids unique to this request, so they are never shared.
      for (int32_t b = static_cast<int32_t>(r.hash_ids.size()); b < num_blocks(r.input_len); ++b)
        r.hash_ids.push_back(
            splitmix64((static_cast<uint64_t>(line_no) << 24) ^ b ^ 0x5eedf00dULL << 40));
    }
    out.push_back(std::move(r));
  }
  if (out.empty()) return make_error(ErrorCode::kInvalidArgument, "trace {} is empty", path);
  return out;
}

Status write_trace_jsonl(const std::string& path, const std::vector<TraceRequest>& requests) {
  std::error_code ec;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  std::ofstream out(path);
  if (!out) return make_error(ErrorCode::kIo, "cannot write trace {}", path);
  for (const auto& r : requests) out << to_json(r).dump() << "\n";
  if (!out) return make_error(ErrorCode::kIo, "short write to {}", path);
  return ok_status();
}

std::vector<TraceSession> group_sessions(const std::vector<TraceRequest>& requests) {
  std::vector<TraceSession> sessions;
  std::map<std::string, size_t> index;
  for (const auto& r : requests) {
    auto [it, inserted] = index.emplace(r.session_id, sessions.size());
    if (inserted) sessions.push_back({r.session_id, r.parent_session_id, {}});
    sessions[it->second].turns.push_back(r);
  }
  for (auto& s : sessions)
    std::stable_sort(s.turns.begin(), s.turns.end(),
                     [](const TraceRequest& a, const TraceRequest& b) { return a.turn < b.turn; });
  return sessions;
}

std::vector<TraceRequest> make_random_workload(int32_t num_requests, int32_t isl, int32_t osl,
                                               uint64_t seed) {
  std::vector<TraceRequest> out;
  out.reserve(static_cast<size_t>(std::max(0, num_requests)));
  uint64_t counter = splitmix64(seed ^ 0x72616e646f6dULL);
  for (int32_t i = 0; i < num_requests; ++i) {
    TraceRequest r;
    r.session_id = "random-" + std::to_string(i);
    r.input_len = isl;
    r.output_len = osl;
    for (int32_t b = 0; b < num_blocks(isl); ++b) r.hash_ids.push_back(splitmix64(++counter));
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<TraceRequest> make_agentic_trace(const AgenticTraceConfig& c) {
  std::mt19937_64 rng(c.seed);
  uint64_t next_id = splitmix64(c.seed ^ 0x6167656e74ULL);
  auto fresh = [&] { return splitmix64(++next_id); };
  auto uniform = [&](int32_t lo, int32_t hi) {
    return std::uniform_int_distribution<int32_t>(lo, std::max(lo, hi))(rng);
  };
  auto idle = [&] {
    return std::min(c.max_idle_s, std::exponential_distribution<double>(
                                      1.0 / std::max(1e-6, c.mean_idle_s))(rng));
  };
  // The system prompt (tool definitions) is the same for every session.
  std::vector<uint64_t> system_ids;
  for (int32_t b = 0; b < c.system_prompt_tokens / kTraceBlockTokens; ++b)
    system_ids.push_back(splitmix64(c.seed * 0x1000193ULL + static_cast<uint64_t>(b) + 1));
  const int32_t system_tokens =
      static_cast<int32_t>(system_ids.size()) * kTraceBlockTokens;  // full blocks only

  std::vector<TraceRequest> out;
  // Emits turns of one session starting from a prefix (full blocks of the parent, or the system
  // prompt). Sub-agents are emitted right after the turn they fork from.
  std::function<void(const std::string&, const std::string&, std::vector<uint64_t>, int32_t,
                     int32_t, int32_t, int32_t)>
      emit_session;
  int32_t subagent_counter = 0;
  emit_session = [&](const std::string& sid, const std::string& parent, std::vector<uint64_t> ids,
                     int32_t prefix_tokens, int32_t first_tokens, int32_t turns, int32_t depth) {
    int32_t len = prefix_tokens + first_tokens;
    double arrival = 0.0;
    for (int32_t t = 0; t < turns && len + c.max_output_tokens <= c.max_input_tokens; ++t) {
      TraceRequest r;
      r.session_id = sid;
      r.parent_session_id = parent;
      r.turn = t;
      r.input_len = len;
      r.output_len = uniform(c.min_output_tokens, c.max_output_tokens);
      r.idle_s = t == 0 ? 0.0 : idle();
      arrival += r.idle_s;
      r.arrival_s = arrival;
      while (static_cast<int32_t>(ids.size()) < num_blocks(len)) ids.push_back(fresh());
      r.hash_ids = ids;
      // Nominal recorded duration: 50 output tokens/s.
      arrival += r.output_len / 50.0;
      out.push_back(r);
      if (depth == 0 && t + 1 < turns && std::bernoulli_distribution(c.subagent_probability)(rng)) {
        // Sub-agent: starts from a snapshot of the parent's cache (its full blocks) plus a task.
        std::vector<uint64_t> child(ids.begin(), ids.begin() + len / kTraceBlockTokens);
        emit_session(sid + "/sub" + std::to_string(subagent_counter++), sid, std::move(child),
                     (len / kTraceBlockTokens) * kTraceBlockTokens,
                     uniform(c.min_append_tokens, c.max_append_tokens), c.subagent_turns, 1);
      }
      // Next turn: the model's answer and a tool result are appended. The last partial block
      // changes content, so it gets a new id.
      const int32_t full = len / kTraceBlockTokens;
      ids.resize(static_cast<size_t>(full));
      len += r.output_len + uniform(c.min_append_tokens, c.max_append_tokens);
    }
  };
  for (int32_t s = 0; s < c.num_sessions; ++s) {
    emit_session("s" + std::to_string(s), "", system_ids, system_tokens, c.first_user_tokens,
                 uniform(c.min_turns, c.max_turns), 0);
  }
  return out;
}

int64_t IdealPrefixCache::observe(const std::vector<uint64_t>& ids, int32_t input_len) {
  int64_t hit_blocks = 0;
  while (hit_blocks < static_cast<int64_t>(ids.size()) && seen_.count(ids[hit_blocks]) > 0)
    ++hit_blocks;
  for (uint64_t id : ids) seen_.insert(id);
  return std::min<int64_t>(hit_blocks * kTraceBlockTokens, input_len);
}

TraceCacheStats ideal_cache_stats(const std::vector<TraceRequest>& requests) {
  IdealPrefixCache cache;
  TraceCacheStats stats;
  for (const auto& r : requests) {
    stats.input_tokens += r.input_len;
    stats.cached_tokens += cache.observe(r.hash_ids, r.input_len);
  }
  return stats;
}

std::vector<int32_t> prompt_token_ids(const TraceRequest& r, uint64_t salt, int32_t token_lo,
                                      int32_t token_hi) {
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(r.input_len));
  const uint64_t range = static_cast<uint64_t>(std::max(1, token_hi - token_lo));
  for (size_t b = 0; b < r.hash_ids.size() && static_cast<int32_t>(out.size()) < r.input_len; ++b) {
    const uint64_t h = salt_hash(r.hash_ids[b], salt);
    for (int32_t i = 0; i < kTraceBlockTokens && static_cast<int32_t>(out.size()) < r.input_len;
         ++i) {
      out.push_back(token_lo +
                    static_cast<int32_t>(splitmix64(h + static_cast<uint64_t>(i)) % range));
    }
  }
  return out;
}

std::string prompt_text(const TraceRequest& r, uint64_t salt) {
  std::string text;
  for (int32_t id : prompt_token_ids(r, salt, 0, kNumWords)) text += kWords[id];
  return text;
}

}  // namespace moeserve::bench
