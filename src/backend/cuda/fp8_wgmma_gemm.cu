// FP8 x FP8 block-scaled GEMM on Hopper wgmma (sm_90a) for the dense projections:
//   y[m, n] = Σ_kb 2^(sa[m, kb] - 127) · 2^(sw[n/32, kb] - 127) · Σ_{k in kb} a[m, k] · w[n, k]
// with a, w e4m3 codes and one ue8m0 scale per 32 along K (per row for A, per 32x32 block for W).
//
// CTA tile: BM = 64 per consumer warpgroup (1 or 2 warpgroups), BN = 128, BK = 128 (4 scale
// blocks). All threads load with cp.async into a 5-stage ring (4 tiles in flight); each warpgroup
// multiplies its 64 rows by the 128 weight rows with wgmma m64n128k32 (e4m3 x e4m3 -> f32), both
// operands from shared memory descriptors.
//
// Promotion: the scales change every 32 along K, so every k32 wgmma writes a fresh temporary
// accumulator (scale-d = 0) and the thread adds tmp * (sa * sw) into its fp32 accumulator. Two
// temporaries ping-pong: the wgmma of step j runs while step j-1's temporary is promoted, so 3 of
// the 4 promotions of a K tile (64 FFMAs per thread each) overlap the tensor cores; the last one
// follows the tile's drain (wait_group 0), exposed.
// NOTE: one FFMA per accumulator per k32 costs as many FP32-pipe cycles as the k32 wgmma costs
// tensor cycles (per warpgroup pair and k32: 2x64x128x32 MACs at ~4096/clk/SM and 2x64x128
// FFMAs at 128/clk/SM, both 128 cycles), so this kernel cannot reach the FP8 peak; it targets
// well above the bf16 rate with half the operand bytes (DeepGEMM's per-128 scales promote 4x
// less often).
//
// Precision: e4m3 x e4m3 products are exact; inside one k32 wgmma Hopper aligns the 32 products
// to the largest exponent with ~14 significant bits (DeepSeek-V3 report; truncating, by published
// bit-level reproductions), so each 32-term partial carries a relative error of about 2^-13 of its
// largest term; the promotion and the sum over K blocks are fp32. Against a double reference
// expect max|err| / max|ref| around 1e-4 to 1e-3 (the tests allow 2e-3), and exact results when
// every k32 partial fits 14 bits.
//
// Shared-memory layout per stage (1024-byte aligned): A [BM rows][128 B] then W [128 rows][128 B],
// each row one 128-byte swizzle row: the 16-byte chunk c of row r is stored at chunk c ^ (r % 8)
// (CUTLASS Swizzle<3,4,3>, what the wgmma descriptor's 128B mode reads). 8 rows form a 1024-byte
// atom; atoms stack along M/N with stride 1024 (the descriptor's SBO); the k32 step s starts 32*s
// bytes into the row (the hardware applies the swizzle to the final address). The scales of the
// stage live in a separate ring: sa [BM][4] bytes (the tile's 4 K blocks per row), sw [4][4].
//
// Split-K: when the (M tile, N tile) grid covers less than the SMs (decode, N = 512..2304), the K
// tiles are split over the `split` CTAs of a thread-block cluster (grid z, cluster (1, 1, split));
// ranks > 0 leave their fp32 tiles in shared memory and rank 0 adds them in rank order through
// distributed shared memory (deterministic) and writes y.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/wgmma.cuh"

namespace moeserve::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kBlockN = 128;
constexpr int kBlockK = 128;  // e4m3 bytes per row per stage: one 128B swizzle row
constexpr int kStages = 5;
constexpr int kKBlocksPerTile = kBlockK / 32;  // scale blocks per stage
constexpr int kWarpGroupThreads = 128;

