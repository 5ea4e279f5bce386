// The CUDA backend: the Backend interface on one device. It owns one non-blocking stream (all of
// its work is ordered on it), a cuBLASLt handle and workspace for GEMM; every other op is a kernel
// reached through the launchers of backend/cuda/kernels.h. Plain header: no CUDA types.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace moeserve {

// Visible CUDA devices (0 when the driver or runtime is missing or sees none; never fails).
[[nodiscard]] int cuda_device_count();
// A backend on device `device` (which must exist).
[[nodiscard]] std::unique_ptr<Backend> make_cuda_backend(int device);
// The backend's stream as an opaque cudaStream_t, for the launchers in kernels.h. `backend` must
// have been made by make_cuda_backend.
[[nodiscard]] void* cuda_backend_stream(Backend& backend);

}  // namespace moeserve
