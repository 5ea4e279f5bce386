// The embedded model `moeserve serve` runs without --model: configs/embedded/config.json (the
// tiny §9 config with the bundled tokenizer's vocab, spec/model.md), compiled into the binary so
// the cached checkpoint depends only on the binary.
#pragma once

#include <string_view>

namespace moeserve::server {

inline constexpr std::string_view kEmbeddedModelName = "moeserve-tiny-random";

// configs/embedded/config.json, verbatim (baked in at configure time).
[[nodiscard]] std::string_view embedded_model_config_json();

}  // namespace moeserve::server
