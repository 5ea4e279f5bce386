#include "server/openai_api.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "server/http_codec.h"

namespace moeserve::server {

using nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::string_view kJson = "application/json";

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

uint64_t process_salt() {
  static const uint64_t salt = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }();
  return salt;
}

// OpenAI's finish_reason: null while running, else the engine's name.
const char* finish_name(FinishReason r) {
  return r == FinishReason::kNone ? nullptr : sched::finish_reason_name(r);
}

ApiError context_error(int32_t max_model_len, int64_t prompt_len, int64_t max_tokens,
                       const char* prompt_param) {
  if (prompt_len >= max_model_len) {
    return bad_request(fmt::format("This model's maximum context length is {} tokens. However, "
                                   "your prompt has {} tokens. Please reduce the length of the "
                                   "{}.",
                                   max_model_len, prompt_len, prompt_param),
                       prompt_param, "context_length_exceeded");
  }
  return bad_request(fmt::format("This model's maximum context length is {} tokens. However, you "
                                 "requested {} tokens ({} in the {}, {} for the completion). "
                                 "Please reduce the length of the {} or of max_tokens.",
                                 max_model_len, prompt_len + max_tokens, prompt_len, prompt_param,
                                 max_tokens, prompt_param),
                     "max_tokens", "context_length_exceeded");
}

json bytes_array(const std::string& s) {
  json arr = json::array();
  for (unsigned char ch : s) arr.push_back(static_cast<int>(ch));
  return arr;
}

struct LogprobEntry {
  std::string token;
  float logprob = 0.0f;
  std::vector<std::pair<std::string, float>> top;
};

}  // namespace

// One generation request (all of its choices). Lives on its channel's executor.
class GenerationJob final : public std::enable_shared_from_this<GenerationJob> {
 public:
  enum class Kind { kCompletion, kChat };

  struct Choice {
    std::string engine_id;
    int32_t index = 0;
    int32_t num_prompt_tokens = 0;
    std::vector<int32_t> prompt_ids;
    std::string echo_text;
    std::unique_ptr<IncrementalDetokenizer> detok;
    std::unique_ptr<OutputParser> parser;
    std::string held;
    bool submitted = false;
    bool started = false;
    bool finished = false;
    bool engine_done = false;
    FinishReason finish = FinishReason::kNone;
    std::string error_message;
    int32_t completion_tokens = 0;
    int32_t num_cached_tokens = 0;
    bool first_token_seen = false;
    Clock::time_point last_token_time;
    // Non-streaming accumulation.
    std::string text;
    std::string reasoning;
    std::vector<ToolCall> tool_calls;
    bool any_tool_call = false;
    std::vector<LogprobEntry> logprobs;
    // tool_choice required / named: the prompt forced the turn to open a tool call.
    bool forced_tool = false;
    std::string forced_tool_name;   // empty: the model writes the function name
    bool forced_parsed = false;     // the output parser produced a call
    std::string raw_output;         // the model's continuation (for the fallback call)
    std::string forced_content;     // parser content, held until the end
    size_t stream_text_offset = 0;  // completions logprobs text_offset of the next streamed token
  };

  GenerationJob(OpenAiApi& api, std::shared_ptr<ResponseChannel> channel, Kind kind,
                CommonParams common, uint64_t key)
      : api_(api),
        channel_(std::move(channel)),
        kind_(kind),
        common_(std::move(common)),
        key_(key),
        arrival_(Clock::now()),
        created_(unix_now()) {
    id_ = fmt::format("{}-{:016x}{:08x}", kind == Kind::kChat ? "chatcmpl" : "cmpl", process_salt(),
                      key);
    for (const auto& s : common_.stop) max_stop_len_ = std::max(max_stop_len_, s.size());
  }

  void set_completion_options(bool echo, int32_t logprobs) {
    echo_ = echo;
    completion_logprobs_ = logprobs;
  }
  void set_chat_options(bool logprobs, bool parallel_tool_calls) {
    chat_logprobs_ = logprobs;
    parallel_tool_calls_ = parallel_tool_calls;
  }
  void set_total_prompt_tokens(int64_t n) { total_prompt_tokens_ = n; }
  std::vector<Choice>& choices() { return choices_; }
  const std::string& id() const { return id_; }

