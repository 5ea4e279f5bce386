// Device probe (not part of the build): would the grouped MXFP4 expert GEMM gain from FP8 wgmma?
// The production kernel (moe_grouped.cu, the swapped-operand "rs" kernel) decodes e2m1 weights to
// bf16 register fragments and runs bf16 wgmma (m64n192k16): its K loop takes ~1112 SM cycles per
// 64-wide tile at 192-row passes, of which the wgmma alone is ~768 (r12), and moe_rs_probe's
// "rs kperm" row at this shape takes 110.4 us (r13, call 1). This probe times the same shape
// (12 experts x 192 rows, n 2304, k 5120) through an FP8 K loop built the same way:
// - weights: each row refolded onto one power-of-two scale (kernels.h "Row-scaled FP8", as the
//   dense linears): e4m3 = e2m1 * 2^(s_b - R + 6) with R the row's largest block scale, so the
//   values are exact down to 11 binades below it (v41::e2m1x8_to_e4m3's PRMT tables; blocks
//   further below round through e2m1x8_to_e4m3_rounded); the row's 2^(R - 6 - 127) multiplies
//   the accumulator in the epilogue;
// - activations: e4m3 codes (row-scaled FP8; here random codes with scale 1), stored K-permuted
//   within each 64-wide block so that a thread's fragments of both k32 steps of the block are 8
//   consecutive packed weight bytes of one 32-wide scale block: column c = 32 s + 16 j + 4 t + e
//   (s, j < 2, t, e < 4) holds k = 16 t + 8 s + 4 j + e;
// - CTA = 128 weight rows (two warpgroups of 64) x 192 tokens, 128-wide K tiles (two 64-wide
//   blocks: 4 k32 steps), a 4-stage cp.async ring (activations [192][128 B] 128-byte swizzled,
//   weights [128][64 B], scales [128][4 B]), wgmma.m64n192k32.e4m3 with A from registers
//   (wgmma::e4m3_rs) and B from shared memory; the fragments of tile kt + 1 are decoded while
//   the wgmma of tile kt run (two register buffers).
// It checks the output against a plain fp32 reference kernel on the natural-order operands
// (max |err| / max |ref|, FP8 tensor-core sums: expect ~1e-4..1e-3, fail above 2e-3) and prints
// microseconds, TFLOP/s and a hash of the output bits. Variants: -DFP8P_NODECODE=1 decodes only
// tile 0 (the wgmma and loads alone), -DFP8P_NOWGMMA=1 skips the wgmma (the decode and loads
// alone; the output is then wrong and not checked).
//   nvcc -O3 -std=c++20 -arch=sm_90a -I src tools/device/moe_fp8_probe.cu -o /tmp/f8 && /tmp/f8
// Written in r13 without a device to run it on (compile-checked only).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/v41_device.cuh"
#include "backend/cuda/wgmma.cuh"
#include "probe_util.h"

#ifndef FP8P_NODECODE
#define FP8P_NODECODE 0
#endif
#ifndef FP8P_NOWGMMA
#define FP8P_NOWGMMA 0
#endif

