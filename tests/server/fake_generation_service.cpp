#include "server/fake_generation_service.h"

#include <chrono>
#include <cmath>

#include <nlohmann/json.hpp>

#include "server/protocol.h"

namespace moeserve::server::testing {
namespace {

constexpr std::string_view kFiller = "The quick brown fox jumps over the lazy dog. ";

uint64_t splitmix(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class FakeDetokenizer final : public IncrementalDetokenizer {
 public:
  explicit FakeDetokenizer(bool skip) : skip_(skip) {}
  std::string push(int32_t id) override {
    if (id >= 256) {
      if (!skip_) pending_ += id == FakeGenerationService::kBos ? "<bos>" : "<eos>";
    } else {
      pending_.push_back(static_cast<char>(id));
    }
    const size_t n = utf8_complete_prefix(pending_);
    std::string out = pending_.substr(0, n);
    pending_.erase(0, n);
    return out;
  }
  std::string finish() override {
    std::string out = std::move(pending_);
    pending_.clear();
    return out;
  }

 private:
  bool skip_;
  std::string pending_;
};

// Holds back any tail of `buf` that is a proper prefix of `tag`.
size_t safe_len(const std::string& buf, std::string_view tag) {
  for (size_t k = std::min(buf.size(), tag.size() - 1); k > 0; --k) {
    if (std::string_view(buf).substr(buf.size() - k) == tag.substr(0, k)) return buf.size() - k;
  }
  return buf.size();
}

class FakeParser final : public OutputParser {
 public:
  explicit FakeParser(const OutputParserOptions& o) : tools_(o.tools_enabled) {
    state_ = o.thinking ? State::kReasoning : State::kContent;
  }
  ParsedDelta push(std::string_view text) override {
    buf_ += text;
    ParsedDelta d;
    run(d, false);
    return d;
  }
  ParsedDelta finish() override {
    ParsedDelta d;
    run(d, true);
    if (state_ == State::kTool)
      d.content += "<tool_call>" + buf_;  // unterminated: give it back
    else if (state_ == State::kReasoning)
      d.reasoning += buf_;
    else
      d.content += buf_;
    buf_.clear();
    return d;
  }

 private:
  enum class State { kReasoning, kContent, kTool };
  void run(ParsedDelta& d, bool final) {
    for (;;) {
      if (state_ == State::kReasoning) {
        const size_t pos = buf_.find("</think>");
        if (pos != std::string::npos) {
          d.reasoning += buf_.substr(0, pos);
          buf_.erase(0, pos + 8);
          state_ = State::kContent;
          continue;
        }
        const size_t n = final ? buf_.size() : safe_len(buf_, "</think>");
        d.reasoning += buf_.substr(0, n);
        buf_.erase(0, n);
        return;
      }
      if (state_ == State::kContent) {
        if (!tools_) {
          d.content += buf_;
          buf_.clear();
          return;
        }
        const size_t pos = buf_.find("<tool_call>");
        if (pos != std::string::npos) {
          d.content += buf_.substr(0, pos);
          buf_.erase(0, pos + 11);
          state_ = State::kTool;
          continue;
        }
        const size_t n = final ? buf_.size() : safe_len(buf_, "<tool_call>");
        d.content += buf_.substr(0, n);
        buf_.erase(0, n);
        return;
      }
      const size_t pos = buf_.find("</tool_call>");
      if (pos == std::string::npos) return;
      auto j = nlohmann::json::parse(buf_.substr(0, pos), nullptr, false);
      buf_.erase(0, pos + 12);
      state_ = State::kContent;
      if (j.is_object() && j.contains("name") && j["name"].is_string()) {
        ToolCallDelta t;
        t.index = calls_++;
        t.name = j["name"].get<std::string>();
        t.arguments = j.contains("arguments") ? j["arguments"].dump() : "{}";
        d.tool_calls.push_back(std::move(t));
      }
    }
  }
  bool tools_;
  State state_;
  std::string buf_;
  int32_t calls_ = 0;
};

}  // namespace

FakeGenerationService::FakeGenerationService(std::string model_name, int32_t max_model_len,
                                             double step_ms, int64_t kv_blocks)
    : model_name_(std::move(model_name)),
      max_model_len_(max_model_len),
      step_ms_(step_ms),
      kv_blocks_total_(kv_blocks) {
  thread_ = std::thread([this] { loop(); });
}

FakeGenerationService::~FakeGenerationService() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

ModelInfo FakeGenerationService::model_info() const {
  return ModelInfo{model_name_, "fake", max_model_len_, 1700000000};
}

std::vector<int32_t> FakeGenerationService::tokenize(std::string_view text,
                                                     bool add_special_tokens) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() + 1);
  if (add_special_tokens) ids.push_back(kBos);
  for (unsigned char ch : text) ids.push_back(ch);
  return ids;
}