  // Submits every choice and starts the response; on failure sends the error and returns false.
  bool start() {
    GenerationService& service = api_.service();
    for (auto& c : choices_) {
      if (c.finished) continue;  // max_tokens = 0 (echo only)
      GenerationRequest req;
      req.request_id = c.engine_id;
      req.prompt_token_ids = c.prompt_ids;
      req.sampling = common_.sampling;
      if (req.sampling.seed && c.index > 0) *req.sampling.seed += static_cast<uint64_t>(c.index);
      std::weak_ptr<ResponseChannel> weak_channel = channel_;
      auto self = shared_from_this();
      const size_t idx = static_cast<size_t>(&c - choices_.data());
      Status st = service.submit(std::move(req), [self, idx](GenerationOutput&& out) {
        auto ch = self->channel_;
        ch->post([self, idx, out = std::move(out)]() mutable { self->on_output(idx, out); });
      });
      if (!st) {
        for (auto& d : choices_) {
          if (d.submitted) service.abort(d.engine_id);
          d.finished = true;
        }
        const bool overloaded = st.error().code == ErrorCode::kResourceExhausted;
        ApiError err{overloaded ? 503 : 500, st.error().message,
                     overloaded ? "service_unavailable" : "internal_error", "",
                     overloaded ? "server_overloaded" : "internal_error"};
        api_.metrics().record_http_status(err.status);
        channel_->respond(err.status, kJson, err.to_json());
        return false;
      }
      c.submitted = true;
      api_.metrics().record_prompt_tokens(c.num_prompt_tokens);
    }
    std::weak_ptr<GenerationJob> weak = weak_from_this();
    channel_->set_on_close([weak] {
      if (auto job = weak.lock()) job->on_client_gone();
    });
    if (common_.stream) {
      api_.metrics().stream_started();
      stream_open_ = true;
      channel_->start_stream();
      api_.metrics().record_http_status(200);
      std::string out;
      for (auto& c : choices_) {
        if (kind_ == Kind::kCompletion && echo_ && !c.echo_text.empty()) {
          json lp;
          if (completion_logprobs_ >= 0) lp = prompt_logprobs_json(c);
          c.stream_text_offset = c.echo_text.size();
          append_sse_event(dump(completion_chunk(
                               c, c.echo_text, completion_logprobs_ >= 0 ? &lp : nullptr, nullptr)),
                           out);
        }
      }
      for (auto& c : choices_) {
        if (c.finished) emit_final(c, out);
      }
      if (!out.empty()) channel_->write(out);
    }
    maybe_complete();
    return true;
  }

  void post_abort() {
    auto self = shared_from_this();
    channel_->post([self] { self->abort_all(); });
  }

  void abort_all() {
    for (auto& c : choices_) {
      if (!c.finished) {
        c.finished = true;
        c.finish = FinishReason::kAbort;
        record_choice_finished(c);
        if (c.submitted && !c.engine_done) api_.service().abort(c.engine_id);
      }
    }
    maybe_complete();
  }

 private:
  void on_client_gone() {
    if (completed_) return;
    api_.metrics().client_disconnected();
    MS_LOG_DEBUG("server: client went away, aborting {}", id_);
    client_gone_ = true;
    abort_all();
  }

  void on_output(size_t idx, GenerationOutput& out) {
    Choice& c = choices_[idx];
    if (c.engine_done) return;
    const size_t n = out.token_ids.size();
    ServerMetrics& metrics = api_.metrics();
    if (n > 0) {
      const auto now = Clock::now();
      metrics.record_generation_tokens(static_cast<int64_t>(n));
      if (!c.first_token_seen) {
        c.first_token_seen = true;
        metrics.record_ttft(std::chrono::duration<double>(now - arrival_).count());
      } else {
        const double gap =
            std::chrono::duration<double>(now - c.last_token_time).count() / static_cast<double>(n);
        for (size_t k = 0; k < n; ++k) metrics.record_itl(gap);
      }
      c.last_token_time = now;
    }
    if (out.finish_reason != FinishReason::kNone) {
      c.engine_done = true;
      c.num_cached_tokens = out.num_cached_tokens;
    }
    if (c.finished) {  // stopped by a stop string or aborted; this is the engine's last word
      return;
    }
    c.completion_tokens += static_cast<int32_t>(n);
    const bool want_logprobs = (kind_ == Kind::kCompletion && completion_logprobs_ >= 0) ||
                               (kind_ == Kind::kChat && chat_logprobs_);
    std::vector<LogprobEntry> lps;
    std::string text;
    GenerationService& service = api_.service();
    for (size_t k = 0; k < n; ++k) {
      const int32_t tok = out.token_ids[k];
      const bool is_stop_token = out.finish_reason == FinishReason::kStop && k + 1 == n &&
                                 out.stop_token_id && *out.stop_token_id == tok;
      if (!(is_stop_token && !common_.include_stop_str_in_output)) text += c.detok->push(tok);
      if (want_logprobs && k < out.logprobs.size()) {
        LogprobEntry e;
        const int32_t one[1] = {tok};
        e.token = service.detokenize(one, false);
        e.logprob = out.logprobs[k].logprob;
        for (const auto& t : out.logprobs[k].top) {
          const int32_t alt[1] = {t.token_id};
          e.top.emplace_back(service.detokenize(alt, false), t.logprob);
        }
        lps.push_back(std::move(e));
      }
    }
    if (c.engine_done) text += c.detok->finish();
    bool stopped = false;
    std::string emit = apply_stop(c, std::move(text), c.engine_done, stopped);
    if (stopped) {
      c.finished = true;
      c.finish = FinishReason::kStop;
      if (!c.engine_done) service.abort(c.engine_id);
    } else if (c.engine_done) {
      c.finished = true;
      c.finish = out.finish_reason;
      c.error_message = out.error_message;
    }
    deliver(c, emit, std::move(lps));
    if (c.finished) record_choice_finished(c);
    maybe_complete();
  }

