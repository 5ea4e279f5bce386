// V4.1 elementwise and small-reduction ops: RoPE (angles in double), clamped SwiGLU, mHC (mixes in
// one launch: cluster split-K register-tiled dots + a per-row finish with sigmoid/softmax/Sinkhorn;
// collapse; expand with an optional fused collapse; expand + mixes fused, on clusters of 4, 8 or
// 16 blocks),
// the Engram gate, the Engram row gather from host memory and its dequantisation, the pinned
// host allocation the tables live in (cuMem HOST with 2 MB granules, else cudaHostAlloc), and the
// hi/lo operands of the split-TF32 GEMM.
#include <cooperative_groups.h>
#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <vector>

#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/v41_device.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kThreads = 256;

// Thread item (row, group of RopeParams::heads_per_thread heads, pair): the pair's angle (one
// double sincos) serves every head of the group (it depends on the row and the pair only; with a
// head per item it is computed `heads` times: 64x for q); the group's values are loaded before
// any is rotated. The same operations per value at every group size: bit-identical.
constexpr int kRopeHeads = 8;  // the most heads per thread
__global__ void rope_kernel(RopeParams p) {
  pdl_wait();
  const int half = p.rd / 2;
  const int hpt = p.heads_per_thread;
  const int groups = (p.heads + hpt - 1) / hpt;
  const int64_t total = p.rows * groups * half;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int pair = static_cast<int>(i % half);
    const int64_t rg = i / half;
    const int h0 = static_cast<int>(rg % groups) * hpt;
    const int64_t r = rg / groups;
    const int nh = min(hpt, p.heads - h0);
    float* t = p.x + r * p.row_stride + h0 * p.head_stride + (p.head_dim - p.rd) + 2 * pair;
    double s, c;
    sincos(static_cast<double>(p.pos[r]) * p.freqs[pair], &s, &c);
    if (p.inverse) s = -s;
    float a[kRopeHeads], b[kRopeHeads];
#pragma unroll
    for (int j = 0; j < kRopeHeads; ++j) {
      if (j < nh) {
        a[j] = t[j * p.head_stride];
        b[j] = t[j * p.head_stride + 1];
      }
    }
#pragma unroll
    for (int j = 0; j < kRopeHeads; ++j) {
      if (j < nh) {
        const double x = a[j], y = b[j];
        t[j * p.head_stride] = static_cast<float>(x * c - y * s);
        t[j * p.head_stride + 1] = static_cast<float>(x * s + y * c);
      }
    }
  }
}

__global__ void swiglu_kernel(SwigluParams p) {
  pdl_wait();
  const int64_t total = p.rows * p.cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / p.cols, c = i % p.cols;
    const float g = fminf(p.gate[r * p.ld_gate + c], p.limit);
    const float u = fminf(fmaxf(p.up[r * p.ld_up + c], -p.limit), p.limit);
    float v = g / (1.0f + expf(-g)) * u;
    if (p.row_weight) v *= p.row_weight[r];
    p.out[r * p.ld_out + c] = v;
  }
}

// ---- mHC ----------------------------------------------------------------------------------------

constexpr int kMaxHc = 4;
constexpr int kMixCluster = 8;  // blocks of a cluster splitting hc*dim (portable cluster size)
// Cluster widths the fused expand + mixes kernel is built for (HcExpandMixesParams::
// cluster_width); 16 is beyond the portable 8 (cudaFuncAttributeNonPortableClusterSizeAllowed).
constexpr int kMaxMixCluster = 16;
constexpr int kMaxSplitBlocks = 256;  // HcExpandMixesParams::split_blocks
constexpr int kMixWarps = kThreads / 32;
constexpr int kMixKLanes = 8;     // lanes along k, a float4 each: 128 contiguous bytes of a row
constexpr int kMixRLanes = 4;     // lanes along rows
constexpr int kMixMinTiles = 24;  // row tiles (clusters) wanted before a tile grows

__device__ __forceinline__ float4 zero4() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }

// row[k .. k+4) with zeros past `width`. kVec: width % 4 == 0 and row 16-byte aligned.
template <bool kVec, bool kStream>
__device__ __forceinline__ float4 load4(const float* row, int64_t k, int64_t width) {
  if constexpr (kVec) {
    if (k >= width) return zero4();
    const float4* a = reinterpret_cast<const float4*>(row + k);
    if constexpr (kStream) return __ldcs(a);
    return __ldg(a);
  } else {
    float4 v = zero4();
    if (k < width) v.x = row[k];
    if (k + 1 < width) v.y = row[k + 1];
    if (k + 2 < width) v.z = row[k + 2];
    if (k + 3 < width) v.w = row[k + 3];
    return v;
  }
}

// The end of mixes for one row, by a whole warp: the row's M + 1 sums (M mixes, then Σ f^2) from
// `part` [tile rows][M + 1] of each of the kCW blocks of the cluster, added in rank order; the RMS
// scale, the sigmoids, the softmax and Sinkhorn on the hc x hc matrix held one element per lane.
// Lane roles: lanes [0, 2*HC) pre/post (mix index = lane), lane 8 the Σ f^2, lanes 16 + 4*jr + kc
// comb[jr][kc] (mix index 2*HC + jr*HC + kc; padding outside hc x hc).
// A lane's role in the end of a row's mixes (hc_mixes_finish_row, the split path's finish):
// idx = the sum it reads (-1: none), cv = it holds comb[jr][kc].
struct MixLane {
  int idx = -1;
  bool cv = false;
  int jr = 0, kc = 0;
};
template <int HC>
__device__ __forceinline__ MixLane mix_lane() {
  constexpr int M = (2 + HC) * HC;
  const int lane = threadIdx.x & 31;
  MixLane l;
  if (lane < 2 * HC) {
    l.idx = lane;
  } else if (lane == 8) {
    l.idx = M;
  } else if (lane >= 16) {
    l.jr = (lane - 16) >> 2;
    l.kc = (lane - 16) & 3;
    l.cv = l.jr < HC && l.kc < HC;
    if (l.cv) l.idx = 2 * HC + l.jr * HC + l.kc;
  }
  return l;
}
template <int HC>
__device__ void hc_mixes_finish_from(const HcMixesParams& p, const MixLane& ml, float val,
                                     int64_t row);
template <int HC, int kCW = kMixCluster>
__device__ void hc_mixes_finish_row(const HcMixesParams& p,
                                    cooperative_groups::cluster_group& cluster, float* part, int rr,
                                    int64_t row) {
  constexpr int MA = (2 + HC) * HC + 1;
  const MixLane ml = mix_lane<HC>();
  float val = 0.0f;
  if (ml.idx >= 0)
    for (int b = 0; b < kCW; ++b) val += cluster.map_shared_rank(part, b)[rr * MA + ml.idx];
  hc_mixes_finish_from<HC>(p, ml, val, row);
}
// The end of a row's mixes from the lane's sum `val` (ml.idx; lane 8 holds the sum of squares):
// the RMS scale, the sigmoids, the softmax and Sinkhorn; by a whole warp.
template <int HC>
__device__ void hc_mixes_finish_from(const HcMixesParams& p, const MixLane& ml, float val,
                                     int64_t row) {
  const int lane = threadIdx.x & 31;
  const int64_t width = static_cast<int64_t>(HC) * p.dim;
  const int idx = ml.idx, jr = ml.jr, kc = ml.kc;
  const bool cv = ml.cv;
  const float ss = __shfl_sync(0xffffffffu, val, 8);
  const float mix = val * rsqrtf(ss / static_cast<float>(width) + p.rms_eps);
  if (lane < HC) {
    p.pre[row * HC + lane] = 1.0f / (1.0f + expf(-(mix * p.scale[0] + p.base[lane]))) + p.hc_eps;
  } else if (lane < 2 * HC) {
    p.post[row * HC + lane - HC] = 2.0f / (1.0f + expf(-(mix * p.scale[1] + p.base[lane])));
  }
  float c = cv ? mix * p.scale[2] + p.base[idx] : -INFINITY;
  float mx = fmaxf(c, __shfl_xor_sync(0xffffffffu, c, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const float e = cv ? expf(c - mx) : 0.0f;
  float sum = e + __shfl_xor_sync(0xffffffffu, e, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  c = cv ? e / sum + p.hc_eps : 0.0f;
#pragma unroll 1
  for (int it = 0; it < p.sinkhorn_iters; ++it) {
    if (it > 0) {  // rows: lanes xor 1, 2
      float s = c + __shfl_xor_sync(0xffffffffu, c, 1);
      s += __shfl_xor_sync(0xffffffffu, s, 2);
      c = cv ? c / (s + p.hc_eps) : 0.0f;
    }
    float s = c + __shfl_xor_sync(0xffffffffu, c, 4);  // columns: lanes xor 4, 8
    s += __shfl_xor_sync(0xffffffffu, s, 8);
    c = cv ? c / (s + p.hc_eps) : 0.0f;
  }
  if (cv) p.comb[row * HC * HC + jr * HC + kc] = c;
}

// mHC mixes in one launch. Grid (kMixCluster, row tiles); a cluster owns a tile of
// rt = 4*RPT*wr rows and splits the width w = HC*dim in units of 32 columns over its
// kMixCluster * (kMixWarps / wr) warps (unit u to slice u % slices). Warp (row_sub = warp % wr,
// k_sub = warp / wr) holds 4*RPT rows: lane = (rq, kq), kq = lane % 8 reads a float4 of each of
// its RPT rows (rq*RPT + r) and of the M fn rows, and keeps RPT x (M + 1) fp32 sums (the last:
// Σ f^2). Reduction, all in a fixed order: lanes by a reduce-scatter over kq, warps of a block
// through shared memory, the cluster's blocks through distributed shared memory; then one warp
// per row (rows rank, rank + 8, ... of the tile) does the RMS scale, the sigmoids, the softmax and
// Sinkhorn on a 4x4 matrix held one element per lane (lanes 16..31, zero padding for hc < 4).
template <int HC, int RPT, bool kVec>
__global__ void __cluster_dims__(kMixCluster, 1, 1) __launch_bounds__(kThreads, RPT == 2 ? 2 : 1)
    hc_mixes_kernel(HcMixesParams p, int wr) {
  pdl_wait();
  constexpr int M = (2 + HC) * HC;
  constexpr int MA = M + 1;
  constexpr int N = RPT * MA;
  constexpr int kWarpRows = kMixRLanes * RPT;
  static_assert(RPT == 2 || RPT == 4);
  __shared__ float red[kMixWarps][kWarpRows][MA];
  __shared__ float part[kMixWarps * kWarpRows][MA];
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int kq = lane % kMixKLanes, rq = lane / kMixKLanes;
  const int row_sub = warp % wr, k_sub = warp / wr, ksubs = kMixWarps / wr;
  const int rt = kWarpRows * wr;
  const int64_t tile0 = static_cast<int64_t>(blockIdx.y) * rt;
  const int64_t width = static_cast<int64_t>(HC) * p.dim;
  const int64_t units = (width + 31) / 32;
  const int64_t slices = static_cast<int64_t>(kMixCluster) * ksubs;
  const int64_t slice = static_cast<int64_t>(cluster.block_rank()) * ksubs + k_sub;

  const float* xr[RPT];
  bool valid[RPT];
#pragma unroll
  for (int r = 0; r < RPT; ++r) {
    const int64_t row = tile0 + row_sub * kWarpRows + rq * RPT + r;
    valid[r] = row < p.rows;
    xr[r] = p.x + (valid[r] ? row : 0) * p.ldx;
  }
  float acc[N];
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i] = 0.0f;
  float4 xn[RPT];
#pragma unroll
  for (int r = 0; r < RPT; ++r)
    xn[r] = valid[r] ? load4<kVec, true>(xr[r], slice * 32 + kq * 4, width) : zero4();
  for (int64_t u = slice; u < units; u += slices) {
    const int64_t k = u * 32 + kq * 4;
    float4 xv[RPT];
#pragma unroll
    for (int r = 0; r < RPT; ++r) xv[r] = xn[r];
    if (u + slices < units) {
#pragma unroll
      for (int r = 0; r < RPT; ++r)
        if (valid[r]) xn[r] = load4<kVec, true>(xr[r], k + slices * 32, width);
    }
#pragma unroll
    for (int j = 0; j < M; ++j) {
      const float4 w = load4<kVec, false>(p.fn + j * width, k, width);
#pragma unroll
      for (int r = 0; r < RPT; ++r) {
        float& a = acc[r * MA + j];
        a = fmaf(xv[r].x, w.x, a);
        a = fmaf(xv[r].y, w.y, a);
        a = fmaf(xv[r].z, w.z, a);
        a = fmaf(xv[r].w, w.w, a);
      }
    }
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
      float& a = acc[r * MA + M];
      a = fmaf(xv[r].x, xv[r].x, a);
      a = fmaf(xv[r].y, xv[r].y, a);
      a = fmaf(xv[r].z, xv[r].z, a);
      a = fmaf(xv[r].w, xv[r].w, a);
    }
  }

  // Sum over the 8 kq lanes (lane bits 0..2). xor 4: each lane keeps half of the rows (bit 2
  // set: the upper half) and adds its partner's copy of them.
  {
    const bool hi = (lane & 4) != 0;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const float send = hi ? acc[i] : acc[i + N / 2];
      const float keep = hi ? acc[i + N / 2] : acc[i];
      acc[i] = keep + __shfl_xor_sync(0xffffffffu, send, 4);
    }
  }
  int rl;  // the warp row (of this lane's rq group) whose sums acc[0, MA) now hold
  if constexpr (RPT == 4) {
    const bool hi = (lane & 2) != 0;
#pragma unroll
    for (int i = 0; i < MA; ++i) {
      const float send = hi ? acc[i] : acc[i + MA];
      const float keep = hi ? acc[i + MA] : acc[i];
      acc[i] = keep + __shfl_xor_sync(0xffffffffu, send, 2);
    }
#pragma unroll
    for (int i = 0; i < MA; ++i) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], 1);
    rl = 2 * ((lane >> 2) & 1) + ((lane >> 1) & 1);
  } else {
#pragma unroll
    for (int i = 0; i < MA; ++i) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], 2);
