// CUDA-only helpers shared by src/backend/cuda/*.cu and the backend's .cpp files: error checks,
// the opaque-stream cast, the kernel launch helper (programmatic dependent launch) and block
// reductions. Include only from src/backend/cuda/.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "backend/cuda/cuda_error.h"
#include "backend/cuda/kernels.h"

#define MS_CUDA_CHECK(expr)                                                         \
  do {                                                                              \
    const cudaError_t ms_cuda_err_ = (expr);                                        \
    if (ms_cuda_err_ != cudaSuccess) [[unlikely]]                                   \
      ::moeserve::cuda::detail::cuda_call_failed(__FILE__, __LINE__, #expr,         \
                                                 cudaGetErrorName(ms_cuda_err_),    \
                                                 cudaGetErrorString(ms_cuda_err_)); \
  } while (0)

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

// ---- Programmatic dependent launch (PDL; kernels.h set_programmatic_launch) ------------------
// A kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization may be scheduled
// before the previous kernel of its stream has completed, and nothing orders its memory accesses
// after that kernel's but griddepcontrol.wait. None of our kernels triggers its dependents early
// by default (the trigger is implicit, as each CTA exits), so a dependent grid is scheduled once
// every CTA of its predecessor has exited: its launch overlaps the predecessor's completion
// (memory flush, teardown) instead of following it.
// Built with -DMOESERVE_PDL_EARLY_TRIGGER, pdl_wait() also lets the dependents launch
// (griddepcontrol.launch_dependents) right after its wait returns, so the next kernel's CTAs are
// scheduled during this one's last wave and wait there. Measured (H200, 2026-11-30, DEP32 decode,
// docs/perf/forward-gpu-2026-11-30-r9.md): slower than the implicit trigger, 64x6 51.7 against
// 51.3 ms and 64x1 24.2 against 23.8 ms (likely: the waiting CTAs hold SM room the running tail
// and the shared expert's side stream could use); hence off.
//
// INVARIANT: every __global__ function launched through launch_kernel / launch_kernel_clusters
// calls pdl_wait() as its first statement, before any global memory access and before every
// early return. It then reads no stale data and overwrites nothing its predecessor still reads:
// the semantics of stream order. A kernel without it may run with the attribute on and race its
// predecessor. Check: every __global__ in src/backend/cuda/*.cu is followed by pdl_wait().

// Waits until the grids this one depends on programmatically have completed and their memory
// operations are visible to it; returns at once for a grid launched without the attribute.
// With MOESERVE_PDL_EARLY_TRIGGER it then lets this grid's dependents launch (see above); a no-op
// without programmatic dependents.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#ifdef MOESERVE_PDL_EARLY_TRIGGER
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
#endif
}

// Launches `kernel` (see the INVARIANT above) as <<<grid, block, smem, stream>>>(args...) would,
// through cudaLaunchKernelEx: with the PDL attribute while programmatic_launch() is on, and with
// a runtime thread-block cluster `cluster` when it has more than one block (kernels whose cluster
// is compiled in with __cluster_dims__ need none). PDL and a cluster may be combined (CUTLASS's
// ClusterLauncher sets both). Returns the launch's error: MS_CUDA_CHECK(launch_kernel(...)).
template <typename... Params, typename... Args>
[[nodiscard]] cudaError_t launch_kernel_clusters(void (*kernel)(Params...), dim3 grid, dim3 cluster,
                                                 dim3 block, size_t smem, cudaStream_t stream,
                                                 Args&&... args) {
  cudaLaunchAttribute attrs[2] = {};
  unsigned n = 0;
  if (cluster.x * cluster.y * cluster.z > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = cluster.x;
    attrs[n].val.clusterDim.y = cluster.y;
    attrs[n].val.clusterDim.z = cluster.z;
    ++n;
  }
  if (programmatic_launch()) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = n > 0 ? attrs : nullptr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

template <typename... Params, typename... Args>
[[nodiscard]] cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block,
                                        size_t smem, cudaStream_t stream, Args&&... args) {
  return launch_kernel_clusters(kernel, grid, dim3(1, 1, 1), block, smem, stream,
                                std::forward<Args>(args)...);
}

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
