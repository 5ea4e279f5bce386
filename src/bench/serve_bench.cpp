#include "bench/serve_bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "bench/http_client.h"
#include "bench/serve_trace.h"
#include "common/logging.h"

namespace moeserve::bench {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using Headers = std::vector<std::pair<std::string, std::string>>;

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// Parses a streamed SSE body into events; times each content chunk on arrival.
class SseCollector {
 public:
  SseCollector(RequestRecord& record, Clock::time_point t0, bool chat)
      : record_(record), t0_(t0), chat_(chat) {}

  void feed(std::string_view bytes) {
    const double now = std::chrono::duration<double>(Clock::now() - t0_).count();
    buf_.append(bytes);
    size_t pos;
    while ((pos = buf_.find("\n\n")) != std::string::npos) {
      std::string event = buf_.substr(0, pos);
      buf_.erase(0, pos + 2);
      handle_event(event, now);
    }
  }
  [[nodiscard]] bool done() const { return done_; }
  [[nodiscard]] const std::string& error() const { return error_; }

 private:
  void handle_event(const std::string& event, double now) {
    std::string data;
    size_t start = 0;
    while (start < event.size()) {
      size_t end = event.find('\n', start);
      if (end == std::string::npos) end = event.size();
      std::string_view line(event.data() + start, end - start);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.substr(0, 5) == "data:") {
        line.remove_prefix(5);
        if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
        if (!data.empty()) data += '\n';
        data.append(line);
      }
      start = end + 1;
    }
    if (data.empty()) return;
    if (data == "[DONE]") {
      done_ = true;
      return;
    }
    json j = json::parse(data, nullptr, false);
    if (j.is_discarded()) {
      error_ = "malformed SSE event";
      return;
    }
    if (j.contains("error")) {
      const json& e = j["error"];
      error_ = e.is_object() ? e.value("message", e.dump()) : e.dump();
      return;
    }
    bool content = false;
    if (j.contains("choices") && j["choices"].is_array()) {
      for (const json& c : j["choices"]) {
        if (chat_) {
          if (!c.contains("delta") || !c["delta"].is_object()) continue;
          const json& d = c["delta"];
          for (const char* key : {"content", "reasoning_content", "reasoning"})
            if (d.contains(key) && d[key].is_string() && !d[key].get<std::string>().empty())
              content = true;
          if (d.contains("tool_calls") && !d["tool_calls"].is_null()) content = true;
        } else if (c.contains("text") && c["text"].is_string() &&
                   !c["text"].get<std::string>().empty()) {
          content = true;
        }
      }
    }
    if (content) {
      if (record_.first_token_s < 0)
        record_.first_token_s = now;
      else
        record_.itl_s.push_back(now - last_chunk_s_);
      last_chunk_s_ = now;
    }
    if (j.contains("usage") && j["usage"].is_object()) {
      const json& u = j["usage"];
      record_.usage_from_server = true;
      record_.prompt_tokens = u.value("prompt_tokens", int64_t{0});
      record_.completion_tokens = u.value("completion_tokens", int64_t{0});
      if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object())
        record_.server_cached_tokens =
            u["prompt_tokens_details"].value("cached_tokens", int64_t{0});
    }
  }

  RequestRecord& record_;
  Clock::time_point t0_;
  bool chat_;
  std::string buf_;
  bool done_ = false;
  std::string error_;
  double last_chunk_s_ = 0.0;
};

std::string error_message(const std::string& body, int status) {
  json j = json::parse(body, nullptr, false);
  if (!j.is_discarded() && j.is_object() && j.contains("error")) {
    const json& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string())
      return fmt::format("HTTP {}: {}", status, e["message"].get<std::string>());
  }
  return fmt::format("HTTP {}: {}", status, body.substr(0, 200));
}

class MetricsScraper {
 public:
  MetricsScraper(HttpEndpoint ep, Headers headers, double interval_s, Clock::time_point t0)
      : client_(std::move(ep)), headers_(std::move(headers)), interval_s_(interval_s), t0_(t0) {}

