#include "tokenizer/python_json.h"

#include <fmt/format.h>

namespace moeserve::tokenizer {
namespace {

void dump(const nlohmann::ordered_json& v, std::string& out) {
  switch (v.type()) {
    case nlohmann::ordered_json::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, item] : v.items()) {
        if (!first) out += ", ";
        first = false;
        out += python_json_string(key);
        out += ": ";
        dump(item, out);
      }
      out += '}';
      return;
    }
    case nlohmann::ordered_json::value_t::array: {
      out += '[';
      for (size_t i = 0; i < v.size(); ++i) {
        if (i > 0) out += ", ";
        dump(v[i], out);
      }
      out += ']';
      return;
    }
    case nlohmann::ordered_json::value_t::string:
      out += python_json_string(v.get_ref<const std::string&>());
      return;
    case nlohmann::ordered_json::value_t::number_float: {
      const double d = v.get<double>();
      if (d != d) {
        out += "NaN";
      } else if (d == std::numeric_limits<double>::infinity()) {
        out += "Infinity";
      } else if (d == -std::numeric_limits<double>::infinity()) {
        out += "-Infinity";
      } else {
        out += v.dump();  // shortest round-trip form, like Python's float repr
      }
      return;
    }
    default:
      out += v.dump();  // null, booleans, integers
      return;
  }
}

}  // namespace

std::string python_json_string(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 2);
  out += '"';
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", c);
        } else {
          out += ch;
        }
    }
  }
  out += '"';
  return out;
}

std::string python_json_dumps(const nlohmann::ordered_json& value) {
  std::string out;
  dump(value, out);
  return out;
}

}  // namespace moeserve::tokenizer
