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
// -DMOESERVE_RS_DECOUPLED=1 (the warpgroups' K loops apart) and -DMOESERVE_RS_SS=1 (the weights
// decoded into bf16 shared-memory tiles, wgmma with both operands from shared memory; its hashes
// must equal the default build's on every rs and sk row). Each row also prints
// a hash of the output bits of its last launch, so that two builds' rows can be compared bit for
// bit:
//   nvcc -O3 -std=c++20 -arch=sm_90a -I src tools/device/moe_rs_probe.cu -o /tmp/rs && /tmp/rs
// With -DMOESERVE_SK_CLOCKS (the segment clocks of moe_grouped.cu; the rows' times then include
// their cost; =2 adds thread 0's waits inside the K loop, at 12 bytes of spills in the stream-K
// k-permuted kernel) the "rs kperm w1+w3" and "sk kperm w1+w3" rows at n 2304 are followed by one
// instrumented launch each and its table (clock_report: CTA busy times, start spread, K loop per
// tile by pass shape, in-loop waits, epilogues, head waits, the schedule's per-CTA costs):
//   nvcc -O3 -std=c++20 -arch=sm_90a -I src -DMOESERVE_SK_CLOCKS tools/device/moe_rs_probe.cu \
//     -o /tmp/rs && /tmp/rs | grep -A12 "kperm w1+w3"
#include <algorithm>
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