#pragma unroll
    for (int i = 0; i < MA; ++i) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], 1);
    rl = (lane >> 2) & 1;
  }
  const int owner_mask = RPT == 4 ? 1 : 3;  // one writer per row among the lanes that hold it
  if ((lane & owner_mask) == 0) {
#pragma unroll
    for (int i = 0; i < MA; ++i) red[warp][rq * RPT + rl][i] = acc[i];
  }
  __syncthreads();
  // Block partial of each tile row: the warps sharing its row_sub, in k_sub order.
  for (int e = threadIdx.x; e < rt * MA; e += blockDim.x) {
    const int rr = e / MA, i = e % MA;
    float s = 0.0f;
    for (int ks = 0; ks < ksubs; ++ks) s += red[ks * wr + rr / kWarpRows][rr % kWarpRows][i];
    part[rr][i] = s;
  }
  cluster.sync();

  const int rank = static_cast<int>(cluster.block_rank());
  for (int rr = rank + kMixCluster * warp; rr < rt; rr += kMixCluster * kMixWarps)
    if (tile0 + rr < p.rows) hc_mixes_finish_row<HC>(p, cluster, &part[0][0], rr, tile0 + rr);
  cluster.sync();  // keep this block's `part` alive until the cluster has read it
}

// ---- mHC mixes, staged (float4 path) --------------------------------------------------------
// Same sums as hc_mixes_kernel, for 16-byte aligned rows with width % 4 == 0. A cluster of
// kMixCluster blocks owns a tile of 8*RPT rows; block `rank` takes the kStageK-column chunks
// rank, rank + kMixCluster, ... of the width. Each chunk (the tile's x columns and the M fn rows)
// comes in through a kStages-deep cp.async ring, so that about 3 chunks per block are in flight
// from HBM while one is multiplied. In a chunk, warp w takes columns [16w, 16w + 16); lane =
// (r = lane % 8, kq = lane / 8) reads the float4 at column 16w + 4kq of rows r, r + 8, ... (RPT
// rows: kXPitch pads rows so that the 8 lanes of a quarter warp hit distinct banks) and of each fn
// row (4 distinct addresses per warp: broadcast), and keeps RPT x (M + 1) fp32 sums. Reduction,
// all in a fixed order: the kq lanes by a butterfly, the warps through shared memory in warp
// order, the cluster's blocks in rank order (hc_mixes_finish_row).
// NOTE: the old kernel kept too few bytes in flight (a float4 per row per lane, prefetched one
// step ahead, fn through L1): at 384 rows it ran at ~18% of HBM.
constexpr int kStageK = 128;  // columns per chunk: kMixWarps warps x 16
constexpr int kStages = 4;
constexpr int kXPitch = kStageK + 4;
static_assert(kStageK == kMixWarps * 16);

template <int HC, int RPT>
struct StagedMixes {
  static constexpr int kM = (2 + HC) * HC;
  static constexpr int kMA = kM + 1;
  static constexpr int kRows = 8 * RPT;
  static constexpr int kXFloats = kRows * kXPitch;
  static constexpr int kStageFloats = kXFloats + kM * kStageK;
  static constexpr int kRedFloats = kMixWarps * kRows * kMA;
  static constexpr int kRingFloats = std::max(kStages * kStageFloats, kRedFloats);
  static constexpr int kSmemBytes = (kRingFloats + kRows * kMA) * 4;
};

// One staged chunk's dot products (hc_mixes_staged_kernel, hc_expand_mixes_kernel): tile rows
// r0 + 8r of the chunk in `xs` (pitch kXPitch) times each of the M fn rows in `fs` (pitch
// kStageK) at columns col .. col + 3 into acc[r][j], and their sums of squares into acc[r][M].
template <int RPT, int M>
__device__ __forceinline__ void staged_chunk_dots(const float* xs, const float* fs, int r0, int col,
                                                  float (&acc)[RPT][M + 1]) {
  float4 xv[RPT];
#pragma unroll
  for (int r = 0; r < RPT; ++r)
    xv[r] = *reinterpret_cast<const float4*>(xs + (r0 + 8 * r) * kXPitch + col);
#pragma unroll
  for (int j = 0; j < M; ++j) {
    const float4 w = *reinterpret_cast<const float4*>(fs + j * kStageK + col);
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
      float& a = acc[r][j];
      a = fmaf(xv[r].x, w.x, a);
      a = fmaf(xv[r].y, w.y, a);
      a = fmaf(xv[r].z, w.z, a);
      a = fmaf(xv[r].w, w.w, a);
    }
  }
#pragma unroll
  for (int r = 0; r < RPT; ++r) {
    float& a = acc[r][M];
    a = fmaf(xv[r].x, xv[r].x, a);
    a = fmaf(xv[r].y, xv[r].y, a);
    a = fmaf(xv[r].z, xv[r].z, a);
    a = fmaf(xv[r].w, xv[r].w, a);
  }
}

// The end of a staged tile (hc_mixes_staged_kernel, hc_expand_mixes_kernel): acc holds this
// thread's sums of tile rows r0 + 8r (r0 = lane % 8) over chunk columns 16 warp + 4 (lane / 8) .. +
// 4 of its chunks; `smem` is the drained ring (at least kMixWarps x 8RPT x (M + 1) floats), `part`
// this block's [8RPT][M + 1] sums, read by the whole cluster; `rank` the block's rank in it. All in
// a fixed order: the kq lanes (lane bits 3, 4), then the warps in order, then (finish) the kCW
// blocks in rank order. `in_cluster_phase` runs between the two cluster barriers, where every
// block's shared memory written before the call is visible to the cluster and still alive.
// This block's sums of its tile rows into `part` [8RPT][M + 1] (not followed by a barrier): the
// kq lanes (lane bits 3, 4), then the warps in order through `smem` (the drained ring).
template <int HC, int RPT>
__device__ __forceinline__ void staged_mixes_block_sums(float (&acc)[RPT][(2 + HC) * HC + 1],
                                                        float* smem, float* part) {
  constexpr int MA = (2 + HC) * HC + 1, BR = 8 * RPT;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, r0 = lane & 7;
#pragma unroll
  for (int r = 0; r < RPT; ++r)
#pragma unroll
    for (int j = 0; j < MA; ++j) {
      acc[r][j] += __shfl_xor_sync(0xffffffffu, acc[r][j], 8);
      acc[r][j] += __shfl_xor_sync(0xffffffffu, acc[r][j], 16);
    }
  float* red = smem;  // [kMixWarps][BR][MA]
  if (lane < 8) {
#pragma unroll
    for (int r = 0; r < RPT; ++r)
#pragma unroll
      for (int j = 0; j < MA; ++j) red[(warp * BR + r0 + 8 * r) * MA + j] = acc[r][j];
  }
  __syncthreads();
  for (int e = tid; e < BR * MA; e += kThreads) {
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kMixWarps; ++w) s += red[w * BR * MA + e];
    part[e] = s;
  }
}

struct NoClusterPhase {
  __device__ void operator()() const {}
};
template <int HC, int RPT, int kCW = kMixCluster, typename ClusterPhase = NoClusterPhase>
__device__ __forceinline__ void staged_mixes_reduce_finish(
    const HcMixesParams& p, float (&acc)[RPT][(2 + HC) * HC + 1], float* smem, float* part,
    cooperative_groups::cluster_group& cluster, int rank, int64_t tile0,
    const ClusterPhase& in_cluster_phase = {}) {
  constexpr int BR = 8 * RPT;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  staged_mixes_block_sums<HC, RPT>(acc, smem, part);
  cluster.sync();
  for (int rr = rank + kCW * warp; rr < BR; rr += kCW * kMixWarps)
    if (tile0 + rr < p.rows) hc_mixes_finish_row<HC, kCW>(p, cluster, part, rr, tile0 + rr);
  in_cluster_phase();
  cluster.sync();  // keep this block's `part` alive until the cluster has read it
}

