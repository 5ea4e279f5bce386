#include "common/logging.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>

#include "common/check.h"

namespace moeserve {

void init_logging(std::string_view level) {
  std::string name(level);
  if (const char* env = std::getenv("MOESERVE_LOG_LEVEL"); env != nullptr && *env != '\0') {
    name = env;
  }
  auto logger = spdlog::stderr_color_mt("moeserve");
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
  spdlog::set_default_logger(logger);
  spdlog::level::level_enum lvl = spdlog::level::from_str(name);
  if (lvl == spdlog::level::off && name != "off") lvl = spdlog::level::info;
  spdlog::set_level(lvl);
}

namespace detail {
void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  std::fprintf(stderr, "CHECK failed at %s:%d: %s%s%s\n", file, line, cond, msg.empty() ? "" : ": ",
               msg.c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace detail

}  // namespace moeserve