template <int kWarpGroups>
struct TileConfig {
  static constexpr int kBlockM = 64 * kWarpGroups;
  static constexpr int kThreads = kWarpGroupThreads * kWarpGroups;
  static constexpr int kABytes = kBlockM * kBlockK;
  static constexpr int kWBytes = kBlockN * kBlockK;
  static constexpr int kStageBytes = kABytes + kWBytes;  // multiple of 1024
  static constexpr int kSaBytes = kBlockM * kKBlocksPerTile;
  static constexpr int kSwBytes = (kBlockN / 32) * kKBlocksPerTile;
  static constexpr int kScaleStageBytes = kSaBytes + kSwBytes;  // multiple of 16
  // + 1024: the dynamic shared window is only 16-byte aligned; the kernel rounds its base up.
  static constexpr int kSmemBytes = kStages * (kStageBytes + kScaleStageBytes) + 1024;
  static_assert(kStageBytes % 1024 == 0 && kScaleStageBytes % 16 == 0);
  static_assert(kThreads >= kBlockM + kBlockN / 32, "scale loads need one thread per row");
};

// ---- PTX wrappers ------------------------------------------------------------------------------

// 4 bytes global -> shared through L1; valid == false zero-fills (the scale rows past M). The
// 16-byte copies, commit and wait are backend/cuda/cp_async.cuh's.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}
// Makes this thread's generic-proxy shared writes (cp.async) visible to the async proxy (wgmma).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Pins later reads of the registers after the preceding wgmma.wait_group (wgmma.cuh).
using wgmma::fence_operands;

// Shared-memory matrix descriptor, K-major with the 128-byte swizzle: start address >> 4 in bits
// 0-13, LBO (unused for swizzled K-major; 1 by convention) in 16-29, SBO = 1024 B (next 8-row
// atom) >> 4 in 32-45, base offset 0 (atoms 1024-aligned), layout 1 (128B swizzle) in 62-63.
__device__ __forceinline__ uint64_t smem_desc_sw128(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

// d = a · b^T for a 64x32 A tile and a 128x32 B tile (both K-major e4m3), fp32 out; scale-d = 0:
// d is written, not accumulated. d[4j + q] is row (lane/4 + 8*(q/2)) of the warp's 16 rows,
// column 8j + 2*(lane%4) + q%2.
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], uint64_t desc_a,
                                                      uint64_t desc_b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{" MS_WGMMA_D64 "}, "
      "%64, %65, p, 1, 1;\n"
      "}\n"
      : MS_WGMMA_ACC64("+f", d)
      : "l"(desc_a), "l"(desc_b), "n"(0)
      : "memory");
}

// ue8m0 code -> 2^(code - 127) with selects instead of v41::ue8m0_decode's branches in the hot
// loop (same values: code 0 is the float subnormal 2^-127, 255 is NaN).
__device__ __forceinline__ float ue8m0_value(uint32_t code) {
  float v = __uint_as_float(code << 23);
  v = code == 0 ? __uint_as_float(0x00400000u) : v;
  return code == 0xFFu ? __uint_as_float(0x7FC00000u) : v;
}

// acc += tmp * scale: scale[h * 4 + b] for row half h (q / 2) and 32-column block b (j / 4).
__device__ __forceinline__ void promote(float (&acc)[64], const float (&tmp)[64],
                                        const float (&scale)[8]) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const float s0 = scale[j >> 2], s1 = scale[4 + (j >> 2)];
    acc[4 * j + 0] = fmaf(tmp[4 * j + 0], s0, acc[4 * j + 0]);
    acc[4 * j + 1] = fmaf(tmp[4 * j + 1], s0, acc[4 * j + 1]);
    acc[4 * j + 2] = fmaf(tmp[4 * j + 2], s1, acc[4 * j + 2]);
    acc[4 * j + 3] = fmaf(tmp[4 * j + 3], s1, acc[4 * j + 3]);
  }
}

