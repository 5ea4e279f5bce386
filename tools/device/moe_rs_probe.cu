// Device probe (not part of the build): times the grouped MXFP4 GEMM kernels at a DEP32 rank's
// decode share (12 experts; w1 / w3: n 2304 k 5120, w2: n 5120 k 2304) and prints microseconds
// and TFLOP/s. Three weight sets rotate so L2 does not hold the weights. Two row counts:
// - uniform: 192 rows per expert (the mean): v1, the swapped-operand kernel (rs) with one and two
//   weight sets, the same on A read as k-permuted (a_kperm: the other decode; A is random), and
//   the rs rows again with passes of up to 224 rows (rs_max_pass; the same passes: no change
//   expected);
// - drawn: the decode bench's counts, 32 x Binomial(2304, 1/384) per expert (64 x 6 tokens x
//   top-6 over 384 experts, every hit computed for 32 ranks; fixed seed), printed with the passes
//   they take at 192 and 224 rows per pass: the rs rows at both maxima.
// On both counts also the stream-K form (GroupedMxfp4GemmParams::stream_k; "sk" rows, 192-row
// passes): one persistent CTA per SM (-DMOESERVE_PROBE_SK_CTAS=G sets the grid) over the K tiles
// of all units, on natural and k-permuted A, one and two weight sets. Its hashes differ from the
// rs rows' (units cut between CTAs sum their K tiles in another fp32 order) but must be the same
// from build to build and run to run.
// Variants of the swapped-operand kernel compile with -DMOESERVE_RS_PROBE=P (1: no dequant after
// tile 0, 2: no loads after the prologue, 3: no wgmma), -DMOESERVE_RS_STAGES=S,
// -DMOESERVE_RS_WIDE_BUFS=3 (the 224-row passes with three fragment buffers) and
// -DMOESERVE_RS_LOOP=1 (the 192-row kernel with the 224-row one's K loop) and
// -DMOESERVE_RS_DECOUPLED=1 (the warpgroups' K loops apart). Each row also prints a hash of the
// output bits of its last launch, so that two builds' rows can be compared bit for bit:
//   nvcc -O3 -std=c++20 -arch=sm_90a -I src tools/device/moe_rs_probe.cu -o /tmp/rs && /tmp/rs
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/moe_grouped.cu"
#include "probe_util.h"

#ifndef MOESERVE_PROBE_SK_CTAS
#define MOESERVE_PROBE_SK_CTAS 0
#endif

using namespace moeserve::cuda;

namespace {

// FNV-1a over the bytes of n floats on the device.
uint64_t device_hash(const float* dev, int64_t n) {
  std::vector<float> h(static_cast<size_t>(n));
  MS_CUDA_CHECK(cudaMemcpy(h.data(), dev, h.size() * 4, cudaMemcpyDeviceToHost));
  uint64_t x = 1469598103934665603ull;
  const auto* b = reinterpret_cast<const unsigned char*>(h.data());
  for (size_t i = 0; i < h.size() * 4; ++i) x = (x ^ b[i]) * 1099511628211ull;
  return x;
}

int64_t passes(const std::vector<int32_t>& counts, int64_t max_pass) {
  int64_t n = 0;
  for (const int32_t c : counts) n += (c + max_pass - 1) / max_pass;
  return n;
}

}  // namespace