template <int HC, int RPT>
__global__ void __cluster_dims__(kMixCluster, 1, 1) __launch_bounds__(kThreads, RPT == 4 ? 1 : 2)
    hc_mixes_staged_kernel(HcMixesParams p) {
  pdl_wait();
  using Cfg = StagedMixes<HC, RPT>;
  constexpr int M = Cfg::kM, MA = Cfg::kMA, BR = Cfg::kRows;
  constexpr int kVecs = kStageK / 4;  // float4 per chunk row: one per lane
  extern __shared__ __align__(16) float smem[];
  float* part = smem + Cfg::kRingFloats;  // [BR][MA]: this block's sums, read by the cluster
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t tile0 = static_cast<int64_t>(blockIdx.y) * BR;
  const int64_t width = static_cast<int64_t>(HC) * p.dim;
  const int64_t chunks = (width + kStageK - 1) / kStageK;
  const int my_chunks =
      rank < chunks ? static_cast<int>((chunks - rank + kMixCluster - 1) / kMixCluster) : 0;

  // Chunk i of this block into ring slot `slot`; zeros past the width and past the last row. Warp
  // w copies x rows w, w + 8, ... and fn rows w, w + 8, ...; lane l the float4 at column 4l.
  static_assert(kVecs == 32);
  const auto issue = [&](int i, int slot) {
    const int64_t k = (rank + static_cast<int64_t>(i) * kMixCluster) * kStageK + lane * 4;
    const bool k_ok = k < width;
    float* xs = smem + slot * Cfg::kStageFloats;
    float* fs = xs + Cfg::kXFloats;
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
      const int row = warp + 8 * r;
      const bool ok = k_ok && tile0 + row < p.rows;
      async::copy16(async::smem_addr(xs + row * kXPitch + lane * 4),
                    p.x + (ok ? (tile0 + row) * p.ldx + k : 0), ok);
    }
#pragma unroll
    for (int jj = 0; jj < (M + 7) / 8; ++jj) {
      const int j = warp + 8 * jj;
      if (M % 8 != 0 && j >= M) break;
      async::copy16(async::smem_addr(fs + j * kStageK + lane * 4),
                    p.fn + (k_ok ? j * width + k : 0), k_ok);
    }
  };

  float acc[RPT][MA];
#pragma unroll
  for (int r = 0; r < RPT; ++r)
#pragma unroll
    for (int j = 0; j < MA; ++j) acc[r][j] = 0.0f;
  const int r0 = lane & 7, col = warp * 16 + (lane >> 3) * 4;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < my_chunks) issue(s, s);
    async::commit();
  }
  for (int i = 0; i < my_chunks; ++i) {
    async::wait<kStages - 2>();
    __syncthreads();  // chunk i landed for all threads; slot (i - 1) % kStages is free again
    if (i + kStages - 1 < my_chunks) issue(i + kStages - 1, (i + kStages - 1) % kStages);
    async::commit();
    const float* xs = smem + (i % kStages) * Cfg::kStageFloats;
    const float* fs = xs + Cfg::kXFloats;
    staged_chunk_dots<RPT, M>(xs, fs, r0, col, acc);
  }
  async::wait<0>();
  __syncthreads();  // the ring becomes `red`
  staged_mixes_reduce_finish<HC, RPT>(p, acc, smem, part, cluster, rank, tile0);
}

// ---- mHC mixes on tensor cores (HcExpandMixesParams::tensor_cores) ----------------------------
// The dots of a staged chunk as mma.sync m16n8k8 TF32 products in the 3xTF32 form: each fp32
// operand is split as v = hi + lo (hi = v rounded to TF32, cvt.rna; lo = v - hi, exact in fp32,
// which the tensor core reads truncated to TF32), and a product is hi_x hi_f + (hi_x lo_f +
// lo_x hi_f): the dropped lo_x lo_f is below 2^-22 of |x f|, so the sums keep fp32-level accuracy
// (the plain 1xTF32 form, as DeepGEMM's sm90 hc-prenorm GEMM runs it on bf16 streams, would put
// ~1e-3 relative into each fp32 x here). The big and the small terms go to separate fp32
// accumulators, added once at the end, so the small ones are not lost to the big sums' rounding.
// Why: the FFMA dots (staged_chunk_dots) read a 16-byte fn quad from shared memory per 8 FMAs,
// which made shared memory the decode launch's limit (r19 ncu: L1 59.6%, 1.1 eligible warps);
// here a warp reads 4 + 6 words per thread per k8 step for 9 MMAs of 16 x 8 x 8.

__device__ __forceinline__ uint32_t tf32_hi(float v) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(v));
  return r;
}

// d += a b, m16n8k8, TF32 operands (fp32 bit patterns), fp32 accumulation.
__device__ __forceinline__ void tf32_1688(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void tf32_split(float v, uint32_t& hi, uint32_t& lo) {
  hi = tf32_hi(v);
  lo = __float_as_uint(v - __uint_as_float(hi));
}

// Tile rows and fragment tiles of the tensor-core dots: BR = 8 RPT rows in MT m16 tiles (at RPT 1
// the upper 8 rows of the one tile are zeros), the M = 24 mixes in 3 n8 tiles.
template <int RPT>
struct TcMixes {
  static constexpr int kRows = 8 * RPT;
  static constexpr int kMt = (kRows + 15) / 16;
  static constexpr int kNt = 3;
};

// This warp's share of a landed chunk: chunk columns 16 warp .. 16 warp + 16 (two k8 steps) of
// the tile's rows in `xs` (pitch kXPitch) times the 24 fn rows in `fs` (pitch kXPitch), into
// big / small [mt][nt][4] (the m16n8 C fragments: row 16 mt + lane / 4 (+ 8 for the last two),
// column 8 nt + 2 (lane % 4) (+ 1 for the odd ones)). The A and B fragment words are read at bank
// 4 (lane / 4) + lane % 4 (+ a constant): conflict-free at pitch 132.
template <int RPT>
__device__ __forceinline__ void tc_chunk_dots(const float* xs, const float* fs,
                                              float (&big)[TcMixes<RPT>::kMt][3][4],
                                              float (&small)[TcMixes<RPT>::kMt][3][4]) {
  using T = TcMixes<RPT>;
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    const int k0 = warp * 16 + ks * 8 + q;
    uint32_t bh[T::kNt][2], bl[T::kNt][2];
#pragma unroll
    for (int nt = 0; nt < T::kNt; ++nt) {
      const float* f = fs + (8 * nt + g) * kXPitch + k0;
      tf32_split(f[0], bh[nt][0], bl[nt][0]);
      tf32_split(f[4], bh[nt][1], bl[nt][1]);
    }
#pragma unroll
    for (int mt = 0; mt < T::kMt; ++mt) {
      const int r = 16 * mt + g;
      const float* x0 = xs + r * kXPitch + k0;
      const float* x1 = x0 + 8 * kXPitch;
      const bool upper = r + 8 < T::kRows;
      uint32_t ah[4], al[4];
      tf32_split(x0[0], ah[0], al[0]);
      tf32_split(upper ? x1[0] : 0.0f, ah[1], al[1]);
      tf32_split(x0[4], ah[2], al[2]);
      tf32_split(upper ? x1[4] : 0.0f, ah[3], al[3]);
#pragma unroll
      for (int nt = 0; nt < T::kNt; ++nt) {
        tf32_1688(small[mt][nt], al, bh[nt][0], bh[nt][1]);
        tf32_1688(small[mt][nt], ah, bl[nt][0], bl[nt][1]);
        tf32_1688(big[mt][nt], ah, bh[nt][0], bh[nt][1]);
      }
    }
  }
}

// The block's sums of its tile rows into `part` [BR][M + 1] (not followed by a barrier): each
// warp's fragments (big + small) into `smem` (the drained ring, [kMixWarps][BR][M + 1]), a
// barrier, then the warps in order; column M is the row's sum of squares from `msq` [BR].
template <int RPT>
__device__ __forceinline__ void tc_mixes_block_sums(const float (&big)[TcMixes<RPT>::kMt][3][4],
                                                    const float (&small)[TcMixes<RPT>::kMt][3][4],
                                                    float* smem, float* part, const float* msq) {
  using T = TcMixes<RPT>;
  constexpr int M = 24, MA = M + 1, BR = T::kRows;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, q = lane & 3;
  float* red = smem;
#pragma unroll
  for (int mt = 0; mt < T::kMt; ++mt)
#pragma unroll
    for (int nt = 0; nt < T::kNt; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = 16 * mt + g + (i >= 2 ? 8 : 0), col = 8 * nt + 2 * q + (i & 1);
        if (row < BR) red[(warp * BR + row) * MA + col] = big[mt][nt][i] + small[mt][nt][i];
      }
  __syncthreads();
  for (int e = tid; e < BR * MA; e += kThreads) {
    const int rr = e / MA, j = e - rr * MA;
    float s = 0.0f;
    if (j < M) {
#pragma unroll
      for (int w = 0; w < kMixWarps; ++w) s += red[w * BR * MA + e];
    } else {
      s = msq[rr];
    }
    part[e] = s;
  }
}

// ---- mHC expand + mixes, fused ----------------------------------------------------------------
// launch_hc_expand followed by launch_hc_mixes of the updated x, for hc == 4. In the decode step
// each mixes call reads the whole residual stream x (31.5 MB at 384 rows x 4 x 5120) that the
// expand right before it has just written (both mixes of a layer follow an expand); here every
// row of x is read once and written once, as by the expand alone, and the dots run on the
// expanded values while they are in shared memory. The structure is hc_mixes_staged_kernel's: a
// cluster of kCW blocks per tile of 8*RPT rows, chunks of kStageK floats per row through a
// STAGES-deep cp.async ring, fn read once per tile, the same dot mapping and the same fixed
// reduction order (staged_mixes_reduce_finish). Only the chunk mapping differs, since the expand
// of a column needs that column of every stream: chunk g holds dim columns [32g, 32g + 32) of the
// 4 streams (chunk column 32s + c is width column s*dim + 32g + c, for x and for the fn rows), and
// the ring slot also holds the tile's 32 columns of y. Block `rank` takes chunks rank,
// rank + kCW, ... . Per landed chunk, thread t < 8*BR takes tile row t / 8 and columns
// 4(t % 8) .. + 4 of each stream: x' in hc_expand_kernel's order of operations (so x' and
// collapse_out are the bits launch_hc_expand writes), stored to global memory and back into the
// slot; after a barrier the dots read x' from the slot. The thread keeps that row's post, comb and
// collapse_pre in registers for all its chunks. The mixes' sums run in another order than
// launch_hc_mixes' (other columns per block and lane), fp32 FMA throughout, deterministic.
// The cluster width kCW (4, 8 or 16: HcExpandMixesParams::cluster_width) is a template parameter,
// and the cluster shape is given at launch (launch_hc_expand_mixes; no __cluster_dims__, so that
// 16, beyond the portable 8, can be asked for at all). At dim 5120 (160 chunks) a block takes
// 40 / 20 / 10 chunks at widths 4 / 8 / 16, and at 384 rows and 2 rows per thread the launch has
// 96 / 192 / 384 blocks. x' and collapse_out are the same bits at every width (per element); the
// mixes' sums and the norm's sum of squares add other partial sums (each block's chunks, then the
// kCW blocks in rank order), so they differ from width to width in the last bits and are the same
// bits from run to run at one width.
// With kNorm (HcExpandMixesParams::collapse_norm_weight) the collapse is RMS-normalised before it
// is written: the thread keeps its collapse values in shared memory (`cst`, [chunk][tile row]
// [32]: the block's chunks of the tile, BR x ceil(dim / (32 kCW)) x 32 floats) and sums their
// squares; the 8 threads of a row add their sums (butterfly), and the row's partial lands in
// `nsq`. Between the cluster barriers of the mixes' reduction (so no extra barrier), each block
// adds the row's kCW partials in rank order (the same total in every block), and the thread
// scales its own values, read back from `cst`, as rms_norm_kernel does (1/sqrtf, then value * inv
// * weight): only the order of the sum of squares differs from launch_rms_norm on the plain
// collapse.
// NOTE: `cst` is why a kNorm block needs more shared memory (+40 KB at RPT 2, dim 5120, width 8;
// +20 KB at width 16, +80 KB at width 4): STAGES (the ring's depth) is 3 where 4 would leave room
// for one block per SM instead of the two that __launch_bounds__ asks (expand_mixes_choice). At
// width 4 even 3 stages (148 KB) leave one block per SM.
// NOTE: what holds the decode's launch (RPT 2, kNorm, 3 stages, width 8) to two blocks per SM:
// both its registers (128 per thread, the cap of __launch_bounds__(256, 2): three blocks would
// need <= 80) and its shared memory (108 KB per block with `cst`, 68 KB without: three blocks
// need <= 75 KB each with the 1 KB the system reserves per block). At width 16 `cst` is 20 KB
// (88 KB per block at 3 stages, 66 KB at 2), so a two-stage ring would take shared memory below
// the three-block line, but the registers do not follow: built with __launch_bounds__(256, 3)
// (ptxas, sm_90a) the kernel gets 80 registers and spills 312..356 bytes per thread at RPT 2 and
// 136..152 at RPT 1 (the RPT x 25 sums and the row's 24 expand coefficients are live across the
// chunk loop). So three blocks per SM are not a cheap change; the wider clusters put more, shorter
// blocks in flight instead.
// kFnPitch: the floats from one fn row of a ring slot to the next (kStageK; the tensor-core form,
// HcExpandMixesParams::tensor_cores, pads them to kXPitch so that its B fragments are loaded
// without bank conflicts).
template <int RPT, int STAGES = kStages, int kCW = kMixCluster, int kFnPitch = kStageK>
struct ExpandMixes {
  static constexpr int kHc = 4;
  static constexpr int kM = (2 + kHc) * kHc;
  static constexpr int kMA = kM + 1;
  static constexpr int kRows = 8 * RPT;
  static constexpr int kCols = kStageK / kHc;  // dim columns per chunk
  static constexpr int kXFloats = kRows * kXPitch;
  static constexpr int kFnPitchFloats = kFnPitch;
  static constexpr int kFnFloats = kM * kFnPitch;
  static constexpr int kStageFloats = kXFloats + kFnFloats + kRows * kCols;
  static constexpr int kRedFloats = kMixWarps * kRows * kMA;
  static constexpr int kRingFloats = std::max(STAGES * kStageFloats, kRedFloats);
  static constexpr int kSmemBytes = (kRingFloats + kRows * kMA) * 4;
  // With the norm, after `part`: nsq [kRows], then cst (16-byte aligned: every size above is a
  // multiple of 4 floats).
  static_assert(kRingFloats % 4 == 0 && kRows * kMA % 4 == 0 && kRows % 4 == 0);
  static constexpr size_t norm_smem_bytes(int64_t dim) {
    const int64_t max_chunks = (dim / kCols + kCW - 1) / kCW;
    return kSmemBytes + static_cast<size_t>(kRows + kRows * max_chunks * kCols) * 4;
  }
};