  void start() {
    if (interval_s_ <= 0) return;
    sample();
    thread_ = std::thread([this] {
      std::unique_lock lock(mu_);
      while (!stop_) {
        cv_.wait_for(lock, seconds(interval_s_), [this] { return stop_; });
        if (stop_) break;
        lock.unlock();
        sample();
        lock.lock();
      }
    });
  }
  PrefixCacheScrape finish() {
    if (interval_s_ <= 0) return {};
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    sample();
    PrefixCacheScrape out;
    if (!first_ || !last_) return out;
    out.available = first_->has_prefix && last_->has_prefix;
    out.queries = last_->queries - first_->queries;
    out.hits = last_->hits - first_->hits;
    out.has_token_counters = first_->has_tokens && last_->has_tokens;
    out.prompt_tokens = last_->prompt - first_->prompt;
    out.generation_tokens = last_->generation - first_->generation;
    out.samples = samples_;
    return out;
  }

 private:
  struct Sample {
    bool has_prefix = false, has_tokens = false;
    double queries = 0, hits = 0, prompt = 0, generation = 0;
  };
  void sample() {
    auto resp = client_.request("GET", "/metrics", "", headers_, Clock::now() + seconds(5));
    if (!resp || resp->status != 200) return;
    const std::string& text = resp->body;
    Sample s;
    auto q = prometheus_sum(text,
                            {"moeserve:prefix_cache_queries", "moeserve:prefix_cache_queries_total",
                             "vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total"});
    auto h = prometheus_sum(text, {"moeserve:prefix_cache_hits", "moeserve:prefix_cache_hits_total",
                                   "vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total"});
    auto p = prometheus_sum(text, {"moeserve:prompt_tokens_total", "vllm:prompt_tokens_total"});
    auto g =
        prometheus_sum(text, {"moeserve:generation_tokens_total", "vllm:generation_tokens_total"});
    s.has_prefix = q.has_value() && h.has_value();
    s.queries = q.value_or(0);
    s.hits = h.value_or(0);
    s.has_tokens = p.has_value() && g.has_value();
    s.prompt = p.value_or(0);
    s.generation = g.value_or(0);
    if (!first_) first_ = s;
    last_ = s;
    if (s.has_prefix)
      samples_.push_back(
          {std::chrono::duration<double>(Clock::now() - t0_).count(), s.queries, s.hits});
  }

  HttpClient client_;
  Headers headers_;
  double interval_s_;
  Clock::time_point t0_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
  std::optional<Sample> first_, last_;
  std::vector<std::array<double, 3>> samples_;
};

// State shared by the lanes of one DP rank.
struct RankState {
  int32_t rank = 0;
  Clock::time_point start;
  Clock::time_point deadline;
  std::atomic<int64_t> next_session{0};
  std::atomic<int64_t> reserved{0};  // measured requests handed out
  std::mutex mu;
  IdealPrefixCache cache;
  std::vector<double> arrivals;  // Poisson session arrivals (rate mode), grown on demand
  std::mt19937_64 rng;
};

class Runner {
 public:
  Runner(const ServeBenchConfig& c, HttpEndpoint ep, std::string model,
         std::vector<TraceSession> sessions)
      : c_(c), ep_(std::move(ep)), model_(std::move(model)), sessions_(std::move(sessions)) {
    if (!c_.api_key.empty()) headers_.emplace_back("Authorization", "Bearer " + c_.api_key);
    run_salt_ =
        c_.cache_bust
            ? splitmix64(c_.seed ^ static_cast<uint64_t>(Clock::now().time_since_epoch().count()))
            : splitmix64(c_.seed + 1);
  }

  std::vector<RequestRecord> run(Clock::time_point t0) {
    t0_ = t0;
    const int32_t ranks = c_.dp_replay == "none" ? 1 : std::max(1, c_.dp_size);
    const int32_t lanes = c_.request_rate > 0 ? c_.max_concurrency : c_.concurrency;
    std::vector<std::unique_ptr<RankState>> states;
    std::vector<std::thread> threads;
    for (int32_t r = 0; r < ranks; ++r) {
      auto st = std::make_unique<RankState>();
      st->rank = r;
      st->start = t0 + (c_.dp_replay == "lag" ? seconds(r * c_.lag_seconds) : Clock::duration{});
      st->deadline = st->start + seconds(c_.duration_s);
      st->rng.seed(c_.seed * 7919 + static_cast<uint64_t>(r));
      states.push_back(std::move(st));
    }
    for (auto& st : states)
      for (int32_t lane = 0; lane < lanes; ++lane)
        threads.emplace_back([this, s = st.get(), lane] { lane_loop(*s, lane); });
    for (auto& t : threads) t.join();
    std::lock_guard lock(records_mu_);
    std::sort(records_.begin(), records_.end(),
              [](const RequestRecord& a, const RequestRecord& b) { return a.start_s < b.start_s; });
    for (size_t i = 0; i < records_.size(); ++i) records_[i].index = static_cast<int64_t>(i);
    return std::move(records_);
  }

