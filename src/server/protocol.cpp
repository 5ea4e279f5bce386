#include "server/protocol.h"

#include <cmath>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace moeserve::server {

// ordered_json keeps the client's key order: tool schemas are printed into the prompt verbatim.
using json = nlohmann::ordered_json;

std::string ApiError::to_json() const {
  json err = {{"message", message},
              {"type", type},
              {"param", param.empty() ? json(nullptr) : json(param)},
              {"code", code.empty() ? json(nullptr) : json(code)}};
  return json({{"error", std::move(err)}}).dump(-1, ' ', false, json::error_handler_t::replace);
}

ApiError bad_request(std::string message, std::string param, std::string code) {
  return ApiError{400, std::move(message), "invalid_request_error", std::move(param),
                  std::move(code)};
}

ApiError unprocessable(std::string message, std::string param, std::string code) {
  return ApiError{422, std::move(message), "invalid_request_error", std::move(param),
                  code.empty() ? std::string("unsupported_parameter") : std::move(code)};
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<uint8_t>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len = 0;
    uint32_t cp = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + static_cast<size_t>(len) > n) return false;
    for (int k = 1; k < len; ++k) {
      const auto cc = static_cast<uint8_t>(s[i + static_cast<size_t>(k)]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)) {
      return false;  // overlong
    }
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += static_cast<size_t>(len);
  }
  return true;
}

size_t utf8_complete_prefix(std::string_view s) {
  // Walk back over at most 3 continuation bytes to the last lead byte; drop it if incomplete.
  const size_t n = s.size();
  size_t back = 0;
  while (back < 4 && back < n && (static_cast<uint8_t>(s[n - 1 - back]) & 0xC0) == 0x80) ++back;
  if (back == n) return n;
  const auto lead = static_cast<uint8_t>(s[n - 1 - back]);
  size_t need = 1;
  if ((lead & 0xE0) == 0xC0) {
    need = 2;
  } else if ((lead & 0xF0) == 0xE0) {
    need = 3;
  } else if ((lead & 0xF8) == 0xF0) {
    need = 4;
  }
  if (need > back + 1) return n - 1 - back;
  return n;
}

namespace {

// Thrown inside this file only, caught at each parse_* boundary.
struct ProtocolError {
  ApiError error;
};

[[noreturn]] void fail(const std::string& param, std::string message) {
  throw ProtocolError{bad_request(std::move(message), param)};
}

[[noreturn]] void fail_unsupported(const std::string& param, std::string message) {
  throw ProtocolError{unprocessable(std::move(message), param)};
}

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "integer";
    case json::value_t::number_float:
      return "number";
    case json::value_t::string:
      return "string";
    case json::value_t::array:
      return "array";
    case json::value_t::object:
      return "object";
    default:
      return "value";
  }
}

// A present, non-null field or nullptr (null means "use the default", as OpenAI does).
const json* field(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string join(const std::string& prefix, const char* key) {
  return prefix.empty() ? std::string(key) : prefix + "." + key;
}

[[noreturn]] void fail_type(const std::string& param, const char* want, const json& got) {
  fail(param, fmt::format("'{}' must be {}, got {}", param, want, type_name(got)));
}

std::optional<bool> get_bool(const json& obj, const char* key, const std::string& prefix = {}) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) fail_type(join(prefix, key), "a boolean", *v);
  return v->get<bool>();
}

std::optional<std::string> get_string(const json& obj, const char* key,
                                      const std::string& prefix = {}) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) fail_type(join(prefix, key), "a string", *v);
  return v->get<std::string>();
}

int64_t as_int(const json& v, const std::string& param) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() &&
        v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail(param, fmt::format("'{}' is too large", param));
    }
    return v.get<int64_t>();
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
      return static_cast<int64_t>(d);
    }
  }
  fail_type(param, "an integer", v);
}

std::optional<int64_t> get_int(const json& obj, const char* key, int64_t lo, int64_t hi,
                               const std::string& prefix = {}) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  const std::string param = join(prefix, key);
  const int64_t x = as_int(*v, param);
  if (x < lo || x > hi) {
    fail(param, fmt::format("'{}' must be between {} and {}, got {}", param, lo, hi, x));
  }
  return x;
}

