#include "tokenizer/default_paths.h"

#include <cstdlib>
#include <filesystem>

namespace moeserve::tokenizer {

std::string default_tokenizer_dir() {
  if (const char* env = std::getenv("MOESERVE_TOKENIZER_DIR"); env != nullptr && *env != '\0') {
    return env;
  }
  std::error_code ec;
  if (std::filesystem::exists("assets/tokenizer/tokenizer.json", ec)) return "assets/tokenizer";
  return std::string(MOESERVE_SOURCE_DIR) + "/assets/tokenizer";
}

}  // namespace moeserve::tokenizer
