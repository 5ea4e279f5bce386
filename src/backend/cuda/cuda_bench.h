// Measuring on the device: CUDA-event timing, the two ceilings every op is compared with (HBM
// bandwidth from a large device-to-device copy; cuBLASLt matrix rates) and what the device is.
// Plain header (streams are opaque cudaStream_t).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "backend/cuda/cublaslt_gemm.h"

namespace moeserve::cuda {

struct DeviceInfo {
  std::string name;
  int compute_major = 0;
  int compute_minor = 0;
  int sm_count = 0;
  int64_t l2_bytes = 0;
  int64_t memory_bytes = 0;
  int driver_version = 0;
  int runtime_version = 0;
};
[[nodiscard]] DeviceInfo device_info(int device);

struct Timing {
  double median_ms = 0;
  double min_ms = 0;
  int iterations = 0;
};
// Runs `fn` (which enqueues work on `stream`) `warmup` times, then `iterations` times, each
// between two CUDA events; returns the median and minimum.
[[nodiscard]] Timing time_on_stream(const std::function<void(int iteration)>& fn, void* stream,
                                    int warmup, int iterations);

// Device-to-device copy of `bytes` (random contents): GB/s counting bytes read plus written.
[[nodiscard]] double measure_copy_bandwidth_gbs(size_t bytes, void* stream);
// cuBLASLt M=N=K=`size` product on random data: TFLOP/s.
[[nodiscard]] double measure_gemm_tflops(GemmPrecision precision, int64_t size, void* stream);

}  // namespace moeserve::cuda
