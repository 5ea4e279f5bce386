// The architecture table: model_type (config.json) -> loader. One explicit list, no static
// registration.
#pragma once

#include <filesystem>
#include <memory>
#include <span>
#include <string_view>

#include "backend/backend.h"
#include "common/result.h"
#include "model/arch/causal_lm.h"

namespace moeserve::arch {

struct ArchitectureEntry {
  std::string_view model_type;
  Result<std::unique_ptr<CausalLm>> (*load)(const std::filesystem::path& dir, Backend& backend);
};

[[nodiscard]] std::span<const ArchitectureEntry> architectures();
// Reads DIR/config.json's model_type and loads the matching architecture.
[[nodiscard]] Result<std::unique_ptr<CausalLm>> load_causal_lm(const std::filesystem::path& dir,
                                                               Backend& backend);

}  // namespace moeserve::arch