namespace {

namespace wg = moeserve::cuda::wgmma;
namespace as = moeserve::cuda::async;
namespace v41 = moeserve::cuda::v41;

constexpr int kE = 12, kN = 2304, kK = 5120, kT = 192;
constexpr int kThreads = 256, kBW = 128, kBK = 128, kStages = 4;
constexpr int kBBytes = kT * kBK;                      // 24576: [192 tokens][128 B], swizzled
constexpr int kWBytes = kBW * kBK / 2;                 // 8192: [128 rows][64 B]
constexpr int kSBytes = kBW * 4;                       // 512: [128 rows][4 scale bytes]
constexpr int kStageBytes = 33792;                     // the three, rounded up to 1024
constexpr int kSmemBytes = kStages * kStageBytes + 1024;  // + base alignment
constexpr int kTiles = kK / kBK;                       // 40
static_assert(kBBytes + kWBytes + kSBytes <= kStageBytes && kStageBytes % 1024 == 0);

struct Params {
  const uint8_t* a;      // [E][T][K] e4m3, K-permuted per 64-wide block
  const uint8_t* w;      // [E][N][K / 2] packed e2m1 (element 2i in the low nibble)
  const uint8_t* ws;     // [E][N][K / 32] ue8m0
  const uint8_t* wref;   // [E][N] R - 6 (the row's fold reference)
  float* y;              // [E][T][N]
};

// Tile kt of expert e, CTA rows n0..n0+127, into stage `st`: activations (6 x 16 B per thread,
// 128-byte swizzle: chunk c of token row r at c ^ (r % 8)), weights (2 x 16 B), scales (4 B,
// threads 0..127).
__device__ __forceinline__ void load_tile(const Params& p, int e, int n0, int kt, uint8_t* st) {
  const uint32_t base = as::smem_addr(st);
  const uint8_t* a = p.a + (static_cast<int64_t>(e) * kT) * kK + kt * kBK;
#pragma unroll
  for (int i = 0; i < kT * 8 / kThreads; ++i) {
    const int q = threadIdx.x + i * kThreads, r = q >> 3, c = q & 7;
    as::copy16(base + r * kBK + ((c ^ (r & 7)) << 4), a + static_cast<int64_t>(r) * kK + c * 16,
               true);
  }
  const uint8_t* w = p.w + (static_cast<int64_t>(e) * kN + n0) * (kK / 2) + kt * (kBK / 2);
#pragma unroll
  for (int i = 0; i < kBW * 4 / kThreads; ++i) {
    const int q = threadIdx.x + i * kThreads, r = q >> 2, c = q & 3;
    as::copy16(base + kBBytes + r * (kBK / 2) + c * 16, w + static_cast<int64_t>(r) * (kK / 2) + c * 16,
               true);
  }
  if (threadIdx.x < kBW) {
    const uint8_t* s = p.ws + (static_cast<int64_t>(e) * kN + n0 + threadIdx.x) * (kK / 32) + kt * 4;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(base + kBBytes + kWBytes +
                                                                       threadIdx.x * 4),
                 "l"(s)
                 : "memory");
  }
  as::commit();
}

