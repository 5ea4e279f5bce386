#include "backend/cuda/cuda_bench.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/kernels.h"

namespace moeserve::cuda {
namespace {

// cudaMalloc'd bytes, freed on scope exit.
class DeviceBytes {
 public:
  explicit DeviceBytes(size_t bytes) { MS_CUDA_CHECK(cudaMalloc(&data_, bytes)); }
  ~DeviceBytes() { cudaFree(data_); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  [[nodiscard]] void* get() const { return data_; }

 private:
  void* data_ = nullptr;
};

}  // namespace

DeviceInfo device_info(int device) {
  cudaDeviceProp prop{};
  MS_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  DeviceInfo info;
  info.name = prop.name;
  info.compute_major = prop.major;
  info.compute_minor = prop.minor;
  info.sm_count = prop.multiProcessorCount;
  info.l2_bytes = prop.l2CacheSize;
  info.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  MS_CUDA_CHECK(cudaDriverGetVersion(&info.driver_version));
  MS_CUDA_CHECK(cudaRuntimeGetVersion(&info.runtime_version));
  return info;
}

Timing time_on_stream(const std::function<void(int)>& fn, void* stream, int warmup,
                      int iterations) {
  cudaStream_t s = as_cuda_stream(stream);
  for (int i = 0; i < warmup; ++i) fn(i);
  MS_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<cudaEvent_t> events(static_cast<size_t>(iterations) + 1);
  for (auto& e : events) MS_CUDA_CHECK(cudaEventCreate(&e));
  MS_CUDA_CHECK(cudaEventRecord(events[0], s));
  for (int i = 0; i < iterations; ++i) {
    fn(warmup + i);
    MS_CUDA_CHECK(cudaEventRecord(events[static_cast<size_t>(i) + 1], s));
  }
  MS_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<double> ms;
  for (int i = 0; i < iterations; ++i) {
    float t = 0;
    MS_CUDA_CHECK(cudaEventElapsedTime(&t, events[static_cast<size_t>(i)],
                                       events[static_cast<size_t>(i) + 1]));
    ms.push_back(t);
  }
  for (auto& e : events) cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front(), iterations};
}

double measure_copy_bandwidth_gbs(size_t bytes, void* stream) {
  DeviceBytes src(bytes);
  DeviceBytes dst(bytes);
  launch_fill_random({src.get(), DType::kU8, static_cast<int64_t>(bytes), 7, 0, 255}, stream);
  const Timing t = time_on_stream(
      [&](int) {
        MS_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice,
                                      as_cuda_stream(stream)));
      },
      stream, 3, 20);
  return 2.0 * static_cast<double>(bytes) / (t.median_ms * 1e-3) / 1e9;
}

double measure_gemm_tflops(GemmPrecision precision, int64_t size, void* stream) {
  const DType dtype = precision == GemmPrecision::kBf16 ? DType::kBF16 : DType::kF32;
  const size_t elem = precision == GemmPrecision::kBf16 ? 2 : 4;
  const size_t bytes = static_cast<size_t>(size * size) * elem;
  DeviceBytes a(bytes), b(bytes), c(bytes);
  launch_fill_random({a.get(), dtype, size * size, 11, -1.0f, 1.0f}, stream);
  launch_fill_random({b.get(), dtype, size * size, 12, -1.0f, 1.0f}, stream);
  CublasLtGemm gemm(stream);
  const LtGemmParams p{precision, a.get(), size, b.get(), size, true, c.get(),
                       size,      size,    size, size,    1.0f, 0.0f};
  const Timing t = time_on_stream([&](int) { gemm.run(p); }, stream, 3, 10);
  return 2.0 * static_cast<double>(size) * size * size / (t.median_ms * 1e-3) / 1e12;
}

}  // namespace moeserve::cuda
