// Device probe (not part of the build): times launch_sparse_attention on random caches, the
// mma.sync kernel and the warpgroup-MMA one (use_wgmma), prints where an mma.sync block and a
// wgmma work item spend their cycles (thread 0's clock64 between the kernels' ATTN_MARK / WG_MARK
// points, averaged per block / per work item: the wgmma grid is persistent, one CTA per SM
// looping over (row, 64 heads) items, so "list" of an item also holds the gap after the previous
// item's epilogue), the largest difference between the kernels' outputs (relative to the largest
// |output|), and a table of the times. The wgmma kernel is timed in its instantiations: hi+lo
// with 2 key buffers and fp16 with 2 (what use_wgmma takes), and fp16 with 3 (the pipelined
// variant, for comparison). Build and run on the device:
//   nvcc -O3 -std=c++20 -arch=sm_90a -I src -DMOESERVE_ATTN_CLOCKS tools/device/attn_probe.cu -o /tmp/attn_probe && /tmp/attn_probe
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

struct Row {
  int rows;
  const char* precision;
  const char* variant;
  double us_old, us_wg, diff;
};

// Per-CTA phases of the wgmma kernel (slots of WG_MARK in v41_attention_wgmma.cu).
const char* const kWgNames[10] = {"list",     "prologue", "S wait", "exchange", "softmax",
                                  "mma issue", "stage wait", "decode", "stage issue", "epilogue"};