template <int kWarpGroups>
__global__ void __launch_bounds__(TileConfig<kWarpGroups>::kThreads, 1)
    fp8_wgmma_gemm_kernel(const Fp8WgmmaGemmParams p) {
  pdl_wait();
  using Cfg = TileConfig<kWarpGroups>;
  constexpr int kBlockM = Cfg::kBlockM;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = async::smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;  // stage ring of A/W tiles
  uint8_t* const smem = smem_raw + (base - raw);
  const uint32_t scale_base = base + kStages * Cfg::kStageBytes;  // ring of sa/sw
  const uint8_t* const scale_smem = smem + kStages * Cfg::kStageBytes;

  const int tid = static_cast<int>(threadIdx.x);
  // M tiles vary fastest: the CTAs sharing a weight tile run together and read it once from HBM.
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * kBlockM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kBlockN;
  // This CTA's K tiles: [kt_begin, kt_begin + num_k_tiles) of the split (the whole K without one).
  cg::cluster_group cluster = cg::this_cluster();
  const int split = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  const int total_k_tiles = static_cast<int>(p.k / kBlockK);
  const int kt_begin = rank * total_k_tiles / split;
  const int num_k_tiles = (rank + 1) * total_k_tiles / split - kt_begin;
  const int64_t w_scale_pitch = p.k / 32;

  // Issues the cp.async copies of this CTA's K tile `local` into ring slot `stage` (one commit
  // group per call site).
  const auto load_tile = [&](int local, int stage) {
    const int kt = kt_begin + local;
    const int64_t k0 = static_cast<int64_t>(kt) * kBlockK;
    const uint32_t a_dst = base + stage * Cfg::kStageBytes;
    const uint32_t w_dst = a_dst + Cfg::kABytes;
    // NOTE: rolled loops: unrolled, the hoisted per-chunk addresses spill (255 registers).
#pragma unroll 1
    for (int i = 0; i < kBlockM * 8 / Cfg::kThreads; ++i) {
      const int e = tid + i * Cfg::kThreads;
      const int r = e >> 3, c = e & 7;  // 8 threads per 128-byte row: coalesced, conflict-free
      const bool ok = m0 + r < p.m;
      const uint8_t* src = p.a + (ok ? m0 + r : 0) * p.lda + k0 + c * 16;
      async::copy16(a_dst + r * 128 + ((c ^ (r & 7)) << 4), src, ok);
    }
#pragma unroll 1
    for (int i = 0; i < kBlockN * 8 / Cfg::kThreads; ++i) {
      const int e = tid + i * Cfg::kThreads;
      const int r = e >> 3, c = e & 7;
      async::copy16(w_dst + r * 128 + ((c ^ (r & 7)) << 4), p.w + (n0 + r) * p.k + k0 + c * 16, true);
    }
    const uint32_t s_dst = scale_base + stage * Cfg::kScaleStageBytes;
    if (tid < kBlockM) {
      const bool ok = m0 + tid < p.m;
      cp_async4(s_dst + tid * 4, p.a_scale + (ok ? m0 + tid : 0) * p.lda_scale + kt * 4, ok);
    } else if (tid < kBlockM + kBlockN / 32) {
      const int b = tid - kBlockM;
      cp_async4(s_dst + Cfg::kSaBytes + b * 4, p.w_scale + (n0 / 32 + b) * w_scale_pitch + kt * 4,
                true);
    }
  };

  // Prologue: kStages - 1 tiles in flight. Slot (kt - 1) % kStages is refilled at iteration kt:
  // each warpgroup drains its wgmmas (wait_group 0) at the end of a tile, and the __syncthreads
  // of iteration kt orders every warpgroup's drain of tile kt - 1 before the refill.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_k_tiles) load_tile(s, s);
    async::commit();
  }

  const int wg = tid / kWarpGroupThreads;
  const int lane = tid & 31;
  const int row0 = wg * 64 + ((tid >> 5) & 3) * 16 + (lane >> 2);  // tile row of d[4j], d[4j+1]

  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
  // Ping-pong wgmma outputs (even / odd k32 steps of a tile) and their scale products.
  float tmp0[64], tmp1[64];
  float scale0[8], scale1[8];

  for (int kt = 0; kt < num_k_tiles; ++kt) {
    // Committed groups: kStages - 1 + kt (group g holds tile g; one commit per iteration, at
    // step 0); tile kt's is done when at most kStages - 2 are pending.
    async::wait<kStages - 2>();
    fence_proxy_async_shared();
    __syncthreads();  // everyone's copies of tile kt; every warpgroup done with tile kt - 1
    const int stage = kt % kStages;
    const uint32_t a_tile = base + stage * Cfg::kStageBytes + wg * 64 * kBlockK;
    const uint32_t w_tile = base + stage * Cfg::kStageBytes + Cfg::kABytes;
    const uint8_t* sc = scale_smem + stage * Cfg::kScaleStageBytes;
    const uint32_t sa0 = *reinterpret_cast<const uint32_t*>(sc + row0 * 4);
    const uint32_t sa1 = *reinterpret_cast<const uint32_t*>(sc + (row0 + 8) * 4);
    uint32_t sw[4];
#pragma unroll
    for (int b = 0; b < 4; ++b)
      sw[b] = *reinterpret_cast<const uint32_t*>(sc + Cfg::kSaBytes + b * 4);

#pragma unroll
    for (int s = 0; s < kKBlocksPerTile; ++s) {
      // Step s: issue its wgmma, then promote step s - 1 while it runs. The last step is promoted
      // after wait_group 0 at the end of the tile.
      // NOTE: carrying the last step's wgmma across the loop's back edge (promoting it under the
      // next tile's first wgmma) makes ptxas serialise every wgmma (C7514), so each tile drains.
      const uint64_t desc_a = smem_desc_sw128(a_tile + s * 32);
      const uint64_t desc_b = smem_desc_sw128(w_tile + s * 32);
      wgmma_fence();
      if (s % 2 == 0) {
        wgmma_m64n128k32_e4m3(tmp0, desc_a, desc_b);
      } else {
        wgmma_m64n128k32_e4m3(tmp1, desc_a, desc_b);
      }
      wgmma_commit();
      if (s == 0) {
        // Refill the slot of tile kt - 1 (drained by every warpgroup before the barrier) while
        // the tensor cores run.
        const int next = kt + kStages - 1;
        if (next < num_k_tiles) load_tile(next, next % kStages);
        async::commit();
      }
      // Scale products of this step (exact: powers of two well inside the fp32 range), used
      // when it is promoted.
      float(&scale)[8] = s % 2 == 0 ? scale0 : scale1;
      const float a0 = ue8m0_value((sa0 >> (8 * s)) & 0xFFu);
      const float a1 = ue8m0_value((sa1 >> (8 * s)) & 0xFFu);
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const float wsc = ue8m0_value((sw[b] >> (8 * s)) & 0xFFu);
        scale[b] = a0 * wsc;
        scale[4 + b] = a1 * wsc;
      }
      if (s > 0) {
        wgmma_wait<1>();  // step s - 1 is done; step s keeps running
        if (s % 2 == 0) {
          fence_operands(tmp1);
          promote(acc, tmp1, scale1);
        } else {
          fence_operands(tmp0);
          promote(acc, tmp0, scale0);
        }
      }
    }
    static_assert(kKBlocksPerTile % 2 == 0, "the last step of a tile writes tmp1");
    wgmma_wait<0>();
    fence_operands(tmp1);
    promote(acc, tmp1, scale1);
  }

  if (split > 1) {
    // Partial tiles in the (now idle) stage ring, [64][kThreads] floats: thread-major, so the
    // stores and rank 0's remote loads are coalesced and conflict-free.
    async::wait<0>();
    __syncthreads();  // every warp is past its last read of the ring
    float* staging = reinterpret_cast<float*>(smem);
    if (rank != 0) {
#pragma unroll
      for (int i = 0; i < 64; ++i) staging[i * Cfg::kThreads + tid] = acc[i];
    }
    cluster.sync();  // every rank's partial tile is visible
    if (rank == 0) {
      for (int r = 1; r < split; ++r) {
        const float* peer = cluster.map_shared_rank(staging, r);
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[i] += peer[i * Cfg::kThreads + tid];
      }
    }
    cluster.sync();  // keep each rank's tile alive until rank 0 has read it
    if (rank != 0) return;
  }
  static_assert(64 * Cfg::kThreads * sizeof(float) <= kStages * Cfg::kStageBytes);

  // Epilogue: straight from registers, two consecutive columns per store (each warp store covers
  // 8 rows x 32 bytes: whole sectors).
  const int64_t r0 = m0 + row0, r1 = r0 + 8;
  float* y0 = p.y + r0 * p.ldy + n0 + 2 * (lane & 3);
  float* y1 = y0 + 8 * p.ldy;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    if (r0 < p.m) *reinterpret_cast<float2*>(y0 + 8 * j) = make_float2(acc[4 * j], acc[4 * j + 1]);
    if (r1 < p.m)
      *reinterpret_cast<float2*>(y1 + 8 * j) = make_float2(acc[4 * j + 2], acc[4 * j + 3]);
  }
}