  // Holds back text that could be the start of a stop string; returns what is safe to emit.
  std::string apply_stop(Choice& c, std::string text, bool final, bool& stopped) {
    c.held += text;
    if (common_.stop.empty()) return std::exchange(c.held, {});
    size_t best = std::string::npos;
    const std::string* best_stop = nullptr;
    for (const auto& s : common_.stop) {
      const size_t pos = c.held.find(s);
      if (pos != std::string::npos && pos < best) {
        best = pos;
        best_stop = &s;
      }
    }
    if (best_stop) {
      stopped = true;
      std::string out = c.held.substr(0, best);
      if (common_.include_stop_str_in_output) out += *best_stop;
      c.held.clear();
      return out;
    }
    if (final) return std::exchange(c.held, {});
    const size_t keep = max_stop_len_ - 1;
    if (c.held.size() <= keep) return {};
    size_t cut = c.held.size() - keep;
    cut = utf8_complete_prefix(std::string_view(c.held).substr(0, cut));
    std::string out = c.held.substr(0, cut);
    c.held.erase(0, cut);
    return out;
  }

  const char* finish_reason_for(const Choice& c) const {
    if (kind_ == Kind::kChat && c.any_tool_call && c.finish == FinishReason::kStop) {
      return "tool_calls";
    }
    return finish_name(c.finish);
  }

  json completion_logprobs_json(const std::vector<LogprobEntry>& lps, size_t& offset) const {
    json tokens = json::array(), token_lps = json::array(), tops = json::array(),
         offsets = json::array();
    for (const auto& e : lps) {
      tokens.push_back(e.token);
      token_lps.push_back(e.logprob);
      json top = json::object();
      for (const auto& [t, lp] : e.top) top[t] = lp;
      tops.push_back(std::move(top));
      offsets.push_back(offset);
      offset += e.token.size();
    }
    return {{"tokens", std::move(tokens)},
            {"token_logprobs", std::move(token_lps)},
            {"top_logprobs", std::move(tops)},
            {"text_offset", std::move(offsets)}};
  }

  // echo + logprobs: the prompt's tokens lead the logprobs with `null` logprobs and top_logprobs
  // (the engine computes no prompt logprobs; OpenAI's first prompt token is `null` too).
  json prompt_logprobs_json(const Choice& c) const {
    json tokens = json::array(), token_lps = json::array(), tops = json::array(),
         offsets = json::array();
    size_t offset = 0;
    for (int32_t id : c.prompt_ids) {
      const int32_t one[1] = {id};
      std::string t = api_.service().detokenize(one, false);
      offsets.push_back(offset);
      // Offsets run over the echoed text: a token it does not contain (BOS) takes no width.
      if (c.echo_text.compare(offset, t.size(), t) == 0) offset += t.size();
      tokens.push_back(std::move(t));
      token_lps.push_back(nullptr);
      tops.push_back(nullptr);
    }
    return {{"tokens", std::move(tokens)},
            {"token_logprobs", std::move(token_lps)},
            {"top_logprobs", std::move(tops)},
            {"text_offset", std::move(offsets)}};
  }