 private:
  void sleep_until_or_deadline(Clock::time_point t, Clock::time_point deadline) {
    std::this_thread::sleep_until(std::min(t, deadline));
  }

  double arrival_of(RankState& st, int64_t j) {
    std::lock_guard lock(st.mu);
    std::exponential_distribution<double> gap(c_.request_rate);
    while (static_cast<int64_t>(st.arrivals.size()) <= j)
      st.arrivals.push_back((st.arrivals.empty() ? 0.0 : st.arrivals.back()) + gap(st.rng));
    return st.arrivals[static_cast<size_t>(j)];
  }

  void lane_loop(RankState& st, int32_t lane) {
    HttpClient client(ep_);
    sleep_until_or_deadline(st.start, st.deadline);
    int32_t warmup_left = c_.warmup;
    bool first_session = true;
    std::mt19937_64 lane_rng(
        splitmix64(c_.seed ^ (static_cast<uint64_t>(st.rank) << 32) ^ static_cast<uint64_t>(lane)));
    const int64_t n = static_cast<int64_t>(sessions_.size());
    // Bounded: each iteration sends >= 1 request or stops; requests are bounded by warm-up +
    // max_requests and every wait by the deadline.
    while (Clock::now() < st.deadline && st.reserved.load() < c_.max_requests) {
      const int64_t j = st.next_session.fetch_add(1);
      if (c_.request_rate > 0) {
        const auto at = st.start + seconds(arrival_of(st, j));
        if (at >= st.deadline) return;
        sleep_until_or_deadline(at, st.deadline);
      }
      const TraceSession& session = sessions_[static_cast<size_t>(j % n)];
      const uint64_t pass = static_cast<uint64_t>(j / n);
      const uint64_t salt = splitmix64(run_salt_ ^ (pass * 0x9e3779b97f4a7c15ULL) ^
                                       (static_cast<uint64_t>(st.rank) << 48));
      size_t first_turn = 0;
      if (first_session && c_.random_lane_start) {
        const double f = std::uniform_real_distribution<double>(0.25, 0.75)(lane_rng);
        first_turn = static_cast<size_t>(f * static_cast<double>(session.turns.size()));
      }
      first_session = false;
      for (size_t t = first_turn; t < session.turns.size(); ++t) {
        const TraceRequest& req = session.turns[t];
        if (t > first_turn && req.idle_s > 0 && c_.idle_scale > 0)
          sleep_until_or_deadline(
              Clock::now() + seconds(std::min(req.idle_s * c_.idle_scale, c_.max_idle_s)),
              st.deadline);
        if (Clock::now() >= st.deadline) return;
        const bool warmup = warmup_left > 0;
        if (warmup) {
          --warmup_left;
        } else if (st.reserved.fetch_add(1) >= c_.max_requests) {
          return;
        }
        RequestRecord rec = send(client, st, lane, req, salt);
        rec.warmup = warmup;
        std::lock_guard lock(records_mu_);
        records_.push_back(std::move(rec));
      }
    }
  }