#ifdef MOESERVE_SK_CLOCKS
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One launch with the segment clocks (MOESERVE_SK_CLOCKS in moe_grouped.cu) and their table:
// per CTA busy time (globaltimer, exit - start) and start spread; the K loop per tile by pass
// shape (sum of t1 - t0 over sum of K tiles: the pipeline fill of each pass included; and a
// least-squares fit t1 - t0 = fill + tiles x rate where the tile counts differ), thread 0's
// in-loop waits per tile (A landed, wgmma, weights, barrier); the epilogue (t2 - t1 - head wait)
// by kind; the head waits; the gaps (CTA start to first pass, between passes, last pass to exit);
// the per-CTA costs the stream-K schedule gave (K tiles x (1 + shape / 64), the cost model of
// SkSchedule) against the ideal W / G, and the slowest CTAs' segments. Cycles to ns at the
// clock64 / globaltimer ratio summed over the CTAs.
template <typename Launch>
void clock_report(const Launch& launch, const char* name, const char* counts) {
  static SkClockCta cta[kSkClockCtas];
  static SkClockSeg seg[kSkClockCtas * kSkClockSegs];
  void* dc = nullptr;
  void* ds = nullptr;
  MS_CUDA_CHECK(cudaGetSymbolAddress(&dc, g_sk_clock_cta));
  MS_CUDA_CHECK(cudaGetSymbolAddress(&ds, g_sk_clock_seg));
  MS_CUDA_CHECK(cudaMemset(dc, 0, sizeof(cta)));
  MS_CUDA_CHECK(cudaMemset(ds, 0, sizeof(seg)));
  launch(0);
  MS_CUDA_CHECK(cudaDeviceSynchronize());
  MS_CUDA_CHECK(cudaMemcpy(cta, dc, sizeof(cta), cudaMemcpyDeviceToHost));
  MS_CUDA_CHECK(cudaMemcpy(seg, ds, sizeof(seg), cudaMemcpyDeviceToHost));
  std::vector<int> live;  // CTAs that ran a pass
  double clk = 0, gt = 0;
  unsigned long long first = ~0ull, last_start = 0, last_end = 0;
  for (int b = 0; b < kSkClockCtas; ++b) {
    if (cta[b].gt1 == 0) continue;
    first = std::min(first, cta[b].gt0);
    if (cta[b].segs == 0) continue;
    live.push_back(b);
    clk += static_cast<double>(cta[b].clk1 - cta[b].clk0);
    gt += static_cast<double>(cta[b].gt1 - cta[b].gt0);
    last_start = std::max(last_start, cta[b].gt0);
    last_end = std::max(last_end, cta[b].gt1);
  }
  if (live.empty() || gt <= 0) {
    std::printf("clocks %s %s: no CTA recorded\n", name, counts);
    return;
  }
  const double ghz = clk / gt;  // cycles per ns
  const auto us = [&](double cycles) { return cycles / ghz * 1e-3; };
  std::vector<double> busy, cost;
  double gaps = 0, epi[3] = {0, 0, 0}, wait_total = 0, waits[4] = {0, 0, 0, 0};
  int epi_n[3] = {0, 0, 0}, heads = 0, max_segs = 0;
  int64_t tiles_all = 0;
  struct Shape {
    double cyc = 0, tiles = 0, n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  } shape[4];
  struct Wait {
    double cyc;
    int cta;
  };
  std::vector<Wait> worst;
  for (const int b : live) {
    const SkClockCta& c = cta[b];
    busy.push_back(static_cast<double>(c.gt1 - c.gt0) * 1e-3);
    max_segs = std::max(max_segs, c.segs);
    double cb = 0;
    long long prev = c.clk0;
    for (int i = 0; i < std::min(c.segs, kSkClockSegs); ++i) {
      const SkClockSeg& s = seg[b * kSkClockSegs + i];
      const int sh = s.shape / 64;
      if (sh < 1 || sh > 3 || s.kind < 0 || s.kind > 2) continue;
      const double loop = static_cast<double>(s.t1 - s.t0);
      Shape& q = shape[sh];
      q.cyc += loop;
      q.tiles += s.ktiles;
      q.n += 1;
      q.sx += s.ktiles;
      q.sy += loop;
      q.sxx += static_cast<double>(s.ktiles) * s.ktiles;
      q.sxy += s.ktiles * loop;
      tiles_all += s.ktiles;
      waits[0] += static_cast<double>(s.a_wait);
      waits[1] += static_cast<double>(s.mma_wait);
      waits[2] += static_cast<double>(s.w_wait);
      waits[3] += static_cast<double>(s.bar_wait);
      epi[s.kind] += static_cast<double>(s.t2 - s.t1 - s.wait);
      ++epi_n[s.kind];
      if (s.kind == 2) {
        ++heads;
        wait_total += static_cast<double>(s.wait);
        worst.push_back({static_cast<double>(s.wait), b});
      }
      gaps += static_cast<double>(s.t0 - prev);
      prev = s.t2;
      cb += s.ktiles * (1.0 + sh);
    }
    gaps += static_cast<double>(c.clk1 - prev);
    cost.push_back(cb);
  }
  const size_t n = live.size();
  std::printf(
      "clocks %-14s %-7s: %zu CTAs with passes (first start to last exit %.1f us), SM "
      "clock %.3f GHz, up to %d passes per CTA\n",
      name, counts, n, static_cast<double>(last_end - first) * 1e-3, ghz, max_segs);
  std::printf(
      "  CTA busy us min %.1f median %.1f max %.1f; start spread %.1f us (last start - "
      "first)\n",
      *std::min_element(busy.begin(), busy.end()), median(busy),
      *std::max_element(busy.begin(), busy.end()), static_cast<double>(last_start - first) * 1e-3);
  for (int sh = 1; sh <= 3; ++sh) {
    const Shape& q = shape[sh];
    if (q.n == 0) continue;
    const double det = q.n * q.sxx - q.sx * q.sx;
    std::printf("  K loop shape %3d: %4.0f passes %6.0f tiles, %6.0f cycles/tile (%.3f us)",
                64 * sh, q.n, q.tiles, q.cyc / q.tiles, us(q.cyc / q.tiles));
    if (det > 1e-9 * q.n * q.sxx) {
      const double rate = (q.n * q.sxy - q.sx * q.sy) / det;
      std::printf("; fit: %6.0f cycles/tile + %6.0f per pass (fill)", rate,
                  (q.sy - rate * q.sx) / q.n);
    }
    std::printf("\n");
  }
  const double t = static_cast<double>(tiles_all);
  std::printf(
      "  thread 0 waits per tile (cycles): A landed %.0f, wgmma %.0f, weights %.0f, "
      "barrier %.0f\n",
      waits[0] / t, waits[1] / t, waits[2] / t, waits[3] / t);
  static constexpr const char* kKinds[3] = {"whole", "partial", "head"};
  std::printf("  epilogue us (excl. head wait):");
  for (int k = 0; k < 3; ++k)
    if (epi_n[k] > 0) std::printf(" %s %d x %.2f", kKinds[k], epi_n[k], us(epi[k] / epi_n[k]));
  std::printf("; gaps (setup, between passes, exit) %.2f us per CTA\n", us(gaps / n));
  if (heads > 0) {
    std::sort(worst.begin(), worst.end(),
              [](const Wait& a, const Wait& b) { return a.cyc > b.cyc; });
    std::printf("  head wait: %d heads, total %.1f us, mean %.2f us; worst:", heads, us(wait_total),
                us(wait_total / heads));
    for (size_t i = 0; i < std::min<size_t>(6, worst.size()); ++i)
      std::printf(" cta %d %.2f us", worst[i].cta, us(worst[i].cyc));
    std::printf("\n");
  }
  double total = 0;
  for (const double c : cost) total += c;
  std::printf(
      "  cost per CTA (K tiles x (1 + shape / 64)) min %.0f median %.0f max %.0f, ideal "
      "W / G %.1f\n",
      *std::min_element(cost.begin(), cost.end()), median(cost),
      *std::max_element(cost.begin(), cost.end()), total / static_cast<double>(n));
  // The slowest CTAs: their passes.
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return busy[a] > busy[b]; });
  for (size_t k = 0; k < std::min<size_t>(3, n); ++k) {
    const int b = live[order[k]];
    std::printf("  slow cta %d busy %.1f us cost %.0f:", b, busy[order[k]], cost[order[k]]);
    for (int i = 0; i < std::min(cta[b].segs, kSkClockSegs); ++i) {
      const SkClockSeg& s = seg[b * kSkClockSegs + i];
      std::printf(" [%s %d rows %d tiles: loop %.1f epi %.1f wait %.1f us]", kKinds[s.kind % 3],
                  s.rows, s.ktiles, us(static_cast<double>(s.t1 - s.t0)),
                  us(static_cast<double>(s.t2 - s.t1 - s.wait)), us(static_cast<double>(s.wait)));
    }
    std::printf("\n");
  }
}
#endif

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
              "probe %d stages %d wide bufs %d loop %d decoupled %d ss %d sk ctas %d %-7s max "
              "%d %-14s n %5ld k %5ld: %7.1f us %6.0f TFLOP/s hash %016llx\n",
              MOESERVE_RS_PROBE, MOESERVE_RS_STAGES, MOESERVE_RS_WIDE_BUFS, MOESERVE_RS_LOOP,
              MOESERVE_RS_DECOUPLED, MOESERVE_RS_SS, sk.ctas, cs.name, max_pass, kNames[variant],
              static_cast<long>(n), static_cast<long>(k), us, flops / us * 1e-6,
              static_cast<unsigned long long>(hash));
#ifdef MOESERVE_SK_CLOCKS
          if (n == 2304 && max_pass == 192 && (variant == 4 || variant == 8))
            clock_report(launch, kNames[variant], cs.name);
#endif
        }
    }
  }
  return 0;
}
