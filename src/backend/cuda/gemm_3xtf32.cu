// fp32-accurate GEMM on TF32 tensor cores (3xTF32, mma.sync m16n8k8): C = A · B^T with each
// operand split into a TF32 high part and a TF32 remainder, hi·hi + hi·lo + lo·hi accumulated in
// fp32 (the dropped lo·lo term is ~2^-22 of each product). 64x64 tiles of 4 warps (32x32 each),
// a 4-deep cp.async ring of 32-column k tiles (XOR-swizzled 16-byte chunks, read with ldmatrix),
// split-K over a thread-block cluster whose partial tiles are added in rank order through
// distributed shared memory (deterministic, no workspace).
// NOTE: the tensor cores add into their fp32 accumulator with truncation (no round to nearest);
// over 4096 / 8 chained MMAs on a growing sum that bias reaches ~10x an fp32 SGEMM's error. Each
// 32-wide k tile is therefore summed in fresh registers and added to the running sum with
// ordinary (round-to-nearest) fp32 adds.
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kBM = 64;
constexpr int kBN = 64;
constexpr int kBK = 32;  // floats per k tile: 8 chunks of 16 bytes per row
constexpr int kStages = 4;
constexpr int kThreads = 128;
constexpr int kMaxSplit = 8;  // portable cluster size
constexpr int kTileFloats = kBM * kBK;
static_assert(kBN * kBK == kTileFloats);
constexpr int kStageFloats = 2 * kTileFloats;  // A tile, then B tile
constexpr int kCPitch = kBN + 4;               // the partial C tile of the split-K reduction
constexpr int kSmemFloats = std::max(kStages * kStageFloats, kBM* kCPitch);
constexpr int kSmemBytes = kSmemFloats * 4;

// Float offset of chunk `chunk` (4 floats) of tile row `row`: chunks XOR-swizzled by row % 8 so
// that ldmatrix's 8 row addresses (same chunk, 8 consecutive rows) hit distinct banks.
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * kBK + ((chunk ^ (row & 7)) << 2);
}

