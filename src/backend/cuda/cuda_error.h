// Failure reporting for CUDA and cuBLASLt calls: logs the call and the error, then aborts (like
// MS_CHECK: a failing CUDA call is a bug or a broken device, not a user error). Plain header.
#pragma once

namespace moeserve::cuda::detail {

[[noreturn]] void cuda_call_failed(const char* file, int line, const char* expr,
                                   const char* error_name, const char* error_string);

}  // namespace moeserve::cuda::detail