// Both k32 steps of 64-wide block h of the tile for weight row r (tile-local) of this thread:
// v[0] (step 2h) and v[1] (step 2h + 1), each {j = 0, j = 1} words.
__device__ __forceinline__ void decode_row(const uint8_t* st, int r, int t, int h, int ref,
                                           uint2 (&v)[2]) {
  const uint2 raw = *reinterpret_cast<const uint2*>(st + kBBytes + r * (kBK / 2) + 32 * h + 8 * t);
  const int sc = st[kBBytes + kWBytes + r * 4 + 2 * h + (t >> 1)];
  const int d = sc - ref;  // <= 6
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

// One K tile: the wgmma of tile kt on fragments f (decoded earlier), then, while they run, the
// refill of tile kt - 1's stage and the decode of tile kt + 1 into g. Two calls per loop
// iteration swap f and g, so the fragment arrays are indexed statically (registers, not local
// memory).
__device__ __forceinline__ void k_step(const Params& p, uint8_t* smem, int e, int n0, int kt,
                                       int r0, int t, int ref0, int ref1, float (&acc)[96],
                                       const uint32_t (&f)[4][4], uint32_t (&g)[4][4]) {
#if !FP8P_NOWGMMA
  wg::fence_operands(acc);
  wg::fence();
  const uint64_t desc = wg::desc_k_sw128(smem + (kt % kStages) * kStageBytes);
#pragma unroll
  for (int s = 0; s < 4; ++s) wg::e4m3_rs<192>(acc, f[s], desc + ((32 * s) >> 4), 1);
  wg::commit_group();
  wg::wait_group<1>();  // tile kt - 1 done: its fragments (g) and its stage are free
  wg::fence_operands(acc);
#else
#pragma unroll
  for (int s = 0; s < 4; ++s) acc[s] += __uint_as_float((f[s][0] ^ f[s][1] ^ f[s][2] ^ f[s][3]) & 0x3F800000u);
#endif
  // Tile kt + 1 has landed (this thread's copies; the barrier makes everyone's visible).
  as::wait<kStages - 3>();
  wg::fence_proxy_async_smem();
  __syncthreads();
  if (kt + kStages - 1 < kTiles)
    load_tile(p, e, n0, kt + kStages - 1, smem + ((kt + kStages - 1) % kStages) * kStageBytes);
  else
    as::commit();  // an empty group keeps the count
  if (kt + 1 < kTiles && (!FP8P_NODECODE || kt == 0)) {
    decode_tile(smem + ((kt + 1) % kStages) * kStageBytes, r0, t, ref0, ref1, g);
  } else if (FP8P_NODECODE) {
#pragma unroll
    for (int s = 0; s < 4; ++s)
#pragma unroll
      for (int i = 0; i < 4; ++i) g[s][i] = f[s][i];
  }
}

__global__ void __launch_bounds__(kThreads, 1) fp8_rs_kernel(Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // nvcc -arch=sm_90a also emits compute_90 PTX
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const int e = blockIdx.z, n0 = blockIdx.x * kBW;
  const int wgi = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int r0 = 64 * wgi + 16 * warp + g;  // tile-local weight rows r0, r0 + 8
  const int ref0 = p.wref[static_cast<int64_t>(e) * kN + n0 + r0];
  const int ref1 = p.wref[static_cast<int64_t>(e) * kN + n0 + r0 + 8];
  for (int s = 0; s < kStages - 1; ++s) load_tile(p, e, n0, s, smem + s * kStageBytes);
  float acc[96];
#pragma unroll
  for (int i = 0; i < 96; ++i) acc[i] = 0.0f;
  uint32_t f0[4][4], f1[4][4];
  as::wait<kStages - 2>();
  wg::fence_proxy_async_smem();
  __syncthreads();
  decode_tile(smem, r0, t, ref0, ref1, f0);
  static_assert(kTiles % 2 == 0);
#pragma unroll 1
  for (int kt = 0; kt < kTiles; kt += 2) {
    k_step(p, smem, e, n0, kt, r0, t, ref0, ref1, acc, f0, f1);
    k_step(p, smem, e, n0, kt + 1, r0, t, ref0, ref1, acc, f1, f0);
  }
#if !FP8P_NOWGMMA
  wg::wait_group<0>();
  wg::fence_operands(acc);
#endif
  // d[4i + 2h + v] = D[16 warp + g + 8h][8i + 2t + v]: weight row (tile-local) r0 + 8h, token
  // 8i + 2t + v; y[e][token][n0 + row] = D * 2^(R - 6 - 127).
  const float sc0 = ldexpf(1.0f, ref0 - 127), sc1 = ldexpf(1.0f, ref1 - 127);
  float* y = p.y + static_cast<int64_t>(e) * kT * kN + n0;
#pragma unroll
  for (int i = 0; i < 24; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int v = 0; v < 2; ++v)
        y[static_cast<int64_t>(8 * i + 2 * t + v) * kN + r0 + 8 * h] =
            acc[4 * i + 2 * h + v] * (h ? sc1 : sc0);
#endif
}

// y_ref[e][tok][n] = sum_k e2m1(w) 2^(s - 127) * e4m3(a_natural[k]) in fp32.
__global__ void reference_kernel(const uint8_t* an, const uint8_t* w, const uint8_t* ws, float* y) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<int64_t>(kE) * kT * kN) return;
  const int n = static_cast<int>(i % kN), tok = static_cast<int>((i / kN) % kT),
            e = static_cast<int>(i / (static_cast<int64_t>(kN) * kT));
  const uint8_t* wr = w + (static_cast<int64_t>(e) * kN + n) * (kK / 2);
  const uint8_t* sr = ws + (static_cast<int64_t>(e) * kN + n) * (kK / 32);
  const uint8_t* ar = an + (static_cast<int64_t>(e) * kT + tok) * kK;
  float acc = 0.0f;
  for (int k = 0; k < kK; ++k) {
    const float wv = v41::e2m1_decode((wr[k / 2] >> (4 * (k & 1))) & 0xFu) * v41::ue8m0_decode(sr[k / 32]);
    acc = fmaf(wv, v41::e4m3_decode(ar[k]), acc);
  }
  y[i] = acc;
}

uint64_t hash_floats(const std::vector<float>& h) {
  uint64_t x = 1469598103934665603ull;
  const auto* b = reinterpret_cast<const unsigned char*>(h.data());
  for (size_t i = 0; i < h.size() * 4; ++i) x = (x ^ b[i]) * 1099511628211ull;
  return x;
}

}  // namespace

