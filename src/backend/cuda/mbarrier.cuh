// Hopper (sm_90) shared-memory mbarriers, on which the TMA copies of the hand-written kernels
// complete. Every address is a shared-space address (__cvta_generic_to_shared); a barrier is 8
// bytes, 8-byte aligned. Include only from src/backend/cuda/*.cu compiled for sm_90a.
//
// A barrier initialised with count 1 completes a phase when its one arrival (mbar_expect_tx, which
// also adds the bytes it expects) has happened and that many bytes of copies completing on it
// have landed; a waiter passes the phase with parity p once phase p has completed (the first
// phase has parity 0), and then sees the copied bytes.
#pragma once

#include <cstdint>

namespace moeserve::cuda {

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// After a thread's mbar_init calls, before the CTA synchronises: the initialisation becomes
// visible to the other threads and to the async proxy that completes copies on the barriers.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// One arrival that also expects `bytes` more bytes of copies to complete on the barrier.
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
}
}  // namespace moeserve::cuda