std::optional<double> get_number(const json& obj, const char* key, double lo, double hi,
                                 bool lo_open = false) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) fail_type(key, "a number", *v);
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo)) {
    fail(key, fmt::format("'{}' must be in {}{}, {}], got {}", key, lo_open ? "(" : "[", lo, hi,
                          v->dump()));
  }
  return x;
}

json parse_body(std::string_view body) {
  if (!is_valid_utf8(body)) {
    throw ProtocolError{bad_request("request body is not valid UTF-8", {}, "invalid_utf8")};
  }
  json doc;
  try {
    doc = json::parse(body);
  } catch (const json::parse_error& e) {
    throw ProtocolError{
        bad_request(fmt::format("malformed JSON: {}", e.what()), {}, "invalid_json")};
  }
  if (!doc.is_object()) {
    throw ProtocolError{
        bad_request(fmt::format("request body must be a JSON object, got {}", type_name(doc)), {},
                    "invalid_json")};
  }
  return doc;
}

std::vector<int32_t> parse_token_array(const json& arr, const std::string& param) {
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) {
    const std::string p = fmt::format("{}[{}]", param, i);
    const int64_t x = as_int(arr[i], p);
    if (x < 0 || x > std::numeric_limits<int32_t>::max()) {
      fail(p, fmt::format("'{}' is not a valid token id: {}", p, x));
    }
    ids.push_back(static_cast<int32_t>(x));
  }
  return ids;
}

void parse_common(const json& doc, const ProtocolLimits& limits, bool is_chat, CommonParams& c) {
  c.model = get_string(doc, "model");
  c.stream = get_bool(doc, "stream").value_or(false);
  if (const json* so = field(doc, "stream_options")) {
    if (!so->is_object()) fail_type("stream_options", "an object", *so);
    if (!c.stream) fail("stream_options", "'stream_options' is only allowed when 'stream' is true");
    c.include_usage = get_bool(*so, "include_usage", "stream_options").value_or(false);
    c.continuous_usage_stats =
        get_bool(*so, "continuous_usage_stats", "stream_options").value_or(false);
  }
  constexpr int64_t kMaxTokens = std::numeric_limits<int32_t>::max();
  std::optional<int64_t> max_tokens = get_int(doc, "max_tokens", 0, kMaxTokens);
  if (is_chat) {
    if (auto mct = get_int(doc, "max_completion_tokens", 0, kMaxTokens)) max_tokens = mct;
  }
  if (max_tokens) c.max_tokens = static_cast<int32_t>(*max_tokens);

  SamplingOptions& s = c.sampling;
  if (auto v = get_number(doc, "temperature", 0.0, 2.0)) s.temperature = static_cast<float>(*v);
  if (auto v = get_number(doc, "top_p", 0.0, 1.0, /*lo_open=*/true)) {
    s.top_p = static_cast<float>(*v);
  }
  if (auto v = get_int(doc, "top_k", -1, std::numeric_limits<int32_t>::max())) {
    s.top_k = *v <= 0 ? 0 : static_cast<int32_t>(*v);
  }
  if (auto v = get_number(doc, "min_p", 0.0, 1.0)) s.min_p = static_cast<float>(*v);
  if (auto v = get_number(doc, "presence_penalty", -2.0, 2.0)) {
    s.presence_penalty = static_cast<float>(*v);
  }
  if (auto v = get_number(doc, "frequency_penalty", -2.0, 2.0)) {
    s.frequency_penalty = static_cast<float>(*v);
  }
  if (auto v = get_number(doc, "repetition_penalty", 0.0, 2.0, /*lo_open=*/true)) {
    s.repetition_penalty = static_cast<float>(*v);
  }
  if (const json* v = field(doc, "seed")) {
    s.seed = static_cast<uint64_t>(as_int(*v, "seed"));
  }
  if (auto v = get_int(doc, "min_tokens", 0, kMaxTokens)) s.min_tokens = static_cast<int32_t>(*v);
  s.ignore_eos = get_bool(doc, "ignore_eos").value_or(false);
  if (const json* v = field(doc, "stop_token_ids")) {
    if (!v->is_array()) fail_type("stop_token_ids", "an array of integers", *v);
    s.stop_token_ids = parse_token_array(*v, "stop_token_ids");
  }
  if (auto v = get_int(doc, "n", 1, limits.max_n)) c.n = static_cast<int32_t>(*v);
  if (const json* v = field(doc, "stop")) {
    if (v->is_string()) {
      c.stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      for (size_t i = 0; i < v->size(); ++i) {
        const json& e = (*v)[i];
        if (!e.is_string()) fail_type(fmt::format("stop[{}]", i), "a string", e);
        c.stop.push_back(e.get<std::string>());
      }
    } else {
      fail_type("stop", "a string or an array of strings", *v);
    }
    if (static_cast<int32_t>(c.stop.size()) > limits.max_stop_strings) {
      fail("stop", fmt::format("at most {} stop strings are allowed", limits.max_stop_strings));
    }
    std::erase_if(c.stop, [](const std::string& x) { return x.empty(); });
  }
  c.include_stop_str_in_output = get_bool(doc, "include_stop_str_in_output").value_or(false);
  c.skip_special_tokens = get_bool(doc, "skip_special_tokens").value_or(true);
  c.user = get_string(doc, "user").value_or("");
  if (const json* rf = field(doc, "response_format")) {
    if (!rf->is_object()) fail_type("response_format", "an object", *rf);
    const std::string type = get_string(*rf, "type", "response_format").value_or("text");
    if (type != "text") {
      fail_unsupported("response_format",
                       fmt::format("response_format type '{}' is not supported by this server "
                                   "(only 'text')",
                                   type));
    }
  }
}

