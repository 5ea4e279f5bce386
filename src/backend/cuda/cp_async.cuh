// sm_80+ asynchronous global -> shared copies (cp.async) for the multistage pipelines of the
// hand-written kernels. Include only from src/backend/cuda/*.cu.
#pragma once

#include <cstdint>

namespace moeserve::cuda::async {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes through L2 only (no L1 allocation); valid == false writes 16 zero bytes instead.
__device__ __forceinline__ void copy16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}

// 4 bytes through L1 (cp.async.ca: the only form for fewer than 16 bytes); valid == false writes 4
// zero bytes instead. For records that are only 4-byte aligned (the 68-byte FP4 index keys).
__device__ __forceinline__ void copy4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}

__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace moeserve::cuda::async
