// Hopper warpgroup MMA (sm_90a wgmma.mma_async) used by the hand-written kernels: bf16 operands
// from shared memory through matrix descriptors, fp32 accumulators in registers. A warpgroup is 4
// consecutive warps (128 threads, the first warp's id a multiple of 4); every wrapper here must be
// executed by all 128 threads together. Include only from src/backend/cuda/*.cu compiled for
// sm_90a.
//
// Accumulator fragment of m64nNk16 (f32), thread `lane` of warp w of the warpgroup, g = lane / 4,
// t = lane % 4: d[4i + 2h + v] is D[16w + g + 8h][8i + 2t + v] for i < N / 8, h, v in {0, 1}
// (the mma.sync m16n8 C layout repeated over N / 8 column blocks, warp w owning rows 16w..16w+15).
#pragma once

#include <cstdint>

namespace moeserve::cuda::wgmma {

// Shared-memory matrix descriptor (PTX ISA, "matrix descriptor" of warpgroup-level MMA):
//   bits  0-13  start address >> 4
//   bits 16-29  leading-dimension byte offset >> 4 (unused for K-major swizzled layouts)
//   bits 32-45  stride-dimension byte offset >> 4: from one 8-row core-matrix group to the next
//   bits 49-51  base offset (0: every swizzle atom starts 1024-byte aligned)
//   bits 62-63  swizzle: 0 none, 1 128 B, 2 64 B, 3 32 B
// desc_k_sw128 builds K-major 128-byte-swizzle descriptors (MN-major ones: desc_mn_sw128 below):
// the operand is rows of 64 bf16 (128 B) one after the other, 8 rows (1024 B, 1024-aligned)
// forming one swizzle atom in which the 16-byte chunk c of row r sits at chunk c ^ (r % 8). A K
// slice of 16 elements (32 B) at column 16k of that 64-wide panel is addressed by advancing the
// start address by 32k bytes: the hardware applies the XOR on the address bits, so the atom
// alignment is what matters, not the start.
__device__ __forceinline__ uint64_t desc_k_sw128(const void* smem) {
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  constexpr uint64_t kLbo = 1;          // ignored for swizzled K-major
  constexpr uint64_t kSbo = 1024 >> 4;  // 8 rows x 128 B
  return static_cast<uint64_t>((addr >> 4) & 0x3FFFu) | (kLbo << 16) | (kSbo << 32) |
         (uint64_t{1} << 62);
}

// Orders this thread's earlier register and shared-memory accesses before the wgmma that follow
// (required before the first wgmma of a group that touches accumulators written by other code).
__device__ __forceinline__ void fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void commit_group() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Waits until at most kPending committed groups of this warpgroup are still running.
template <int kPending>
__device__ __forceinline__ void wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Generic-proxy shared-memory writes (st.shared) become visible to the async proxy that wgmma
// reads through: each writing thread runs this after its stores, then the CTA synchronises.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Pins accumulator registers in program order against the asynchronous wgmma: the compiler sees
// each register read and written here, so reads placed after wait_group cannot be hoisted above it.
template <int kN>
__device__ __forceinline__ void fence_operands(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

template <int kN>
struct Shape {};

// Operand lists the wrappers below share: MS_WGMMA_D<n> is the accumulator vector's registers
// "%0, ..., %<n-1>" of the PTX string, MS_WGMMA_ACC<n>(c, d) the matching constraints c(d[0]),
// ..., c(d[n - 1]) (c is "+f", or "=f" where the old values are not read). The operands after
// the accumulators are numbered from n.
#define MS_WGMMA_D16 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11" \
  ", %12, %13, %14, %15"
#define MS_WGMMA_D32 \
  MS_WGMMA_D16 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27" \
  ", %28, %29, %30, %31"
#define MS_WGMMA_D64 \
  MS_WGMMA_D32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43" \
  ", %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55" \
  ", %56, %57, %58, %59, %60, %61, %62, %63"
#define MS_WGMMA_D96 \
  MS_WGMMA_D64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75" \
  ", %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87" \
  ", %88, %89, %90, %91, %92, %93, %94, %95"
#define MS_WGMMA_D112 \
  MS_WGMMA_D96 ", %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107" \
  ", %108, %109, %110, %111"
#define MS_WGMMA_D128 \
  MS_WGMMA_D112 ", %112, %113, %114, %115, %116, %117, %118, %119" \
  ", %120, %121, %122, %123, %124, %125, %126, %127"
#define MS_WGMMA_ACC8(c, d, i) \
  c(d[i]), c(d[i + 1]), c(d[i + 2]), c(d[i + 3]), c(d[i + 4]), c(d[i + 5]), c(d[i + 6]), c(d[i + 7])
#define MS_WGMMA_ACC16(c, d) MS_WGMMA_ACC8(c, d, 0), MS_WGMMA_ACC8(c, d, 8)
#define MS_WGMMA_ACC32(c, d) MS_WGMMA_ACC16(c, d), MS_WGMMA_ACC8(c, d, 16), MS_WGMMA_ACC8(c, d, 24)
#define MS_WGMMA_ACC64(c, d) \
  MS_WGMMA_ACC32(c, d), MS_WGMMA_ACC8(c, d, 32), MS_WGMMA_ACC8(c, d, 40), \
      MS_WGMMA_ACC8(c, d, 48), MS_WGMMA_ACC8(c, d, 56)
#define MS_WGMMA_ACC96(c, d) \
  MS_WGMMA_ACC64(c, d), MS_WGMMA_ACC8(c, d, 64), MS_WGMMA_ACC8(c, d, 72), \
      MS_WGMMA_ACC8(c, d, 80), MS_WGMMA_ACC8(c, d, 88)
#define MS_WGMMA_ACC112(c, d) \
  MS_WGMMA_ACC96(c, d), MS_WGMMA_ACC8(c, d, 96), MS_WGMMA_ACC8(c, d, 104)
#define MS_WGMMA_ACC128(c, d) \
  MS_WGMMA_ACC112(c, d), MS_WGMMA_ACC8(c, d, 112), MS_WGMMA_ACC8(c, d, 120)

// One wrapper per accumulator count: bf16 operands, A and B from shared memory (SS) or A from
// registers (RS), both K-major (no transpose); P0.. are the operand numbers after the
// accumulators.
#define MS_WGMMA_BF16_SS(N, NACC, P0, P1, P2)                                                    \
  __device__ __forceinline__ void bf16_ss(float (&d)[NACC], uint64_t desc_a, uint64_t desc_b,   \
                                          int accumulate, Shape<N>) {                          \
    asm volatile("{\n.reg .pred p;\n"                                                          \
                 "setp.ne.b32 p, %" #P2 ", 0;\n"                                               \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 "                    \
                 "{" MS_WGMMA_D##NACC "}, %" #P0 ", %" #P1 ", p, 1, 1, 0, 0;\n}\n"              \
                 : MS_WGMMA_ACC##NACC("+f", d)                                                 \
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate));                                 \
  }
#define MS_WGMMA_BF16_RS(N, NACC, P0, P1, P2, P3, P4, P5)                                        \
  __device__ __forceinline__ void bf16_rs(float (&d)[NACC], const uint32_t (&a)[4],            \
                                          uint64_t desc_b, int accumulate, Shape<N>) {         \
    asm volatile("{\n.reg .pred p;\n"                                                          \
                 "setp.ne.b32 p, %" #P5 ", 0;\n"                                               \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 "                    \
                 "{" MS_WGMMA_D##NACC "}, {%" #P0 ", %" #P1 ", %" #P2 ", %" #P3 "}, %" #P4       \
                 ", p, 1, 1, 0;\n}\n"                                                           \
                 : MS_WGMMA_ACC##NACC("+f", d)                                                 \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));  \
  }

// d (+)= A · B^T for one k16 step: A 64 x 16 and B kN x 16, both bf16, both K-major in shared
// memory (descriptors above; no transpose), fp32 accumulators d[kN / 2]. accumulate == 0 starts
// from zero (scale-d false).
MS_WGMMA_BF16_SS(64, 32, 32, 33, 34)
MS_WGMMA_BF16_SS(128, 64, 64, 65, 66)
MS_WGMMA_BF16_SS(192, 96, 96, 97, 98)
MS_WGMMA_BF16_SS(224, 112, 112, 113, 114)  // moe_grouped.cu's 224-row passes, MOESERVE_RS_SS
MS_WGMMA_BF16_SS(256, 128, 128, 129, 130)

template <int kN>
__device__ __forceinline__ void bf16_ss(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b,
                                        int accumulate) {
  bf16_ss(d, desc_a, desc_b, accumulate, Shape<kN>{});
}

// d (+)= A · B^T for one k16 step, bf16 operands: A (64 x 16) from registers in the m16n8k16
// A-fragment layout per warp (a[0]: rows g, k 2t..2t+1; a[1]: rows g + 8; a[2]: rows g, k 2t + 8..;
// a[3]: rows g + 8, k 2t + 8..; warp w of the warpgroup owns rows 16w..16w+15), B (kN x 16)
// K-major in shared memory (desc_k_sw128; no transpose), fp32 accumulators d[kN / 2].
// accumulate == 0 starts from zero.
MS_WGMMA_BF16_RS(64, 32, 32, 33, 34, 35, 36, 37)
MS_WGMMA_BF16_RS(128, 64, 64, 65, 66, 67, 68, 69)
MS_WGMMA_BF16_RS(192, 96, 96, 97, 98, 99, 100, 101)
MS_WGMMA_BF16_RS(224, 112, 112, 113, 114, 115, 116, 117)
MS_WGMMA_BF16_RS(256, 128, 128, 129, 130, 131, 132, 133)

template <int kN>
__device__ __forceinline__ void bf16_rs(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                        int accumulate) {
  bf16_rs(d, a, desc_b, accumulate, Shape<kN>{});
}

// ---- e4m3 operands, A and B from shared memory (the FP8 indexer scores, v41_select.cu) ----------
//
// d (+)= A · B^T for one k32 step: A 64 x 32 and B kN x 32, both e4m3, both K-major in shared
// memory (desc_k_sw128: a 128-byte swizzle row holds 128 e4m3 values; k32 step s starts 32 s bytes
// into the row), fp32 accumulators d[kN / 2] in the bf16_ss layout. accumulate == 0 starts from
// zero. NOTE: Hopper sums each k32 step's 32 products together with d (accumulate == 1) aligned
// to the largest exponent with ~14 significant bits, truncating (fp8_wgmma_gemm.cu says more).
#define MS_WGMMA_E4M3_SS(N, NACC, P0, P1, P2)                                                    \
  __device__ __forceinline__ void e4m3_ss(float (&d)[NACC], uint64_t desc_a, uint64_t desc_b,   \
                                          int accumulate, Shape<N>) {                          \
    asm volatile("{\n.reg .pred p;\n"                                                          \
                 "setp.ne.b32 p, %" #P2 ", 0;\n"                                               \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 "                    \
                 "{" MS_WGMMA_D##NACC "}, %" #P0 ", %" #P1 ", p, 1, 1;\n}\n"                    \
                 : MS_WGMMA_ACC##NACC("+f", d)                                                 \
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate));                                 \
  }
MS_WGMMA_E4M3_SS(32, 16, 16, 17, 18)
MS_WGMMA_E4M3_SS(64, 32, 32, 33, 34)
MS_WGMMA_E4M3_SS(128, 64, 64, 65, 66)
MS_WGMMA_E4M3_SS(192, 96, 96, 97, 98)
MS_WGMMA_E4M3_SS(256, 128, 128, 129, 130)

template <int kN>
__device__ __forceinline__ void e4m3_ss(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b,
                                        int accumulate) {
  e4m3_ss(d, desc_a, desc_b, accumulate, Shape<kN>{});
}

// d (+)= A · B^T for one k32 step, e4m3 operands: A (64 x 32) from registers in the 8-bit
// A-fragment layout (bf16_rs's with each bf16 pair widened to four bytes: a[0]: row g, k 4t..4t+3;
// a[1]: row g + 8; a[2]: row g, k 16 + 4t..; a[3]: row g + 8, k 16 + 4t..; warp w of the
// warpgroup owns rows 16w..16w+15), B (kN x 32) K-major in shared memory (desc_k_sw128; a k32
// step starts 32 s bytes into the 128-byte row), fp32 accumulators d[kN / 2]. Used by the FP8
// grouped-GEMM probe (tools/device/moe_fp8_probe.cu).
#define MS_WGMMA_E4M3_RS(N, NACC, P0, P1, P2, P3, P4, P5)                                        \
  __device__ __forceinline__ void e4m3_rs(float (&d)[NACC], const uint32_t (&a)[4],            \
                                          uint64_t desc_b, int accumulate, Shape<N>) {         \
    asm volatile("{\n.reg .pred p;\n"                                                          \
                 "setp.ne.b32 p, %" #P5 ", 0;\n"                                               \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 "                    \
                 "{" MS_WGMMA_D##NACC "}, {%" #P0 ", %" #P1 ", %" #P2 ", %" #P3 "}, %" #P4       \
                 ", p, 1, 1;\n}\n"                                                              \
                 : MS_WGMMA_ACC##NACC("+f", d)                                                 \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));  \
  }
MS_WGMMA_E4M3_RS(192, 96, 96, 97, 98, 99, 100, 101)

template <int kN>
__device__ __forceinline__ void e4m3_rs(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                        int accumulate) {
  e4m3_rs(d, a, desc_b, accumulate, Shape<kN>{});
}

// ---- fp16 operands (sparse attention, v41_attention_wgmma.cu) -----------------------------------
//
// MN-major 128-byte-swizzle descriptor (an operand whose MN dimension is contiguous in shared
// memory; used with imm-trans = 1). Canonical layout, in 16-bit elements: MN index
// e + 8 c + 64 j (e < 8, chunk c < 8) and K index r + 8 k (r < 8) sit at byte
//   j * LBO + k * SBO + r * 128 + ((c ^ r) * 16) + 2 e
// i.e. swizzle atoms of 8 K-rows x 64 MN-elements (1024 B, 1024-aligned), the 16-byte chunks of
// K-row r XORed with r % 8 as for K-major. LBO (bits 16-29) is the byte stride from one 64-element
// MN block to the next, SBO (bits 32-45) from one 8-row K group to the next.
__device__ __forceinline__ uint64_t desc_mn_sw128(uint32_t smem_addr, uint32_t lbo_bytes,
                                                  uint32_t sbo_bytes) {
  return static_cast<uint64_t>((smem_addr >> 4) & 0x3FFFu) |
         (static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16) |
         (static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFFu) << 32) | (uint64_t{1} << 62);
}

// desc_k_sw128 from a shared-space address (what __cvta_generic_to_shared returns).
__device__ __forceinline__ uint64_t desc_k_sw128_addr(uint32_t smem_addr) {
  return static_cast<uint64_t>((smem_addr >> 4) & 0x3FFFu) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

// d (+)= A · B^T, m64n32k16, fp16 operands, both K-major in shared memory (desc_k_sw128), fp32
// accumulators d[16].
__device__ __forceinline__ void f16_ss_n32(float (&d)[16], uint64_t desc_a, uint64_t desc_b,
                                           int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
      "{" MS_WGMMA_D16 "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : MS_WGMMA_ACC16("+f", d)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// The same with scale-d = 0 (d = A · B^T): d is only written, so no earlier definition of the
// accumulator registers has to be kept (ptxas otherwise serialises the wgmma pipeline).
__device__ __forceinline__ void f16_ss_n32_zero(float (&d)[16], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %18, 0;\n"  // false: scale-d = 0
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
      "{" MS_WGMMA_D16 "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : MS_WGMMA_ACC16("=f", d)
      : "l"(desc_a), "l"(desc_b), "r"(0));
}

// d (+)= A · B, m64n256k16, fp16 operands: A (64 x 16) from registers in the m16n8k16 A-fragment
// layout per warp (a[0]: rows g, k 2t..2t+1; a[1]: rows g + 8; a[2]: rows g, k 2t + 8..; a[3]:
// rows g + 8, k 2t + 8..; warp w of the warpgroup owns rows 16w..16w+15), B (16 x 256) MN-major
// in shared memory (desc_mn_sw128; imm-trans-b = 1), fp32 accumulators d[128] (layout above).
__device__ __forceinline__ void f16_rs_n256_tb(float (&d)[128], const uint32_t (&a)[4],
                                               uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
      "{" MS_WGMMA_D128 "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      : MS_WGMMA_ACC128("+f", d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

// ---- fp16 operands for the warp-specialised attention (v41_attention_wgmma.cu, attn_ws) --------
//
// d (+)= A · B^T, m64n64k16, fp16 operands, both K-major in shared memory (desc_k_sw128), fp32
// accumulators d[32].
__device__ __forceinline__ void f16_ss_n64(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{" MS_WGMMA_D32 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : MS_WGMMA_ACC32("+f", d)
      : "l"(desc_a), "l"(desc_b), "r"(1));
}
// The same with scale-d = 0 (d = A · B^T; d only written, see f16_ss_n32_zero).
__device__ __forceinline__ void f16_ss_n64_zero(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{" MS_WGMMA_D32 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : MS_WGMMA_ACC32("=f", d)
      : "l"(desc_a), "l"(desc_b), "r"(0));
}
// d += A · B, m64n256k16, fp16 operands: A (64 x 16) K-major in shared memory (desc_k_sw128), B
// (16 x 256) MN-major in shared memory (desc_mn_sw128; imm-trans-b = 1), fp32 accumulators d[128].
__device__ __forceinline__ void f16_ss_n256_tb(float (&d)[128], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
      "{" MS_WGMMA_D128 "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
      : MS_WGMMA_ACC128("+f", d)
      : "l"(desc_a), "l"(desc_b), "r"(1));
}

// The m64n128k16 forms of the two above (d[64]: half of a 256-column accumulator, whose first
// 64 registers are columns 0..127): the 512-thread kernel's launch gives 128 registers per thread,
// too few for ptxas to place an n256 instruction's 128 accumulators, though setmaxnreg raises the
// consumers' budget above that.
__device__ __forceinline__ void f16_rs_n128_tb(float (&d)[64], const uint32_t (&a)[4],
                                               uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{" MS_WGMMA_D64 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : MS_WGMMA_ACC64("+f", d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}
__device__ __forceinline__ void f16_ss_n128_tb(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{" MS_WGMMA_D64 "}, %64, %65, p, 1, 1, 0, 1;\n}\n"
      : MS_WGMMA_ACC64("+f", d)
      : "l"(desc_a), "l"(desc_b), "r"(1));
}

}  // namespace moeserve::cuda::wgmma

#undef MS_WGMMA_BF16_RS
#undef MS_WGMMA_BF16_SS
#undef MS_WGMMA_E4M3_SS