std::string parse_content(const json& v, const std::string& param) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) fail_type(param, "a string or an array of content parts", v);
  std::string text;
  for (size_t i = 0; i < v.size(); ++i) {
    const json& part = v[i];
    const std::string p = fmt::format("{}[{}]", param, i);
    if (part.is_string()) {
      if (!text.empty()) text += "\n";
      text += part.get<std::string>();
      continue;
    }
    if (!part.is_object()) fail_type(p, "an object", part);
    const std::string type = get_string(part, "type", p).value_or("");
    if (type == "text" || type == "input_text") {
      auto t = get_string(part, "text", p);
      if (!t) fail(p + ".text", fmt::format("'{}.text' is required", p));
      if (!text.empty()) text += "\n";
      text += *t;
    } else if (type.empty()) {
      fail(p + ".type", fmt::format("'{}.type' is required", p));
    } else {
      fail_unsupported(p + ".type",
                       fmt::format("content part type '{}' is not supported: this model accepts "
                                   "text only",
                                   type));
    }
  }
  return text;
}

std::string arguments_text(const json& v, const std::string& param) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object()) return v.dump();
  fail_type(param, "a string (JSON text)", v);
}

std::vector<ChatMessage> parse_messages(const json& doc) {
  const json* msgs = field(doc, "messages");
  if (!msgs) fail("messages", "'messages' is required");
  if (!msgs->is_array()) fail_type("messages", "an array", *msgs);
  if (msgs->empty()) fail("messages", "'messages' must not be empty");
  static const std::set<std::string> kRoles = {"system", "developer", "user", "assistant", "tool"};
  std::vector<ChatMessage> out;
  out.reserve(msgs->size());
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    const std::string p = fmt::format("messages[{}]", i);
    if (!m.is_object()) fail_type(p, "an object", m);
    ChatMessage msg;
    auto role = get_string(m, "role", p);
    if (!role) fail(p + ".role", fmt::format("'{}.role' is required", p));
    if (!kRoles.count(*role)) {
      fail(p + ".role", fmt::format("'{}.role' must be one of system, developer, user, assistant, "
                                    "tool; got '{}'",
                                    p, *role));
    }
    msg.role = *role;
    if (const json* c = field(m, "content")) {
      msg.content = parse_content(*c, p + ".content");
    } else if (msg.role != "assistant") {
      fail(p + ".content", fmt::format("'{}.content' is required for role '{}'", p, msg.role));
    }
    msg.name = get_string(m, "name", p).value_or("");
    if (auto r = get_string(m, "reasoning_content", p)) {
      msg.reasoning_content = *r;
    } else if (auto r2 = get_string(m, "reasoning", p)) {
      msg.reasoning_content = *r2;
    }
    msg.tool_call_id = get_string(m, "tool_call_id", p).value_or("");
    if (const json* tc = field(m, "tool_calls")) {
      if (!tc->is_array()) fail_type(p + ".tool_calls", "an array", *tc);
      for (size_t k = 0; k < tc->size(); ++k) {
        const json& call = (*tc)[k];
        const std::string cp = fmt::format("{}.tool_calls[{}]", p, k);
        if (!call.is_object()) fail_type(cp, "an object", call);
        const json* fn = field(call, "function");
        if (!fn || !fn->is_object()) fail(cp + ".function", "'function' object is required");
        ToolCall t;
        t.id = get_string(call, "id", cp).value_or(fmt::format("call_{}_{}", i, k));
        auto name = get_string(*fn, "name", cp + ".function");
        if (!name || name->empty()) fail(cp + ".function.name", "'function.name' is required");
        t.name = *name;
        if (const json* a = field(*fn, "arguments")) {
          t.arguments = arguments_text(*a, cp + ".function.arguments");
        } else {
          t.arguments = "{}";
        }
        msg.tool_calls.push_back(std::move(t));
      }
    }
    out.push_back(std::move(msg));
  }
  return out;
}

