// The backend registry: one explicit table (no static-initialisation registration).
#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"

#ifdef MOESERVE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace moeserve {

std::string_view backend_kind_name(BackendKind kind) {
  switch (kind) {
    case BackendKind::kCpu: return "cpu";
    case BackendKind::kCuda: return "cuda";
  }
  return "unknown";
}

std::vector<BackendKind> available_backends() {
  std::vector<BackendKind> kinds = {BackendKind::kCpu};
#ifdef MOESERVE_HAVE_CUDA
  if (cuda_device_count() > 0) kinds.push_back(BackendKind::kCuda);
#endif
  return kinds;
}

Result<std::unique_ptr<Backend>> create_backend(BackendKind kind) {
  switch (kind) {
    case BackendKind::kCpu:
      return make_cpu_backend();
    case BackendKind::kCuda:
#ifdef MOESERVE_HAVE_CUDA
      if (cuda_device_count() == 0) return make_error(ErrorCode::kNotFound, "no CUDA device is visible");
      return make_cuda_backend(0);
#else
      return make_error(ErrorCode::kUnimplemented, "this build has no CUDA backend (configure with the cuda-release preset)");
#endif
  }
  return make_error(ErrorCode::kInvalidArgument, "unknown backend kind");
}

Result<std::unique_ptr<Backend>> create_backend(std::string_view name) {
  if (name == "cpu") return create_backend(BackendKind::kCpu);
  if (name == "cuda") return create_backend(BackendKind::kCuda);
  return make_error(ErrorCode::kInvalidArgument, "unknown backend '{}' (expected cpu or cuda)", name);
}

}  // namespace moeserve