int main() {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255), sc(120, 126);
  std::vector<uint8_t> w(static_cast<size_t>(kE) * kN * kK / 2), ws(static_cast<size_t>(kE) * kN * kK / 32);
  for (auto& b : w) b = static_cast<uint8_t>(byte(rng));
  for (auto& b : ws) b = static_cast<uint8_t>(sc(rng));
  // A few blocks far below their row (the rounded decode path): every 97th block 20 binades down.
  for (size_t i = 0; i < ws.size(); i += 97) ws[i] = static_cast<uint8_t>(ws[i] - 20);
  std::vector<uint8_t> wref(static_cast<size_t>(kE) * kN);
  for (size_t r = 0; r < wref.size(); ++r)
    wref[r] = static_cast<uint8_t>(*std::max_element(ws.begin() + r * (kK / 32), ws.begin() + (r + 1) * (kK / 32)) - 6);
  // Activations: random finite e4m3 codes (no NaN: 0x7F / 0xFF excluded), natural and permuted.
  std::vector<uint8_t> an(static_cast<size_t>(kE) * kT * kK), ap(an.size());
  for (auto& b : an) {
    do b = static_cast<uint8_t>(byte(rng));
    while ((b & 0x7F) == 0x7F);
  }
  for (size_t row = 0; row < an.size() / kK; ++row)
    for (int c = 0; c < kK; ++c) {
      const int blk = c & ~63, cc = c & 63;
      const int s = cc >> 5, j = (cc >> 4) & 1, t = (cc >> 2) & 3, e = cc & 3;
      ap[row * kK + c] = an[row * kK + blk + 16 * t + 8 * s + 4 * j + e];
    }
  Params p{up(ap), up(w), up(ws), up(wref), nullptr};
  const size_t outs = static_cast<size_t>(kE) * kT * kN;
  float *y = nullptr, *yr = nullptr;
  MS_CUDA_CHECK(cudaMalloc(&y, outs * 4));
  MS_CUDA_CHECK(cudaMalloc(&yr, outs * 4));
  p.y = y;
  const uint8_t* dan = up(an);
  reference_kernel<<<static_cast<unsigned>((outs + 255) / 256), 256>>>(dan, p.w, p.ws, yr);
  MS_CUDA_CHECK(cudaGetLastError());
  MS_CUDA_CHECK(cudaFuncSetAttribute(fp8_rs_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  const dim3 grid(kN / kBW, 1, kE);
  fp8_rs_kernel<<<grid, kThreads, kSmemBytes>>>(p);
  MS_CUDA_CHECK(cudaGetLastError());
  MS_CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  MS_CUDA_CHECK(cudaEventCreate(&e0));
  MS_CUDA_CHECK(cudaEventCreate(&e1));
  constexpr int kIters = 20;
  MS_CUDA_CHECK(cudaEventRecord(e0));
  for (int i = 0; i < kIters; ++i) fp8_rs_kernel<<<grid, kThreads, kSmemBytes>>>(p);
  MS_CUDA_CHECK(cudaEventRecord(e1));
  MS_CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0.0f;
  MS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  const double us = 1e3 * ms / kIters;
  std::vector<float> got(outs), ref(outs);
  MS_CUDA_CHECK(cudaMemcpy(got.data(), y, outs * 4, cudaMemcpyDeviceToHost));
  MS_CUDA_CHECK(cudaMemcpy(ref.data(), yr, outs * 4, cudaMemcpyDeviceToHost));
  double num = 0.0, den = 1e-30;
  size_t bad = 0;
  for (size_t i = 0; i < outs; ++i) {
    if (!std::isfinite(got[i])) ++bad;
    num = std::max(num, std::abs(static_cast<double>(got[i]) - ref[i]));
    den = std::max(den, std::abs(static_cast<double>(ref[i])));
  }
  const double err = bad ? INFINITY : num / den;
  const double tflops = 2.0 * kE * kT * static_cast<double>(kN) * kK / (us * 1e-6) / 1e12;
  std::printf("fp8 rs probe nodecode %d nowgmma %d: %d experts x %d rows, n %d k %d: %8.1f us %6.0f "
              "TFLOP/s  max|err|/max|ref| %.3g%s  hash %016llx\n",
              FP8P_NODECODE, FP8P_NOWGMMA, kE, kT, kN, kK, us, tflops, err,
              (FP8P_NODECODE || FP8P_NOWGMMA) ? " (variant: not checked)" : (err <= 2e-3 ? " ok" : " FAIL"),
              static_cast<unsigned long long>(hash_floats(got)));
  return (FP8P_NODECODE || FP8P_NOWGMMA || err <= 2e-3) ? 0 : 1;
}