bool valid_function_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char ch : name) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '_' || ch == '-' || ch == '.';
    if (!ok) return false;
  }
  return true;
}

void parse_tools(const json& doc, ChatPromptInput& chat) {
  std::vector<ToolDefinition> tools;
  if (const json* arr = field(doc, "tools")) {
    if (!arr->is_array()) fail_type("tools", "an array", *arr);
    std::set<std::string> names;
    for (size_t i = 0; i < arr->size(); ++i) {
      const json& t = (*arr)[i];
      const std::string p = fmt::format("tools[{}]", i);
      if (!t.is_object()) fail_type(p, "an object", t);
      const std::string type = get_string(t, "type", p).value_or("function");
      if (type != "function") {
        fail_unsupported(p + ".type", fmt::format("tool type '{}' is not supported", type));
      }
      const json* fn = field(t, "function");
      if (!fn) fail(p + ".function", fmt::format("'{}.function' is required", p));
      if (!fn->is_object()) fail_type(p + ".function", "an object", *fn);
      ToolDefinition def;
      auto name = get_string(*fn, "name", p + ".function");
      if (!name) fail(p + ".function.name", fmt::format("'{}.function.name' is required", p));
      if (!valid_function_name(*name)) {
        fail(p + ".function.name",
             fmt::format("function name '{}' must be 1-64 characters of a-z, A-Z, 0-9, _ . -",
                         *name));
      }
      if (!names.insert(*name).second) {
        fail(p + ".function.name", fmt::format("duplicate function name '{}'", *name));
      }
      def.name = *name;
      def.description = get_string(*fn, "description", p + ".function").value_or("");
      def.function_json = fn->dump();
      if (const json* params = field(*fn, "parameters")) {
        if (!params->is_object()) fail_type(p + ".function.parameters", "an object", *params);
        def.parameters_json = params->dump();
      } else {
        def.parameters_json = "{}";
      }
      tools.push_back(std::move(def));
    }
  }
  chat.tool_choice = tools.empty() ? ToolChoiceMode::kNone : ToolChoiceMode::kAuto;
  if (const json* tc = field(doc, "tool_choice")) {
    if (tc->is_string()) {
      const std::string mode = tc->get<std::string>();
      if (mode == "none") {
        chat.tool_choice = ToolChoiceMode::kNone;
      } else if (mode == "auto") {
        chat.tool_choice = ToolChoiceMode::kAuto;
      } else if (mode == "required") {
        chat.tool_choice = ToolChoiceMode::kRequired;
      } else {
        fail("tool_choice", fmt::format("'tool_choice' must be 'none', 'auto', 'required' or a "
                                        "function object, got '{}'",
                                        mode));
      }
    } else if (tc->is_object()) {
      const json* fn = field(*tc, "function");
      if (!fn || !fn->is_object())
        fail("tool_choice.function", "'tool_choice.function' is required");
      auto name = get_string(*fn, "name", "tool_choice.function");
      if (!name) fail("tool_choice.function.name", "'tool_choice.function.name' is required");
      chat.tool_choice = ToolChoiceMode::kNamed;
      chat.tool_choice_name = *name;
    } else {
      fail_type("tool_choice", "a string or an object", *tc);
    }
    // As OpenAI and vLLM: any tool_choice but "none" needs tools to choose from.
    if (chat.tool_choice != ToolChoiceMode::kNone && tools.empty()) {
      fail("tool_choice", "'tool_choice' is only allowed when 'tools' are specified");
    }
    if (chat.tool_choice == ToolChoiceMode::kNamed) {
      bool found = false;
      for (const auto& t : tools) found = found || t.name == chat.tool_choice_name;
      if (!found) {
        fail("tool_choice", fmt::format("'tool_choice' names function '{}', which is not in "
                                        "'tools'",
                                        chat.tool_choice_name));
      }
    }
  }
  if (chat.tool_choice != ToolChoiceMode::kNone) chat.tools = std::move(tools);
}

