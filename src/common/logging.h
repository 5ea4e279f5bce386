// Logging through spdlog. One process-wide logger; level set from the CLI (--log-level) or the
// MOESERVE_LOG_LEVEL environment variable.
#pragma once

#include <string_view>

#include <spdlog/spdlog.h>

namespace moeserve {

// Sets up the default logger (stderr, "[time] [level] msg"). Unknown level names fall back to info.
void init_logging(std::string_view level = "info");

}  // namespace moeserve

#define MS_LOG_TRACE(...) SPDLOG_TRACE(__VA_ARGS__)
#define MS_LOG_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
#define MS_LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define MS_LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define MS_LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