  RequestRecord send(HttpClient& client, RankState& st, int32_t lane, const TraceRequest& req,
                     uint64_t salt) {
    RequestRecord rec;
    rec.session_id = req.session_id;
    rec.turn = req.turn;
    rec.lane = lane;
    rec.dp_rank = st.rank;
    rec.target_input_len = req.input_len;
    rec.target_output_len = req.output_len;
    std::vector<uint64_t> salted;
    salted.reserve(req.hash_ids.size());
    for (uint64_t h : req.hash_ids) salted.push_back(salt_hash(h, salt));
    {
      std::lock_guard lock(st.mu);
      rec.trace_cached_tokens = st.cache.observe(salted, req.input_len);
    }
    const bool chat = c_.endpoint == "chat";
    json body{{"model", model_},
              {"max_tokens", req.output_len},
              {"stream", true},
              {"stream_options", {{"include_usage", true}}},
              {"temperature", c_.temperature}};
    if (c_.ignore_eos) {
      body["ignore_eos"] = true;
      body["min_tokens"] = req.output_len;
    }
    if (chat)
      body["messages"] = json::array({{{"role", "user"}, {"content", prompt_text(req, salt)}}});
    else
      body["prompt"] = prompt_token_ids(req, salt, c_.token_lo, c_.token_hi);
    Headers headers = headers_;
    if (c_.dp_replay != "none")
      headers.emplace_back("X-data-parallel-rank", std::to_string(st.rank));
    const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
    const std::string payload = body.dump();
    const auto start = Clock::now();
    rec.start_s = std::chrono::duration<double>(start - t0_).count();
    SseCollector sse(rec, t0_, chat);
    std::string error_body;
    bool streamed_ok = true;
    auto resp = client.request("POST", path, payload, headers,
                               start + seconds(c_.request_timeout_s), [&](std::string_view bytes) {
                                 if (streamed_ok) sse.feed(bytes);
                                 if (error_body.size() < 4096)
                                   error_body.append(bytes.substr(0, 4096));
                               });
    rec.end_s = std::chrono::duration<double>(Clock::now() - t0_).count();
    if (!resp) {
      rec.error = resp.error().message;
      return rec;
    }
    rec.http_status = resp->status;
    if (resp->status != 200) {
      rec.error = error_message(error_body, resp->status);
      return rec;
    }
    if (!sse.error().empty()) {
      rec.error = sse.error();
    } else if (!sse.done()) {
      rec.error = "stream ended without [DONE]";
    } else {
      rec.ok = true;
    }
    if (!rec.usage_from_server) {
      rec.prompt_tokens = req.input_len;
      rec.completion_tokens =
          static_cast<int64_t>(rec.itl_s.size()) + (rec.first_token_s >= 0 ? 1 : 0);
    }
    return rec;
  }

  const ServeBenchConfig& c_;
  HttpEndpoint ep_;
  std::string model_;
  std::vector<TraceSession> sessions_;
  Headers headers_;
  uint64_t run_salt_ = 0;
  Clock::time_point t0_;
  std::mutex records_mu_;
  std::vector<RequestRecord> records_;
};

}  // namespace

std::optional<double> prometheus_sum(std::string_view text, const std::vector<std::string>& names) {
  std::optional<double> sum;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    start = end + 1;
    if (line.empty() || line.front() == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string_view::npos) continue;
    const std::string_view name = line.substr(0, name_end);
    if (std::find(names.begin(), names.end(), name) == names.end()) continue;
    size_t value_start = name_end;
    if (line[name_end] == '{') {
      const size_t close = line.find('}', name_end);
      if (close == std::string_view::npos) continue;
      value_start = close + 1;
    }
    std::string value(line.substr(value_start));
    const size_t first = value.find_first_not_of(' ');
    if (first == std::string::npos) continue;
    value = value.substr(first, value.find(' ', first) - first);
    char* parse_end = nullptr;
    const double v = std::strtod(value.c_str(), &parse_end);
    if (parse_end == value.c_str()) continue;
    sum = sum.value_or(0.0) + v;
  }
  return sum;
}

Status validate(const ServeBenchConfig& c) {
  if (c.endpoint != "completions" && c.endpoint != "chat")
    return make_error(ErrorCode::kInvalidArgument, "--endpoint must be chat or completions");
  if (c.concurrency < 1)
    return make_error(ErrorCode::kInvalidArgument, "--concurrency must be >= 1");
  if (c.request_rate < 0 || c.max_concurrency < 1)
    return make_error(ErrorCode::kInvalidArgument, "bad --request-rate / --max-concurrency");
  if (c.max_requests < 1)
    return make_error(ErrorCode::kInvalidArgument, "--max-requests must be >= 1");
  if (c.duration_s <= 0) return make_error(ErrorCode::kInvalidArgument, "--duration must be > 0");
  if (c.isl < 1 || c.osl < 1)
    return make_error(ErrorCode::kInvalidArgument, "ISL/OSL must be >= 1");
  if (c.token_lo < 0 || c.token_hi <= c.token_lo)
    return make_error(ErrorCode::kInvalidArgument, "bad --token-range");
  if (c.dp_replay != "none" && c.dp_replay != "mirror" && c.dp_replay != "lag")
    return make_error(ErrorCode::kInvalidArgument, "--dp-replay must be none, mirror or lag");
  if (c.dp_size < 1 || c.num_gpus < 1)
    return make_error(ErrorCode::kInvalidArgument, "--dp-size and --num-gpus must be >= 1");
  return ok_status();
}

