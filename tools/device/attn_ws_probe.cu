// Device probe (not part of the build): the warp-specialised wgmma attention (attn_wg::ws, 
// SparseAttentionParams::warp_specialized) against the two-warpgroup fp16 kernel on random caches
// at the decode shape (64 heads, 128 SWA + 512 FP4 keys per row, FP4 entries drawn from a pool
// larger than L2), with the per-role phase clocks of the ws kernel (the first thread of each
// warpgroup, cycles per work item; WS_MARK slots in v41_attention_wgmma.cu). Build and run:
//   nvcc -O3 -std=c++20 -arch=sm_90a -I src -DMOESERVE_ATTN_CLOCKS tools/device/attn_ws_probe.cu -o /tmp/attn_ws_probe && /tmp/attn_ws_probe
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/v41_attention.cu"
#include "backend/cuda/v41_attention_wgmma.cu"
#include "probe_util.h"

using namespace moeserve::cuda;

const char* const kNames[24] = {
    "P list_full wait", "P first prefetch", "P loads", "P empty wait", "P convert+store", "P q_empty wait", "P q convert",
    "-", "A q_full wait", "A full wait", "A S", "A softmax", "A P_free wait",
    "A P store+rescale", "A PV", "A epilogue", "B rope/list + full", "B P_ready wait",
    "B rescale+PV", "B epi1 wait", "B epilogue", "B q convert (q_in_b)", "-", "-"};

int main(int argc, char** argv) {
  std::mt19937 rng(7);
  const int heads = 64, pool = 1 << (argc > 1 ? std::atoi(argv[1]) : 20);  // FP4 entries
  std::printf("FP4 pool %d entries (%.1f MB)\n", pool, pool * 288.0 / 1e6);
  std::vector<uint8_t> ring(128 * 528), glob(static_cast<size_t>(pool) * 288);
  for (size_t i = 0; i < ring.size(); ++i)
    ring[i] = (i % 528) < 512 ? static_cast<uint8_t>((rng() % 0x7E) | (rng() & 0x80)) : 120;
  for (size_t i = 0; i < glob.size(); ++i)
    glob[i] = (i % 288) < 256 ? static_cast<uint8_t>(rng()) : static_cast<uint8_t>(0x20 + rng() % 32);
  std::vector<double> freqs(32);
  for (int i = 0; i < 32; ++i) freqs[static_cast<size_t>(i)] = std::pow(160000.0, -i / 32.0);
  for (int rows : {132, 384}) {
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<float> q(static_cast<size_t>(rows) * heads * 512), sink(heads);
    for (auto& x : q) x = u(rng);
    for (auto& x : sink) x = u(rng);
    std::vector<int32_t> gidx(static_cast<size_t>(rows) * 512), pos(static_cast<size_t>(rows));
    for (auto& g : gidx) g = static_cast<int32_t>(rng() % pool);
    for (int r = 0; r < rows; ++r) pos[static_cast<size_t>(r)] = 5000 + r;
    SparseAttentionParams p;
    p.q = up(q);
    p.rows = rows;
    p.heads = heads;
    p.swa = up(ring);
    p.glob = up(glob);
    p.glob_idx = up(gidx);
    p.glob_k = 512;
    p.sink = up(sink);
    p.pos = up(pos);
    p.freqs = up(freqs);
    p.split_precision = false;
    p.use_wgmma = true;
    float* out = nullptr;
    MS_CUDA_CHECK(cudaMalloc(&out, q.size() * 4));
    p.out = out;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    const auto time = [&](void (*fn)(const SparseAttentionParams&, cudaStream_t)) {
      for (int i = 0; i < 3; ++i) fn(p, nullptr);
      const int iters = 20;
      cudaEventRecord(e0);
      for (int i = 0; i < iters; ++i) fn(p, nullptr);
      cudaEventRecord(e1);
      MS_CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      return 1000.0 * ms / iters;
    };
    const double us_wg = time(attn_wg::launch<false, 3>);
    std::vector<float> o_wg(q.size()), o_ws(q.size());
    MS_CUDA_CHECK(cudaMemcpy(o_wg.data(), out, q.size() * 4, cudaMemcpyDeviceToHost));
    unsigned long long clk[24] = {};
#ifdef MOESERVE_ATTN_CLOCKS
    MS_CUDA_CHECK(cudaMemcpyToSymbol(attn_wg::ws::g_ws_clocks, clk, sizeof(clk)));
#endif
    attn_wg::ws::launch<attn_wg::kOutF32>(p, nullptr);
#ifdef MOESERVE_ATTN_CLOCKS
    MS_CUDA_CHECK(cudaMemcpyFromSymbol(clk, attn_wg::ws::g_ws_clocks, sizeof(clk)));
#endif
    MS_CUDA_CHECK(cudaMemcpy(o_ws.data(), out, q.size() * 4, cudaMemcpyDeviceToHost));
    const double us_ws = time(attn_wg::ws::launch<attn_wg::kOutF32>);
    double num = 0, den = 1e-30;
    for (size_t i = 0; i < q.size(); ++i) {
      const double d = std::abs(static_cast<double>(o_ws[i]) - o_wg[i]);
      num = std::isnan(d) ? INFINITY : std::max(num, d);
      den = std::max(den, std::abs(static_cast<double>(o_wg[i])));
    }
    std::printf("rows %d: two-warpgroup %.1f us, ws %.1f us, max|ws - wg| / max|wg| %.3g\n", rows,
                us_wg, us_ws, num / den);
    // Consumer B converting q (SparseAttentionParams::ws_q_in_b): time, bits and clocks.
    p.ws_q_in_b = true;
    unsigned long long clq[24] = {};
#ifdef MOESERVE_ATTN_CLOCKS
    MS_CUDA_CHECK(cudaMemcpyToSymbol(attn_wg::ws::g_ws_clocks, clq, sizeof(clq)));
#endif
    attn_wg::ws::launch<attn_wg::kOutF32>(p, nullptr);
#ifdef MOESERVE_ATTN_CLOCKS
    MS_CUDA_CHECK(cudaMemcpyFromSymbol(clq, attn_wg::ws::g_ws_clocks, sizeof(clq)));
#endif
    std::vector<float> o_qb(q.size());
    MS_CUDA_CHECK(cudaMemcpy(o_qb.data(), out, q.size() * 4, cudaMemcpyDeviceToHost));
    const double us_qb = time(attn_wg::ws::launch<attn_wg::kOutF32>);
    p.ws_q_in_b = false;
    size_t ndiff = 0;
    for (size_t i = 0; i < q.size(); ++i) ndiff += std::memcmp(&o_ws[i], &o_qb[i], 4) != 0;
    std::printf("rows %d: ws q in B %.1f us (ws %.1f), %zu of %zu values differ from ws\n", rows,
                us_qb, us_ws, ndiff, q.size());
    std::printf("  ws cycles per item (first thread of each warpgroup):\n");
    for (int i = 0; i < 24; ++i)
      if (kNames[i][0] != '-')
        std::printf("    %-20s %10.0f   q in B %10.0f\n", kNames[i], clk[i] / double(rows),
                    clq[i] / double(rows));
    MS_CUDA_CHECK(cudaFree(out));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  return 0;
}