// The mixes' HcMixesParams of a fused launch (its outputs mix_pre, mix_post, mix_comb).
__device__ __forceinline__ HcMixesParams mixes_params_of(const HcExpandMixesParams& p) {
  HcMixesParams mp;
  mp.rows = p.rows;
  mp.hc = p.hc;
  mp.dim = p.dim;
  mp.base = p.base;
  mp.scale = p.scale;
  mp.rms_eps = p.rms_eps;
  mp.hc_eps = p.hc_eps;
  mp.sinkhorn_iters = p.sinkhorn_iters;
  mp.pre = p.mix_pre;
  mp.post = p.mix_post;
  mp.comb = p.mix_comb;
  return mp;
}

// kTc (split path only): the mixes' dots on tensor cores (tc_chunk_dots, 3xTF32), fn rows at
// pitch kXPitch in the ring, the sum of squares of x' from the expanding threads (xsq).
template <int RPT, bool kNorm, int STAGES, int kCW, bool kSplit = false, bool kTc = false>
__global__ void __launch_bounds__(kThreads, RPT >= 3 ? 1 : 2)
    hc_expand_mixes_kernel(HcExpandMixesParams p) {
  pdl_wait();
  static_assert(!kTc || kSplit);
  using Cfg = ExpandMixes<RPT, STAGES, kCW, kTc ? kXPitch : kStageK>;
  constexpr int HC = Cfg::kHc, M = Cfg::kM, MA = Cfg::kMA, BR = Cfg::kRows, CC = Cfg::kCols;
  constexpr int kQuads = CC / 4;  // float4 per stream per chunk row
  static_assert(kStageK == HC * CC && kQuads == 8 && BR * kQuads <= kThreads);
  static_assert(STAGES >= 2 && (kCW == 4 || kCW == 8 || kCW == kMaxMixCluster));
  extern __shared__ __align__(16) float smem[];
  float* part = smem + Cfg::kRingFloats;  // [BR][MA]: this block's sums, read by the cluster
  float* nsq = part + BR * MA;            // kNorm: [BR] the rows' partial sums of squares
  float* cst = nsq + BR;                  // kNorm, clusters: [my_chunks][BR][CC] collapse values
  namespace cg = cooperative_groups;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // kSplit: the gridDim.x blocks of a tile are no cluster; block blockIdx.x takes chunks
  // blockIdx.x, + gridDim.x, ... and its sums go to p.partials (hc_expand_mixes_finish_kernel).
  const int rank =
      kSplit ? static_cast<int>(blockIdx.x) : static_cast<int>(cg::this_cluster().block_rank());
  const int cw = kSplit ? static_cast<int>(gridDim.x) : kCW;
  const int64_t tile0 = static_cast<int64_t>(blockIdx.y) * BR;
  const int64_t width = static_cast<int64_t>(HC) * p.dim;
  const int64_t chunks = p.dim / CC;
  const int my_chunks = rank < chunks ? static_cast<int>((chunks - rank + cw - 1) / cw) : 0;

  // This thread's expand: tile row er, columns 4 eq .. 4 eq + 4 of each stream of every chunk.
  const int er = tid / kQuads, eq = tid % kQuads;
  const int64_t erow = tile0 + er;
  const bool stages_y = tid < BR * kQuads;
  const bool expands = stages_y && erow < p.rows;
  const bool collapse = kNorm || p.collapse_out != nullptr;
  float post[HC], comb[HC][HC], cpre[HC];
#pragma unroll
  for (int k = 0; k < HC; ++k) {
    post[k] = expands ? p.post[erow * HC + k] : 0.0f;
    cpre[k] = expands && collapse ? p.collapse_pre[erow * HC + k] : 0.0f;
#pragma unroll
    for (int j = 0; j < HC; ++j) comb[j][k] = expands ? p.comb[(erow * HC + j) * HC + k] : 0.0f;
  }

  // Chunk i of this block into ring slot `slot`; zeros past the last row. Warp w copies x rows
  // w, w + 8, ... and fn rows w, w + 8, ...; lane l the float4 of stream l / 8 at dim column
  // 4 (l % 8) of the chunk (chunk column 4l). Thread t < 8*BR copies the y float4 it expands.
  const auto issue = [&](int i, int slot) {
    const int64_t c0 = (rank + static_cast<int64_t>(i) * cw) * CC;
    const int64_t k = (lane / kQuads) * p.dim + c0 + (lane % kQuads) * 4;
    float* xs = smem + slot * Cfg::kStageFloats;
    float* fs = xs + Cfg::kXFloats;
    float* ys = fs + Cfg::kFnFloats;
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
      const int row = warp + 8 * r;
      const bool ok = tile0 + row < p.rows;
      async::copy16(async::smem_addr(xs + row * kXPitch + lane * 4),
                    p.x + (ok ? (tile0 + row) * width + k : 0), ok);
    }
#pragma unroll
    for (int jj = 0; jj < (M + 7) / 8; ++jj) {
      const int j = warp + 8 * jj;
      if (M % 8 != 0 && j >= M) break;
      async::copy16(async::smem_addr(fs + j * Cfg::kFnPitchFloats + lane * 4), p.fn + j * width + k,
                    true);
    }
    if (stages_y)
      async::copy16(async::smem_addr(ys + er * CC + eq * 4),
                    p.y + (expands ? erow * p.dim + c0 + eq * 4 : 0), expands);
  };

  float acc[RPT][MA];
#pragma unroll
  for (int r = 0; r < RPT; ++r)
