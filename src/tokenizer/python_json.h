// JSON text exactly as Python's json.dumps(value, ensure_ascii=False) writes it (", " and ": "
// separators, non-ASCII kept, insertion order kept). DeepSeek's prompts embed tool schemas and
// argument values in this form, so the encoder must reproduce it byte for byte.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace moeserve::tokenizer {

[[nodiscard]] std::string python_json_dumps(const nlohmann::ordered_json& value);
[[nodiscard]] std::string python_json_string(std::string_view text);  // a quoted JSON string

}  // namespace moeserve::tokenizer
