// CUDA-only helpers shared by src/backend/cuda/*.cu and the backend's .cpp files: error checks,
// the opaque-stream cast and block reductions. Include only from src/backend/cuda/.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_error.h"

#define MS_CUDA_CHECK(expr)                                                         \
  do {                                                                              \
    const cudaError_t ms_cuda_err_ = (expr);                                        \
    if (ms_cuda_err_ != cudaSuccess) [[unlikely]]                                   \
      ::moeserve::cuda::detail::cuda_call_failed(__FILE__, __LINE__, #expr,         \
                                                 cudaGetErrorName(ms_cuda_err_),    \
                                                 cudaGetErrorString(ms_cuda_err_)); \
  } while (0)

// After a kernel launch: a bad configuration shows up here (asynchronous faults at the next sync).
#define MS_CUDA_CHECK_LAUNCH() MS_CUDA_CHECK(cudaGetLastError())

namespace moeserve::cuda {

inline cudaStream_t as_cuda_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Attributes of the device current at the first call, queried once (launchers size grids with
// them; the backend drives one device per process).
inline int device_sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    MS_CUDA_CHECK(cudaGetDevice(&dev));
    MS_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}
inline int device_cc_major() {
  static const int n = [] {
    int dev = 0, v = 0;
    MS_CUDA_CHECK(cudaGetDevice(&dev));
    MS_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, dev));
    return v;
  }();
  return n;
}

#ifdef __CUDACC__

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// `scratch` holds 32 floats of shared memory; the call synchronises the block twice.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(t);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < warps ? scratch[lane] : -INFINITY;
  return warp_max(t);
}

// (value, index) argmax with ties to the lower index.
struct ArgMax {
  float value;
  int32_t index;
};

__device__ __forceinline__ bool argmax_better(float v, int32_t i, float bv, int32_t bi) {
  return v > bv || (v == bv && i < bi);
}

__device__ __forceinline__ ArgMax warp_argmax(ArgMax a) {
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, a.value, o);
    const int32_t i = __shfl_xor_sync(0xffffffffu, a.index, o);
    if (argmax_better(v, i, a.value, a.index)) a = {v, i};
  }
  return a;
}

#endif  // __CUDACC__

}  // namespace moeserve::cuda