json to_json(const ServeBenchConfig& c) {
  return json{{"base_url", c.base_url},
              {"model", c.model},
              {"endpoint", c.endpoint},
              {"workload", c.trace.empty() ? "random" : "trace"},
              {"trace", c.trace},
              {"isl", c.isl},
              {"osl", c.osl},
              {"concurrency", c.concurrency},
              {"request_rate", c.request_rate},
              {"max_concurrency", c.max_concurrency},
              {"warmup", c.warmup},
              {"random_lane_start", c.random_lane_start},
              {"duration_s", c.duration_s},
              {"max_requests", c.max_requests},
              {"request_timeout_s", c.request_timeout_s},
              {"max_idle_s", c.max_idle_s},
              {"idle_scale", c.idle_scale},
              {"ignore_eos", c.ignore_eos},
              {"temperature", c.temperature},
              {"token_range", {c.token_lo, c.token_hi}},
              {"seed", c.seed},
              {"cache_bust", c.cache_bust},
              {"num_gpus", c.num_gpus},
              {"gpu_hour_price", c.gpu_hour_price},
              {"metrics_interval_s", c.metrics_interval_s},
              {"dp_replay", c.dp_replay},
              {"dp_size", c.dp_size},
              {"lag_seconds", c.lag_seconds},
              {"max_error_rate", c.max_error_rate}};
}

Result<ServeBenchOutput> run_serve_bench(const ServeBenchConfig& c) {
  MS_RETURN_IF_ERROR(validate(c));
  MS_ASSIGN_OR_RETURN(HttpEndpoint ep, parse_base_url(c.base_url));
  Headers auth;
  if (!c.api_key.empty()) auth.emplace_back("Authorization", "Bearer " + c.api_key);

  // Server info and the model id.
  json server_info = json::object();
  std::string model = c.model;
  {
    HttpClient client(ep);
    auto resp = client.request("GET", "/v1/models", "", auth, Clock::now() + seconds(30));
    if (!resp) return make_error(ErrorCode::kIo, "GET /v1/models: {}", resp.error().message);
    if (resp->status != 200)
      return make_error(ErrorCode::kIo, "GET /v1/models: {}",
                        error_message(resp->body, resp->status));
    json models = json::parse(resp->body, nullptr, false);
    if (!models.is_discarded()) server_info["models"] = models;
    if (model.empty() && !models.is_discarded() && models.contains("data") &&
        models["data"].is_array() && !models["data"].empty())
      model = models["data"][0].value("id", "");
    if (model.empty()) return make_error(ErrorCode::kInvalidArgument, "no --model and none served");
  }
  server_info["model"] = model;

  std::vector<TraceRequest> requests;
  if (!c.trace.empty()) {
    MS_ASSIGN_OR_RETURN(requests, read_trace_jsonl(c.trace));
  } else {
    const int64_t lanes = c.request_rate > 0 ? c.max_concurrency : c.concurrency;
    const int64_t n = std::min<int64_t>(c.max_requests + lanes * c.warmup, 1'000'000);
    requests = make_random_workload(static_cast<int32_t>(n), c.isl, c.osl, c.seed);
  }
  auto sessions = group_sessions(requests);
  const TraceCacheStats trace_stats = ideal_cache_stats(requests);

  const auto t0 = Clock::now();
  MetricsScraper scraper(ep, auth, c.metrics_interval_s, t0);
  scraper.start();
  Runner runner(c, ep, model, std::move(sessions));
  ServeBenchOutput out;
  out.records = runner.run(t0);
  out.scrape = scraper.finish();

  out.summary = summarize_records(out.records, {c.num_gpus, c.gpu_hour_price});
  out.failed = out.summary.num_ok == 0 || out.summary.error_rate > c.max_error_rate;

  BenchResult& r = out.result;
  r.benchmark = "serve";
  r.config = to_json(c);
  r.config["model"] = model;
  r.results = to_json(out.summary);
  r.results["failed"] = out.failed;
  r.results["trace_file_ideal_hit_ratio"] = trace_stats.hit_ratio();
  r.results["trace_cached_ratio"] =
      out.summary.input_tokens > 0
          ? static_cast<double>(out.summary.trace_cached_tokens) / out.summary.input_tokens
          : 0.0;
  json pc{{"available", out.scrape.available}};
  if (out.scrape.available) {
    pc["queries"] = out.scrape.queries;
    pc["hits"] = out.scrape.hits;
    pc["hit_ratio"] = out.scrape.hit_ratio();
    pc["samples"] = out.scrape.samples;
  }
  r.results["prefix_cache"] = pc;
  if (out.scrape.has_token_counters)
    r.results["server_counters"] = {{"prompt_tokens", out.scrape.prompt_tokens},
                                    {"generation_tokens", out.scrape.generation_tokens}};
  if (c.dp_replay != "none") {
    json per_rank = json::array();
    for (int32_t rank = 0; rank < c.dp_size; ++rank) {
      std::vector<RequestRecord> mine;
      for (const auto& rec : out.records)
        if (rec.dp_rank == rank) mine.push_back(rec);
      per_rank.push_back(to_json(summarize_records(mine, {1, c.gpu_hour_price})));
    }
    r.results["per_dp_rank"] = per_rank;
  }
  std::map<std::string, int64_t> errors;
  for (const auto& rec : out.records)
    if (!rec.ok && !rec.warmup) ++errors[rec.error.substr(0, 120)];
  r.results["errors"] = errors;
  r.roofline_note = "serving benchmark: end-to-end over HTTP; no roofline";

  out.json = r.to_json();
  out.json["server"] = server_info;
  if (c.save_requests) {
    json recs = json::array();
    for (const auto& rec : out.records) recs.push_back(to_json(rec));
    out.json["requests"] = std::move(recs);
  }
  return out;
}