#pragma unroll
    for (int j = 0; j < MA; ++j) acc[r][j] = 0.0f;
  const int r0 = lane & 7, col = warp * 16 + (lane >> 3) * 4;
  float ss = 0.0f;   // kNorm: Σ collapse^2 over this thread's values
  float xsq = 0.0f;  // kTc: Σ x'^2 over this thread's values (the mixes' norm)
  float tbig[TcMixes<RPT>::kMt][3][4], tsmall[TcMixes<RPT>::kMt][3][4];  // kTc: the dots
  if constexpr (kTc) {
#pragma unroll
    for (int mt = 0; mt < TcMixes<RPT>::kMt; ++mt)
#pragma unroll
      for (int nt = 0; nt < 3; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) tbig[mt][nt][e] = tsmall[mt][nt][e] = 0.0f;
  }

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < my_chunks) issue(s, s);
    async::commit();
  }
  for (int i = 0; i < my_chunks; ++i) {
    async::wait<STAGES - 2>();
    __syncthreads();  // chunk i landed for all threads; slot (i - 1) % STAGES is free again
    if (i + STAGES - 1 < my_chunks) issue(i + STAGES - 1, (i + STAGES - 1) % STAGES);
    async::commit();
    float* xs = smem + (i % STAGES) * Cfg::kStageFloats;
    const float* fs = xs + Cfg::kXFloats;
    const float* ys = fs + Cfg::kFnFloats;
    if (expands) {
      const int64_t c = (rank + static_cast<int64_t>(i) * cw) * CC + eq * 4;
      float4 in[HC];
#pragma unroll
      for (int j = 0; j < HC; ++j)
        in[j] = *reinterpret_cast<const float4*>(xs + er * kXPitch + j * CC + eq * 4);
      const float4 yv = *reinterpret_cast<const float4*>(ys + er * CC + eq * 4);
      float4 cv = zero4();
#pragma unroll
      for (int k = 0; k < HC; ++k) {
        float4 o = make_float4(post[k] * yv.x, post[k] * yv.y, post[k] * yv.z, post[k] * yv.w);
#pragma unroll
        for (int j = 0; j < HC; ++j) {
          o.x = fmaf(comb[j][k], in[j].x, o.x);
          o.y = fmaf(comb[j][k], in[j].y, o.y);
          o.z = fmaf(comb[j][k], in[j].z, o.z);
          o.w = fmaf(comb[j][k], in[j].w, o.w);
        }
        *reinterpret_cast<float4*>(p.x + erow * width + k * p.dim + c) = o;
        *reinterpret_cast<float4*>(xs + er * kXPitch + k * CC + eq * 4) = o;
        if constexpr (kTc) {
          xsq = fmaf(o.x, o.x, xsq);
          xsq = fmaf(o.y, o.y, xsq);
          xsq = fmaf(o.z, o.z, xsq);
          xsq = fmaf(o.w, o.w, xsq);
        }
        cv.x = fmaf(cpre[k], o.x, cv.x);
        cv.y = fmaf(cpre[k], o.y, cv.y);
        cv.z = fmaf(cpre[k], o.z, cv.z);
        cv.w = fmaf(cpre[k], o.w, cv.w);
      }
      if constexpr (kNorm) {
        // kSplit: the plain collapse, normalised in place by the finish kernel.
        if constexpr (kSplit)
          *reinterpret_cast<float4*>(p.collapse_out + erow * p.dim + c) = cv;
        else
          *reinterpret_cast<float4*>(cst + (i * BR + er) * CC + eq * 4) = cv;
        ss = fmaf(cv.x, cv.x, ss);
        ss = fmaf(cv.y, cv.y, ss);
        ss = fmaf(cv.z, cv.z, ss);
        ss = fmaf(cv.w, cv.w, ss);
      } else if (collapse) {
        *reinterpret_cast<float4*>(p.collapse_out + erow * p.dim + c) = cv;
      }
    }
    __syncthreads();  // x' of the chunk is in the slot
    if constexpr (kTc)
      tc_chunk_dots<RPT>(xs, fs, tbig, tsmall);
    else
      staged_chunk_dots<RPT, M>(xs, fs, r0, col, acc);
  }
  async::wait<0>();
  __syncthreads();  // the ring becomes `red`
  if constexpr (kTc) {
    // The row's Σ x'^2 over this block, as the norm's below: its 8 threads by a butterfly, into
    // msq (after nsq).
    xsq += __shfl_xor_sync(0xffffffffu, xsq, 1);
    xsq += __shfl_xor_sync(0xffffffffu, xsq, 2);
    xsq += __shfl_xor_sync(0xffffffffu, xsq, 4);
    if (stages_y && eq == 0) nsq[BR + er] = xsq;
  }
  if constexpr (kNorm) {
    // The row's partial over this block: its 8 threads (lanes 8q .. 8q + 7), by a butterfly;
    // every warp takes part (threads past 8*BR hold 0), a thread of each row stores it.
    ss += __shfl_xor_sync(0xffffffffu, ss, 1);
    ss += __shfl_xor_sync(0xffffffffu, ss, 2);
    ss += __shfl_xor_sync(0xffffffffu, ss, 4);
    if (stages_y && eq == 0) nsq[er] = ss;
  }
  if constexpr (kSplit) {
    // This block's sums of its tile rows, then to p.partials [block][row][MA + 1] (the last:
    // the collapse's partial sum of squares; 0 without the norm).
    if constexpr (kTc)
      tc_mixes_block_sums<RPT>(tbig, tsmall, smem, part, nsq + BR);
    else
      staged_mixes_block_sums<HC, RPT>(acc, smem, part);
    __syncthreads();
    constexpr int PA = MA + 1;
    for (int e = tid; e < BR * PA; e += kThreads) {
      const int rr = e / PA, j = e - rr * PA;
      if (tile0 + rr < p.rows)
        p.partials[(rank * p.rows + tile0 + rr) * PA + j] =
            j < MA ? part[rr * MA + j] : (kNorm ? nsq[rr] : 0.0f);
    }
    return;
  }
  cg::cluster_group cluster = cg::this_cluster();
  const HcMixesParams mp = mixes_params_of(p);
  if constexpr (kNorm) {
    // After the first cluster barrier: every block's nsq is visible. rms_norm_kernel's scale.
    const auto normalise = [&] {
      if (!expands) return;
      float sum = 0.0f;
#pragma unroll
      for (int b = 0; b < kCW; ++b) sum += cluster.map_shared_rank(nsq, b)[er];
      const float inv = 1.0f / sqrtf(sum / static_cast<float>(p.dim) + p.collapse_norm_eps);
      for (int i = 0; i < my_chunks; ++i) {
        const int64_t c = (rank + static_cast<int64_t>(i) * cw) * CC + eq * 4;
        const float4 v = *reinterpret_cast<const float4*>(cst + (i * BR + er) * CC + eq * 4);
        const float4 w = __ldg(reinterpret_cast<const float4*>(p.collapse_norm_weight + c));
        *reinterpret_cast<float4*>(p.collapse_out + erow * p.dim + c) =
            make_float4(v.x * inv * w.x, v.y * inv * w.y, v.z * inv * w.z, v.w * inv * w.w);
      }
    };
    staged_mixes_reduce_finish<HC, RPT, kCW>(mp, acc, smem, part, cluster, rank, tile0, normalise);
  } else {
    staged_mixes_reduce_finish<HC, RPT, kCW>(mp, acc, smem, part, cluster, rank, tile0);
  }
}

// The split path's second launch (HcExpandMixesParams::split_blocks), a block per row: warp 0
// adds the row's split_blocks partial sums in block order (each lane its own sum, as
// hc_mixes_finish_row adds a cluster's blocks in rank order) and ends the mixes; with the norm,
// every thread adds the collapse's partial sums of squares the same way (the same total in each)
// and normalises its columns of collapse_out in place with the operations of the cluster path's
// `normalise` (1/sqrtf, then value * inv * weight). (A warp per row took 18.5 us at 384 rows,
// 5120 columns, 10 blocks (ncu, r16): each lane's 40 dependent load-store round trips.)
template <int HC>
__global__ void __launch_bounds__(kThreads) hc_expand_mixes_finish_kernel(HcExpandMixesParams p) {
  pdl_wait();
  constexpr int MA = (2 + HC) * HC + 1, PA = MA + 1;
  const int64_t row = blockIdx.x;
  const float* part = p.partials + row * PA;
  const int64_t bstride = p.rows * PA;  // one block's partials to the next
  if (threadIdx.x < 32) {
    const MixLane ml = mix_lane<HC>();
    float val = 0.0f;
    if (ml.idx >= 0) {
#pragma unroll 8
      for (int b = 0; b < p.split_blocks; ++b) val += part[b * bstride + ml.idx];
    }
    hc_mixes_finish_from<HC>(mixes_params_of(p), ml, val, row);
  }
  if (p.collapse_norm_weight == nullptr) return;
  float sum = 0.0f;
#pragma unroll 8
  for (int b = 0; b < p.split_blocks; ++b) sum += part[b * bstride + MA];
  const float inv = 1.0f / sqrtf(sum / static_cast<float>(p.dim) + p.collapse_norm_eps);
  float* out = p.collapse_out + row * p.dim;
  if (p.collapse_fp8 == nullptr) {
#pragma unroll 4
    for (int64_t c = 4 * static_cast<int64_t>(threadIdx.x); c < p.dim; c += 4 * kThreads) {
      const float4 v = *reinterpret_cast<const float4*>(out + c);
      const float4 w = __ldg(reinterpret_cast<const float4*>(p.collapse_norm_weight + c));
      *reinterpret_cast<float4*>(out + c) =
          make_float4(v.x * inv * w.x, v.y * inv * w.y, v.z * inv * w.z, v.w * inv * w.w);
    }
    return;
  }
  // collapse_fp8: 8-column chunks (chunk c = 8 (j kThreads + t) of thread t, a 32-wide block on
  // 4 consecutive lanes; the trip count is the same in every thread, so the shuffles of
  // fp8_rows_quant8 see whole warps). Pass 1 normalises as above (the same operations, so the
  // same fp32 values), stores them and folds each block's reference code into m; the row's R by a
  // block reduction; pass 2 reads this thread's own stored values back, quantises them again (the
  // same codes and block scales) and stores the codes refolded onto R, as act_quant_fp8_rows_kernel
  // does for a CTA per row.
  uint32_t m = 0;
  for (int64_t c0 = 0; c0 < p.dim; c0 += 8 * kThreads) {
    const int64_t c = c0 + 8 * static_cast<int64_t>(threadIdx.x);
    const bool live = c < p.dim;
    float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (live) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float4 x = *reinterpret_cast<const float4*>(out + c + 4 * h);
        const float4 w = __ldg(reinterpret_cast<const float4*>(p.collapse_norm_weight + c + 4 * h));
        const float4 y =
            make_float4(x.x * inv * w.x, x.y * inv * w.y, x.z * inv * w.z, x.w * inv * w.w);
        *reinterpret_cast<float4*>(out + c + 4 * h) = y;
        v[4 * h] = y.x, v[4 * h + 1] = y.y, v[4 * h + 2] = y.z, v[4 * h + 3] = y.w;
      }
    }
    uint2 q;
    uint32_t code;
    v41::fp8_rows_quant8(v, live, q, code, m);
  }
  __shared__ uint32_t red[kThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
  __syncthreads();
  uint32_t R = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) R = max(R, red[w]);
  uint8_t* codes = p.collapse_fp8 + row * p.dim;
  for (int64_t c0 = 0; c0 < p.dim; c0 += 8 * kThreads) {
    const int64_t c = c0 + 8 * static_cast<int64_t>(threadIdx.x);
    const bool live = c < p.dim;
    float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (live) {
      const float4 x0 = *reinterpret_cast<const float4*>(out + c);
      const float4 x1 = *reinterpret_cast<const float4*>(out + c + 4);
      v[0] = x0.x, v[1] = x0.y, v[2] = x0.z, v[3] = x0.w;
      v[4] = x1.x, v[5] = x1.y, v[6] = x1.z, v[7] = x1.w;
    }
    uint2 q;
    uint32_t code, unused = 0;
    v41::fp8_rows_quant8(v, live, q, code, unused);
    if (live)
      *reinterpret_cast<uint2*>(codes + c) =
          make_uint2(v41::fp8_rows_refold4(q.x, code, R), v41::fp8_rows_refold4(q.y, code, R));
  }
  if (threadIdx.x == 0) p.collapse_fp8_scale[row] = v41::ue8m0_decode(R);
}

// V values per thread (4: float4 loads and stores; needs dim % 4 == 0 and aligned rows).
template <int V>
__device__ __forceinline__ void load_v(const float* p, float (&o)[V]) {
  if constexpr (V == 4) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    o[0] = v.x;
    o[1] = v.y;
    o[2] = v.z;
    o[3] = v.w;
  } else {
    o[0] = *p;
  }
}
template <int V>
__device__ __forceinline__ void store_v(float* p, const float (&o)[V]) {
  if constexpr (V == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(o[0], o[1], o[2], o[3]);
  } else {
    *p = o[0];
  }
}

// Grid (chunks of dim / V, rows); grid-stride in both.
template <int V>
__global__ void hc_collapse_kernel(HcCollapseParams p) {
  pdl_wait();
  const int64_t chunks = p.dim / V;
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y)
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < chunks;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      float acc[V];
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] = 0.0f;
#pragma unroll
      for (int k = 0; k < kMaxHc; ++k) {
        if (k >= p.hc) break;
        float in[V];
        load_v<V>(p.x + (r * p.hc + k) * p.dim + i * V, in);
        const float w = p.pre[r * p.hc + k];
#pragma unroll
        for (int e = 0; e < V; ++e) acc[e] = fmaf(w, in[e], acc[e]);
      }
      store_v<V>(p.out + r * p.dim + i * V, acc);
    }
}

template <int V>
__global__ void hc_expand_kernel(HcExpandParams p) {
  pdl_wait();
  const int64_t chunks = p.dim / V;
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y)
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < chunks;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      float in[kMaxHc][V];
#pragma unroll
      for (int j = 0; j < kMaxHc; ++j)
        if (j < p.hc) load_v<V>(p.x + (r * p.hc + j) * p.dim + i * V, in[j]);
      float y[V];
      load_v<V>(p.y + r * p.dim + i * V, y);
      float col[V];
#pragma unroll
      for (int e = 0; e < V; ++e) col[e] = 0.0f;