  static void append_logprobs(json& into, const json& more) {
    for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
      for (const auto& v : more[key]) into[key].push_back(v);
    }
  }

  static json chat_logprobs_json(const std::vector<LogprobEntry>& lps) {
    json content = json::array();
    for (const auto& e : lps) {
      json top = json::array();
      for (const auto& [t, lp] : e.top) {
        top.push_back({{"token", t}, {"logprob", lp}, {"bytes", bytes_array(t)}});
      }
      content.push_back({{"token", e.token},
                         {"logprob", e.logprob},
                         {"bytes", bytes_array(e.token)},
                         {"top_logprobs", std::move(top)}});
    }
    return {{"content", std::move(content)}, {"refusal", nullptr}};
  }

  json chunk_base(const char* object) const {
    json j = {{"id", id_}, {"object", object}, {"created", created_}, {"model", model_name()}};
    return j;
  }

  const std::string& model_name() const { return api_.options().served_model_name; }

  json usage_json() const {
    int64_t completion = 0;
    int64_t cached = 0;
    for (const auto& c : choices_) {
      completion += c.completion_tokens;
      cached = std::max<int64_t>(cached, c.num_cached_tokens);
    }
    json u = {{"prompt_tokens", total_prompt_tokens_},
              {"completion_tokens", completion},
              {"total_tokens", total_prompt_tokens_ + completion}};
    if (cached > 0) u["prompt_tokens_details"] = {{"cached_tokens", cached}};
    return u;
  }

  json completion_chunk(const Choice& c, const std::string& text, const json* logprobs,
                        const char* finish) const {
    json j = chunk_base("text_completion");
    j["choices"] = json::array({{{"index", c.index},
                                 {"text", text},
                                 {"logprobs", logprobs ? *logprobs : json(nullptr)},
                                 {"finish_reason", finish ? json(finish) : json(nullptr)}}});
    if (common_.include_usage) j["usage"] = nullptr;
    return j;
  }

  json chat_chunk(const Choice& c, json delta, const json* logprobs, const char* finish) const {
    json j = chunk_base("chat.completion.chunk");
    json choice = {{"index", c.index},
                   {"delta", std::move(delta)},
                   {"logprobs", logprobs ? *logprobs : json(nullptr)},
                   {"finish_reason", finish ? json(finish) : json(nullptr)}};
    j["choices"] = json::array({std::move(choice)});
    if (common_.include_usage) j["usage"] = nullptr;
    return j;
  }

  void add_usage_if_continuous(json& chunk) const {
    if (common_.include_usage && common_.continuous_usage_stats) chunk["usage"] = usage_json();
  }

  // Applies tool-call policy to a parsed delta and records tool calls.
  void filter_tool_calls(Choice& c, ParsedDelta& d) {
    if (!parallel_tool_calls_) {
      std::erase_if(d.tool_calls, [](const ToolCallDelta& t) { return t.index > 0; });
    }
    for (auto& t : d.tool_calls) {
      if (t.index == static_cast<int32_t>(c.tool_calls.size())) {
        c.tool_calls.push_back(ToolCall{
            t.id.empty()
                ? fmt::format("call_{:016x}{:04x}{:02x}", process_salt() ^ key_, c.index, t.index)
                : t.id,
            t.name, ""});
        t.id = c.tool_calls.back().id;
      }
      if (t.index >= 0 && t.index < static_cast<int32_t>(c.tool_calls.size())) {
        c.tool_calls[static_cast<size_t>(t.index)].arguments += t.arguments;
      }
      c.any_tool_call = true;
    }
  }

  // tool_choice required / named. Calls the parser completes stream as usual and text outside
  // them is held to the end. When the continuation never forms a well-formed DSML invoke, the
  // answer is still one call (as vLLM answers a named tool_choice with the raw generated text as
  // its arguments): the forced function (or the name the model wrote up to its closing quote)
  // with the model's raw continuation as `arguments`, which is then not necessarily JSON.
  void apply_forced_tool_choice(Choice& c, const std::string& text, ParsedDelta& d) {
    c.raw_output += text;
    c.forced_content += d.content;
    d.content.clear();
    if (!d.tool_calls.empty()) c.forced_parsed = true;
    if (!c.finished) return;
    if (c.forced_parsed || c.any_tool_call) {
      const bool blank = std::all_of(c.forced_content.begin(), c.forced_content.end(),
                                     [](unsigned char ch) { return std::isspace(ch) != 0; });
      if (!blank) d.content = std::move(c.forced_content);
      return;
    }
    if (c.finish != FinishReason::kStop && c.finish != FinishReason::kLength) return;
    ToolCallDelta call;
    call.index = 0;
    if (!c.forced_tool_name.empty()) {
      call.name = c.forced_tool_name;
      call.arguments = c.raw_output;
    } else {
      // The prompt ended inside `invoke name="`: the name runs to the closing quote.
      const size_t quote = c.raw_output.find('"');
      call.name = c.raw_output.substr(0, quote);
      if (quote != std::string::npos) {
        size_t rest = quote + 1;
        if (rest < c.raw_output.size() && c.raw_output[rest] == '>') ++rest;
        if (rest < c.raw_output.size() && c.raw_output[rest] == '\n') ++rest;
        call.arguments = c.raw_output.substr(rest);
      }
    }
    d.tool_calls.push_back(std::move(call));
  }

  void deliver(Choice& c, const std::string& text, std::vector<LogprobEntry> lps) {
    const char* finish = c.finished ? finish_reason_for(c) : nullptr;
    if (kind_ == Kind::kCompletion) {
      if (!common_.stream) {
        c.text += text;
        for (auto& e : lps) c.logprobs.push_back(std::move(e));
        return;
      }
      std::string out;
      json lp;
      if (completion_logprobs_ >= 0) lp = completion_logprobs_json(lps, c.stream_text_offset);
      if (!text.empty() || !lps.empty() || finish) {
        json chunk = completion_chunk(c, text, completion_logprobs_ >= 0 ? &lp : nullptr,
                                      finish_reason_for(c) && c.finished ? finish : nullptr);
        add_usage_if_continuous(chunk);
        append_sse_event(dump(chunk), out);
      }
      if (c.finished && !c.error_message.empty()) append_error_event(c, out);
      write(out);
      return;
    }
    // Chat: split the text into reasoning / content / tool calls.
    ParsedDelta d = c.parser->push(text);
    if (c.finished) {
      ParsedDelta tail = c.parser->finish();
      d.reasoning += tail.reasoning;
      d.content += tail.content;
      for (auto& t : tail.tool_calls) d.tool_calls.push_back(std::move(t));
    }
    if (c.forced_tool) apply_forced_tool_choice(c, text, d);
    filter_tool_calls(c, d);
    finish = c.finished ? finish_reason_for(c) : nullptr;
    if (!common_.stream) {
      c.reasoning += d.reasoning;
      c.text += d.content;
      for (auto& e : lps) c.logprobs.push_back(std::move(e));
      return;
    }
    std::string out;
    if (!c.started) {
      c.started = true;
      append_sse_event(
          dump(chat_chunk(c, {{"role", "assistant"}, {"content", ""}}, nullptr, nullptr)), out);
    }
    json delta = json::object();
    if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
    if (!d.content.empty()) delta["content"] = d.content;
    if (!d.tool_calls.empty()) {
      json calls = json::array();
      for (const auto& t : d.tool_calls) {
        json call = {{"index", t.index}};
        json fn = json::object();
        if (!t.id.empty()) {
          call["id"] = t.id;
          call["type"] = "function";
          fn["name"] = t.name;
        }
        fn["arguments"] = t.arguments;
        call["function"] = std::move(fn);
        calls.push_back(std::move(call));
      }
      delta["tool_calls"] = std::move(calls);
    }
    json lp;
    if (chat_logprobs_) lp = chat_logprobs_json(lps);
    if (!delta.empty() || !lps.empty() || finish) {
      json chunk =
          chat_chunk(c, std::move(delta), chat_logprobs_ && !lps.empty() ? &lp : nullptr, finish);
      add_usage_if_continuous(chunk);
      append_sse_event(dump(chunk), out);
    }
    if (c.finished && !c.error_message.empty()) append_error_event(c, out);
    write(out);
  }

  void append_error_event(const Choice& c, std::string& out) const {
    ApiError e{500, c.error_message, "internal_error", "", "generation_failed"};
    out += "data: ";
    out += e.to_json();
    out += "\n\n";
  }

  // The closing chunk of a choice that finished without any engine output (max_tokens = 0).
  void emit_final(Choice& c, std::string& out) {
    if (kind_ == Kind::kCompletion) {
      append_sse_event(dump(completion_chunk(c, "", nullptr, finish_reason_for(c))), out);
    }
  }

  void write(const std::string& out) {
    if (out.empty() || !stream_open_ || channel_->closed()) return;
    channel_->write(out);
    if (channel_->pending_bytes() > api_.options().max_pending_stream_bytes && !completed_) {
      MS_LOG_WARN("server: client of {} is too slow ({} bytes queued), aborting", id_,
                  channel_->pending_bytes());
      abort_all();
    }
  }

  void record_choice_finished(const Choice& c) {
    if (!c.submitted) return;
    api_.metrics().record_finished(c.finish, seconds_since(arrival_), c.num_prompt_tokens,
                                   c.completion_tokens);
  }

  void maybe_complete() {
    if (completed_) return;
    for (const auto& c : choices_) {
      if (!c.finished) return;
    }
    completed_ = true;
    if (!client_gone_) {
      if (common_.stream) {
        std::string out;
        if (common_.include_usage) {
          json j = chunk_base(kind_ == Kind::kChat ? "chat.completion.chunk" : "text_completion");
          j["choices"] = json::array();
          j["usage"] = usage_json();
          append_sse_event(dump(j), out);
        }
        out += kSseDone;
        if (!channel_->closed()) {
          channel_->write(out);
          channel_->end_stream();
        }
      } else {
        respond_full();
      }
    }
    if (stream_open_) api_.metrics().stream_ended();
    api_.job_finished(key_);
  }

  void respond_full() {
    for (const auto& c : choices_) {
      if (c.finish == FinishReason::kError) {
        ApiError e{500, c.error_message.empty() ? "generation failed" : c.error_message,
                   "internal_error", "", "generation_failed"};
        api_.metrics().record_http_status(500);
        channel_->respond(500, kJson, e.to_json());
        return;
      }
    }
    json choices = json::array();
    if (kind_ == Kind::kCompletion) {
      for (auto& c : choices_) {
        json lp = nullptr;
        if (completion_logprobs_ >= 0) {
          size_t offset = 0;
          if (echo_) {
            lp = prompt_logprobs_json(c);
            offset = c.echo_text.size();
            append_logprobs(lp, completion_logprobs_json(c.logprobs, offset));
          } else {
            lp = completion_logprobs_json(c.logprobs, offset);
          }
        }
        choices.push_back({{"index", c.index},
                           {"text", c.echo_text + c.text},
                           {"logprobs", std::move(lp)},
                           {"finish_reason", finish_name(c.finish)}});
      }
    } else {
      for (auto& c : choices_) {
        json msg = {{"role", "assistant"},
                    {"content", c.text.empty() && c.any_tool_call ? json(nullptr) : json(c.text)}};
        if (!c.reasoning.empty()) msg["reasoning_content"] = c.reasoning;
        if (c.any_tool_call) {
          json calls = json::array();
          for (const auto& t : c.tool_calls) {
            calls.push_back({{"id", t.id},
                             {"type", "function"},
                             {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
          }
          msg["tool_calls"] = std::move(calls);
        }
        choices.push_back(
            {{"index", c.index},
             {"message", std::move(msg)},
             {"logprobs", chat_logprobs_ ? chat_logprobs_json(c.logprobs) : json(nullptr)},
             {"finish_reason", finish_reason_for(c)}});
      }
    }
    json j = {{"id", id_},
              {"object", kind_ == Kind::kChat ? "chat.completion" : "text_completion"},
              {"created", created_},
              {"model", model_name()},
              {"choices", std::move(choices)},
              {"usage", usage_json()}};
    api_.metrics().record_http_status(200);
    channel_->respond(200, kJson, dump(j));
  }

  OpenAiApi& api_;
  std::shared_ptr<ResponseChannel> channel_;
  Kind kind_;
  CommonParams common_;
  uint64_t key_;
  Clock::time_point arrival_;
  int64_t created_;
  std::string id_;
  size_t max_stop_len_ = 0;
  bool echo_ = false;
  int32_t completion_logprobs_ = -1;
  bool chat_logprobs_ = false;
  bool parallel_tool_calls_ = true;
  int64_t total_prompt_tokens_ = 0;
  std::vector<Choice> choices_;
  bool stream_open_ = false;
  bool completed_ = false;
  bool client_gone_ = false;
};

OpenAiApi::OpenAiApi(GenerationService& service, ApiOptions options, ServerMetrics& metrics)
    : service_(service), options_(std::move(options)), metrics_(metrics) {
  model_ = service_.model_info();
  if (options_.served_model_name.empty()) options_.served_model_name = model_.id;
  if (options_.max_model_len <= 0 || options_.max_model_len > model_.max_model_len) {
    options_.max_model_len = model_.max_model_len;
  }
}

OpenAiApi::~OpenAiApi() = default;

void OpenAiApi::job_started(uint64_t key, const std::shared_ptr<GenerationJob>& job) {
  active_.fetch_add(1, std::memory_order_acq_rel);
  std::lock_guard<std::mutex> lock(jobs_mu_);
  jobs_[key] = job;
}

void OpenAiApi::job_finished(uint64_t key) {
  {
    std::lock_guard<std::mutex> lock(jobs_mu_);
    jobs_.erase(key);
  }
  active_.fetch_sub(1, std::memory_order_acq_rel);
}

void OpenAiApi::abort_all() {
  std::vector<std::shared_ptr<GenerationJob>> jobs;
  {
    std::lock_guard<std::mutex> lock(jobs_mu_);
    for (auto& [key, weak] : jobs_) {
      if (auto job = weak.lock()) jobs.push_back(std::move(job));
    }
  }
  // NOTE: each job's state belongs to its channel's executor, so the abort runs there.
  for (auto& job : jobs) job->post_abort();
}

void OpenAiApi::send_json(ResponseChannel& ch, int status, std::string body) {
  metrics_.record_http_status(status);
  ch.respond(status, kJson, std::move(body));
}

void OpenAiApi::send_error(ResponseChannel& ch, const ApiError& error) {
  send_json(ch, error.status, error.to_json());
}

bool OpenAiApi::check_model(const std::optional<std::string>& model, ResponseChannel& ch) {
  if (!model || *model == options_.served_model_name) return true;
  send_error(ch, ApiError{404,
                          fmt::format("The model '{}' does not exist; this server serves '{}'.",
                                      *model, options_.served_model_name),
                          "not_found_error", "model", "model_not_found"});
  return false;
}

void OpenAiApi::handle(HttpRequest request, const std::shared_ptr<ResponseChannel>& channel) {
  ResponseChannel& ch = *channel;
  std::string path = request.target.substr(0, request.target.find('?'));
  const bool is_get = request.method == "GET" || request.method == "HEAD";
  const bool is_post = request.method == "POST";
  if (path.rfind("/v1/", 0) == 0 && !options_.api_key.empty()) {
    const std::string expected = "Bearer " + options_.api_key;
    bool ok = request.authorization.size() == expected.size();
    unsigned diff = 0;
    for (size_t i = 0; ok && i < expected.size(); ++i) {
      diff |= static_cast<unsigned>(request.authorization[i] ^ expected[i]);
    }
    if (!ok || diff != 0) {
      send_error(ch, ApiError{401,
                              request.authorization.empty()
                                  ? "Missing API key: send 'Authorization: Bearer <key>'."
                                  : "Incorrect API key provided.",
                              "authentication_error", "", "invalid_api_key"});
      return;
    }
  }
  auto method_not_allowed = [&](const char* allowed) {
    send_error(ch, ApiError{405,
                            fmt::format("Method {} not allowed on {} (use {}).", request.method,
                                        path, allowed),
                            "invalid_request_error", "", "method_not_allowed"});
  };
  if (path == "/health") {
    if (!is_get) return method_not_allowed("GET");
    if (draining_.load(std::memory_order_acquire) || !service_.healthy()) {
      return send_json(ch, 503, R"({"status":"unavailable"})");
    }
    return send_json(ch, 200, R"({"status":"ok"})");
  }
  if (path == "/metrics") {
    if (!is_get) return method_not_allowed("GET");
    return handle_metrics(ch);
  }
  if (path == "/v1/models" || path.rfind("/v1/models/", 0) == 0) {
    if (!is_get) return method_not_allowed("GET");
    return handle_models(path, ch);
  }
  if (path == "/v1/completions") {
    if (!is_post) return method_not_allowed("POST");
    return handle_completions(request, channel);
  }
  if (path == "/v1/chat/completions") {
    if (!is_post) return method_not_allowed("POST");
    return handle_chat(request, channel);
  }
  if (path == "/tokenize") {
    if (!is_post) return method_not_allowed("POST");
    return handle_tokenize(request, ch);
  }
  if (path == "/detokenize") {
    if (!is_post) return method_not_allowed("POST");
    return handle_detokenize(request, ch);
  }
  send_error(ch, ApiError{404, fmt::format("Not found: {} {}", request.method, path),
                          "not_found_error", "", "not_found"});
}

void OpenAiApi::handle_models(const std::string& path, ResponseChannel& ch) {
  json card = {{"id", options_.served_model_name},
               {"object", "model"},
               {"created", model_.created_unix},
               {"owned_by", "moeserve"},
               {"root", model_.root},
               {"parent", nullptr},
               {"max_model_len", options_.max_model_len}};
  if (path == "/v1/models") {
    return send_json(ch, 200, dump({{"object", "list"}, {"data", json::array({card})}}));
  }
  const std::string id = path.substr(std::string("/v1/models/").size());
  if (id != options_.served_model_name) {
    return send_error(ch, ApiError{404, fmt::format("The model '{}' does not exist.", id),
                                   "not_found_error", "model", "model_not_found"});
  }
  send_json(ch, 200, dump(card));
}

void OpenAiApi::handle_metrics(ResponseChannel& ch) {
  metrics_.record_http_status(200);
  ch.respond(
      200, "text/plain; version=0.0.4; charset=utf-8",
      metrics_.render(service_.stats(), service_.engine_metrics_text(options_.served_model_name)));
}

void OpenAiApi::handle_completions(const HttpRequest& req,
                                   const std::shared_ptr<ResponseChannel>& channel) {
  ResponseChannel& ch = *channel;
  auto parsed = parse_completion_request(req.body, options_.limits);
  if (!parsed) return send_error(ch, parsed.error());
  CompletionRequest& r = *parsed;
  if (!check_model(r.common.model, ch)) return;
  if (draining_.load(std::memory_order_acquire)) {
    return send_error(ch, ApiError{503, "The server is shutting down.", "service_unavailable", "",
                                   "server_shutting_down"});
  }
  const int32_t vocab = service_.vocab_size();
  std::vector<std::vector<int32_t>> prompt_ids;
  std::vector<std::string> echo_texts;
  int64_t total_prompt = 0;
  int32_t max_tokens = r.common.max_tokens.value_or(16);
  for (size_t p = 0; p < r.prompts.size(); ++p) {
    const PromptInput& in = r.prompts[p];
    const std::string param = r.prompts.size() == 1 ? "prompt" : fmt::format("prompt[{}]", p);
    std::vector<int32_t> ids;
    if (in.text) {
      ids = service_.tokenize(*in.text, /*add_special_tokens=*/true);
    } else {
      ids = in.token_ids;
      for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] >= vocab) {
          return send_error(ch, bad_request(fmt::format("token id {} at {}[{}] is out of the "
                                                        "vocabulary (size {})",
                                                        ids[i], param, i, vocab),
                                            param));
        }
      }
    }
    const auto len = static_cast<int64_t>(ids.size());
    if (len >= options_.max_model_len || len + max_tokens > options_.max_model_len) {
      return send_error(ch, context_error(options_.max_model_len, len, max_tokens, "prompt"));
    }
    if (r.echo) echo_texts.push_back(in.text ? *in.text : service_.detokenize(ids, false));
    total_prompt += len;
    prompt_ids.push_back(std::move(ids));
  }
  if (r.common.sampling.min_tokens > max_tokens) {
    return send_error(ch, bad_request("'min_tokens' must not exceed 'max_tokens'", "min_tokens"));
  }
  r.common.sampling.max_tokens = max_tokens;
  const uint64_t key = next_id_.fetch_add(1);
  const int32_t n = r.common.n;
  auto job = std::make_shared<GenerationJob>(*this, channel, GenerationJob::Kind::kCompletion,
                                             r.common, key);
  job->set_completion_options(r.echo, r.logprobs);
  job->set_total_prompt_tokens(total_prompt);
  auto& choices = job->choices();
  choices.resize(prompt_ids.size() * static_cast<size_t>(n));
  for (size_t p = 0; p < prompt_ids.size(); ++p) {
    for (int32_t i = 0; i < n; ++i) {
      auto& c = choices[p * static_cast<size_t>(n) + static_cast<size_t>(i)];
      c.index = static_cast<int32_t>(p) * n + i;
      c.engine_id = fmt::format("{}-{}", job->id(), c.index);
      c.prompt_ids = prompt_ids[p];
      c.num_prompt_tokens = static_cast<int32_t>(prompt_ids[p].size());
      if (r.echo) c.echo_text = echo_texts[p];
      c.detok = service_.make_detokenizer(r.common.skip_special_tokens);
      if (max_tokens == 0) {
        c.finished = true;
        c.finish = FinishReason::kLength;
      }
    }
  }
  job_started(key, job);
  job->start();
}

