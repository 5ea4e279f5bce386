// Device probe (not part of the build): times the grouped MXFP4 GEMM kernels at a DEP32 rank's
// decode share (12 experts x 192 rows; w1 / w3: n 2304 k 5120, w2: n 5120 k 2304) and prints
// microseconds and TFLOP/s. Three weight sets rotate so L2 does not hold the weights. The rs rows
// also run on A read as k-permuted (a_kperm: the other decode; A is random). Variants of
// the swapped-operand kernel compile with -DMOESERVE_RS_PROBE=P (1: no dequant after tile 0,
// 2: no loads after the prologue, 3: no wgmma) and -DMOESERVE_RS_STAGES=S:
//   nvcc -O3 -std=c++20 -arch=sm_90a -I src tools/device/moe_rs_probe.cu -o /tmp/rs && /tmp/rs
#include <cstdio>
#include <random>
#include <vector>

#include "backend/cuda/moe_grouped.cu"
#include "probe_util.h"

using namespace moeserve::cuda;

int main() {
  std::mt19937 rng(7);
  const int experts = 12;
  const int64_t per = 192, rows = experts * per;
  std::vector<int32_t> off(experts + 1);
  for (int e = 0; e <= experts; ++e) off[static_cast<size_t>(e)] = static_cast<int32_t>(e * per);
  const int32_t* doff = up(off);
  for (const auto [n, k] : {std::pair<int64_t, int64_t>{2304, 5120}, {5120, 2304}}) {
    std::vector<uint16_t> a(static_cast<size_t>(rows * k));
    for (auto& x : a) x = static_cast<uint16_t>(0x3C00 + rng() % 0x800);
    const uint8_t** wp[3];
    const uint8_t** sp[3];
    for (int set = 0; set < 3; ++set) {
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
    float *y = nullptr, *y2 = nullptr;
    MS_CUDA_CHECK(cudaMalloc(&y, static_cast<size_t>(rows * n) * 4));
    MS_CUDA_CHECK(cudaMalloc(&y2, static_cast<size_t>(rows * n) * 4));
    const auto* da = up(a);
    // v1, rs, rs with two weight sets, and the two rs rows with a_kperm
    for (const int variant : {0, 1, 2, 3, 4}) {
      GroupedMxfp4GemmParams p;
      p.a = da;
      p.lda = k;
      p.offsets = doff;
      p.num_experts = experts;
      p.max_rows = per;
      p.y = y;
      p.ldy = n;
      p.n = n;
      p.k = k;
      p.rows_hint = per;
      p.use_wgmma = true;
      p.wgmma_rs = variant > 0;
      p.a_rows = rows;
      p.a_kperm = variant >= 3;
      const auto launch = [&](int i) {
        p.w = wp[i % 3];
        p.w_scale = sp[i % 3];
        if (variant == 2 || variant == 4) {
          p.w_b = wp[(i + 1) % 3];
          p.w_scale_b = sp[(i + 1) % 3];
          p.y_b = y2;
        }
        const GroupedMxfp4Kernel kind = launch_grouped_mxfp4_gemm(p, nullptr);
        if (kind != (variant == 0 ? GroupedMxfp4Kernel::kWgmma : GroupedMxfp4Kernel::kWgmmaRs)) {
          std::fprintf(stderr, "variant %d: another kernel ran (%d)\n", variant, static_cast<int>(kind));
          std::exit(1);
        }
      };
      for (int i = 0; i < 4; ++i) launch(i);
      cudaEvent_t e0, e1;
      cudaEventCreate(&e0);
      cudaEventCreate(&e1);
      const int iters = 30;
      cudaEventRecord(e0);
      for (int i = 0; i < iters; ++i) launch(i);
      cudaEventRecord(e1);
      MS_CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      const double us = 1000.0 * ms / iters;
      static constexpr const char* kNames[] = {"v1", "rs", "rs w1+w3", "rs kperm",
                                               "rs kperm w1+w3"};
      const double flops = 2.0 * rows * n * k * (variant == 2 || variant == 4 ? 2 : 1);
      std::printf("probe %d stages %d %-14s n %5ld k %5ld: %7.1f us %6.0f TFLOP/s\n",
                  MOESERVE_RS_PROBE, MOESERVE_RS_STAGES, kNames[variant], static_cast<long>(n),
                  static_cast<long>(k), us, flops / us * 1e-6);
    }
  }
  return 0;
}
