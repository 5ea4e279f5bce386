// CHECK macros for invariants (bugs, not user errors): on failure they log file:line, the
// condition and an optional formatted message, then abort. User-facing errors use Result<T>.
#pragma once

#include <string>

#include <fmt/format.h>

namespace moeserve::detail {
[[noreturn]] void check_failed(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace moeserve::detail

#define MS_CHECK(cond)                                                        \
  do {                                                                        \
    if (!(cond)) [[unlikely]]                                                 \
      ::moeserve::detail::check_failed(__FILE__, __LINE__, #cond, {});        \
  } while (0)

#define MS_CHECK_MSG(cond, ...)                                                              \
  do {                                                                                       \
    if (!(cond)) [[unlikely]]                                                                \
      ::moeserve::detail::check_failed(__FILE__, __LINE__, #cond, fmt::format(__VA_ARGS__)); \
  } while (0)

#define MS_CHECK_EQ(a, b) MS_CHECK_MSG((a) == (b), "{} vs {}", (a), (b))
#define MS_CHECK_LT(a, b) MS_CHECK_MSG((a) < (b), "{} vs {}", (a), (b))
#define MS_CHECK_LE(a, b) MS_CHECK_MSG((a) <= (b), "{} vs {}", (a), (b))
#define MS_CHECK_GE(a, b) MS_CHECK_MSG((a) >= (b), "{} vs {}", (a), (b))

#ifndef NDEBUG
#define MS_DCHECK(cond) MS_CHECK(cond)
#else
#define MS_DCHECK(cond) \
  do {                  \
  } while (0)
#endif
