#include "model/arch/registry.h"

#include <array>

#include "model/arch/deepseek_v41.h"

namespace moeserve::arch {

namespace {

Result<std::unique_ptr<CausalLm>> load_deepseek_v41(const std::filesystem::path& dir,
                                                    Backend& backend) {
  MS_ASSIGN_OR_RETURN(auto model, DeepseekV41Model::load(dir, backend));
  return std::unique_ptr<CausalLm>(std::move(model));
}

constexpr std::array<ArchitectureEntry, 1> kArchitectures = {{
    {"deepseek_v41", &load_deepseek_v41},
}};

}  // namespace

std::span<const ArchitectureEntry> architectures() { return kArchitectures; }

Result<std::unique_ptr<CausalLm>> load_causal_lm(const std::filesystem::path& dir,
                                                 Backend& backend) {
  MS_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(dir));
  for (const ArchitectureEntry& e : kArchitectures)
    if (e.model_type == config.model_type) return e.load(dir, backend);
  return make_error(ErrorCode::kUnimplemented, "{}: no architecture for model_type '{}'",
                    dir.string(), config.model_type);
}

Result<ForwardMode> forward_mode_from_name(std::string_view name) {
  if (name == "oracle") return ForwardMode::kOracle;
  if (name == "production") return ForwardMode::kProduction;
  return make_error(ErrorCode::kInvalidArgument, "mode '{}': expected oracle|production", name);
}

}  // namespace moeserve::arch
