#include "tokenizer/chat_output_parser.h"

#include <algorithm>
#include <set>

#include "tokenizer/chat_encoding.h"
#include "tokenizer/python_json.h"

namespace moeserve::tokenizer::dsv4 {
namespace {

// Length of the longest suffix of `text` that is a proper prefix of `marker`.
size_t partial_suffix(std::string_view text, std::string_view marker) {
  const size_t max = std::min(text.size(), marker.size() - 1);
  for (size_t n = max; n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

bool consume(std::string_view& s, std::string_view prefix) {
  if (s.substr(0, prefix.size()) != prefix) return false;
  s.remove_prefix(prefix.size());
  return true;
}

bool read_until(std::string_view& s, char stop, std::string_view& value) {
  const size_t pos = s.find(stop);
  if (pos == std::string_view::npos) return false;
  value = s.substr(0, pos);
  s.remove_prefix(pos + 1);
  return true;
}

void skip_newlines(std::string_view& s) {
  while (!s.empty() && (s.front() == '\n' || s.front() == '\r' || s.front() == ' ')) {
    s.remove_prefix(1);
  }
}

}  // namespace

void ParsedDelta::append(ParsedDelta&& other) {
  reasoning_content += other.reasoning_content;
  content += other.content;
  for (ToolCall& c : other.tool_calls) tool_calls.push_back(std::move(c));
}

ChatOutputParser::ChatOutputParser(ChatOutputParserOptions options)
    : options_(std::move(options)),
      state_(options_.thinking ? State::kReasoning : State::kContent) {}

ParsedDelta ChatOutputParser::feed(std::string_view chunk) {
  buffer_.append(chunk);
  ParsedDelta out;
  process(/*final=*/false, out);
  return out;
}

ParsedDelta ChatOutputParser::finish() {
  ParsedDelta out;
  process(/*final=*/true, out);
  return out;
}

bool ChatOutputParser::parse_invoke(std::string_view s, ToolCall& call) const {
  // <｜DSML｜invoke name="NAME">\n (<｜DSML｜parameter name="K" string="true|false">V</｜DSML｜
  // parameter>\n)* </｜DSML｜invoke>
  std::string_view name;
  if (!consume(s, kInvokeStart) || !consume(s, " name=\"") || !read_until(s, '"', name) ||
      name.empty() || !consume(s, ">")) {
    return false;
  }
  std::string arguments = "{";
  std::set<std::string_view> seen;
  while (true) {
    skip_newlines(s);
    if (consume(s, kInvokeEnd)) break;
    std::string_view key;
    std::string_view is_string;
    if (!consume(s, kParameterStart) || !consume(s, " name=\"") || !read_until(s, '"', key) ||
        !consume(s, " string=\"") || !read_until(s, '"', is_string) || !consume(s, ">")) {
      return false;
    }
    if (is_string != "true" && is_string != "false") return false;
    const size_t end = s.find(kParameterEnd);
    if (end == std::string_view::npos || !seen.insert(key).second) return false;
    const std::string_view value = s.substr(0, end);
    s.remove_prefix(end + kParameterEnd.size());
    if (arguments.size() > 1) arguments += ", ";
    arguments += python_json_string(key);
    arguments += ": ";
    if (is_string == "true") {
      arguments += python_json_string(value);
    } else {
      if (nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false).is_discarded()) {
        return false;
      }
      arguments += value;
    }
  }
  skip_newlines(s);
  if (!s.empty()) return false;
  arguments += "}";
  call.id = options_.id_prefix + std::to_string(tool_index_);
  call.name = std::string(name);
  call.arguments = std::move(arguments);
  return true;
}

void ChatOutputParser::process(bool final, ParsedDelta& out) {
  while (true) {
    std::string_view buf = buffer_;
    switch (state_) {
      case State::kReasoning: {
        if (at_start_) {
          // The prompt already opened <think>; tolerate the model repeating it.
          if (!final && buf.size() < kThinkStart.size() &&
              kThinkStart.substr(0, buf.size()) == buf) {
            return;
          }
          at_start_ = false;
          if (buf.substr(0, kThinkStart.size()) == kThinkStart) {
            buffer_.erase(0, kThinkStart.size());
            continue;
          }
        }
        const size_t end = buf.find(kThinkEnd);
        if (end != std::string_view::npos) {
          out.reasoning_content.append(buf.substr(0, end));
          buffer_.erase(0, end + kThinkEnd.size());
          state_ = State::kContent;
          continue;
        }
        const size_t hold = final ? 0 : partial_suffix(buf, kThinkEnd);
        out.reasoning_content.append(buf.substr(0, buf.size() - hold));
        buffer_.erase(0, buf.size() - hold);
        return;
      }
      case State::kContent: {
        at_start_ = false;
        const size_t calls = buf.find(kToolCallsStart);
        const size_t eos = buf.find(kEos);
        if (eos != std::string_view::npos && (calls == std::string_view::npos || eos < calls)) {
          // End of sentence as text (normally stripped as a special token): drop the marker.
          out.content.append(buf.substr(0, eos));
          buffer_.erase(0, eos + kEos.size());
          continue;
        }
        if (calls != std::string_view::npos) {
          // The blank line that introduces the block belongs to the block, not the content.
          size_t cut = calls;
          while (cut > 0 && buf[cut - 1] == '\n') --cut;
          out.content.append(buf.substr(0, cut));
          block_raw_ = std::string(buf.substr(cut, calls + kToolCallsStart.size() - cut));
          block_has_call_ = false;
          buffer_.erase(0, calls + kToolCallsStart.size());
          state_ = State::kToolCalls;
          continue;
        }
        size_t keep = buf.size();
        if (!final) {
          const size_t hold =
              std::max(partial_suffix(buf, kToolCallsStart), partial_suffix(buf, kEos));
          keep = buf.size() - hold;
          while (keep > 0 && buf[keep - 1] == '\n') --keep;  // may be the blank line before a block
        }
        out.content.append(buf.substr(0, keep));
        buffer_.erase(0, keep);
        return;
      }
      case State::kToolCalls: {
        size_t ws = 0;
        while (ws < buf.size() && (buf[ws] == '\n' || buf[ws] == '\r' || buf[ws] == ' ')) ++ws;
        std::string_view rest = buf.substr(ws);
        if (rest.substr(0, kToolCallsEnd.size()) == kToolCallsEnd) {
          if (!block_has_call_) {
            // A block without one well-formed invoke: give all of it back as text.
            out.content += block_raw_;
            out.content.append(buf.substr(0, ws + kToolCallsEnd.size()));
          }
          block_raw_.clear();
          block_has_call_ = false;
          buffer_.erase(0, ws + kToolCallsEnd.size());
          state_ = State::kContent;
          continue;
        }
        if (rest.substr(0, kInvokeStart.size()) == kInvokeStart) {
          const size_t end = rest.find(kInvokeEnd);
          if (end == std::string_view::npos) {
            if (!final) return;
            out.content += block_raw_;
            out.content.append(buf);
            block_raw_.clear();
            block_has_call_ = false;
            buffer_.clear();
            state_ = State::kContent;
            return;
          }
          const size_t len = ws + end + kInvokeEnd.size();
          ToolCall call;
          if (parse_invoke(rest.substr(0, end + kInvokeEnd.size()), call)) {
            ++tool_index_;
            out.tool_calls.push_back(std::move(call));
            block_raw_.clear();
            block_has_call_ = true;
          } else {
            out.content += block_raw_;
            out.content.append(buf.substr(0, len));
            block_raw_.clear();
          }
          buffer_.erase(0, len);
          continue;
        }
        const bool maybe_marker =
            rest.size() < kInvokeStart.size() || rest.size() < kToolCallsEnd.size()
                ? (kInvokeStart.substr(0, rest.size()) == rest ||
                   kToolCallsEnd.substr(0, rest.size()) == rest)
                : false;
        if (!final && maybe_marker) return;
        // Unexpected text inside the block (or the stream ended in it): leave the block; the raw
        // text not yet accounted for, and everything after, is content.
        out.content += block_raw_;
        block_raw_.clear();
        block_has_call_ = false;
        state_ = State::kContent;
        continue;
      }
    }
  }
}

nlohmann::json to_openai_json(const ToolCall& call) {
  return {{"id", call.id},
          {"type", "function"},
          {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
}

ParsedDelta parse_chat_output(std::string_view text, const ChatOutputParserOptions& options) {
  ChatOutputParser parser(options);
  ParsedDelta out = parser.feed(text);
  out.append(parser.finish());
  return out;
}

}  // namespace moeserve::tokenizer::dsv4