void OpenAiApi::handle_chat(const HttpRequest& req,
                            const std::shared_ptr<ResponseChannel>& channel) {
  ResponseChannel& ch = *channel;
  auto parsed = parse_chat_request(req.body, options_.limits);
  if (!parsed) return send_error(ch, parsed.error());
  ChatCompletionRequest& r = *parsed;
  if (!check_model(r.common.model, ch)) return;
  if (draining_.load(std::memory_order_acquire)) {
    return send_error(ch, ApiError{503, "The server is shutting down.", "service_unavailable", "",
                                   "server_shutting_down"});
  }
  auto prompt = service_.render_chat(r.chat);
  if (!prompt) {
    return send_error(
        ch, bad_request(fmt::format("cannot encode the conversation: {}", prompt.error().message),
                        "messages"));
  }
  const auto len = static_cast<int64_t>(prompt->token_ids.size());
  const int64_t max_tokens =
      r.common.max_tokens ? *r.common.max_tokens : options_.max_model_len - len;
  if (len >= options_.max_model_len || len + max_tokens > options_.max_model_len) {
    return send_error(ch, context_error(options_.max_model_len, len, max_tokens, "messages"));
  }
  if (r.common.sampling.min_tokens > max_tokens) {
    return send_error(ch, bad_request("'min_tokens' must not exceed 'max_tokens'", "min_tokens"));
  }
  r.common.sampling.max_tokens = static_cast<int32_t>(max_tokens);
  const uint64_t key = next_id_.fetch_add(1);
  const int32_t n = r.common.n;
  auto job =
      std::make_shared<GenerationJob>(*this, channel, GenerationJob::Kind::kChat, r.common, key);
  job->set_chat_options(r.logprobs, r.parallel_tool_calls);
  job->set_total_prompt_tokens(len);
  OutputParserOptions parser_options;
  parser_options.thinking = r.chat.thinking;
  parser_options.tools_enabled = !r.chat.tools.empty();
  auto& choices = job->choices();
  choices.resize(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    auto& c = choices[static_cast<size_t>(i)];
    c.index = i;
    c.engine_id = fmt::format("{}-{}", job->id(), i);
    c.prompt_ids = prompt->token_ids;
    c.num_prompt_tokens = static_cast<int32_t>(len);
    c.detok = service_.make_detokenizer(r.common.skip_special_tokens);
    c.parser = service_.make_output_parser(parser_options);
    if (!prompt->forced_output_prefix.empty()) {
      c.forced_tool = true;
      c.forced_tool_name = prompt->forced_tool_name;
      // The forced opening is part of the assistant turn: the parser starts inside the block.
      (void)c.parser->push(prompt->forced_output_prefix);
    }
  }
  job_started(key, job);
  job->start();
}

