// The K loop of the FP8 grouped MXFP4 GEMM (moe_grouped_fp8.cu; its probe,
// tools/device/moe_fp8_probe.cu). Include only from .cu files compiled for sm_90a, inside
// `#if defined(__CUDA_ARCH_FEAT_SM90_ALL)` for the device code that calls the wgmma.
//
// D = W · A^T per expert with the weights as wgmma's register operand (as the bf16 "rs" kernel of
// moe_grouped.cu), but e4m3 x e4m3 (wgmma m64n192k32):
// - weights: each row refolded onto one power-of-two scale (kernels.h "Row-scaled FP8"): e4m3 =
//   e2m1 * 2^(s_b - ref) with ref = R - 6 (R the row's largest block scale; w_ref holds ref), so
//   values are exact down to 11 binades below the row's largest block (v41::e2m1x8_to_e4m3's PRMT
//   tables; blocks further below round through e2m1x8_to_e4m3_rounded); the row's weight is
//   e4m3 * 2^(ref - 127);
// - activations: row-scaled e4m3 codes, K-permuted within each 64-wide block
//   (ActQuantFp8RowsParams::kperm_fp8: column 32 s + 16 j + 4 t + e holds k = 16 t + 8 s + 4 j +
//   e), so that thread t's fragments of both k32 steps of a 64-wide block are the 8 packed weight
//   bytes 8 t .. 8 t + 7 of the block, under one scale (32-wide block t / 2);
// - CTA = 128 weight rows (two warpgroups of 64; thread (warp w, g = lane / 4, t = lane % 4) of
//   warpgroup q holds rows r0 = 64 q + 16 w + g and r0 + 8) x 192 activation rows, 128-wide K
//   tiles (4 k32 steps), a 4-stage cp.async ring per tile: activations [192][128 B] 128-byte
//   swizzled (chunk c of row r at c ^ (r % 8)), weights [128][64 B], scales [128][4 B];
// - per tile kt (k_step): the 4 wgmma of kt on fragments decoded earlier, commit, wait_group 1
//   (kt - 1 done), the barrier after tile kt + 1 landed, the refill of kt - 1's stage, then the
//   decode of tile kt + 1 into the other fragment buffer while the wgmma of kt run. Two k_step
//   calls per loop iteration swap the buffers, so the fragments stay in registers.
#pragma once

#include <cstdint>

#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/v41_device.cuh"
#include "backend/cuda/wgmma.cuh"

namespace moeserve::cuda::mfp8 {

constexpr int kThreads = 256;
constexpr int kBW = 128;  // weight rows per CTA
constexpr int kTN = 192;  // activation rows per pass
constexpr int kBK = 128;  // K per tile
constexpr int kStages = 4;
constexpr int kABytes = kTN * kBK;       // 24576: [192 rows][128 B], swizzled
constexpr int kWBytes = kBW * kBK / 2;   // 8192: [128 rows][64 B]
constexpr int kSBytes = kBW * 4;         // 512: [128 rows][4 scale bytes]
constexpr int kStageBytes = 33792;       // the three, rounded up to 1024
constexpr int kSmemBytes = kStages * kStageBytes + 1024;  // + base alignment
static_assert(kABytes + kWBytes + kSBytes <= kStageBytes && kStageBytes % 1024 == 0);

// Activation rows [0, rows) of the pass (row r at a + r * lda), K tile kt, into stage st; rows
// past `rows` are zero-filled (their outputs are not stored). 6 x 16 B per thread.
__device__ __forceinline__ void load_a(uint8_t* st, const uint8_t* a, int64_t lda, int rows,
                                       int kt) {
  const uint32_t base = async::smem_addr(st);
#pragma unroll
  for (int i = 0; i < kTN * 8 / kThreads; ++i) {
    const int q = threadIdx.x + i * kThreads, r = q >> 3, c = q & 7;
    const bool valid = r < rows;
    async::copy16(base + r * kBK + ((c ^ (r & 7)) << 4),
                  a + (valid ? r : 0) * lda + kt * kBK + c * 16, valid);
  }
}

// Weight rows [0, 128) of the CTA (row r at w + r * (K / 2), its scales at ws + r * (K / 32)), K
// tile kt: 2 x 16 B per thread, 4 scale bytes for threads 0..127.
__device__ __forceinline__ void load_w(uint8_t* st, const uint8_t* w, const uint8_t* ws, int64_t k,
                                       int kt) {
  const uint32_t base = async::smem_addr(st);
#pragma unroll
  for (int i = 0; i < kBW * 4 / kThreads; ++i) {
    const int q = threadIdx.x + i * kThreads, r = q >> 2, c = q & 3;
    async::copy16(base + kABytes + r * (kBK / 2) + c * 16, w + r * (k / 2) + kt * (kBK / 2) + c * 16,
                  true);
  }
  if (threadIdx.x < kBW) {
    const uint8_t* s = ws + threadIdx.x * (k / 32) + kt * 4;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(base + kABytes + kWBytes +
                                                                       threadIdx.x * 4),
                 "l"(s)
                 : "memory");
  }
}