std::string FakeGenerationService::detokenize(std::span<const int32_t> ids, bool skip) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 256) {
      out.push_back(static_cast<char>(id));
    } else if (!skip) {
      out += id == kBos ? "<bos>" : "<eos>";
    }
  }
  return out;
}

std::unique_ptr<IncrementalDetokenizer> FakeGenerationService::make_detokenizer(
    bool skip_special) const {
  return std::make_unique<FakeDetokenizer>(skip_special);
}

Result<ChatPrompt> FakeGenerationService::render_chat(const ChatPromptInput& input) const {
  std::string text;
  if (!input.tools.empty()) {
    text += "<|tools|>";
    for (const auto& t : input.tools) text += t.name + ":" + t.parameters_json + ";";
    text += "\n";
  }
  for (const auto& m : input.messages) {
    text += "<|" + m.role + "|>" + m.content;
    for (const auto& c : m.tool_calls) {
      text +=
          "<tool_call>{\"name\":\"" + c.name + "\",\"arguments\":" + c.arguments + "}</tool_call>";
    }
    text += "\n";
  }
  if (input.add_generation_prompt) {
    text += "<|assistant|>";
    if (input.thinking) text += "<think>";
  }
  ChatPrompt p;
  p.token_ids = tokenize(text, true);
  p.text = std::move(text);
  return p;
}

std::unique_ptr<OutputParser> FakeGenerationService::make_output_parser(
    const OutputParserOptions& options) const {
  return std::make_unique<FakeParser>(options);
}

std::vector<int32_t> FakeGenerationService::make_script(const GenerationRequest& r) const {
  const std::string prompt = detokenize(r.prompt_token_ids, true);
  const size_t pos = prompt.rfind("say:");
  std::vector<int32_t> script;
  if (pos != std::string::npos) {
    size_t end = prompt.find('\n', pos);
    if (end == std::string::npos) end = prompt.size();
    for (unsigned char ch : prompt.substr(pos + 4, end - pos - 4)) script.push_back(ch);
    script.push_back(kEos);
  }
  return script;
}

Status FakeGenerationService::submit(GenerationRequest request, OutputCallback on_output) {
  auto run = std::make_unique<Running>();
  run->script = make_script(request);
  uint64_t seed = request.sampling.seed.value_or(0);
  if (!request.sampling.seed && request.sampling.temperature > 0.0f) {
    seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }
  run->rng = seed;
  run->request = std::move(request);
  run->callback = std::move(on_output);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return make_error(ErrorCode::kCancelled, "engine stopped");
    incoming_.push_back(std::move(run));
    ++num_waiting_;
  }
  cv_.notify_one();
  return ok_status();
}

void FakeGenerationService::abort(const std::string& request_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    aborts_.insert(request_id);
  }
  cv_.notify_one();
}

EngineStats FakeGenerationService::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineStats s;
  s.num_requests_running = num_running_;
  s.num_requests_waiting = num_waiting_;
  s.kv_blocks_total = kv_blocks_total_;
  s.kv_blocks_free = kv_blocks_total_ - kv_blocks_used_;
  s.kv_cache_usage = static_cast<double>(kv_blocks_used_) /
                     static_cast<double>(std::max<int64_t>(1, kv_blocks_total_));
  s.prefix_cache_queries = prefix_queries_;
  s.prefix_cache_hits = 0;
  return s;
}