#pragma unroll
      for (int k = 0; k < kMaxHc; ++k) {
        if (k >= p.hc) break;
        const float post = p.post[r * p.hc + k];
        float out[V];
#pragma unroll
        for (int e = 0; e < V; ++e) out[e] = post * y[e];
#pragma unroll
        for (int j = 0; j < kMaxHc; ++j) {
          if (j >= p.hc) break;
          const float cjk = p.comb[(r * p.hc + j) * p.hc + k];
#pragma unroll
          for (int e = 0; e < V; ++e) out[e] = fmaf(cjk, in[j][e], out[e]);
        }
        store_v<V>(p.x + (r * p.hc + k) * p.dim + i * V, out);
        if (p.collapse_out != nullptr) {
          const float w = p.collapse_pre[r * p.hc + k];
#pragma unroll
          for (int e = 0; e < V; ++e) col[e] = fmaf(w, out[e], col[e]);
        }
      }
      if (p.collapse_out != nullptr) store_v<V>(p.collapse_out + r * p.dim + i * V, col);
    }
}

// ---- Engram -------------------------------------------------------------------------------------

// One block per (row, stream).
__global__ void __launch_bounds__(kThreads) engram_gate_kernel(EngramGateParams p) {
  pdl_wait();
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x / p.hc;
  const int k = static_cast<int>(blockIdx.x % p.hc);
  float* xk = p.x + (t * p.hc + k) * p.dim;
  const float* kk = p.key + t * p.ld_key + k * p.dim;
  const float* wk = p.wprod + k * p.dim;
  float dot = 0.0f, sx = 0.0f, sk = 0.0f;
  for (int64_t d = threadIdx.x; d < p.dim; d += blockDim.x) {
    const float xv = xk[d], kv = kk[d];
    dot = fmaf(xv * wk[d], kv, dot);
    sx = fmaf(xv, xv, sx);
    sk = fmaf(kv, kv, sk);
  }
  dot = block_sum(dot, scratch);
  sx = block_sum(sx, scratch);
  sk = block_sum(sk, scratch);
  const float n = static_cast<float>(p.dim);
  dot = dot * rsqrtf(sx / n + p.eps) * rsqrtf(sk / n + p.eps) * rsqrtf(n);
  float g = 1.0f / (1.0f + expf(-copysignf(sqrtf(fmaxf(fabsf(dot), 1e-6f)), dot)));
  if (p.is_image != nullptr && p.is_image[t]) g = 0.0f;
  if (p.gate_out != nullptr && threadIdx.x == 0) p.gate_out[t * p.hc + k] = g;
  const float* v = p.val + t * p.ld_val;
  for (int64_t d = threadIdx.x; d < p.dim; d += blockDim.x) xk[d] = fmaf(g, v[d], xk[d]);
}

// One warp per gathered row: 16-byte reads of the codes, then the scales.
__global__ void engram_gather_kernel(EngramGatherParams p) {
  pdl_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (i >= p.n) return;
  const int64_t id = p.ids[i];
  const int vecs = p.dim / 16;
  const uint4* src = reinterpret_cast<const uint4*>(p.codes + id * p.dim);
  uint4* dst = reinterpret_cast<uint4*>(p.out_codes + i * p.dim);
  for (int v = lane; v < vecs; v += 32) dst[v] = src[v];
  const int sb = p.dim / 32;
  for (int b = lane; b < sb; b += 32) p.out_scales[i * sb + b] = p.scales[id * sb + b];
}

__global__ void engram_dequant_kernel(EngramDequantParams p) {
  pdl_wait();
  const int64_t total = p.n * p.dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / p.dim;
    const int c = static_cast<int>(i % p.dim);
    p.out[i] =
        v41::e4m3_decode(p.codes[i]) * v41::ue8m0_decode(p.scales[r * (p.dim / 32) + c / 32]);
  }
}

// ---- split-TF32 operands ------------------------------------------------------------------------

// x = hi + lo as SplitTf32Params states: RNE to TF32 on the bits (the carry of a mantissa that
// rounds up moves into the exponent, which is the right result). x - hi is exact: |x - hi| is at
// most half a TF32 ulp of x and hi is within a factor 2 of x (Sterbenz).
__device__ __forceinline__ void split_tf32(float x, float& hi, float& lo) {
  if (!isfinite(x)) {
    hi = x;
    lo = 0.0f;
    return;
  }
  const uint32_t u = __float_as_uint(x);
  uint32_t h = (u + 0xFFFu + ((u >> 13) & 1u)) & ~0x1FFFu;
  if ((h & 0x7F800000u) == 0x7F800000u) h = u & ~0x1FFFu;  // rounded up to inf: truncate
  hi = __uint_as_float(h);
  lo = x - hi;
}

// blockIdx.y strides the rows, x-threads the columns (coalesced reads of x, three coalesced
// writes).
__global__ void split_tf32_kernel(SplitTf32Params p) {
  pdl_wait();
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    const float* x = p.x + r * p.ldx;
    float* o = p.out + r * p.ldo;
    for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < p.cols;
         c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      float hi, lo;
      split_tf32(x[c], hi, lo);
      o[c] = p.lo_part == 0 ? lo : hi;
      o[p.cols + c] = p.lo_part == 1 ? lo : hi;
      o[2 * p.cols + c] = p.lo_part == 2 ? lo : hi;
    }
  }
}

int grid_for(int64_t total) {
  return static_cast<int>(std::clamp<int64_t>(ceil_div(total, kThreads), 1, 132 * 16));
}

}  // namespace

void launch_rope(const RopeParams& p, Stream stream) {
  if (p.heads_per_thread < 1 || p.heads_per_thread > kRopeHeads)
    detail::cuda_call_failed(__FILE__, __LINE__, "launch_rope", "bad arguments",
                             "heads_per_thread 1..8");
  const int64_t total = p.rows * ((p.heads + p.heads_per_thread - 1) / p.heads_per_thread) *
                        (p.rd / 2);
  if (total == 0) return;
  MS_CUDA_CHECK(
      launch_kernel(rope_kernel, grid_for(total), kThreads, 0, as_cuda_stream(stream), p));
}

void launch_swiglu_clamped(const SwigluParams& p, Stream stream) {
  if (p.rows * p.cols == 0) return;
  MS_CUDA_CHECK(launch_kernel(swiglu_kernel, grid_for(p.rows * p.cols), kThreads, 0,
                              as_cuda_stream(stream), p));
}