// x = hi + lo, both TF32 (round to nearest, ties away: cvt.rna).
__device__ __forceinline__ void split_tf32(uint32_t x, uint32_t& hi, uint32_t& lo) {
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(hi) : "f"(__uint_as_float(x)));
  const float rest = __uint_as_float(x) - __uint_as_float(hi);
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(lo) : "f"(rest));
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Grid (n tiles, m tiles, split); cluster (1, 1, split): rank z takes k tiles
// [z*kt/split, (z+1)*kt/split). Warp w owns rows 32*(w % 2) and columns 32*(w / 2) of the tile:
// 2 m16 x 4 n8 accumulators.
__global__ void __launch_bounds__(kThreads) gemm_3xtf32_kernel(Gemm3xTf32Params p) {
  extern __shared__ __align__(128) float smem[];
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int split = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kBM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBN;
  const int64_t k_tiles = (p.k + kBK - 1) / kBK;
  const int64_t kt0 = k_tiles * rank / split, kt1 = k_tiles * (rank + 1) / split;
  const int tiles = static_cast<int>(kt1 - kt0);

  // k tile kt into ring slot `slot`: 512 chunks of A then 512 of B, 8 per thread; zeros past m,
  // n and k.
  const auto issue = [&](int64_t kt, int slot) {
    float* as = smem + slot * kStageFloats;
    float* bs = as + kTileFloats;
#pragma unroll
    for (int it = 0; it < 2 * kTileFloats / 4 / kThreads; ++it) {
      const int e = tid + it * kThreads;
      const bool is_b = e >= kTileFloats / 4;
      const int row = (e % (kTileFloats / 4)) >> 3, chunk = e & 7;
      const int64_t k = kt * kBK + chunk * 4;
      const int64_t gr = (is_b ? n0 : m0) + row;
      const bool ok = k < p.k && gr < (is_b ? p.n : p.m);
      const float* src = is_b ? p.b + (ok ? gr * p.ldb + k : 0) : p.a + (ok ? gr * p.lda + k : 0);
      async::copy16(async::smem_addr((is_b ? bs : as) + swizzled(row, chunk)), src, ok);
    }
  };

  float acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
  const int wm = (warp & 1) * 32, wn = (warp >> 1) * 32;
  // ldmatrix roles: lane l gives a row address of matrix l / 8.
  const int lrow = lane & 7, lmat = lane >> 3;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < tiles) issue(kt0 + s, s);
    async::commit();
  }
  for (int i = 0; i < tiles; ++i) {
    async::wait<kStages - 2>();
    __syncthreads();  // tile i landed for all threads; slot (i - 1) % kStages is free again
    if (i + kStages - 1 < tiles) issue(kt0 + i + kStages - 1, (i + kStages - 1) % kStages);
    async::commit();
    const float* as = smem + (i % kStages) * kStageFloats;
    const float* bs = as + kTileFloats;
    float tile_acc[2][4][4];  // this k tile's sum: the MMAs' truncating adds stay small
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int ni = 0; ni < 4; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) tile_acc[mi][ni][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kBK / 8; ++kk) {
      uint32_t ahi[2][4], alo[2][4], bhi[4][2], blo[4][2];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        // Matrices: rows +0 / +8 (bit 0 of lmat), k chunk 2kk / 2kk + 1 (bit 1): a0..a3.
        uint32_t r[4];
        mma::ldsm_x4(r, as + swizzled(wm + mi * 16 + lrow + (lmat & 1) * 8, kk * 2 + (lmat >> 1)));
#pragma unroll
        for (int e = 0; e < 4; ++e) split_tf32(r[e], ahi[mi][e], alo[mi][e]);
      }
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        // Matrices: k chunk 2kk / 2kk + 1 (bit 0), n rows +0 / +8 (bit 1): b0, b1 of n8 tile
        // 2np, then of 2np + 1.
        uint32_t r[4];
        mma::ldsm_x4(r, bs + swizzled(wn + np * 16 + lrow + (lmat >> 1) * 8, kk * 2 + (lmat & 1)));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          split_tf32(r[2 * h], bhi[2 * np + h][0], blo[2 * np + h][0]);
          split_tf32(r[2 * h + 1], bhi[2 * np + h][1], blo[2 * np + h][1]);
        }
      }
      // The small terms first, then hi·hi, into the same fp32 accumulators.
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
          mma_tf32(tile_acc[mi][ni], alo[mi], bhi[ni][0], bhi[ni][1]);
          mma_tf32(tile_acc[mi][ni], ahi[mi], blo[ni][0], blo[ni][1]);
          mma_tf32(tile_acc[mi][ni], ahi[mi], bhi[ni][0], bhi[ni][1]);
        }
    }
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int ni = 0; ni < 4; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mi][ni][e] += tile_acc[mi][ni][e];
  }
  async::wait<0>();
  __syncthreads();  // the ring becomes the partial C tile

  float* cs = smem;  // [kBM][kCPitch]
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
      const int r = wm + mi * 16 + g, c = wn + ni * 8 + 2 * t;
      *reinterpret_cast<float2*>(cs + r * kCPitch + c) =
          make_float2(acc[mi][ni][0], acc[mi][ni][1]);
      *reinterpret_cast<float2*>(cs + (r + 8) * kCPitch + c) =
          make_float2(acc[mi][ni][2], acc[mi][ni][3]);
    }
  cluster.sync();
  // Rank z stores tile rows z, z + split, ...: the sum over ranks in rank order.
  for (int row = rank + split * (tid / kBN); row < kBM; row += split * (kThreads / kBN)) {
    const int col = tid % kBN;
    const int64_t gm = m0 + row, gn = n0 + col;
    if (gm >= p.m || gn >= p.n) continue;
    float s = cluster.map_shared_rank(cs, 0)[row * kCPitch + col];
    for (int b = 1; b < split; ++b) s += cluster.map_shared_rank(cs, b)[row * kCPitch + col];
    p.c[gm * p.ldc + gn] = s;
  }
  cluster.sync();  // keep this block's partial tile alive until the cluster has read it
}

bool aligned16(const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15u) == 0; }

}  // namespace

void launch_gemm_f32_3xtf32(const Gemm3xTf32Params& p, Stream stream) {
  if (p.m == 0 || p.n == 0) return;
  if (p.k % 4 != 0 || p.lda % 4 != 0 || p.ldb % 4 != 0 || !aligned16(p.a) || !aligned16(p.b) ||
      p.k <= 0)
    detail::cuda_call_failed(__FILE__, __LINE__, "gemm 3xtf32",
                             "needs k % 4 == 0, lda/ldb % 4 == 0, 16-byte aligned a and b", "");
  const int64_t m_tiles = ceil_div(p.m, kBM), n_tiles = ceil_div(p.n, kBN);
  if (m_tiles > 65535) detail::cuda_call_failed(__FILE__, __LINE__, "gemm 3xtf32", "m too big", "");
  const int64_t k_tiles = ceil_div(p.k, kBK);
  int split = p.split_k;
  if (split == 0) {
    // As many k slices as keep every tile's cluster on its own SMs in one wave.
    int device = 0, sms = 0;
    MS_CUDA_CHECK(cudaGetDevice(&device));
    MS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    split = static_cast<int>(std::clamp<int64_t>(sms / (m_tiles * n_tiles), 1, kMaxSplit));
  }
  split = static_cast<int>(std::clamp<int64_t>(split, 1, std::min<int64_t>(kMaxSplit, k_tiles)));
  MS_CUDA_CHECK(cudaFuncSetAttribute(gemm_3xtf32_kernel,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(n_tiles), static_cast<unsigned>(m_tiles),
                     static_cast<unsigned>(split));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmemBytes;
  cfg.stream = as_cuda_stream(stream);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = static_cast<unsigned>(split);
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  MS_CUDA_CHECK(cudaLaunchKernelEx(&cfg, gemm_3xtf32_kernel, p));
}

}  // namespace moeserve::cuda