void FakeGenerationService::loop() {
  const auto step = std::chrono::microseconds(static_cast<int64_t>(step_ms_ * 1000.0));
  std::vector<std::pair<OutputCallback*, GenerationOutput>> outs;
  std::vector<std::unique_ptr<Running>> done;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (running_.empty() && incoming_.empty() && aborts_.empty()) {
        cv_.wait(lock, [&] { return stop_ || !incoming_.empty() || !aborts_.empty(); });
      }
      if (stop_) break;
      // Admit what fits in the KV pool.
      while (!incoming_.empty()) {
        auto& r = incoming_.front();
        const int64_t need =
            blocks_for(static_cast<int64_t>(r->request.prompt_token_ids.size()) + 1);
        if (kv_blocks_used_ + need > kv_blocks_total_) break;
        r->blocks = need;
        kv_blocks_used_ += need;
        prefix_queries_ += static_cast<int64_t>(r->request.prompt_token_ids.size());
        --num_waiting_;
        ++num_running_;
        std::string id = r->request.request_id;
        running_[id] = std::move(r);
        incoming_.pop_front();
      }
      for (const auto& id : aborts_) {
        auto it = running_.find(id);
        if (it != running_.end()) {
          GenerationOutput out;
          out.finish_reason = FinishReason::kAbort;
          kv_blocks_used_ -= it->second->blocks;
          --num_running_;
          done.push_back(std::move(it->second));
          outs.emplace_back(&done.back()->callback, std::move(out));
          running_.erase(it);
          continue;
        }
        for (auto q = incoming_.begin(); q != incoming_.end(); ++q) {
          if ((*q)->request.request_id == id) {
            GenerationOutput out;
            out.finish_reason = FinishReason::kAbort;
            --num_waiting_;
            done.push_back(std::move(*q));
            outs.emplace_back(&done.back()->callback, std::move(out));
            incoming_.erase(q);
            break;
          }
        }
      }
      aborts_.clear();
      // One token per running request.
      for (auto it = running_.begin(); it != running_.end();) {
        Running& r = *it->second;
        const SamplingOptions& s = r.request.sampling;
        int32_t tok;
        if (r.next < r.script.size()) {
          tok = r.script[r.next++];
          if (tok == kEos && (s.ignore_eos || r.generated < s.min_tokens)) {
            tok = static_cast<unsigned char>(
                kFiller[static_cast<size_t>(r.generated) % kFiller.size()]);
          }
        } else {
          tok = static_cast<unsigned char>(
              kFiller[static_cast<size_t>(r.generated) % kFiller.size()]);
          if (r.rng != 0 && tok == ' ') tok = '0' + static_cast<int32_t>(splitmix(r.rng) % 10);
        }
        ++r.generated;
        GenerationOutput out;
        out.token_ids.push_back(tok);
        if (s.logprobs >= 0) {
          TokenLogprobs lp;
          lp.logprob = -0.125f * static_cast<float>(r.generated % 4);
          for (int32_t k = 0; k < s.logprobs; ++k) {
            lp.top.push_back(TopLogprob{(tok + 1 + k) % 256, -1.0f - static_cast<float>(k)});
          }
          out.logprobs.push_back(std::move(lp));
        }
        bool stop_tok = tok == kEos;
        for (int32_t st : s.stop_token_ids) stop_tok = stop_tok || st == tok;
        if (stop_tok && !(tok == kEos && s.ignore_eos)) {
          out.finish_reason = FinishReason::kStop;
          out.stop_token_id = tok;
        } else if (r.generated >= s.max_tokens) {
          out.finish_reason = FinishReason::kLength;
        }
        const int64_t need =
            blocks_for(static_cast<int64_t>(r.request.prompt_token_ids.size()) + r.generated + 1);
        kv_blocks_used_ += need - r.blocks;
        r.blocks = need;
        if (out.finish_reason != FinishReason::kNone) {
          kv_blocks_used_ -= r.blocks;
          --num_running_;
          done.push_back(std::move(it->second));
          outs.emplace_back(&done.back()->callback, std::move(out));
          it = running_.erase(it);
        } else {
          outs.emplace_back(&r.callback, std::move(out));
          ++it;
        }
      }
    }
    for (auto& [cb, out] : outs) (*cb)(std::move(out));
    outs.clear();
    done.clear();
    if (step.count() > 0) std::this_thread::sleep_for(step);
  }
  // Shutdown: every request still known gets its final output.
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, r] : running_) {
    GenerationOutput out;
    out.finish_reason = FinishReason::kAbort;
    r->callback(std::move(out));
  }
  for (auto& r : incoming_) {
    GenerationOutput out;
    out.finish_reason = FinishReason::kAbort;
    r->callback(std::move(out));
  }
}

}  // namespace moeserve::server::testing
