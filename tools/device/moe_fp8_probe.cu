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
// The K loop is moe_fp8.cuh's, shared with the production kernel (moe_grouped_fp8.cu).
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

#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/moe_fp8.cuh"
#include "probe_util.h"

#ifndef FP8P_NODECODE
#define FP8P_NODECODE 0
#endif
#ifndef FP8P_NOWGMMA
#define FP8P_NOWGMMA 0
#endif

namespace {

namespace mf = moeserve::cuda::mfp8;
namespace v41 = moeserve::cuda::v41;

constexpr int kE = 12, kN = 2304, kK = 5120, kT = mf::kTN;
[[maybe_unused]] constexpr int kTiles = kK / mf::kBK;  // 40

struct Params {
  const uint8_t* a;      // [E][T][K] e4m3, K-permuted per 64-wide block
  const uint8_t* w;      // [E][N][K / 2] packed e2m1 (element 2i in the low nibble)
  const uint8_t* ws;     // [E][N][K / 32] ue8m0
  const uint8_t* wref;   // [E][N] R - 6 (the row's fold reference)
  float* y;              // [E][T][N]
};

// The K loop of moe_fp8.cuh (the production kernel's, moe_grouped_fp8.cu) on one expert's 192
// rows and 128 weight rows, then the epilogue.
__global__ void __launch_bounds__(mf::kThreads, 1) fp8_rs_kernel(Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // nvcc -arch=sm_90a also emits compute_90 PTX
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const int e = blockIdx.z, n0 = blockIdx.x * mf::kBW;
  const int wgi = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int r0 = 64 * wgi + 16 * warp + g;  // tile-local weight rows r0, r0 + 8
  const int ref0 = p.wref[static_cast<int64_t>(e) * kN + n0 + r0];
  const int ref1 = p.wref[static_cast<int64_t>(e) * kN + n0 + r0 + 8];
  const uint8_t* a = p.a + static_cast<int64_t>(e) * kT * kK;
  const uint8_t* w = p.w + (static_cast<int64_t>(e) * kN + n0) * (kK / 2);
  const uint8_t* ws = p.ws + (static_cast<int64_t>(e) * kN + n0) * (kK / 32);
  const auto load = [&](int kt, uint8_t* st) {
    mf::load_a(st, a, kK, kT, kt);
    mf::load_w(st, w, ws, kK, kt);
  };
  float acc[96];
  mf::k_loop<FP8P_NODECODE != 0, FP8P_NOWGMMA != 0>(smem, kTiles, r0, t, ref0, ref1, acc, load);
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
  MS_CUDA_CHECK(cudaFuncSetAttribute(fp8_rs_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, mf::kSmemBytes));
  const dim3 grid(kN / mf::kBW, 1, kE);
  fp8_rs_kernel<<<grid, mf::kThreads, mf::kSmemBytes>>>(p);
  MS_CUDA_CHECK(cudaGetLastError());
  MS_CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  MS_CUDA_CHECK(cudaEventCreate(&e0));
  MS_CUDA_CHECK(cudaEventCreate(&e1));
  constexpr int kIters = 20;
  MS_CUDA_CHECK(cudaEventRecord(e0));
  for (int i = 0; i < kIters; ++i) fp8_rs_kernel<<<grid, mf::kThreads, mf::kSmemBytes>>>(p);
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
