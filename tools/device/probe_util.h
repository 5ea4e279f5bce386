// Shared by the standalone device probes (tools/device/*_probe.cu), which #include one kernel
// source directly and link nothing else: the CUDA error hook the launchers call, the
// programmatic-launch switch they read (kernels.h; off: the probes time plain launches) and a
// host -> device upload. Include after the kernel source.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace moeserve::cuda::detail {
void cuda_call_failed(const char* file, int line, const char* expr, const char* name,
                      const char* msg) {
  std::fprintf(stderr, "%s:%d %s: %s %s\n", file, line, expr, name, msg);
  std::abort();
}
}  // namespace moeserve::cuda::detail

namespace moeserve::cuda {
bool programmatic_launch() { return false; }
}  // namespace moeserve::cuda

template <typename T>
T* up(const std::vector<T>& v) {
  T* d = nullptr;
  MS_CUDA_CHECK(cudaMalloc(&d, v.size() * sizeof(T)));
  MS_CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