std::string format_summary_table(const ServeBenchOutput& o) {
  const ServeSummary& s = o.summary;
  std::string t;
  auto row = [&](std::string_view k, const std::string& v) {
    t += fmt::format("{:<40} {:>16}\n", k, v);
  };
  auto pct = [&](std::string_view name, const Percentiles& p) {
    t += fmt::format("{:<16} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f}\n", name, p.mean * 1e3,
                     p.p50 * 1e3, p.p90 * 1e3, p.p99 * 1e3);
  };
  t += "============ Serving benchmark ============\n";
  row("Requests (measured / ok / errors)",
      fmt::format("{}/{}/{}", s.num_requests, s.num_ok, s.num_errors));
  row("Error rate", fmt::format("{:.2f}%{}", s.error_rate * 100, o.failed ? " FAIL" : ""));
  row("Duration (s)", fmt::format("{:.2f}", s.duration_s));
  row("Input tokens (cached by server / trace)",
      fmt::format("{} ({}/{})", s.input_tokens, s.cached_tokens, s.trace_cached_tokens));
  row("Output tokens", fmt::format("{}", s.output_tokens));
  row("Request throughput (req/s)", fmt::format("{:.3f}", s.request_throughput));
  row("Output throughput (tok/s)", fmt::format("{:.1f}", s.output_throughput));
  row("Total throughput (tok/s)", fmt::format("{:.1f}", s.total_throughput));
  row("Total tok/s per GPU", fmt::format("{:.1f}", s.total_tok_s_per_gpu));
  row("Interactivity P90 (tok/s/user, E2E)", fmt::format("{:.2f}", s.interactivity_p90));
  row("Decode tok/s per user (1/P50 TPOT)", fmt::format("{:.2f}", s.decode_tok_s_per_user_p50));
  if (o.scrape.available)
    row("Prefix-cache hit ratio (server)", fmt::format("{:.3f}", o.scrape.hit_ratio()));
  if (s.cost_per_1m_total > 0) {
    row("$ per 1M total tokens", fmt::format("{:.5f}", s.cost_per_1m_total));
    row("$ per 1M input / output tokens",
        fmt::format("{:.4f}/{:.4f}", s.cost_per_1m_input, s.cost_per_1m_output));
  }
  t += fmt::format("{:<16} {:>10} {:>10} {:>10} {:>10}\n", "latency (ms)", "mean", "P50", "P90",
                   "P99");
  pct("TTFT", s.ttft);
  pct("TPOT", s.tpot);
  pct("ITL", s.itl);
  pct("E2E", s.e2e);
  pct("E2E/OSL", s.e2e_per_output_token);
  return t;
}

}  // namespace moeserve::bench