namespace {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <int HC, int RPT, bool kVec>
void launch_mixes(const HcMixesParams& p, int wr, int64_t tiles, cudaStream_t s) {
  MS_CUDA_CHECK(launch_kernel(hc_mixes_kernel<HC, RPT, kVec>,
                              dim3(kMixCluster, static_cast<unsigned>(tiles)), kThreads, 0, s, p,
                              wr));
}

template <int HC, int RPT>
void launch_staged_mixes(const HcMixesParams& p, int64_t tiles, cudaStream_t s) {
  constexpr int kSmem = StagedMixes<HC, RPT>::kSmemBytes;
  const auto kernel = hc_mixes_staged_kernel<HC, RPT>;
  MS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  MS_CUDA_CHECK(launch_kernel(kernel, dim3(kMixCluster, static_cast<unsigned>(tiles)), kThreads,
                              kSmem, s, p));
}

// Grid of the row-wise mHC kernels: (chunks per row, rows), both capped.
dim3 hc_row_grid(int64_t rows, int64_t chunks) {
  return dim3(static_cast<unsigned>(std::clamp<int64_t>(ceil_div(chunks, kThreads), 1, 64)),
              static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
}

}  // namespace

void launch_hc_mixes(const HcMixesParams& p, Stream stream) {
  if (p.rows == 0) return;
  if (p.hc < 1 || p.hc > kMaxHc)
    detail::cuda_call_failed(__FILE__, __LINE__, "hc <= 4", "bad hc", "");
  const int64_t width = p.hc * p.dim;
  const bool vec = width % 4 == 0 && p.ldx % 4 == 0 && aligned16(p.x) && aligned16(p.fn);
  const cudaStream_t s = as_cuda_stream(stream);
  if (vec) {
    // One row per thread while its clusters fit in one wave of one block per SM; 4 (32-row
    // tiles, fn read once per 32 rows) past that. Measured on the H200 at 384 rows x 4 x 5120:
    // 1, 2, 3, 4 rows per thread take 45.8, 31.2, 38.3, 31.2 us (3 fills 128 of 132 SMs, and
    // clusters placed per GPC leave some SMs with two blocks).
    int rpt = p.rows_per_thread;
    if (rpt == 0) rpt = ceil_div(p.rows, int64_t{8}) * kMixCluster <= device_sm_count() ? 1 : 4;
    if (rpt < 1 || rpt > 4)
      detail::cuda_call_failed(__FILE__, __LINE__, "hc mixes rows_per_thread", "not 0..4", "");
    const int64_t tiles = ceil_div(p.rows, int64_t{8} * rpt);
    if (tiles > 65535)
      detail::cuda_call_failed(__FILE__, __LINE__, "hc mixes rows", "too many rows", "");
    switch (p.hc * 8 + rpt) {
#define MS_HC_MIXES_CASE(HC, RPT)              \
  case HC * 8 + RPT:                           \
    launch_staged_mixes<HC, RPT>(p, tiles, s); \
    break;
      MS_HC_MIXES_CASE(4, 1)
      MS_HC_MIXES_CASE(4, 2)
      MS_HC_MIXES_CASE(4, 3)
      MS_HC_MIXES_CASE(4, 4)
      MS_HC_MIXES_CASE(3, 1)
      MS_HC_MIXES_CASE(3, 2)
      MS_HC_MIXES_CASE(3, 3)
      MS_HC_MIXES_CASE(3, 4)
      MS_HC_MIXES_CASE(2, 1)
      MS_HC_MIXES_CASE(2, 2)
      MS_HC_MIXES_CASE(2, 3)
      MS_HC_MIXES_CASE(2, 4)
      MS_HC_MIXES_CASE(1, 1)
      MS_HC_MIXES_CASE(1, 2)
      MS_HC_MIXES_CASE(1, 3)
      MS_HC_MIXES_CASE(1, 4)
#undef MS_HC_MIXES_CASE
      default:
        break;
    }
    return;
  }
  // Scalar loads (odd widths or pitches): 2 rows per thread.
  const int warp_rows = kMixRLanes * 2;
  int wr = 1;  // warps of a block on different rows (the rest split k)
  while (wr < kMixWarps && ceil_div(p.rows, int64_t{warp_rows} * wr * 2) >= kMixMinTiles) wr *= 2;
  const int64_t tiles = ceil_div(p.rows, int64_t{warp_rows} * wr);
  if (tiles > 65535)
    detail::cuda_call_failed(__FILE__, __LINE__, "hc mixes rows", "too many rows", "");
  switch (p.hc) {
    case 4:
      launch_mixes<4, 2, false>(p, wr, tiles, s);
      break;
    case 3:
      launch_mixes<3, 2, false>(p, wr, tiles, s);
      break;
    case 2:
      launch_mixes<2, 2, false>(p, wr, tiles, s);
      break;
    default:
      launch_mixes<1, 2, false>(p, wr, tiles, s);
      break;
  }
}

void launch_hc_collapse(const HcCollapseParams& p, Stream stream) {
  if (p.rows * p.dim == 0) return;
  if (p.hc < 1 || p.hc > kMaxHc)
    detail::cuda_call_failed(__FILE__, __LINE__, "hc <= 4", "bad hc", "");
  const cudaStream_t s = as_cuda_stream(stream);
  if (p.dim % 4 == 0 && aligned16(p.x) && aligned16(p.out))
    MS_CUDA_CHECK(
        launch_kernel(hc_collapse_kernel<4>, hc_row_grid(p.rows, p.dim / 4), kThreads, 0, s, p));
  else
    MS_CUDA_CHECK(
        launch_kernel(hc_collapse_kernel<1>, hc_row_grid(p.rows, p.dim), kThreads, 0, s, p));
}

void launch_hc_expand(const HcExpandParams& p, Stream stream) {
  if (p.rows * p.dim == 0) return;
  if (p.hc < 1 || p.hc > kMaxHc)
    detail::cuda_call_failed(__FILE__, __LINE__, "hc <= 4", "bad hc", "");
  const cudaStream_t s = as_cuda_stream(stream);
  if (p.dim % 4 == 0 && aligned16(p.x) && aligned16(p.y) && aligned16(p.collapse_out))
    MS_CUDA_CHECK(
        launch_kernel(hc_expand_kernel<4>, hc_row_grid(p.rows, p.dim / 4), kThreads, 0, s, p));
  else
    MS_CUDA_CHECK(
        launch_kernel(hc_expand_kernel<1>, hc_row_grid(p.rows, p.dim), kThreads, 0, s, p));
}

namespace {

// Shared memory of the current device (queried once): the most a block may opt in to, an SM's
// total, and what the system reserves per resident block.
struct SmemLimits {
  size_t per_block = 0, per_sm = 0, reserved = 0;
};
const SmemLimits& device_smem_limits() {
  static const SmemLimits limits = [] {
    int dev = 0, block = 0, sm = 0, reserved = 0;
    MS_CUDA_CHECK(cudaGetDevice(&dev));
    MS_CUDA_CHECK(cudaDeviceGetAttribute(&block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    MS_CUDA_CHECK(cudaDeviceGetAttribute(&sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    MS_CUDA_CHECK(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev));
    return SmemLimits{static_cast<size_t>(block), static_cast<size_t>(sm),
                      static_cast<size_t>(reserved)};
  }();
  return limits;
}

// The fused kernel's instantiations share one signature; the launcher picks one at run time.
using ExpandMixesKernel = void (*)(HcExpandMixesParams);

// What the one-kernel path runs for a launch: the kernel, its cluster width and dynamic shared
// memory, and whether collapse_out's norm is left to norm_collapse_out (the kernel's shared
// memory with the norm would not fit a block).
struct ExpandMixesChoice {
  ExpandMixesKernel kernel = nullptr;
  int cluster_width = kMixCluster;
  size_t smem = 0;
  bool norm_apart = false;
};

// The fused kernel at RPT rows per thread and cluster width kCW. With the norm: the kernel
// without it (norm_apart) where its shared memory does not fit a block. At RPT <= 2 (two blocks
// per SM asked) the ring is 3 deep where 4 would leave room for one block per SM only (at dim
// 5120, RPT 2 and width 8: 131 KB for 4 stages, 108 KB for 3; at width 16: 111 and 88 KB).
template <int RPT, int kCW>
ExpandMixesChoice expand_mixes_choice(const HcExpandMixesParams& p) {
  using Cfg = ExpandMixes<RPT, kStages, kCW>;
  const ExpandMixesChoice plain{hc_expand_mixes_kernel<RPT, false, kStages, kCW>, kCW,
                                Cfg::kSmemBytes, p.collapse_norm_weight != nullptr};
  if (p.collapse_norm_weight == nullptr) return plain;
  const SmemLimits& lim = device_smem_limits();
  const size_t smem = Cfg::norm_smem_bytes(p.dim);
  if constexpr (RPT == 2) {
    const size_t smem3 = ExpandMixes<RPT, 3, kCW>::norm_smem_bytes(p.dim);
    const auto two_fit = [&](size_t bytes) { return 2 * (bytes + lim.reserved) <= lim.per_sm; };
    if (!two_fit(smem) && (two_fit(smem3) || smem > lim.per_block) && smem3 <= lim.per_block)
      return {hc_expand_mixes_kernel<RPT, true, 3, kCW>, kCW, smem3, false};
  }
  if (smem > lim.per_block) return plain;
  return {hc_expand_mixes_kernel<RPT, true, kStages, kCW>, kCW, smem, false};
}

template <int kCW>
ExpandMixesChoice expand_mixes_choice(const HcExpandMixesParams& p, int rpt) {
  switch (rpt) {
    case 1:
      return expand_mixes_choice<1, kCW>(p);
    case 2:
      return expand_mixes_choice<2, kCW>(p);
    case 3:
      return expand_mixes_choice<3, kCW>(p);
    default:
      return expand_mixes_choice<4, kCW>(p);
  }
}

ExpandMixesChoice expand_mixes_choice(const HcExpandMixesParams& p, int rpt, int cw) {
  switch (cw) {
    case 4:
      return expand_mixes_choice<4>(p, rpt);
    case kMaxMixCluster:
      return expand_mixes_choice<kMaxMixCluster>(p, rpt);
    default:
      return expand_mixes_choice<kMixCluster>(p, rpt);
  }
}

// The attributes a launch of `c` needs, set before it (and before asking whether it fits): its
// dynamic shared memory and, past 8 blocks, the non-portable cluster size.
void set_expand_mixes_attributes(const ExpandMixesChoice& c) {
  MS_CUDA_CHECK(cudaFuncSetAttribute(c.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(c.smem)));
  if (c.cluster_width > kMixCluster)
    MS_CUDA_CHECK(
        cudaFuncSetAttribute(c.kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
}

// Whether clusters of `c` can be resident at all on this GPU (cudaOccupancyMaxActiveClusters
// > 0 with its cluster shape, block and shared memory). A cluster's blocks must share a GPC,
// and a width past the portable 8 is not promised on every part (nor under MPS or MIG, which
// leave fewer SMs per GPC); a GPU that refuses the attributes or the query (an error, cleared)
// does not fit either. Asked once per kernel and shared memory size: the backend drives one
// device per process.
bool cluster_shape_fits(const ExpandMixesChoice& c) {
  struct Seen {
    ExpandMixesKernel kernel;
    size_t smem;
    bool fits;
  };
  static std::mutex mu;
  static std::vector<Seen> seen;
  const std::lock_guard<std::mutex> lock(mu);
  for (const Seen& s : seen)
    if (s.kernel == c.kernel && s.smem == c.smem) return s.fits;
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(c.cluster_width);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(c.cluster_width), 1, 1);
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = c.smem;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  cudaError_t err = cudaFuncSetAttribute(c.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(c.smem));
  if (err == cudaSuccess && c.cluster_width > kMixCluster)
    err = cudaFuncSetAttribute(c.kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (err == cudaSuccess) err = cudaOccupancyMaxActiveClusters(&clusters, c.kernel, &cfg);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    clusters = 0;
  }
  seen.push_back({c.kernel, c.smem, clusters > 0});
  return clusters > 0;
}

// The one-kernel path's shapes: hc 4, whole 32-column chunks, 16-byte aligned operands.
bool expand_mixes_one_kernel(const HcExpandMixesParams& p) {
  return p.hc == ExpandMixes<1>::kHc && p.dim % ExpandMixes<1>::kCols == 0 && aligned16(p.x) &&
         aligned16(p.y) && aligned16(p.fn) && aligned16(p.collapse_out) &&
         aligned16(p.collapse_norm_weight);
}

void check_expand_mixes_args(const HcExpandMixesParams& p) {
  const bool collapse = p.collapse_out != nullptr;
  const bool norm = p.collapse_norm_weight != nullptr;
  const int cw = p.cluster_width;
  if (p.rows < 0 || p.hc < 1 || p.hc > kMaxHc || p.dim < 1 || p.x == nullptr || p.y == nullptr ||
      p.post == nullptr || p.comb == nullptr || collapse != (p.collapse_pre != nullptr) ||
      (norm && !collapse) || !(p.collapse_norm_eps >= 0.0f) || p.fn == nullptr ||
      p.base == nullptr || p.scale == nullptr || p.mix_pre == nullptr || p.mix_post == nullptr ||
      p.mix_comb == nullptr || p.rows_per_thread < 0 || p.rows_per_thread > 4 ||
      (cw != 0 && cw != 4 && cw != kMixCluster && cw != kMaxMixCluster) || p.split_blocks < 0 ||
      p.split_blocks > kMaxSplitBlocks || (p.split_blocks > 0 && p.partials == nullptr) ||
      (p.collapse_fp8 == nullptr) != (p.collapse_fp8_scale == nullptr) ||
      (p.collapse_fp8 != nullptr && (p.split_blocks == 0 || !norm || p.hc != 4 || p.dim % 32 != 0 ||
                                     !aligned16(p.collapse_out) ||
                                     reinterpret_cast<uintptr_t>(p.collapse_fp8) % 8 != 0))) {
    detail::cuda_call_failed(__FILE__, __LINE__, "launch_hc_expand_mixes", "bad arguments",
                             "hc 1..4, dim >= 1, rows >= 0, all pointers but the collapse pair, "
                             "collapse_pre with collapse_out, collapse_norm_weight only with "
                             "collapse_out, collapse_norm_eps >= 0, rows_per_thread 0..4, "
                             "cluster_width 0, 4, 8 or 16, split_blocks 0..256 (with partials), "
                             "collapse_fp8 with collapse_fp8_scale, only on the split path with "
                             "the norm (hc 4, dim % 32 == 0, 16-byte aligned collapse_out, "
                             "8-byte aligned codes)");
  }
}

// The split path of p (checked, rows > 0, expand_mixes_one_kernel, split_blocks > 0): the fused
// kernel without clusters on a (split_blocks, tiles) grid, then hc_expand_mixes_finish_kernel.
// Rows per thread: launch_hc_mixes' rule counted with split_blocks blocks per tile. The ring is
// kStages deep; the block's shared memory holds no collapse values (the plain collapse goes to
// collapse_out), only the rows' partial sums of squares after `part`.
// With p.tensor_cores the kTc kernel (fn at pitch kXPitch; msq after nsq: 2 x kRows floats).
template <int RPT>
void launch_expand_mixes_split_at(const HcExpandMixesParams& p, cudaStream_t s) {
  const bool norm = p.collapse_norm_weight != nullptr;
  ExpandMixesKernel kernel = nullptr;
  size_t smem = 0;
  if (p.tensor_cores) {
    using Cfg = ExpandMixes<RPT, kStages, kMixCluster, kXPitch>;
    kernel = norm ? hc_expand_mixes_kernel<RPT, true, kStages, kMixCluster, true, true>
                  : hc_expand_mixes_kernel<RPT, false, kStages, kMixCluster, true, true>;
    smem = static_cast<size_t>(Cfg::kSmemBytes) + 2 * sizeof(float) * Cfg::kRows;
  } else {
    using Cfg = ExpandMixes<RPT>;
    kernel = norm ? hc_expand_mixes_kernel<RPT, true, kStages, kMixCluster, true>
                  : hc_expand_mixes_kernel<RPT, false, kStages, kMixCluster, true>;
    smem = static_cast<size_t>(Cfg::kSmemBytes) + sizeof(float) * Cfg::kRows;
  }
  using Cfg = ExpandMixes<RPT>;
  MS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem)));
  const int64_t tiles = ceil_div(p.rows, int64_t{Cfg::kRows});
  if (tiles > 65535)
    detail::cuda_call_failed(__FILE__, __LINE__, "hc expand mixes rows", "too many rows", "");
  MS_CUDA_CHECK(launch_kernel(kernel,
                              dim3(static_cast<unsigned>(p.split_blocks),
                                   static_cast<unsigned>(tiles)),
                              kThreads, smem, s, p));
  if (p.rows > 2147483647)
    detail::cuda_call_failed(__FILE__, __LINE__, "hc expand mixes rows", "too many rows", "");
  MS_CUDA_CHECK(launch_kernel(hc_expand_mixes_finish_kernel<ExpandMixes<RPT>::kHc>,
                              static_cast<unsigned>(p.rows), kThreads, 0, s, p));
}
void launch_expand_mixes_split(const HcExpandMixesParams& p, Stream stream) {
  int rpt = p.rows_per_thread;
  if (rpt == 0) rpt = ceil_div(p.rows, int64_t{8}) * p.split_blocks <= device_sm_count() ? 1 : 2;
  const cudaStream_t s = as_cuda_stream(stream);
  switch (rpt) {
    case 1:
      return launch_expand_mixes_split_at<1>(p, s);
    case 2:
      return launch_expand_mixes_split_at<2>(p, s);
    case 3:
      return launch_expand_mixes_split_at<3>(p, s);
    default:
      return launch_expand_mixes_split_at<4>(p, s);
  }
}

// The one-kernel launch of p (checked, rows > 0, expand_mixes_one_kernel). Rows per thread: one
// while the clusters fit in one wave of one block per SM (launch_hc_mixes' rule, counted with
// the launch's cluster width), 2 past that: in the decode 64 x 6 forward on the H200 (384 rows,
// r10, width 8) the fused launches took 5.05 / 3.94 / 6.30 / 4.53 ms per step at 1 / 2 / 3 / 4
// rows per thread, against 4.49 ms for the expands and mixes apart. Width 16 where
// cluster_shape_fits says it cannot be resident: width 8 (the same rule for the rows per thread).
struct ExpandMixesPlan {
  ExpandMixesChoice choice;
  int64_t tiles = 0;
};
ExpandMixesPlan expand_mixes_plan(const HcExpandMixesParams& p) {
  const auto plan_at = [&](int cw) {
    int rpt = p.rows_per_thread;
    if (rpt == 0) rpt = ceil_div(p.rows, int64_t{8}) * cw <= device_sm_count() ? 1 : 2;
    const int64_t tiles = ceil_div(p.rows, int64_t{8} * rpt);
    if (tiles > 65535)
      detail::cuda_call_failed(__FILE__, __LINE__, "hc expand mixes rows", "too many rows", "");
    return ExpandMixesPlan{expand_mixes_choice(p, rpt, cw), tiles};
  };
  const int cw = p.cluster_width == 0 ? kMixCluster : p.cluster_width;
  const ExpandMixesPlan plan = plan_at(cw);
  if (cw > kMixCluster && !cluster_shape_fits(plan.choice)) return plan_at(kMixCluster);
  return plan;
}

// In place: collapse_out = launch_rms_norm(collapse_out) with the collapse norm's weight and eps
// (the two-launch path of HcExpandMixesParams::collapse_norm_weight).
void norm_collapse_out(const HcExpandMixesParams& p, Stream stream) {
  RmsNormParams r;
  r.x = p.collapse_out;
  r.weight = p.collapse_norm_weight;
  r.out = p.collapse_out;
  r.rows = p.rows;
  r.cols = p.dim;
  r.x_stride = p.dim;
  r.out_stride = p.dim;
  r.eps = p.collapse_norm_eps;
  launch_rms_norm(r, stream);
}

}  // namespace

int hc_expand_mixes_auto_split(int64_t rows) {
  if (rows <= 128) return 16;
  if (rows > 1024) return 0;
  const int64_t tiles = ceil_div(rows, int64_t{16});
  return static_cast<int>(std::max<int64_t>(2, 2 * device_sm_count() / tiles));
}

int hc_expand_mixes_cluster_width(const HcExpandMixesParams& p) {
  check_expand_mixes_args(p);
  if (p.rows == 0 || !expand_mixes_one_kernel(p) || p.split_blocks > 0) return 0;
  return expand_mixes_plan(p).choice.cluster_width;
}

void launch_hc_expand_mixes(const HcExpandMixesParams& p, Stream stream) {
  check_expand_mixes_args(p);
  if (p.rows == 0) return;
  if (!expand_mixes_one_kernel(p)) {
    launch_hc_expand(
        {p.x, p.y, p.rows, p.hc, p.dim, p.post, p.comb, p.collapse_pre, p.collapse_out}, stream);
    if (p.collapse_norm_weight != nullptr) norm_collapse_out(p, stream);
    if (p.collapse_fp8 != nullptr) {
      // The fused form's operand from the normalised collapse (the same codes).
      ActQuantFp8RowsParams q;
      q.x = p.collapse_out;
      q.x_type = ActivationType::kF32;
      q.ldx = p.dim;
      q.rows = p.rows;
      q.cols = p.dim;
      q.out = p.collapse_fp8;
      q.ldo = p.dim;
      q.row_scale = p.collapse_fp8_scale;
      launch_act_quant_fp8_rows(q, stream);
    }
    HcMixesParams m{p.x,        p.hc * p.dim, p.rows,           p.hc,
                    p.dim,      p.fn,         p.base,           p.scale,
                    p.rms_eps,  p.hc_eps,     p.sinkhorn_iters, p.mix_pre,
                    p.mix_post, p.mix_comb};
    m.rows_per_thread = p.rows_per_thread;
    launch_hc_mixes(m, stream);
    return;
  }
  if (p.split_blocks > 0) {
    launch_expand_mixes_split(p, stream);
    return;
  }
  const ExpandMixesPlan plan = expand_mixes_plan(p);
  const ExpandMixesChoice& c = plan.choice;
  set_expand_mixes_attributes(c);
  const unsigned cw = static_cast<unsigned>(c.cluster_width);
  HcExpandMixesParams q = p;
  if (c.norm_apart) q.collapse_norm_weight = nullptr;  // the plain collapse, then its norm
  MS_CUDA_CHECK(launch_kernel_clusters(c.kernel, dim3(cw, static_cast<unsigned>(plan.tiles)),
                                       dim3(cw, 1, 1), dim3(kThreads), c.smem,
                                       as_cuda_stream(stream), q));
  if (c.norm_apart) norm_collapse_out(p, stream);
}

void launch_engram_gate(const EngramGateParams& p, Stream stream) {
  if (p.rows == 0) return;
  MS_CUDA_CHECK(launch_kernel(engram_gate_kernel, static_cast<unsigned>(p.rows * p.hc), kThreads, 0,
                              as_cuda_stream(stream), p));
}

void launch_engram_gather(const EngramGatherParams& p, Stream stream) {
  if (p.n == 0) return;
  MS_CUDA_CHECK(launch_kernel(engram_gather_kernel, static_cast<unsigned>(ceil_div(p.n, 8)), 256, 0,
                              as_cuda_stream(stream), p));
}

void launch_engram_dequant(const EngramDequantParams& p, Stream stream) {
  if (p.n == 0) return;
  MS_CUDA_CHECK(launch_kernel(engram_dequant_kernel, grid_for(p.n * p.dim), kThreads, 0,
                              as_cuda_stream(stream), p));
}

void launch_split_tf32(const SplitTf32Params& p, Stream stream) {
  if (p.rows == 0 || p.cols == 0) return;
  if (p.lo_part < 0 || p.lo_part > 2 || p.ldx < p.cols || p.ldo < 3 * p.cols) {
    detail::cuda_call_failed(__FILE__, __LINE__, "launch_split_tf32", "bad arguments",
                             "0 <= lo_part <= 2, ldx >= cols, ldo >= 3 cols");
  }
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(ceil_div(p.cols, kThreads), 64)),
                  static_cast<unsigned>(std::min<int64_t>(p.rows, 65535)));
  MS_CUDA_CHECK(launch_kernel(split_tf32_kernel, grid, kThreads, 0, as_cuda_stream(stream), p));
}

