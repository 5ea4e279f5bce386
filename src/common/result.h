// Result<T>: a value or an Error (code + message). No exceptions cross module boundaries; errors
// carry a message a user can act on (e.g. the name of the missing tensor).
#pragma once

#include <string>
#include <utility>

#include <fmt/format.h>
#include <tl/expected.hpp>

namespace moeserve {

enum class ErrorCode {
  kInvalidArgument,  // bad input from a user or a file
  kNotFound,         // a file, tensor, field or key does not exist
  kOutOfRange,       // offsets/sizes/values outside what is allowed
  kUnimplemented,    // a feature or dtype this build does not support
  kResourceExhausted,
  kInternal,         // a bug: an invariant did not hold
  kIo,               // the OS refused (open, mmap, read, write)
  kCancelled,
};

const char* error_code_name(ErrorCode code);

struct Error {
  ErrorCode code = ErrorCode::kInternal;
  std::string message;

  [[nodiscard]] std::string to_string() const;
};

template <typename T>
using Result = tl::expected<T, Error>;
using Status = Result<void>;

[[nodiscard]] inline tl::unexpected<Error> make_error(ErrorCode code, std::string message) {
  return tl::unexpected<Error>(Error{code, std::move(message)});
}

template <typename... Args>
[[nodiscard]] tl::unexpected<Error> make_error(ErrorCode code, fmt::format_string<Args...> f,
                                               Args&&... args) {
  return tl::unexpected<Error>(Error{code, fmt::format(f, std::forward<Args>(args)...)});
}

[[nodiscard]] inline Status ok_status() { return {}; }

}  // namespace moeserve

// Propagate an error from an expression returning Result<T>/Status; evaluates to nothing.
#define MS_RETURN_IF_ERROR(expr)                                   \
  do {                                                             \
    auto _ms_status = (expr);                                      \
    if (!_ms_status) return tl::unexpected(_ms_status.error());    \
  } while (0)

#define MS_CONCAT_INNER(a, b) a##b
#define MS_CONCAT(a, b) MS_CONCAT_INNER(a, b)
// MS_ASSIGN_OR_RETURN(auto x, expr): unwraps a Result<T> into x or returns its error.
#define MS_ASSIGN_OR_RETURN(lhs, expr)                                       \
  auto MS_CONCAT(_ms_result_, __LINE__) = (expr);                            \
  if (!MS_CONCAT(_ms_result_, __LINE__))                                     \
    return tl::unexpected(MS_CONCAT(_ms_result_, __LINE__).error());         \
  lhs = std::move(*MS_CONCAT(_ms_result_, __LINE__))