int main() {
  std::mt19937 rng(7);
  const int experts = 12;
  struct Counts {
    const char* name;
    std::vector<int32_t> rows;
  };
  Counts sets[2] = {{"uniform", std::vector<int32_t>(experts, 192)}, {"drawn", {}}};
  {
    std::mt19937 draw(384);
    std::binomial_distribution<int32_t> hits(2304, 1.0 / 384);
    for (int e = 0; e < experts; ++e) sets[1].rows.push_back(32 * hits(draw));
  }
  int64_t alloc_rows = 0;
  for (const Counts& s : sets) {
    int64_t total = 0;
    std::string list;
    for (const int32_t c : s.rows) {
      total += c;
      list += " " + std::to_string(c);
    }
    alloc_rows = std::max(alloc_rows, total);
    std::printf("%s counts:%s (%ld rows); passes: %ld at 192 rows, %ld at 224\n", s.name,
                list.c_str(), static_cast<long>(total), static_cast<long>(passes(s.rows, 192)),
                static_cast<long>(passes(s.rows, 224)));
  }
  for (const auto [n, k] : {std::pair<int64_t, int64_t>{2304, 5120}, {5120, 2304}}) {
    std::vector<uint16_t> a(static_cast<size_t>(alloc_rows * k));
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
    MS_CUDA_CHECK(cudaMalloc(&y, static_cast<size_t>(alloc_rows * n) * 4));
    MS_CUDA_CHECK(cudaMalloc(&y2, static_cast<size_t>(alloc_rows * n) * 4));
    const auto* da = up(a);
    // The stream-K workspace (flags zeroed once; every launch leaves them 0).
    const GroupedStreamKWorkspace sk = grouped_mxfp4_stream_k_workspace(MOESERVE_PROBE_SK_CTAS);
    float* sk_ws = nullptr;
    int32_t* sk_flags = nullptr;
    MS_CUDA_CHECK(cudaMalloc(&sk_ws, static_cast<size_t>(sk.floats) * 4));
    MS_CUDA_CHECK(cudaMalloc(&sk_flags, static_cast<size_t>(sk.flags) * 4));
    MS_CUDA_CHECK(cudaMemset(sk_flags, 0, static_cast<size_t>(sk.flags) * 4));
    for (const Counts& cs : sets) {
      std::vector<int32_t> off(experts + 1, 0);
      for (int e = 0; e < experts; ++e) off[e + 1] = off[e] + cs.rows[static_cast<size_t>(e)];
      const int32_t* doff = up(off);
      const int64_t rows = off[experts];
      // v1, rs, rs with two weight sets, and the two rs rows with a_kperm; each rs row at both
      // pass maxima (v1 on the uniform counts only: the reference of the earlier rounds); then
      // the same four rs rows in the stream-K form (variants 5-8, 192-row passes only).
      for (const int variant : {0, 1, 2, 3, 4, 5, 6, 7, 8})
        for (const int max_pass : {192, 224}) {
          if (variant == 0 && (max_pass != 192 || &cs != &sets[0])) continue;
          if (variant >= 5 && max_pass != 192) continue;
          const bool stream_k = variant >= 5;
          const int rs_variant = stream_k ? variant - 4 : variant;  // its rs row
          GroupedMxfp4GemmParams p;
          p.a = da;
          p.lda = k;
          p.offsets = doff;
          p.num_experts = experts;
          p.max_rows = *std::max_element(cs.rows.begin(), cs.rows.end());
          p.y = y;
          p.ldy = n;
          p.n = n;
          p.k = k;
          p.rows_hint = 192;
          p.use_wgmma = true;
          p.wgmma_rs = variant > 0;
          p.rs_max_pass = max_pass;
          p.a_rows = alloc_rows;
          p.a_kperm = rs_variant >= 3;
          p.stream_k = stream_k;
          p.sk_ctas = MOESERVE_PROBE_SK_CTAS;
          p.sk_workspace = sk_ws;
          p.sk_workspace_floats = sk.floats;
          p.sk_flags = sk_flags;
          p.sk_flag_count = sk.flags;
          const bool two = rs_variant == 2 || rs_variant == 4;
          const auto launch = [&](int i) {
            p.w = wp[i % 3];
            p.w_scale = sp[i % 3];
            if (two) {
              p.w_b = wp[(i + 1) % 3];
              p.w_scale_b = sp[(i + 1) % 3];
              p.y_b = y2;
            }
            const GroupedMxfp4Kernel kind = launch_grouped_mxfp4_gemm(p, nullptr);
            if (kind != (variant == 0 ? GroupedMxfp4Kernel::kWgmma
                         : stream_k   ? GroupedMxfp4Kernel::kWgmmaRsStreamK
                                      : GroupedMxfp4Kernel::kWgmmaRs)) {
              std::fprintf(stderr, "variant %d: another kernel ran (%d)\n", variant,
                           static_cast<int>(kind));
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
          static constexpr const char* kNames[] = {
              "v1", "rs",       "rs w1+w3", "rs kperm",      "rs kperm w1+w3",
              "sk", "sk w1+w3", "sk kperm", "sk kperm w1+w3"};
          const double flops = 2.0 * rows * n * k * (two ? 2 : 1);
          const uint64_t hash =
              device_hash(y, rows * n) ^ (two ? device_hash(y2, rows * n) * 31 : 0);
          std::printf(
              "probe %d stages %d wide bufs %d loop %d decoupled %d sk ctas %d %-7s max %d %-14s "
              "n %5ld k %5ld: %7.1f us %6.0f TFLOP/s hash %016llx\n",
              MOESERVE_RS_PROBE, MOESERVE_RS_STAGES, MOESERVE_RS_WIDE_BUFS, MOESERVE_RS_LOOP,
              MOESERVE_RS_DECOUPLED, sk.ctas, cs.name, max_pass, kNames[variant],
              static_cast<long>(n), static_cast<long>(k), us, flops / us * 1e-6,
              static_cast<unsigned long long>(hash));
        }
    }
  }
  return 0;
}