// ---- pinned host memory -------------------------------------------------------------------------

namespace {

template <typename Fn>
Fn driver_fn(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess)
    return nullptr;
  return reinterpret_cast<Fn>(fn);
}

bool try_cumem_host(size_t bytes, PinnedHostBuffer& b) {
  auto create = driver_fn<decltype(&cuMemCreate)>("cuMemCreate");
  auto granularity =
      driver_fn<decltype(&cuMemGetAllocationGranularity)>("cuMemGetAllocationGranularity");
  auto reserve = driver_fn<decltype(&cuMemAddressReserve)>("cuMemAddressReserve");
  auto map = driver_fn<decltype(&cuMemMap)>("cuMemMap");
  auto set_access = driver_fn<decltype(&cuMemSetAccess)>("cuMemSetAccess");
  auto unmap = driver_fn<decltype(&cuMemUnmap)>("cuMemUnmap");
  auto release = driver_fn<decltype(&cuMemRelease)>("cuMemRelease");
  auto free_va = driver_fn<decltype(&cuMemAddressFree)>("cuMemAddressFree");
  if (!create || !granularity || !reserve || !map || !set_access || !unmap || !release || !free_va)
    return false;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
  prop.location.id = 0;
  size_t gran = 0;
  if (granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS || gran == 0)
    return false;
  const size_t size = (bytes + gran - 1) / gran * gran;
  CUmemGenericAllocationHandle h{};
  if (create(&h, size, &prop, 0) != CUDA_SUCCESS) return false;
  CUdeviceptr va = 0;
  if (reserve(&va, size, gran, 0, 0) != CUDA_SUCCESS) {
    release(h);
    return false;
  }
  CUmemAccessDesc access[2]{};
  access[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access[0].location.id = device;
  access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  access[1].location.type = CU_MEM_LOCATION_TYPE_HOST;
  access[1].location.id = 0;
  access[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (map(va, size, 0, h, 0) != CUDA_SUCCESS || set_access(va, size, access, 2) != CUDA_SUCCESS) {
    unmap(va, size);
    free_va(va, size);
    release(h);
    (void)cudaGetLastError();
    return false;
  }
  b.host = reinterpret_cast<void*>(va);
  b.device = reinterpret_cast<void*>(va);
  b.bytes = size;
  b.cumem = true;
  b.granule = gran;
  b.handle = static_cast<uint64_t>(h);
  return true;
}

}  // namespace

PinnedHostBuffer allocate_pinned_host(size_t bytes, bool try_cumem) {
  PinnedHostBuffer b;
  if (try_cumem && try_cumem_host(bytes, b)) return b;
  MS_CUDA_CHECK(cudaHostAlloc(&b.host, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  MS_CUDA_CHECK(cudaHostGetDevicePointer(&b.device, b.host, 0));
  b.bytes = bytes;
  return b;
}

void free_pinned_host(PinnedHostBuffer& b) {
  if (b.host == nullptr) return;
  if (b.cumem) {
    auto unmap = driver_fn<decltype(&cuMemUnmap)>("cuMemUnmap");
    auto release = driver_fn<decltype(&cuMemRelease)>("cuMemRelease");
    auto free_va = driver_fn<decltype(&cuMemAddressFree)>("cuMemAddressFree");
    const auto va = reinterpret_cast<CUdeviceptr>(b.device);
    if (unmap) unmap(va, b.bytes);
    if (free_va) free_va(va, b.bytes);
    if (release) release(static_cast<CUmemGenericAllocationHandle>(b.handle));
  } else {
    MS_CUDA_CHECK(cudaFreeHost(b.host));
  }
  b = {};
}

}  // namespace moeserve::cuda
