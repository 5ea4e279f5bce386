// Build identity (version, git commit) for --version and benchmark JSON. The values live in one
// generated translation unit so a new commit re-compiles that file only.
#pragma once

#include <string_view>

namespace moeserve {

[[nodiscard]] std::string_view build_version();
[[nodiscard]] std::string_view build_git_commit();

}  // namespace moeserve