void OpenAiApi::handle_tokenize(const HttpRequest& req, ResponseChannel& ch) {
  auto parsed = parse_tokenize_request(req.body);
  if (!parsed) return send_error(ch, parsed.error());
  if (!check_model(parsed->model, ch)) return;
  std::vector<int32_t> ids;
  if (parsed->chat) {
    auto prompt = service_.render_chat(*parsed->chat);
    if (!prompt) {
      return send_error(
          ch, bad_request(fmt::format("cannot encode the conversation: {}", prompt.error().message),
                          "messages"));
    }
    ids = std::move(prompt->token_ids);
  } else {
    ids = service_.tokenize(*parsed->prompt, parsed->add_special_tokens);
  }
  json j = {{"count", ids.size()}, {"max_model_len", options_.max_model_len}, {"tokens", ids}};
  if (parsed->return_token_strs) {
    json strs = json::array();
    for (int32_t id : ids) {
      const int32_t one[1] = {id};
      strs.push_back(service_.detokenize(one, false));
    }
    j["token_strs"] = std::move(strs);
  }
  send_json(ch, 200, dump(j));
}

void OpenAiApi::handle_detokenize(const HttpRequest& req, ResponseChannel& ch) {
  auto parsed = parse_detokenize_request(req.body);
  if (!parsed) return send_error(ch, parsed.error());
  if (!check_model(parsed->model, ch)) return;
  const int32_t vocab = service_.vocab_size();
  for (size_t i = 0; i < parsed->tokens.size(); ++i) {
    if (parsed->tokens[i] >= vocab) {
      return send_error(ch, bad_request(fmt::format("token id {} at tokens[{}] is out of the "
                                                    "vocabulary (size {})",
                                                    parsed->tokens[i], i, vocab),
                                        "tokens"));
    }
  }
  send_json(ch, 200, dump({{"prompt", service_.detokenize(parsed->tokens, false)}}));
}

}  // namespace moeserve::server
