#include "common/result.h"

namespace moeserve {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kNotFound: return "not_found";
    case ErrorCode::kOutOfRange: return "out_of_range";
    case ErrorCode::kUnimplemented: return "unimplemented";
    case ErrorCode::kResourceExhausted: return "resource_exhausted";
    case ErrorCode::kInternal: return "internal";
    case ErrorCode::kIo: return "io";
    case ErrorCode::kCancelled: return "cancelled";
  }
  return "unknown";
}

std::string Error::to_string() const { return fmt::format("{}: {}", error_code_name(code), message); }

}  // namespace moeserve