int main() {
  std::mt19937 rng(7);
  std::vector<Row> table;
  const int heads = 64, pool = 1 << 16;
  std::vector<uint8_t> ring(128 * 528), glob(static_cast<size_t>(pool) * 288);
  for (size_t i = 0; i < ring.size(); ++i)
    ring[i] = (i % 528) < 512 ? static_cast<uint8_t>((rng() % 0x7E) | (rng() & 0x80)) : 120;
  for (size_t i = 0; i < glob.size(); ++i)
    glob[i] = (i % 288) < 256 ? static_cast<uint8_t>(rng()) : static_cast<uint8_t>(0x20 + rng() % 32);
  std::vector<double> freqs(32);
  for (int i = 0; i < 32; ++i) freqs[static_cast<size_t>(i)] = std::pow(160000.0, -i / 32.0);
  const char* names[12] = {"list",   "q load",  "sync A", "decode", "sync B", "stage",
                           "logits", "sync C",  "softmax", "sync D", "P.V",     "epilogue"};
  for (int rows : {1, 64, 384, 512}) {
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
    float* out = nullptr;
    MS_CUDA_CHECK(cudaMalloc(&out, q.size() * 4));
    p.out = out;
    for (bool split : {true, false}) {
      p.split_precision = split;
      p.use_wgmma = false;
      for (int i = 0; i < 3; ++i) launch_sparse_attention(p, nullptr);
      cudaEvent_t e0, e1;
      cudaEventCreate(&e0);
      cudaEventCreate(&e1);
      const int iters = 20;
      cudaEventRecord(e0);
      for (int i = 0; i < iters; ++i) launch_sparse_attention(p, nullptr);
      cudaEventRecord(e1);
      MS_CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      unsigned long long clk[16] = {};
#ifdef MOESERVE_ATTN_CLOCKS
      MS_CUDA_CHECK(cudaMemcpyToSymbol(g_attn_clocks, clk, sizeof(clk)));
      launch_sparse_attention(p, nullptr);
      MS_CUDA_CHECK(cudaMemcpyFromSymbol(clk, g_attn_clocks, sizeof(clk)));
#endif
      const double blocks = rows * (heads / 32.0);
      std::printf("rows %4d split %d: %8.1f us/launch | cycles per block:", rows, split,
                  1000.0 * ms / iters);
      double total = 0;
      for (int i = 0; i < 12; ++i) total += clk[i] / blocks;
      for (int i = 0; i < 12; ++i) std::printf(" %s %.0f", names[i], clk[i] / blocks);
      std::printf(" | total %.0f\n", total);
      const double us_old = 1000.0 * ms / iters;

      // The wgmma kernel (use_wgmma's instantiation, and for fp16 also the 2-buffer one): one
      // launch for the phase clocks and the difference of the outputs, then the timing.
      std::vector<float> o_old(q.size()), o_wg(q.size());
      MS_CUDA_CHECK(cudaMemcpy(o_old.data(), out, q.size() * 4, cudaMemcpyDeviceToHost));
      struct Variant {
        const char* name;
        void (*fn)(const SparseAttentionParams&, cudaStream_t);
        bool f16s = false;  // SparseAttentionParams::swa_f16_scale (its own instantiations)
      };
      std::vector<Variant> variants;
      if (split) {
        variants.push_back({"2 bufs", attn_wg::launch<true, attn_wg::kNBSplit>});
      } else {
        variants.push_back({"2 bufs", attn_wg::launch<false, 2>});
        variants.push_back({"3 bufs", attn_wg::launch<false, 3>});
        variants.push_back({"3 bufs f16s", attn_wg::launch<false, 3>, true});
      }
      p.use_wgmma = true;
      std::vector<float> o_base;  // the last variant without swa_f16_scale: f16s's bits against it
      for (const Variant& v : variants) {
        p.swa_f16_scale = v.f16s;
        MS_CUDA_CHECK(cudaMemset(out, 0xFF, q.size() * 4));  // NaN: unwritten outputs show
        unsigned long long wclk[16] = {};
#ifdef MOESERVE_ATTN_CLOCKS
        MS_CUDA_CHECK(cudaMemcpyToSymbol(attn_wg::g_wg_clocks, wclk, sizeof(wclk)));
#endif
        v.fn(p, nullptr);
        MS_CUDA_CHECK(cudaGetLastError());
#ifdef MOESERVE_ATTN_CLOCKS
        MS_CUDA_CHECK(cudaMemcpyFromSymbol(wclk, attn_wg::g_wg_clocks, sizeof(wclk)));
#endif
        MS_CUDA_CHECK(cudaMemcpy(o_wg.data(), out, q.size() * 4, cudaMemcpyDeviceToHost));
        if (!v.f16s) {
          o_base = o_wg;
        } else {
          size_t differ = 0;
          for (size_t i = 0; i < q.size(); ++i)
            differ += std::memcmp(&o_wg[i], &o_base[i], 4) != 0 ? 1 : 0;
          std::printf("rows %4d: %s: %zu of %zu outputs differ in their bits from 3 bufs\n", rows,
                      v.name, differ, q.size());
        }
        double num = 0, den = 1e-30;
        for (size_t i = 0; i < q.size(); ++i) {
          const double d = std::abs(static_cast<double>(o_wg[i]) - o_old[i]);
          num = std::isnan(d) ? INFINITY : std::max(num, d);
          den = std::max(den, std::abs(static_cast<double>(o_old[i])));
        }
        for (int i = 0; i < 3; ++i) v.fn(p, nullptr);
        cudaEventRecord(e0);
        for (int i = 0; i < iters; ++i) v.fn(p, nullptr);
        cudaEventRecord(e1);
        MS_CUDA_CHECK(cudaEventSynchronize(e1));
        cudaEventElapsedTime(&ms, e0, e1);
        const double us_wg = 1000.0 * ms / iters;
        const double ctas = rows * (heads / 64.0);  // work items (row, 64 heads)
        std::printf(
            "rows %4d split %d: wgmma %s %8.1f us/launch, max |wgmma - mma.sync| / max "
            "|out| %.3g | cycles per item:",
            rows, split, v.name, us_wg, num / den);
        double wtotal = 0;
        for (int i = 0; i < 10; ++i) wtotal += wclk[i] / ctas;
        for (int i = 0; i < 10; ++i) std::printf(" %s %.0f", kWgNames[i], wclk[i] / ctas);
        std::printf(" | total %.0f\n", wtotal);
        table.push_back({rows, split ? "hi+lo" : "fp16", v.name, us_old, us_wg, num / den});
      }
      p.swa_f16_scale = false;
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
    }
    MS_CUDA_CHECK(cudaFree(out));
  }
  std::printf("\n| rows | precision | wgmma | mma.sync us | wgmma us | speed-up | rel diff |\n");
  std::printf("|---:|---|---|---:|---:|---:|---:|\n");
  for (const Row& r : table)
    std::printf("| %d | %s | %s | %.1f | %.1f | %.2fx | %.2g |\n", r.rows, r.precision, r.variant,
                r.us_old, r.us_wg, r.us_old / r.us_wg, r.diff);
  return 0;
}