template <typename T, typename F>
ApiResult<T> guarded(F&& f) {
  try {
    return f();
  } catch (const ProtocolError& e) {
    return tl::unexpected(e.error);
  } catch (const json::exception& e) {
    return tl::unexpected(bad_request(fmt::format("invalid request: {}", e.what())));
  }
}

}  // namespace

ApiResult<CompletionRequest> parse_completion_request(std::string_view body,
                                                      const ProtocolLimits& limits) {
  return guarded<CompletionRequest>([&] {
    const json doc = parse_body(body);
    CompletionRequest req;
    parse_common(doc, limits, /*is_chat=*/false, req.common);
    req.echo = get_bool(doc, "echo").value_or(false);
    if (const json* lp = field(doc, "logprobs")) {
      if (lp->is_boolean()) {
        req.logprobs = lp->get<bool>() ? 0 : -1;
      } else {
        req.logprobs = static_cast<int32_t>(*get_int(doc, "logprobs", 0, limits.max_logprobs));
      }
    }
    if (field(doc, "suffix")) fail_unsupported("suffix", "'suffix' is not supported");
    if (req.common.max_tokens && *req.common.max_tokens == 0 && !req.echo) {
      fail("max_tokens", "'max_tokens' must be at least 1 (0 is allowed only with 'echo')");
    }
    const json* prompt = field(doc, "prompt");
    if (!prompt) fail("prompt", "'prompt' is required");
    auto add_text = [&](const json& v, const std::string& p) {
      std::string text = v.get<std::string>();
      if (text.empty()) fail(p, fmt::format("'{}' must not be empty", p));
      req.prompts.push_back(PromptInput{std::move(text), {}});
    };
    auto add_ids = [&](const json& v, const std::string& p) {
      auto ids = parse_token_array(v, p);
      if (ids.empty()) fail(p, fmt::format("'{}' must not be empty", p));
      req.prompts.push_back(PromptInput{std::nullopt, std::move(ids)});
    };
    if (prompt->is_string()) {
      add_text(*prompt, "prompt");
    } else if (prompt->is_array()) {
      if (prompt->empty()) fail("prompt", "'prompt' must not be empty");
      const json& first = (*prompt)[0];
      if (first.is_number()) {
        add_ids(*prompt, "prompt");
      } else {
        for (size_t i = 0; i < prompt->size(); ++i) {
          const json& e = (*prompt)[i];
          const std::string p = fmt::format("prompt[{}]", i);
          if (e.is_string()) {
            add_text(e, p);
          } else if (e.is_array()) {
            add_ids(e, p);
          } else {
            fail_type(p, "a string or an array of token ids", e);
          }
        }
      }
    } else {
      fail_type("prompt", "a string, an array of strings or an array of token ids", *prompt);
    }
    if (static_cast<int32_t>(req.prompts.size()) > limits.max_batch_prompts) {
      fail("prompt", fmt::format("at most {} prompts per request", limits.max_batch_prompts));
    }
    if (static_cast<int64_t>(req.prompts.size()) * req.common.n > limits.max_n) {
      fail("n", fmt::format("prompts x n must be at most {}", limits.max_n));
    }
    req.common.sampling.logprobs = req.logprobs;
    return req;
  });
}