// Both k32 steps of 64-wide block h of the tile for weight row r (tile-local) of this thread:
// v[0] (step 2h) and v[1] (step 2h + 1), each {j = 0, j = 1} words.
__device__ __forceinline__ void decode_row(const uint8_t* st, int r, int t, int h, int ref,
                                           uint2 (&v)[2]) {
  const uint2 raw = *reinterpret_cast<const uint2*>(st + kABytes + r * (kBK / 2) + 32 * h + 8 * t);
  const int d = static_cast<int>(st[kABytes + kWBytes + r * 4 + 2 * h + (t >> 1)]) - ref;  // <= 6
  if (d >= -5) {
    const uint32_t t0 = v41::kE2m1E4m3Lo + static_cast<uint32_t>(d) * 0x08080800u;
    const uint32_t t1 = v41::kE2m1E4m3Hi + static_cast<uint32_t>(d) * 0x08080808u;
    v[0] = v41::e2m1x8_to_e4m3(raw.x, t0, t1);
    v[1] = v41::e2m1x8_to_e4m3(raw.y, t0, t1);
  } else {
    v[0] = v41::e2m1x8_to_e4m3_rounded(raw.x, d);
    v[1] = v41::e2m1x8_to_e4m3_rounded(raw.y, d);
  }
}

// The 4 k32 steps' A fragments of a tile for this thread (rows r0 and r0 + 8).
__device__ __forceinline__ void decode_tile(const uint8_t* st, int r0, int t, int ref0, int ref1,
                                            uint32_t (&f)[4][4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint2 a[2], b[2];
    decode_row(st, r0, t, h, ref0, a);
    decode_row(st, r0 + 8, t, h, ref1, b);
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      f[2 * h + s][0] = a[s].x;  // row g, k32 columns 4t..4t+3 (j = 0)
      f[2 * h + s][1] = b[s].x;  // row g + 8
      f[2 * h + s][2] = a[s].y;  // row g, columns 16 + 4t.. (j = 1)
      f[2 * h + s][3] = b[s].y;
    }
  }
}

// One K tile (see the top): `load(kt2, stage)` issues tile kt2's copies into `stage` (without
// the commit). kNoDecode / kNoWgmma: the probe's variants (decode only tile 0; no wgmma).
template <bool kNoDecode = false, bool kNoWgmma = false, typename Load>
__device__ __forceinline__ void k_step(uint8_t* smem, int kt, int tiles, int r0, int t, int ref0,
                                       int ref1, float (&acc)[96], const uint32_t (&f)[4][4],
                                       uint32_t (&g)[4][4], const Load& load) {
  if constexpr (!kNoWgmma) {
    wgmma::fence_operands(acc);
    wgmma::fence();
    const uint64_t desc = wgmma::desc_k_sw128(smem + (kt % kStages) * kStageBytes);
#pragma unroll
    for (int s = 0; s < 4; ++s) wgmma::e4m3_rs<192>(acc, f[s], desc + ((32 * s) >> 4), 1);
    wgmma::commit_group();
    wgmma::wait_group<1>();  // tile kt - 1 done: its fragments (g) and its stage are free
    wgmma::fence_operands(acc);
  } else {
#pragma unroll
    for (int s = 0; s < 4; ++s)
      acc[s] += __uint_as_float((f[s][0] ^ f[s][1] ^ f[s][2] ^ f[s][3]) & 0x3F800000u);
  }
  // Tile kt + 1 has landed (this thread's copies; the barrier makes everyone's visible).
  async::wait<kStages - 3>();
  wgmma::fence_proxy_async_smem();
  __syncthreads();
  if (kt + kStages - 1 < tiles) load(kt + kStages - 1, smem + ((kt + kStages - 1) % kStages) * kStageBytes);
  async::commit();  // an empty group past the last tile keeps the count
  if (kt + 1 < tiles && (!kNoDecode || kt == 0)) {
    decode_tile(smem + ((kt + 1) % kStages) * kStageBytes, r0, t, ref0, ref1, g);
  } else if (kNoDecode) {
#pragma unroll
    for (int s = 0; s < 4; ++s)
#pragma unroll
      for (int i = 0; i < 4; ++i) g[s][i] = f[s][i];
  }
}

// The whole K loop of one CTA pass: the prologue (tiles 0 .. kStages - 2), the decode of tile 0,
// then k_step over the tiles (pairs, then an odd last one with the buffers as after the pairs),
// ending with every wgmma complete. acc is zeroed here.
template <bool kNoDecode = false, bool kNoWgmma = false, typename Load>
__device__ __forceinline__ void k_loop(uint8_t* smem, int tiles, int r0, int t, int ref0, int ref1,
                                       float (&acc)[96], const Load& load) {
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < tiles) load(s, smem + s * kStageBytes);
    async::commit();
  }
#pragma unroll
  for (int i = 0; i < 96; ++i) acc[i] = 0.0f;
  uint32_t f0[4][4], f1[4][4];
  async::wait<kStages - 2>();
  wgmma::fence_proxy_async_smem();
  __syncthreads();
  decode_tile(smem, r0, t, ref0, ref1, f0);
  int kt = 0;
#pragma unroll 1
  for (; kt + 1 < tiles; kt += 2) {
    k_step<kNoDecode, kNoWgmma>(smem, kt, tiles, r0, t, ref0, ref1, acc, f0, f1, load);
    k_step<kNoDecode, kNoWgmma>(smem, kt + 1, tiles, r0, t, ref0, ref1, acc, f1, f0, load);
  }
  if (kt < tiles) k_step<kNoDecode, kNoWgmma>(smem, kt, tiles, r0, t, ref0, ref1, acc, f0, f1, load);
  if constexpr (!kNoWgmma) {
    wgmma::wait_group<0>();
    wgmma::fence_operands(acc);
  }
}

}  // namespace moeserve::cuda::mfp8