constexpr int kMaxSplit = 8;  // portable cluster size

template <int kWarpGroups>
void launch_tiles(const Fp8WgmmaGemmParams& p, cudaStream_t stream) {
  using Cfg = TileConfig<kWarpGroups>;
  const auto kernel = fp8_wgmma_gemm_kernel<kWarpGroups>;
  MS_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
  const int64_t m_tiles = ceil_div(p.m, Cfg::kBlockM);
  const int64_t n_tiles = p.n / kBlockN;
  const int k_tiles = static_cast<int>(p.k / kBlockK);
  int split = p.split_k;
  if (split == 0) {
    // Enough CTAs to cover the SMs once, each rank keeping at least 2 K tiles.
    const int sms = device_sm_count();
    const int64_t fill = std::max<int64_t>(1, sms / (m_tiles * n_tiles));
    split = static_cast<int>(std::min<int64_t>({fill, kMaxSplit, std::max(1, k_tiles / 2)}));
  }
  split = std::min(split, k_tiles);

  const dim3 grid(static_cast<unsigned>(m_tiles), static_cast<unsigned>(n_tiles),
                  static_cast<unsigned>(split));
  MS_CUDA_CHECK(launch_kernel_clusters(kernel, grid, dim3(1, 1, static_cast<unsigned>(split)),
                                       Cfg::kThreads, Cfg::kSmemBytes, stream, p));
}

}  // namespace