ApiResult<ChatCompletionRequest> parse_chat_request(std::string_view body,
                                                    const ProtocolLimits& limits) {
  return guarded<ChatCompletionRequest>([&] {
    const json doc = parse_body(body);
    ChatCompletionRequest req;
    parse_common(doc, limits, /*is_chat=*/true, req.common);
    if (req.common.max_tokens && *req.common.max_tokens == 0) {
      fail("max_tokens", "'max_tokens' must be at least 1");
    }
    req.logprobs = get_bool(doc, "logprobs").value_or(false);
    if (auto k = get_int(doc, "top_logprobs", 0, limits.max_logprobs)) {
      req.top_logprobs = static_cast<int32_t>(*k);
      if (req.top_logprobs > 0 && !req.logprobs) {
        fail("top_logprobs", "'top_logprobs' requires 'logprobs' to be true");
      }
    }
    req.common.sampling.logprobs = req.logprobs ? req.top_logprobs : -1;
    req.chat.messages = parse_messages(doc);
    parse_tools(doc, req.chat);
    req.parallel_tool_calls = get_bool(doc, "parallel_tool_calls").value_or(true);
    req.chat.add_generation_prompt = get_bool(doc, "add_generation_prompt").value_or(true);
    req.chat.continue_final_message = get_bool(doc, "continue_final_message").value_or(false);
    if (req.chat.add_generation_prompt && req.chat.continue_final_message &&
        field(doc, "add_generation_prompt")) {
      fail("continue_final_message",
           "'continue_final_message' and 'add_generation_prompt' cannot both be true");
    }
    if (req.chat.continue_final_message) req.chat.add_generation_prompt = false;
    if (const json* kw = field(doc, "chat_template_kwargs")) {
      if (!kw->is_object()) fail_type("chat_template_kwargs", "an object", *kw);
      if (auto t = get_bool(*kw, "thinking", "chat_template_kwargs")) req.chat.thinking = *t;
      if (auto t = get_bool(*kw, "enable_thinking", "chat_template_kwargs")) req.chat.thinking = *t;
    }
    return req;
  });
}

ApiResult<TokenizeRequest> parse_tokenize_request(std::string_view body) {
  return guarded<TokenizeRequest>([&] {
    const json doc = parse_body(body);
    TokenizeRequest req;
    req.model = get_string(doc, "model");
    req.add_special_tokens = get_bool(doc, "add_special_tokens").value_or(true);
    req.return_token_strs = get_bool(doc, "return_token_strs").value_or(false);
    if (field(doc, "messages")) {
      ChatPromptInput chat;
      chat.messages = parse_messages(doc);
      parse_tools(doc, chat);
      chat.add_generation_prompt = get_bool(doc, "add_generation_prompt").value_or(true);
      if (const json* kw = field(doc, "chat_template_kwargs")) {
        if (!kw->is_object()) fail_type("chat_template_kwargs", "an object", *kw);
        if (auto t = get_bool(*kw, "thinking", "chat_template_kwargs")) chat.thinking = *t;
        if (auto t = get_bool(*kw, "enable_thinking", "chat_template_kwargs")) chat.thinking = *t;
      }
      req.chat = std::move(chat);
    } else {
      req.prompt = get_string(doc, "prompt");
      if (!req.prompt) fail("prompt", "'prompt' (or 'messages') is required");
    }
    return req;
  });
}

ApiResult<DetokenizeRequest> parse_detokenize_request(std::string_view body) {
  return guarded<DetokenizeRequest>([&] {
    const json doc = parse_body(body);
    DetokenizeRequest req;
    req.model = get_string(doc, "model");
    const json* t = field(doc, "tokens");
    if (!t) fail("tokens", "'tokens' is required");
    if (!t->is_array()) fail_type("tokens", "an array of integers", *t);
    req.tokens = parse_token_array(*t, "tokens");
    return req;
  });
}

}  // namespace moeserve::server
