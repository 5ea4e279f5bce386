// Device probe (not part of the build): times launch_grouped_mxfp4_gemm on the decode shapes of
// a DEP32 rank (12 local experts, ~6 rows each; w1/w3 N 2304 K 5120, w2 N 5120 K 2304) and
// prints microseconds and HBM GB/s. Two weight sets alternate so L2 does not hold the weights.
// Variants of the skinny kernel's split heuristics compile with -DMOESERVE_SKINNY_STEPS=S
// -DMOESERVE_SKINNY_MIN_CTAS=C:
//   nvcc -O3 -std=c++20 -arch=sm_90a -I src tools/device/gemm_probe.cu -o /tmp/gemm_probe && /tmp/gemm_probe
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "backend/cuda/moe_grouped.cu"
#include "probe_util.h"

using namespace moeserve::cuda;

int main() {
  std::mt19937 rng(7);
  const int experts = 12;
  for (int rows_per : {6, 12}) {
    for (const auto [n, k] : {std::pair<int64_t, int64_t>{2304, 5120}, {5120, 2304}}) {
      const int64_t rows = experts * rows_per;
      std::vector<uint16_t> a(static_cast<size_t>(rows * k));
      for (auto& x : a) x = static_cast<uint16_t>(0x3C00 + rng() % 0x800);  // bf16 ~[0.0078, 2)
      std::vector<int32_t> off(experts + 1);
      for (int e = 0; e <= experts; ++e) off[static_cast<size_t>(e)] = e * rows_per;
      const uint8_t** wp[2];
      const uint8_t** sp[2];
      for (int set = 0; set < 2; ++set) {
        std::vector<const uint8_t*> w(experts), s(experts);
        for (int e = 0; e < experts; ++e) {
          std::vector<uint8_t> wb(static_cast<size_t>(n * k / 2)), sb(static_cast<size_t>(n * k / 32));
          for (auto& x : wb) x = static_cast<uint8_t>(rng());
          for (auto& x : sb) x = static_cast<uint8_t>(118 + rng() % 8);
          w[static_cast<size_t>(e)] = up(wb);
          s[static_cast<size_t>(e)] = up(sb);
        }
        wp[set] = up(w);
        sp[set] = up(s);
      }
      float* y = nullptr;
      MS_CUDA_CHECK(cudaMalloc(&y, static_cast<size_t>(rows * n) * 4));
      GroupedMxfp4GemmParams p;
      p.a = up(a);
      p.lda = k;
      p.offsets = up(off);
      p.num_experts = experts;
      p.max_rows = 384;
      p.y = y;
      p.ldy = n;
      p.n = n;
      p.k = k;
      p.rows_hint = 6;
      const auto launch = [&](int i) {
        p.w = wp[i & 1];
        p.w_scale = sp[i & 1];
        launch_grouped_mxfp4_gemm(p, nullptr);
      };
      for (int i = 0; i < 4; ++i) launch(i);
      cudaEvent_t e0, e1;
      cudaEventCreate(&e0);
      cudaEventCreate(&e1);
      const int iters = 40;
      cudaEventRecord(e0);
      for (int i = 0; i < iters; ++i) launch(i);
      cudaEventRecord(e1);
      MS_CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      const double us = 1000.0 * ms / iters;
      const double bytes = experts * (n * k / 2.0 + n * k / 32.0);
      std::printf("steps %d min_ctas %d rows/expert %2d n %5ld k %5ld: %7.1f us %7.0f GB/s\n",
                  MOESERVE_SKINNY_STEPS, MOESERVE_SKINNY_MIN_CTAS, rows_per,
                  static_cast<long>(n), static_cast<long>(k), us, bytes / us * 1e-3);
    }
  }
  return 0;
}