void launch_fp8_wgmma_gemm(const Fp8WgmmaGemmParams& p, Stream stream) {
  if (p.m == 0) return;
  const auto aligned = [](const void* ptr, uintptr_t a) {
    return reinterpret_cast<uintptr_t>(ptr) % a == 0;
  };
  const bool ok = p.m > 0 && p.n > 0 && p.k > 0 && p.n % kBlockN == 0 && p.k % kBlockK == 0 &&
                  p.n / kBlockN <= 65535 && p.split_k >= 0 && p.split_k <= kMaxSplit &&
                  ceil_div(p.m, 64) <= 0x7FFFFFFF && p.lda >= p.k && p.lda % 16 == 0 &&
                  p.lda_scale >= p.k / 32 && p.lda_scale % 4 == 0 && p.ldy >= p.n &&
                  p.ldy % 2 == 0 && aligned(p.a, 16) && aligned(p.w, 16) && aligned(p.a_scale, 4) &&
                  aligned(p.w_scale, 4) && aligned(p.y, 8);
  if (!ok)
    detail::cuda_call_failed(__FILE__, __LINE__, "launch_fp8_wgmma_gemm", "bad arguments",
                             "N % 128 == 0, K % 128 == 0, 0 <= split_k <= 8, lda >= K and % 16, "
                             "lda_scale >= K/32 and % 4, ldy >= N and even, a/w 16-byte, scales "
                             "4-byte, y 8-byte aligned");
  const cudaStream_t s = as_cuda_stream(stream);
  // One warpgroup (BM = 64) for decode-sized batches: half the wasted rows of BM = 128.
  if (p.m <= 64) {
    launch_tiles<1>(p, s);
  } else {
    launch_tiles<2>(p, s);
  }
}

}  // namespace moeserve::cuda
