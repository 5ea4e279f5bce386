// Where the bundled tokenizer lives when a command is not given --model.
#pragma once

#include <string>

namespace moeserve::tokenizer {

// $MOESERVE_TOKENIZER_DIR if set; else ./assets/tokenizer if it exists; else the source tree's
// assets/tokenizer (baked in at configure time).
[[nodiscard]] std::string default_tokenizer_dir();

}  // namespace moeserve::tokenizer
