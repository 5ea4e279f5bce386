// The quantised-activation GEMM path of the forward (model.md §5): the MXFP8 activation
// fake-quant, the routed expert's SwiGLU fused with it, the device-side MoE grouping (no host
// sync, a prerequisite for capturing the MoE in a CUDA graph), the grouped MXFP4 GEMM over the
// grouped rows, and the FP8 -> bf16 weight dequantisation for the cuBLASLt dense path.
// The grouped GEMM: one CTA per (128 output columns, 16 or 64 rows, expert; skinny decode
// batches: per K quarter, a 4-CTA cluster adding its partial tiles in rank order); it walks K in
// steps of 128 (skinny tiles) or 32, one ue8m0 scale per 32 per weight row, dequantises the
// packed e2m1 nibbles to bf16 through a 16-entry table and one bf16x2 multiply by the
// power-of-two scale (exact), and multiplies with bf16 WMMA into fp32. The next step's weights and activations are loaded into registers while
// the current step multiplies. CTAs past an expert's row count exit at once, so the grid is
// sized from max_rows without knowing the counts on the host.
// Decode hints (rows_hint <= 24, K % 128 == 0) take the skinny kernel instead: weights as the
// mma A operand dequantised in registers (no table, no weight tile in shared memory), the
// expert's rows as n8 B tiles, split-K over a cluster sized to keep HBM busy (see its comment).
#include <cooperative_groups.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cudaTypedefs.h>
#include <mma.h>

#include <algorithm>

#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mbarrier.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/v41_device.cuh"
#include "backend/cuda/wgmma.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kQuantThreads = 256;  // 8 warps, one 32-element block per warp at a time

// The MXFP8 rule of fq_fp8_block32_pow2 (v41_device.cuh; the attention's fused epilogue uses the
// same functions).
using v41::mxfp8_code;
using v41::mxfp8_round;
using v41::mxfp8_round2;
using v41::mxfp8_scale;
using v41::Mxfp8Scale;

__device__ __forceinline__ void store_act(void* out, ActivationType type, int64_t i, float v) {
  if (type == ActivationType::kBF16) {
    static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
  } else {
    static_cast<float*>(out)[i] = v;
  }
}

// The column that holds column c of the natural order in the k-permuted layout of
// ActQuantParams::kperm64 / GroupedMxfp4GemmParams::a_kperm: within each 64-wide tile, k =
// 16 t + 4 s + 2 h + v goes to 16 s + 8 h + 2 t + v (so the swapped-operand GEMM's thread t finds
// all its k16 steps' pairs in packed weight bytes 8 t .. 8 t + 7). Pairs (v) stay adjacent.
__device__ __forceinline__ int64_t kperm64_col(int64_t c) {
  const int64_t k = c & 63;
  return (c - k) + 16 * ((k >> 2) & 3) + 8 * ((k >> 1) & 1) + 2 * (k >> 4) + (k & 1);
}

// Quantises the lane's element within its warp's 32-element block (c = the block's start + lane;
// warp-collective) and stores it: the fake-quant value (bf16 / fp32; kperm64: at its permuted
// column), or its e4m3 code with lane 0 writing the block's scale code (kMxfp8).
template <typename P>
__device__ __forceinline__ void quant_store_lane(const P& p, int64_t r, int64_t c, float v) {
  float a = fabsf(v);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
  const Mxfp8Scale sc = mxfp8_scale(a);
  if (p.out_type == ActivationType::kMxfp8) {
    static_cast<uint8_t*>(p.out)[r * p.ldo + c] = static_cast<uint8_t>(mxfp8_code(v, sc));
    if ((threadIdx.x & 31) == 0)
      p.out_scale[r * p.ldo_scale + c / 32] = static_cast<uint8_t>(sc.code);
  } else {
    store_act(p.out, p.out_type, r * p.ldo + (p.kperm64 ? kperm64_col(c) : c), mxfp8_round(v, sc));
  }
}

__global__ void __launch_bounds__(kQuantThreads) act_quant_kernel(ActQuantParams p) {
  pdl_wait();
  const int64_t rows = p.device_rows != nullptr ? *p.device_rows : p.rows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t blocks = p.cols / 32;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t src = p.row_index != nullptr ? p.row_index[r] : r;
    const float* x = p.x + src * p.ldx;
    for (int64_t b = warp; b < blocks; b += kQuantThreads / 32) {
      quant_store_lane(p, r, b * 32 + lane, x[b * 32 + lane]);
    }
  }
}

// 8 consecutive elements per thread (two float4 loads, one 16-byte bf16 store): a 32-element
// block is 4 lanes, its amax two shuffles. The same float operations per element as
// quant_store_lane, so bit-identical to it. grid (column chunks of 2048, row stride).
__device__ __forceinline__ Mxfp8Scale block_scale8(const float (&v)[8]) {
  float a = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) a = fmaxf(a, fabsf(v[e]));
  a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, 1));
  a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, 2));
  return mxfp8_scale(a);
}

__device__ __forceinline__ void store_act8(void* out, ActivationType type, int64_t i,
                                           const float (&v)[8]) {
  if (type == ActivationType::kBF16) {
    uint32_t w[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const __nv_bfloat162 b = __floats2bfloat162_rn(v[2 * e], v[2 * e + 1]);
      w[e] = *reinterpret_cast<const uint32_t*>(&b);
    }
    *reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(out) + i) =
        make_uint4(w[0], w[1], w[2], w[3]);
  } else {
    auto* o = reinterpret_cast<float4*>(static_cast<float*>(out) + i);
    o[0] = make_float4(v[0], v[1], v[2], v[3]);
    o[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
}

// Quantises and stores v = row r, columns [c, c + 8) (warp-collective: every lane calls it; live
// lanes store). kMxfp8: one 8-byte store of the codes; the block's first lane writes its scale.
// kperm64 (bf16): the four pairs go to their permuted columns, one 4-byte store each.
template <typename P>
__device__ __forceinline__ void quant_store8(const P& p, int64_t r, int64_t c, float (&v)[8],
                                             bool live) {
  const Mxfp8Scale sc = block_scale8(v);
  if (!live) return;
  if (p.kperm64) {  // the launchers allow it with kBF16 only
    auto* o = static_cast<__nv_bfloat16*>(p.out) + r * p.ldo;
#pragma unroll
    for (int e = 0; e < 4; ++e)
      *reinterpret_cast<__nv_bfloat162*>(o + kperm64_col(c + 2 * e)) =
          __float22bfloat162_rn(mxfp8_round2(v[2 * e], v[2 * e + 1], sc));
    return;
  }
  if (p.out_type == ActivationType::kMxfp8) {
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      lo |= mxfp8_code(v[e], sc) << (8 * e);
      hi |= mxfp8_code(v[4 + e], sc) << (8 * e);
    }
    *reinterpret_cast<uint2*>(static_cast<uint8_t*>(p.out) + r * p.ldo + c) = make_uint2(lo, hi);
    if ((threadIdx.x & 3) == 0)
      p.out_scale[r * p.ldo_scale + c / 32] = static_cast<uint8_t>(sc.code);
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 q = mxfp8_round2(v[2 * e], v[2 * e + 1], sc);
      v[2 * e] = q.x;
      v[2 * e + 1] = q.y;
    }
    store_act8(p.out, p.out_type, r * p.ldo + c, v);
  }
}

// The vector kernels: work item i is row i / (cols / 8), columns [8 (i % (cols / 8)), +8), one
// thread each. cols % 32 == 0, so the 4 lanes of a 32-wide block are 4 consecutive items of one row
// and a warp's 32 consecutive items are 8 whole blocks. The grid (at most kVecBlocksPerSm per SM)
// strides over the items, two per thread per step with both loads issued before either is
// quantised; a warp steps together (its bound is its first item), so the shuffles of quant_store8
// always see the whole warp. Items are < 2^31 (the launchers check it): 32-bit index arithmetic.
constexpr int kVecBlocksPerSm = 8;

template <typename P, typename Load>
__device__ __forceinline__ void quant_items(const P& p, int64_t rows, Load load) {
  const uint32_t chunks = static_cast<uint32_t>(p.cols / 8);
  const uint32_t total = static_cast<uint32_t>(rows) * chunks;
  const uint32_t stride = gridDim.x * blockDim.x;
  const uint32_t lane = threadIdx.x & 31u;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i - lane < total; i += 2u * stride) {
    float v[2][8];
    int64_t r[2], c[2];
    bool live[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const uint32_t j = i + u * stride;
      live[u] = j < total;
      r[u] = j / chunks;
      c[u] = 8 * static_cast<int64_t>(j % chunks);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[u][e] = 0.0f;
      if (live[u]) load(r[u], c[u], v[u]);
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) quant_store8(p, r[u], c[u], v[u], live[u]);
  }
}

__global__ void __launch_bounds__(kQuantThreads) act_quant_vec_kernel(ActQuantParams p) {
  pdl_wait();
  const int64_t rows = p.device_rows != nullptr ? *p.device_rows : p.rows;
  quant_items(p, rows, [&](int64_t r, int64_t c, float(&v)[8]) {
    const int64_t src = p.row_index != nullptr ? p.row_index[r] : r;
    const auto* x = reinterpret_cast<const float4*>(p.x + src * p.ldx + c);
    const float4 a = x[0], b = x[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
    v[7] = b.w;
  });
}

// The clamped SwiGLU (v41_device.cuh): the two kernels below and the grouped GEMM's fused
// epilogue.
using v41::swiglu_clamped;

__global__ void __launch_bounds__(kQuantThreads) swiglu_quant_vec_kernel(SwigluQuantParams p) {
  pdl_wait();
  const int64_t rows = p.device_rows != nullptr ? *p.device_rows : p.rows;
  const v41::SwigluScales sc{p.in_row_scale, p.gate_col_scale, p.up_col_scale, p.ld_col_scale,
                             p.group_rows};
  quant_items(p, rows, [&](int64_t r, int64_t c, float(&v)[8]) {
    v41::swiglu8(p.gate + r * p.ld + c, p.up + r * p.ld + c, r, c, p.row_weight, p.limit, sc, v);
  });
}

__global__ void __launch_bounds__(kQuantThreads) swiglu_quant_kernel(SwigluQuantParams p) {
  pdl_wait();
  const int64_t rows = p.device_rows != nullptr ? *p.device_rows : p.rows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t blocks = p.cols / 32;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    for (int64_t b = warp; b < blocks; b += kQuantThreads / 32) {
      const int64_t c = b * 32 + lane;
      float g = p.gate[r * p.ld + c], u = p.up[r * p.ld + c];
      if (p.in_row_scale != nullptr) {
        const float rs = p.in_row_scale[r];
        const int64_t o = (r / p.group_rows) * p.ld_col_scale + c;
        g = g * rs * p.gate_col_scale[o];
        u = u * rs * p.up_col_scale[o];
      }
      float v = swiglu_clamped(g, u, p.limit);
      if (p.row_weight != nullptr) v *= p.row_weight[r];
      quant_store_lane(p, r, c, v);
    }
  }
}

constexpr int kGroupThreads = 1024;

// Rank-block replicas whose blocks tile the experts without a wrap (experts_total = q local,
// replicas <= q, as the DEP bench's 384 = 32 x 12): the copies m_r = (id - r local) mod
// experts_total that are < local reduce to r = id / local (when < replicas), m = id mod local, so
// each hit is placed in O(1) instead of a loop over the replicas. The same copies in the same
// order (one copy per hit).
__device__ __forceinline__ bool rank_blocks_clean(const MoeGroupParams& p) {
  return p.replicas > 1 && p.experts_total > p.local && p.experts_total % p.local == 0 &&
         static_cast<int64_t>(p.replicas) * p.local <= p.experts_total;
}

// One CTA: counts by shared-memory atomics, positions by atomic cursors (the order inside an
// expert follows the atomics).
__global__ void __launch_bounds__(kGroupThreads) moe_group_kernel(MoeGroupParams p) {
  pdl_wait();
  extern __shared__ int32_t group_smem[];
  int32_t* count = group_smem;
  int32_t* cursor = group_smem + p.local;
  const int64_t hits = p.rows * p.k;
  for (int e = threadIdx.x; e < p.local; e += blockDim.x) count[e] = 0;
  __syncthreads();
  const auto pick = [&](int64_t i, int32_t* id, float* w) {
    const bool vl = p.ids_vl != nullptr && p.image[i / p.k] != 0;
    *id = vl ? p.ids_vl[i] : p.ids[i];
    *w = vl ? p.weights_vl[i] : p.weights[i];
  };
  // Rank-block replicas (experts_total > local, see kernels.h): copy r of a hit on expert id
  // goes to local expert m_r = (id - r * local) mod experts_total when m_r < local; m_r is
  // stepped from m_0 = id (id < experts_total), not divided, per replica.
  const bool blocks = p.replicas > 1 && p.experts_total > p.local;
  const bool clean = rank_blocks_clean(p);
  const auto for_each_copy = [&](int32_t id, auto&& fn) {
    if (clean) {  // the one copy, if any: r = id / local (see rank_blocks_clean)
      const int32_t r = id / p.local;
      if (r < p.replicas) fn(r, id - r * p.local);
      return;
    }
    int32_t m = id;
    for (int r = 0; r < p.replicas; ++r) {
      if (m < p.local) fn(r, m);
      m -= p.local;
      if (m < 0) m += p.experts_total;
    }
  };
  for (int64_t i = threadIdx.x; i < hits; i += blockDim.x) {
    int32_t id;
    float w;
    pick(i, &id, &w);
    if (id < 0) continue;
    if (blocks) {
      if (id < p.experts_total) for_each_copy(id, [&](int, int32_t m) { atomicAdd(&count[m], 1); });
    } else if (id < p.local) {
      atomicAdd(&count[id], p.replicas);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t off = 0;
    for (int e = 0; e < p.local; ++e) {
      p.offsets[e] = off;
      cursor[e] = off;
      off += count[e];
    }
    p.offsets[p.local] = off;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < hits; i += blockDim.x) {
    int32_t id;
    float w;
    pick(i, &id, &w);
    if (blocks) {
      p.inv[i] = -1;
      if (id < 0 || id >= p.experts_total) continue;
      const int32_t row = static_cast<int32_t>(i / p.k);
      for_each_copy(id, [&](int r, int32_t m) {
        const int32_t pos = atomicAdd(&cursor[m], 1);
        p.perm_row[pos] = row;
        p.perm_weight[pos] = w;
        if (r == 0) p.inv[i] = pos;
      });
      continue;
    }
    if (id >= 0 && id < p.local) {
      // The hit's replicas take consecutive positions; inv names the first (this rank's own).
      const int32_t pos = atomicAdd(&cursor[id], p.replicas);
      for (int c = 0; c < p.replicas; ++c) {
        p.perm_row[pos + c] = static_cast<int32_t>(i / p.k);
        p.perm_weight[pos + c] = w;
      }
      p.inv[i] = pos;
    } else {
      p.inv[i] = -1;
    }
  }
}

// The ordered kernels' copies of a hit on expert id. Rank-block replicas (experts_total > local,
// see kernels.h): copy r goes to local expert m_r = (id - r * local) mod experts_total when
// m_r < local; m_r is stepped from m_0 = id (id < experts_total), not divided, per replica.
// Otherwise copies of a hit on a local expert are `replicas` consecutive rows of it.
// fn(r, m, n): n rows at expert m.
template <class Fn>
__device__ __forceinline__ void for_each_ordered_copy(const MoeGroupParams& p, bool blocks,
                                                      bool clean, int32_t id, Fn&& fn) {
  if (id < 0) return;
  if (!blocks) {
    if (id < p.local) fn(0, id, p.replicas);
    return;
  }
  if (id >= p.experts_total) return;
  if (clean) {  // the one copy, if any: r = id / local (see rank_blocks_clean)
    const int32_t r = id / p.local;
    if (r < p.replicas) fn(r, id - r * p.local, 1);
    return;
  }
  int32_t m = id;
  for (int r = 0; r < p.replicas; ++r) {
    if (m < p.local) fn(r, m, 1);
    m -= p.local;
    if (m < 0) m += p.experts_total;
  }
}

// MoeGroupParams::ordered. One CTA. Deterministic: a local expert's grouped rows are in hit order (token-major; a hit's
// copies in replica order). Range thread t (of T, a few hits each) takes hits [t H, (t + 1) H):
// it counts its copies per expert into scratch [local][T] (phase 1), each warp turns one expert's
// row of counts into exclusive prefixes over t (phase 2, shuffle scans), thread 0 the experts'
// offsets, then each range thread places its copies at offsets[m] + its prefix, in order
// (phase 3). No atomics decide a position.
__global__ void __launch_bounds__(kGroupThreads) moe_group_ordered_kernel(MoeGroupParams p, int T,
                                                                  int64_t H) {
  pdl_wait();
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int64_t hits = p.rows * p.k;
  const auto pick = [&](int64_t i, int32_t* id, float* w) {
    const bool vl = p.ids_vl != nullptr && p.image[i / p.k] != 0;
    *id = vl ? p.ids_vl[i] : p.ids[i];
    *w = vl ? p.weights_vl[i] : p.weights[i];
  };
  const bool blocks = p.replicas > 1 && p.experts_total > p.local;
  const bool clean = rank_blocks_clean(p);
  const auto for_each_copy = [&](int32_t id, auto&& fn) {
    for_each_ordered_copy(p, blocks, clean, id, fn);
  };
  int32_t* mine = p.scratch + tid;  // scratch[m * T + tid]
  const int64_t h0 = static_cast<int64_t>(tid) * H, h1 = min(h0 + H, hits);
  if (tid < T) {
    for (int e = 0; e < p.local; ++e) mine[static_cast<int64_t>(e) * T] = 0;
    for (int64_t i = h0; i < h1; ++i) {
      int32_t id;
      float w;
      pick(i, &id, &w);
      for_each_copy(id, [&](int, int32_t m, int n) { mine[static_cast<int64_t>(m) * T] += n; });
    }
  }
  __syncthreads();
  // Phase 2: warp w scans experts w, w + 32, ...: exclusive prefixes over t, 32 at a time.
  for (int e = warp; e < p.local; e += kGroupThreads / 32) {
    int32_t* row = p.scratch + static_cast<int64_t>(e) * T;
    int32_t run = 0;
    for (int t0 = 0; t0 < T; t0 += 32) {
      const int t = t0 + lane;
      const int32_t c = t < T ? row[t] : 0;
      int32_t x = c;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int32_t y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
      }
      if (t < T) row[t] = run + x - c;
      run += __shfl_sync(0xffffffffu, x, 31);
    }
    if (lane == 0) p.offsets[e] = run;  // the expert's count for now
  }
  __syncthreads();
  if (tid == 0) {
    int32_t off = 0;
    for (int e = 0; e < p.local; ++e) {
      const int32_t cnt = p.offsets[e];
      p.offsets[e] = off;
      off += cnt;
    }
    p.offsets[p.local] = off;
  }
  __syncthreads();
  if (tid < T) {
    for (int64_t i = h0; i < h1; ++i) {
      int32_t id;
      float w;
      pick(i, &id, &w);
      p.inv[i] = -1;
      const int32_t row = static_cast<int32_t>(i / p.k);
      for_each_copy(id, [&](int r, int32_t m, int n) {
        int32_t& cur = mine[static_cast<int64_t>(m) * T];
        const int32_t pos = p.offsets[m] + cur;
        cur += n;
        for (int c = 0; c < n; ++c) {
          p.perm_row[pos + c] = row;
          p.perm_weight[pos + c] = w;
        }
        if (r == 0) p.inv[i] = pos;  // copy 0: the hit itself (a local expert)
      });
    }
  }
}

// MoeGroupParams::ordered with MoeGroupParams::staged: the phases of moe_group_ordered_kernel
// (the same positions), with
// kSmem: counts and offsets in shared memory (local * T + local + 1 ints within
// kGroupOrderedSmemBytes: 27.7 KB at the DEP32 decode share, 12 experts x 576 range threads),
// else counts in p.scratch. Each range thread reads its hits kGroupBatch at a time, loads first,
// and each warp reads its expert's whole row of counts before the scan, so no chain of dependent
// global loads is longer than a few (r18 ncu: the global-scratch form took 12.1 us per layer at
// 64 x 6, one CTA, on the main stream's chain). The same positions either way.
constexpr int kGroupBatch = 4;
constexpr size_t kGroupOrderedSmemBytes = 96 * 1024;

template <bool kSmem>
__global__ void __launch_bounds__(kGroupThreads, 1) moe_group_ordered_staged_kernel(MoeGroupParams p, int T,
                                                                         int64_t H) {
  pdl_wait();
  extern __shared__ int32_t ordered_smem[];
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int64_t hits = p.rows * p.k;
  const int local = p.local;
  const auto pick_id = [&](int64_t i) {
    const bool vl = p.ids_vl != nullptr && p.image[i / p.k] != 0;
    return vl ? p.ids_vl[i] : p.ids[i];
  };
  const auto pick_w = [&](int64_t i) {
    const bool vl = p.ids_vl != nullptr && p.image[i / p.k] != 0;
    return vl ? p.weights_vl[i] : p.weights[i];
  };
  const bool blocks = p.replicas > 1 && p.experts_total > p.local;
  const bool clean = rank_blocks_clean(p);
  const auto for_each_copy = [&](int32_t id, auto&& fn) {
    for_each_ordered_copy(p, blocks, clean, id, fn);
  };
  int32_t* counts = kSmem ? ordered_smem + local + 1 : p.scratch;  // counts[m * T + t]
  int32_t* offs = kSmem ? ordered_smem : p.offsets;                 // [local + 1]
  int32_t* mine = counts + tid;
  const int64_t h0 = static_cast<int64_t>(tid) * H, h1 = min(h0 + H, hits);
  if constexpr (kSmem) {
    for (int64_t q = tid; q < static_cast<int64_t>(local) * T; q += kGroupThreads) counts[q] = 0;
    __syncthreads();
  } else if (tid < T) {
    for (int e = 0; e < local; ++e) mine[static_cast<int64_t>(e) * T] = 0;
  }
  if (tid < T) {
    for (int64_t i0 = h0; i0 < h1; i0 += kGroupBatch) {
      int32_t id[kGroupBatch];
#pragma unroll
      for (int j = 0; j < kGroupBatch; ++j) id[j] = i0 + j < h1 ? pick_id(i0 + j) : -1;
#pragma unroll
      for (int j = 0; j < kGroupBatch; ++j)
        for_each_copy(id[j], [&](int, int32_t m, int n) { mine[static_cast<int64_t>(m) * T] += n; });
    }
  }
  __syncthreads();
  // Phase 2: warp w scans experts w, w + 32, ...: exclusive prefixes over t, 32 at a time, the
  // counts of kScanBatch such steps read before they are scanned.
  constexpr int kScanBatch = 8;
  for (int e = warp; e < local; e += kGroupThreads / 32) {
    int32_t* row = counts + static_cast<int64_t>(e) * T;
    int32_t run = 0;
    for (int t0 = 0; t0 < T; t0 += 32 * kScanBatch) {
      int32_t c[kScanBatch];
#pragma unroll
      for (int j = 0; j < kScanBatch; ++j) {
        const int t = t0 + j * 32 + lane;
        c[j] = t < T ? row[t] : 0;
      }
#pragma unroll
      for (int j = 0; j < kScanBatch; ++j) {
        const int t = t0 + j * 32 + lane;
        int32_t x = c[j];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          const int32_t y = __shfl_up_sync(0xffffffffu, x, o);
          if (lane >= o) x += y;
        }
        if (t < T) row[t] = run + x - c[j];
        run += __shfl_sync(0xffffffffu, x, 31);
      }
    }
    if (lane == 0) offs[e] = run;  // the expert's count for now
  }
  __syncthreads();
  if (tid == 0) {
    int32_t off = 0;
    for (int e = 0; e < local; ++e) {
      const int32_t cnt = offs[e];
      offs[e] = off;
      if constexpr (kSmem) p.offsets[e] = off;
      off += cnt;
    }
    offs[local] = off;
    if constexpr (kSmem) p.offsets[local] = off;
  }
  __syncthreads();
  if (tid < T) {
    for (int64_t i0 = h0; i0 < h1; i0 += kGroupBatch) {
      int32_t id[kGroupBatch];
      float w[kGroupBatch];
#pragma unroll
      for (int j = 0; j < kGroupBatch; ++j) {
        const bool in = i0 + j < h1;
        id[j] = in ? pick_id(i0 + j) : -1;
        w[j] = in ? pick_w(i0 + j) : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < kGroupBatch; ++j) {
        const int64_t i = i0 + j;
        if (i >= h1) break;
        p.inv[i] = -1;
        const int32_t row = static_cast<int32_t>(i / p.k);
        const float wj = w[j];
        for_each_copy(id[j], [&](int r, int32_t m, int n) {
          int32_t& cur = mine[static_cast<int64_t>(m) * T];
          const int32_t pos = offs[m] + cur;
          cur += n;
          for (int c2 = 0; c2 < n; ++c2) {
            p.perm_row[pos + c2] = row;
            p.perm_weight[pos + c2] = wj;
          }
          if (r == 0) p.inv[i] = pos;  // copy 0: the hit itself (a local expert)
        });
      }
    }
  }
}

constexpr int kGemmThreads = 128;  // 4 warps, each 32 output columns
constexpr int kTileN = 128;
constexpr int kPadN = kTileN + 4;

template <int kTM, int kTK>
struct GemmTile {
  static constexpr int kPadK = kTK + 8;  // bf16 pitch (WMMA- and uint4-aligned)
  static constexpr size_t kAb = sizeof(__nv_bfloat16) * (kTM + kTileN) * kPadK;
  static constexpr size_t kC = sizeof(float) * kTM * kPadN;
  static constexpr size_t kBytes = kAb > kC ? kAb : kC;
  static constexpr int kBVec = kTK / 32;               // uint4 of packed weights per row
  static constexpr int kAVec = kTM * kTK / 8;          // uint4 per activation tile
  static constexpr int kAPer = (kAVec + kGemmThreads - 1) / kGemmThreads;
};

// kTK: K per step (32 or 128; one ue8m0 scale per 32). Skinny tiles (16 rows) take 128 so a CTA
// keeps 8 KB of weights in flight (this step's and the next's).
// kSplit > 1: the K steps are split over the kSplit CTAs of a thread-block cluster (consecutive
// blockIdx.x), which add their partial tiles through distributed shared memory in rank order
// (deterministic), each rank writing 1/kSplit of the tile: small-M decode batches then stream the
// expert weights with kSplit times more CTAs in flight.
template <int kTM, int kTK, int kSplit>
__device__ __forceinline__ void grouped_mxfp4_gemm_tile(const GroupedMxfp4GemmParams& p,
                                                        int64_t m0) {
  using namespace nvcuda;
  using T = GemmTile<kTM, kTK>;
  constexpr int kPadK = T::kPadK;
  __shared__ alignas(128) unsigned char smem[T::kBytes];
  __shared__ uint16_t lut[16];
  auto* a_tile = reinterpret_cast<__nv_bfloat16(*)[kPadK]>(smem);
  auto* b_tile =
      reinterpret_cast<__nv_bfloat16(*)[kPadK]>(smem + sizeof(__nv_bfloat16) * kTM * kPadK);
  auto* c_tile = reinterpret_cast<float(*)[kPadN]>(smem);

  const int e = blockIdx.z;
  const int64_t beg = p.offsets[e];
  const int64_t cnt = p.offsets[e + 1] - beg;
  const int sp = static_cast<int>(blockIdx.x % kSplit);
  const int64_t n0 = static_cast<int64_t>(blockIdx.x / kSplit) * kTileN;
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  if (tid < 16) {
    // e2m1 -> bf16 bits: 0 .5 1 1.5 2 3 4 6, sign in bit 3.
    constexpr uint16_t kMag[8] = {0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0};
    lut[tid] = static_cast<uint16_t>(kMag[tid & 7] | ((tid & 8) != 0 ? 0x8000u : 0u));
  }

  const int64_t brow = n0 + tid;  // one weight row per thread
  const bool bvalid = brow < p.n;
  const uint8_t* wrow = p.w[e] + (bvalid ? brow : 0) * (p.k / 2);
  const uint8_t* srow = p.w_scale[e] + (bvalid ? brow : 0) * (p.k / 32);
  const auto* a = static_cast<const __nv_bfloat16*>(p.a) + beg * p.lda;

  uint4 breg[T::kBVec];
  uint32_t sreg;  // kTK / 32 scale bytes, little end first
  uint4 areg[T::kAPer];
  const auto load = [&](int64_t kb) {
    const int64_t k0 = kb * kTK;
#pragma unroll
    for (int i = 0; i < T::kBVec; ++i)
      breg[i] = bvalid ? *reinterpret_cast<const uint4*>(wrow + k0 / 2 + 16 * i)
                       : make_uint4(0, 0, 0, 0);
    if constexpr (kTK == 128) {
      sreg = bvalid ? *reinterpret_cast<const uint32_t*>(srow + k0 / 32) : 0x7F7F7F7Fu;
    } else {
      sreg = bvalid ? srow[k0 / 32] : 0x7Fu;
    }
#pragma unroll
    for (int j = 0; j < T::kAPer; ++j) {
      const int v = tid + j * kGemmThreads;
      if (v < T::kAVec) {
        const int r = v / (kTK / 8);
        const int c = (v % (kTK / 8)) * 8;
        areg[j] = m0 + r < cnt
                      ? *reinterpret_cast<const uint4*>(a + (m0 + r) * p.lda + k0 + c)
                      : make_uint4(0, 0, 0, 0);
      }
    }
  };

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kTM / 16][2];
#pragma unroll
  for (int i = 0; i < kTM / 16; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  const int64_t k_steps = p.k / kTK;
  const int64_t per = (k_steps + kSplit - 1) / kSplit;
  const int64_t ks0 = k_steps < sp * per ? k_steps : sp * per;
  const int64_t ks1 = k_steps < ks0 + per ? k_steps : ks0 + per;
  if (ks0 < ks1) load(ks0);
  __syncthreads();  // lut
  for (int64_t ks = ks0; ks < ks1; ++ks) {
#pragma unroll
    for (int j = 0; j < T::kAPer; ++j) {
      const int v = tid + j * kGemmThreads;
      if (v < T::kAVec)
        *reinterpret_cast<uint4*>(&a_tile[v / (kTK / 8)][(v % (kTK / 8)) * 8]) = areg[j];
    }
#pragma unroll
    for (int i = 0; i < T::kBVec; ++i) {  // 32 K elements, one scale
      const float sf = v41::ue8m0_decode((sreg >> (8 * i)) & 0xFFu);
      const __nv_bfloat162 scale2 = __floats2bfloat162_rn(sf, sf);
      const uint32_t words[4] = {breg[i].x, breg[i].y, breg[i].z, breg[i].w};
      uint32_t outw[16];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const uint32_t byte = (words[q] >> (8 * b)) & 0xFFu;
          const uint32_t pair = static_cast<uint32_t>(lut[byte & 0xFu]) |
                                (static_cast<uint32_t>(lut[byte >> 4]) << 16);
          __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&pair);
          v = __hmul2(v, scale2);
          outw[q * 4 + b] = *reinterpret_cast<const uint32_t*>(&v);
        }
      }
      uint4* dst = reinterpret_cast<uint4*>(&b_tile[tid][32 * i]);
#pragma unroll
      for (int q = 0; q < 4; ++q)
        dst[q] = make_uint4(outw[q * 4], outw[q * 4 + 1], outw[q * 4 + 2], outw[q * 4 + 3]);
    }
    __syncthreads();
    if (ks + 1 < ks1) load(ks + 1);
#pragma unroll
    for (int kk = 0; kk < kTK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> af[kTM / 16];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> bf[2];
#pragma unroll
      for (int i = 0; i < kTM / 16; ++i) wmma::load_matrix_sync(af[i], &a_tile[i * 16][kk], kPadK);
#pragma unroll
      for (int j = 0; j < 2; ++j)
        wmma::load_matrix_sync(bf[j], &b_tile[warp * 32 + j * 16][kk], kPadK);
#pragma unroll
      for (int i = 0; i < kTM / 16; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], af[i], bf[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < kTM / 16; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(&c_tile[i * 16][warp * 32 + j * 16], acc[i][j], kPadN,
                              wmma::mem_row_major);
  if constexpr (kSplit == 1) {
    __syncthreads();
    for (int i = tid; i < kTM * kTileN; i += kGemmThreads) {
      const int r = i / kTileN;
      const int c = i % kTileN;
      if (m0 + r < cnt && n0 + c < p.n) p.y[(beg + m0 + r) * p.ldy + n0 + c] = c_tile[r][c];
    }
  } else {
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every rank's partial tile is in its shared memory
    constexpr int kPart = kTM * kTileN / kSplit;
    for (int i = sp * kPart + tid; i < (sp + 1) * kPart; i += kGemmThreads) {
      const int r = i / kTileN;
      const int c = i % kTileN;
      float v = 0.0f;
#pragma unroll
      for (int q = 0; q < kSplit; ++q) v += cluster.map_shared_rank(&c_tile[r][c], q)[0];
      if (m0 + r < cnt && n0 + c < p.n) p.y[(beg + m0 + r) * p.ldy + n0 + c] = v;
    }
    cluster.sync();  // keep this rank's tile alive until every rank has read it
  }
}

// The M tiles of expert blockIdx.z from blockIdx.y on, gridDim.y apart: the grid is sized from
// the expected rows per expert, not the worst case, so few CTAs start only to find no rows. The
// loop bounds are the same for every CTA of a cluster (same expert and blockIdx.y).
template <int kTM, int kTK, int kSplit>
__device__ __forceinline__ void grouped_mxfp4_gemm_body(const GroupedMxfp4GemmParams& p) {
  const int e = blockIdx.z;
  const int64_t cnt = p.offsets[e + 1] - p.offsets[e];
  for (int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTM; m0 < cnt;
       m0 += static_cast<int64_t>(gridDim.y) * kTM) {
    grouped_mxfp4_gemm_tile<kTM, kTK, kSplit>(p, m0);
    __syncthreads();  // this tile's shared memory reads are done before the next tile's writes
  }
}

template <int kTM, int kTK>
__global__ void __launch_bounds__(kGemmThreads) grouped_mxfp4_gemm_kernel(
    GroupedMxfp4GemmParams p) {
  pdl_wait();
  grouped_mxfp4_gemm_body<kTM, kTK, 1>(p);
}

constexpr int kKSplit = 4;
template <int kTM, int kTK>
__global__ void __cluster_dims__(kKSplit, 1, 1) __launch_bounds__(kGemmThreads)
    grouped_mxfp4_gemm_split_kernel(GroupedMxfp4GemmParams p) {
  pdl_wait();
  grouped_mxfp4_gemm_body<kTM, kTK, kKSplit>(p);
}

// ---------------------------------------------------------------------------------------------
// Skinny (decode) grouped MXFP4 GEMM: a few rows per expert, so the call is pure weight streaming
// and the kernel is built around keeping HBM busy with little ALU work per weight byte.
//
// Swapped operands: the m16n8k16 A operand is 16 WEIGHT rows (16 output columns), the B operand
// is 8 grouped activation rows (tokens), so ~6 rows per expert fill one n8 tile instead of
// wasting 10 of 16 rows of an M tile. Each warp owns 32 weight rows (two m16 tiles, sharing the
// B fragments), a CTA 4 warps = 128 rows; the CTA's K steps (128 each) may be split over a
// thread-block cluster whose ranks add their partial tiles in rank order (deterministic).
//
// The K permutation (a dot product is invariant under one permutation of K applied to both
// operands; no weight repacking). Lane = 4 g + t. In each 128-K step the thread owns the
// physical K chunk [k0 + 32 t, k0 + 32 t + 32) of weight rows g and g + 8 of each m16 tile: one
// 16-byte load per row (32 nibbles) and exactly one ue8m0 scale byte per row (the chunk is one
// 32-block). In mma k16-step j (0..7) the fragment's logical k {2t, 2t+1} is physical
// k0 + 32 t + 4 j + {0, 1} and logical k {2t+8, 2t+9} is physical k0 + 32 t + 4 j + {2, 3}; over
// j = 0..7 and t = 0..3 this is a bijection onto the 128 physical k of the step. With the PTX
// m16n8k16 layouts (A: a0 = row g k 2t.., a1 = row g+8, a2 = row g k 2t+8.., a3 = row g+8 k
// 2t+8..; B: b0 = k 2t.. of column g, b1 = k 2t+8..; C: c0,c1 = row g columns 2t, 2t+1, c2,c3 =
// row g+8), step j takes nibbles 4j..4j+3 of the thread's chunk: a0/a1 = nibbles (4j, 4j+1) of
// rows g/g+8, a2/a3 = nibbles (4j+2, 4j+3); b0/b1 = bf16 elements (4j, 4j+1)/(4j+2, 4j+3) of the
// same physical chunk of token g. One 32-bit word of the weight chunk (8 nibbles) feeds two
// steps; one 16-byte unit of the token's chunk (8 bf16) feeds the same two steps.
//
// NOTE: the activation rows are staged in shared memory once per CTA (<= 32 tokens x the CTA's K
// range, bf16): every warp of the CTA reads the same B fragments, and read from global each lane
// would fetch 16 bytes 64 bytes apart from its neighbours (half-used sectors, 16 L1 wavefronts per
// warp load). Staged in fragment order ([step][n8 tile][16-byte unit q][lane]) every B load is one
// conflict-free 512-byte LDS.128 across the warp. Tokens past the expert's count are zero-filled.
//
// The e2m1 -> bf16 dequantisation stays in registers: prmt byte tables indexed by the 3 magnitude
// bits give the low and high bytes of the bf16 values, prmt in sign-replicate mode builds the sign
// bytes, a final prmt interleaves low and high bytes into bf16x2 words, then one bf16x2 multiply by
// the power-of-two scale (the same multiply as the table kernel above, so bit-identical to it).
//
// Memory-level parallelism: each thread keeps kSkinnyDepth steps of weights in a register ring, so
// a warp has the next two steps (2 x 2 KB) in flight while it multiplies the current one; at 4
// CTAs (16 warps) per SM that is ~64 KB in flight per SM.

constexpr int kSkinnyWarps = 4;
constexpr int kSkinnyThreads = 32 * kSkinnyWarps;
constexpr int kSkinnyRows = 32 * kSkinnyWarps;  // weight rows (output columns) per CTA
constexpr int kSkinnyStepK = 128;
constexpr int kSkinnyDepth = 3;                    // register ring: current step + 2 in flight
constexpr int kSkinnyPartPitch = kSkinnyRows + 4;  // fp32 partial tile pitch (conflict-free stores)
constexpr int kSkinnyMaxSplit = 8;                 // portable cluster size
constexpr size_t kSkinnySmemBudget = 48 * 1024;    // no opt-in attribute needed; 4 CTAs per SM
// NOTE: split K until each rank has at most kSkinnyStepsPerCta steps and the grid has at least
// kSkinnyMinCtas CTAs (two per SM of a 132-SM H200; an SM holds 4). Untuned guesses: the decode
// shapes get 864 CTAs of 10 steps (w1, w3) and 960 of 9 (w2), ~1.7 waves of 4 CTAs per SM.
// (tools/device/gemm_probe.cu compiles variants with MOESERVE_SKINNY_STEPS / _MIN_CTAS.)
#ifndef MOESERVE_SKINNY_STEPS
#define MOESERVE_SKINNY_STEPS 10
#endif
#ifndef MOESERVE_SKINNY_MIN_CTAS
#define MOESERVE_SKINNY_MIN_CTAS 264
#endif
constexpr int64_t kSkinnyStepsPerCta = MOESERVE_SKINNY_STEPS;
constexpr int64_t kSkinnyMinCtas = MOESERVE_SKINNY_MIN_CTAS;

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// Streamed once: no L1 allocation (L1 keeps the scale sectors, reused over 8 steps).
__device__ __forceinline__ uint4 ldg_stream16(const void* ptr) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr));
  return v;
}

// 16 bytes global -> shared; src_bytes 0 writes zeros (gmem must still be a valid address).
__device__ __forceinline__ void cp_async16_zfill(void* smem_dst, const void* gmem_src, bool valid) {
  const auto d = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(gmem_src),
               "r"(src_bytes));
}

// Eight e2m1 nibbles (x, lowest nibble = lowest k) -> four bf16x2 words (n0,n1), (n2,n3), (n4,n5),
// (n6,n7), each times scale2. e2m1 -> bf16 bits as the table kernel: magnitudes 0 .5 1 1.5 2 3 4 6
// = 0x0000 0x3F00 0x3F80 0x3FC0 0x4000 0x4040 0x4080 0x40C0, bit 3 the sign (0x8000).
__device__ __forceinline__ void e2m1x8_to_bf16(uint32_t x, __nv_bfloat162 scale2,
                                               uint32_t (&out)[4]) {
  // prmt byte tables (selector 0-3: first operand, 4-7: second) of the low and high bytes.
  constexpr uint32_t kLo03 = 0xC0800000u, kLo47 = 0xC0804000u;
  constexpr uint32_t kHi03 = 0x3F3F3F00u, kHi47 = 0x40404040u;
  // Magnitude selectors with bit 3 clear (prmt's copy mode); prmt reads the low 4 nibbles.
  const uint32_t m = x & 0x77777777u;
  const uint32_t mh = m >> 16;
  const uint32_t lo0 = prmt(kLo03, kLo47, m), hi0 = prmt(kHi03, kHi47, m);    // n0..n3
  const uint32_t lo1 = prmt(kLo03, kLo47, mh), hi1 = prmt(kHi03, kHi47, mh);  // n4..n7
  // Signs: a selector nibble with bit 3 set replicates the msb of the chosen byte. The msb of
  // byte b of x is the sign of nibble 2b + 1, that of byte b of x << 4 the sign of nibble 2b
  // (bytes 0-3: x << 4, 4-7: x), so 0xD9C8 gives the sign bytes of n0..n3, 0xFBEA of n4..n7.
  const uint32_t x4 = x << 4;
  const uint32_t h0 = hi0 | (prmt(x4, x, 0xD9C8u) & 0x80808080u);
  const uint32_t h1 = hi1 | (prmt(x4, x, 0xFBEAu) & 0x80808080u);
  // Interleave (low, high) bytes into bf16 pairs.
  const uint32_t w[4] = {prmt(lo0, h0, 0x5140u), prmt(lo0, h0, 0x7362u), prmt(lo1, h1, 0x5140u),
                         prmt(lo1, h1, 0x7362u)};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 v = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]), scale2);
    out[i] = *reinterpret_cast<const uint32_t*>(&v);
  }
}

// One 128-K step of a thread's weights: [m16 tile i][row g / g + 8] 32 nibbles.
struct SkinnyStage {
  uint4 w[2][2];
};

// 4 bytes global -> shared (through L1: the neighbouring scale bytes are other threads').
__device__ __forceinline__ void cp_async4(void* smem_dst, const void* gmem_src) {
  const auto d = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(gmem_src));
}

// Dynamic shared memory of the skinny kernel: the staged activations (reused for the fp32
// partial tile once the K loop is done), then the CTA's scale codes [row][4 per step].
__host__ __device__ constexpr size_t skinny_act_bytes(int64_t steps_per_rank, int tokens) {
  const int64_t act = steps_per_rank * tokens * (kSkinnyStepK * 2);
  const int64_t part = static_cast<int64_t>(tokens) * kSkinnyPartPitch * 4;
  return static_cast<size_t>(act > part ? act : part);
}
__host__ __device__ constexpr size_t skinny_smem_bytes(int64_t steps_per_rank, int tokens) {
  return skinny_act_bytes(steps_per_rank, tokens) +
         static_cast<size_t>(kSkinnyRows * steps_per_rank * (kSkinnyStepK / 32));
}

// grid (128-row tiles x split, token-chunk CTAs, experts), cluster (split, 1, 1) when split > 1.
// kNT n8 tiles = 8 kNT tokens per chunk; further tokens loop over chunks (re-reading the weights,
// rare at decode). n8 tiles past the chunk's count are skipped (warp-uniform), so kNT = 4 costs
// little when an expert has few rows.
template <int kNT>
__global__ void __launch_bounds__(kSkinnyThreads, kNT <= 2 ? 4 : 3)
    grouped_mxfp4_gemm_skinny_kernel(GroupedMxfp4GemmParams p) {
  pdl_wait();
  namespace cg = cooperative_groups;
  constexpr int kT = 8 * kNT;
  extern __shared__ uint4 skinny_smem[];
  uint4* act = skinny_smem;                            // [step][kNT][4][32] 16-byte units
  auto* part = reinterpret_cast<float*>(skinny_smem);  // [kT][kSkinnyPartPitch] (after the K loop)

  const int e = blockIdx.z;
  const int64_t beg = p.offsets[e];
  const int64_t cnt = p.offsets[e + 1] - beg;
  // Nothing for this CTA: every rank of the cluster has the same expert and chunk, so the whole
  // cluster leaves together.
  if (static_cast<int64_t>(blockIdx.y) * kT >= cnt) return;

  cg::cluster_group cluster = cg::this_cluster();
  const int split = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  const auto sync_ranks = [&] {
    if (split > 1) {
      cluster.sync();
    } else {
      __syncthreads();
    }
  };
  const int64_t row0 = static_cast<int64_t>(blockIdx.x / split) * kSkinnyRows;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;

  const int64_t k_steps = p.k / kSkinnyStepK;
  const int64_t per = (k_steps + split - 1) / split;
  const int64_t ks0 = min(k_steps, rank * per);
  const int nsteps = static_cast<int>(min(k_steps, ks0 + per) - ks0);

  // Weight rows row0 + 32 warp + 16 i + 8 h + g (local row 32 warp + 8 j + g, j = 2 i + h); rows
  // past n read row n - 1 (only their own output columns see them, and those are not stored).
  // 32-bit row offsets (the launcher checks n * k / 2 < 2^31) keep the register count down.
  const uint8_t* wbase = p.w[e] + ks0 * (kSkinnyStepK / 2) + 16 * t;
  int32_t woff[4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
    woff[j] = static_cast<int32_t>(min(row0 + 32 * warp + 8 * j + g, p.n - 1) * (p.k / 2));
  const auto load = [&](SkinnyStage& st, int s) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      st.w[j >> 1][j & 1] = ldg_stream16(wbase + woff[j] + s * (kSkinnyStepK / 2));
  };

  // The scale codes of the CTA's rows and K range, [local row][4 s + t'], staged once (they are
  // 1/16 of the weight bytes; in registers they would cost 4 per step of the ring).
  const int scale_pitch = static_cast<int>(per) * (kSkinnyStepK / 32);
  auto* scales = reinterpret_cast<uint8_t*>(skinny_smem) + skinny_act_bytes(per, kT);
  for (int u = tid; u < kSkinnyRows * nsteps; u += kSkinnyThreads) {
    const int rl = u / nsteps, s = u % nsteps;
    const int64_t r = min(row0 + rl, p.n - 1);
    cp_async4(scales + rl * scale_pitch + 4 * s,
              p.w_scale[e] + r * (p.k / 32) + (ks0 + s) * (kSkinnyStepK / 32));
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
  const uint8_t* my_scales = scales + (32 * warp + g) * scale_pitch + t;

  const auto* a = static_cast<const __nv_bfloat16*>(p.a);
  for (int64_t c0 = static_cast<int64_t>(blockIdx.y) * kT; c0 < cnt;
       c0 += static_cast<int64_t>(gridDim.y) * kT) {
    const int live =
        static_cast<int>(min(static_cast<int64_t>(kNT), (cnt - c0 + 7) / 8));  // n8 tiles

    // The first steps' weights go out before the activation staging so that their latency
    // overlaps it.
    SkinnyStage st[kSkinnyDepth];
#pragma unroll
    for (int d = 0; d < kSkinnyDepth - 1; ++d)
      if (d < nsteps) load(st[d], d);

    // Stage tokens [c0, c0 + 8 live) x this rank's K range: unit u = (token, 8-element chunk c),
    // c fastest so that neighbouring threads read neighbouring global bytes; c = 16 s + 4 t' + q
    // (step s, thread chunk t', unit q) lands at act[s][tile][q][4 g' + t'].
    const int units_per_token = 16 * nsteps;
    for (int u = tid; u < 8 * live * units_per_token; u += kSkinnyThreads) {
      const int tok = u / units_per_token, c = u % units_per_token;
      const int s = c >> 4, tq = (c >> 2) & 3, q = c & 3;
      const bool valid = c0 + tok < cnt;
      const __nv_bfloat16* src =
          valid ? a + (beg + c0 + tok) * p.lda + ks0 * kSkinnyStepK + 8 * c : a;
      cp_async16_zfill(&act[((s * kNT + (tok >> 3)) * 4 + q) * 32 + 4 * (tok & 7) + tq], src,
                       valid);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();

    float acc[2][kNT][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
        acc[i][nt][0] = acc[i][nt][1] = acc[i][nt][2] = acc[i][nt][3] = 0.0f;

    const auto compute = [&](const SkinnyStage& cur, int s) {
      __nv_bfloat162 scale2[2][2];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float sf = v41::ue8m0_decode(my_scales[8 * j * scale_pitch + 4 * s]);
        scale2[j >> 1][j & 1] = __floats2bfloat162_rn(sf, sf);
      }
      const uint4* b_step = act + s * (kNT * 4 * 32) + lane;
#pragma unroll
      for (int q = 0; q < 4; ++q) {  // weight word q = k16-steps 2q, 2q + 1
        uint32_t wf[2][2][4];        // [tile][row g / g + 8][(n0,n1) (n2,n3) (n4,n5) (n6,n7)]
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint4 v = cur.w[i][h];
            const uint32_t word = q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w;
            e2m1x8_to_bf16(word, scale2[i][h], wf[i][h]);
          }
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          if (nt >= live) break;
          const uint4 b = b_step[(nt * 4 + q) * 32];
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const uint32_t f0[4] = {wf[i][0][0], wf[i][1][0], wf[i][0][1], wf[i][1][1]};
            const uint32_t f1[4] = {wf[i][0][2], wf[i][1][2], wf[i][0][3], wf[i][1][3]};
            mma::bf16_16816(acc[i][nt], f0, b.x, b.y);
            mma::bf16_16816(acc[i][nt], f1, b.z, b.w);
          }
        }
      }
    };

    for (int s0 = 0; s0 < nsteps; s0 += kSkinnyDepth) {
#pragma unroll
      for (int d = 0; d < kSkinnyDepth; ++d) {
        const int s = s0 + d;
        if (s < nsteps) {
          if (s + kSkinnyDepth - 1 < nsteps)
            load(st[(d + kSkinnyDepth - 1) % kSkinnyDepth], s + kSkinnyDepth - 1);
          compute(st[d], s);
        }
      }
    }

    // Partial tile [token][column] in shared memory (over the staged activations), then each
    // rank sums its share of the elements over the ranks in rank order and stores it.
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        if (nt >= live) break;
        const int col = 32 * warp + 16 * i + g, tok = 8 * nt + 2 * t;
        part[tok * kSkinnyPartPitch + col] = acc[i][nt][0];
        part[(tok + 1) * kSkinnyPartPitch + col] = acc[i][nt][1];
        part[tok * kSkinnyPartPitch + col + 8] = acc[i][nt][2];
        part[(tok + 1) * kSkinnyPartPitch + col + 8] = acc[i][nt][3];
      }
    sync_ranks();  // every rank's partial tile is in its shared memory
    const int elems = 8 * live * kSkinnyRows;
    const int share = (elems + split - 1) / split;
    const int end = min(elems, (rank + 1) * share);
    for (int i = rank * share + tid; i < end; i += kSkinnyThreads) {
      const int tok = i / kSkinnyRows, col = i % kSkinnyRows;
      float* src = part + tok * kSkinnyPartPitch + col;
      float v = 0.0f;
      for (int r = 0; r < split; ++r) v += split > 1 ? *cluster.map_shared_rank(src, r) : *src;
      if (c0 + tok < cnt && row0 + col < p.n) p.y[(beg + c0 + tok) * p.ldy + row0 + col] = v;
    }
    sync_ranks();  // this rank's tile stays alive until every rank has read it
  }
}

// Row tiles per expert in a grouped GEMM's grid (blockIdx.y): twice the expected rows
// (rows_hint) in tiles of `tile`, at least 1 and no more than max_rows needs. CTAs loop over
// further tiles when an expert gets more rows; those past its count exit at once.
int64_t row_tiles_per_expert(const GroupedMxfp4GemmParams& p, int64_t tile) {
  return std::min(ceil_div(p.max_rows, tile),
                  std::max<int64_t>(1, ceil_div(2 * std::max<int64_t>(p.rows_hint, 1), tile)));
}

// The skinny kernel when it applies (decode hints, K % 128 == 0, the staging fits the budget);
// false: use the table kernels.
bool launch_grouped_mxfp4_skinny(const GroupedMxfp4GemmParams& p, cudaStream_t stream) {
  if (p.rows_hint > 24 || p.k % kSkinnyStepK != 0 || p.n * (p.k / 2) >= (int64_t{1} << 31))
    return false;
  const int nt = p.rows_hint <= 8 ? 2 : 4;
  const int64_t tokens = 8 * nt;
  const int64_t steps = p.k / kSkinnyStepK;
  const int64_t tiles = ceil_div(p.n, kSkinnyRows);
  const auto smem_for = [&](int64_t split) {
    return skinny_smem_bytes(ceil_div(steps, split), static_cast<int>(tokens));
  };
  int64_t split = 1;
  while (split < kSkinnyMaxSplit && split < steps &&
         (smem_for(split) > kSkinnySmemBudget || ceil_div(steps, split) > kSkinnyStepsPerCta ||
          tiles * p.num_experts * split < kSkinnyMinCtas))
    split *= 2;
  if (smem_for(split) > kSkinnySmemBudget) return false;
  const int64_t chunks = row_tiles_per_expert(p, tokens);  // token-chunk CTAs per expert
  if (tiles * split > 0x7FFFFFFF || chunks > 65535) return false;

  const dim3 grid(static_cast<unsigned>(tiles * split), static_cast<unsigned>(chunks),
                  static_cast<unsigned>(p.num_experts));
  MS_CUDA_CHECK(launch_kernel_clusters(
      nt == 2 ? grouped_mxfp4_gemm_skinny_kernel<2> : grouped_mxfp4_gemm_skinny_kernel<4>, grid,
      dim3(static_cast<unsigned>(split)), kSkinnyThreads, smem_for(split), stream, p));
  return true;
}

// ---------------------------------------------------------------------------------------------
// sm_90a wgmma grouped MXFP4 GEMM (rows_hint > 24, K % 128 == 0; GroupedMxfp4GemmParams::use_wgmma).
//
// CTA = (256 output columns, 128 grouped rows, expert), 2 warpgroups (256 threads), each
// warpgroup 64 rows x 256 columns of fp32 accumulators (m64n256k16 bf16, 128 registers). K walks
// in tiles of 64 (one 128-byte swizzle row of bf16 per operand row).
//
// Shared memory (1024-byte aligned base):
//   B[2]     two dequantised weight tiles, bf16 [256 n][64 k], K-major 128B swizzle (32 KB each);
//   raw[S]   the cp.async ring: A bf16 [128 rows][64 k] swizzled (16 KB; wgmma reads it as is),
//            the packed e2m1 weights [half h][256 n][16 B] (8 KB), one scale word per n (1 KB).
// Swizzle (what desc_k_sw128 reads): the 16-byte chunk c of operand row r sits at byte
// r * 128 + ((c ^ (r % 8)) << 4); 8 rows = one 1024-byte atom (SBO), k16 step s = +32 s bytes.
//
// Thread tid owns weight row n0 + tid (rows past n read row n - 1, not stored): it cp.asyncs that
// row's 32 packed bytes of each K tile and the 4-byte scale word holding the tile's two ue8m0
// codes (k % 128 == 0 keeps it aligned; the same word serves two tiles), and later dequantises
// exactly those bytes into row tid of B, so the raw weight bytes need no barrier between the copy
// and the dequant (the thread's own cp.async.wait orders them). The dequantisation is the skinny
// kernel's prmt path (bit-identical to the table kernel), the stores conflict-free (the 8 rows of
// a quarter-warp hit 8 distinct swizzled chunks).
//
// Per K tile kt (S = 4 stages, tiles kt + 1 .. kt + 3 in flight):
//   barrier  -- every thread's B[kt % 2] stores and its A copies of tile kt are visible
//               (each thread ran cp.async.wait + fence.proxy.async before it)
//   wgmma x4 on (A raw[kt % S], B[kt % 2]); commit; wait_group 1 (tile kt - 1 done)
//   barrier  -- every warpgroup is done with tile kt - 1: raw[(kt - 1) % S] and B[(kt + 1) % 2]
//               are free
//   cp.async tile kt + S - 1 into raw[(kt + S - 1) % S]; commit (empty groups past the end)
//   cp.async.wait S - 2 (own copies of tile kt + 1), dequant tile kt + 1 into B[(kt + 1) % 2]
//   (under the tensor cores' work on tile kt), fence.proxy.async.
// Both warpgroups always issue their wgmma, also on a tile's all-zero rows past the expert's count
// (skipping them in a warpgroup-uniform branch makes ptxas serialise every wgmma, C7518). Rows
// past the count are zero-filled, never stored.
// Epilogue: fp32 float2 stores straight from the accumulator fragments.
namespace gwg {
constexpr int kThreads = 256;
constexpr int kBM = 128, kBN = 256, kBK = 64;
constexpr int kStages = 4;
constexpr int kABytes = kBM * kBK * 2;  // 16384
constexpr int kWBytes = kBN * kBK / 2;  // 8192
constexpr int kSBytes = kBN * 4;        // 1024
constexpr int kRawBytes = kABytes + kWBytes + kSBytes;
constexpr int kBBytes = kBN * kBK * 2;  // 32768
constexpr int kSmemBytes = 2 * kBBytes + kStages * kRawBytes + 1024;  // + base alignment
static_assert(kRawBytes % 1024 == 0 && kBBytes % 1024 == 0);
static_assert(kBM * 8 % kThreads == 0 && kBN == kThreads);
}  // namespace gwg

__global__ void __launch_bounds__(gwg::kThreads, 1)
    grouped_mxfp4_gemm_wgmma_kernel(GroupedMxfp4GemmParams p) {
  pdl_wait();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace gwg;
  extern __shared__ uint8_t gwg_smem_raw[];
  const auto raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(gwg_smem_raw));
  const uint32_t base = (raw_addr + 1023u) & ~1023u;
  uint8_t* const smem = gwg_smem_raw + (base - raw_addr);

  const int e = blockIdx.z;
  const int64_t beg = p.offsets[e];
  const int64_t cnt = p.offsets[e + 1] - beg;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBN;
  const int tid = static_cast<int>(threadIdx.x);
  const int wg = tid >> 7;
  const int lane = tid & 31;
  const int nk = static_cast<int>(p.k / kBK);

  const int64_t wrow = min(n0 + tid, p.n - 1);
  const uint8_t* const wsrc = p.w[e] + wrow * (p.k / 2);
  const uint8_t* const ssrc = p.w_scale[e] + wrow * (p.k / 32);
  const auto* const a_all = static_cast<const __nv_bfloat16*>(p.a);
  const __nv_bfloat16* const a = a_all + beg * p.lda;

  for (int64_t m0 = static_cast<int64_t>(blockIdx.y) * kBM; m0 < cnt;
       m0 += static_cast<int64_t>(gridDim.y) * kBM) {

    const auto load_tile = [&](int kt, int stage) {
      uint8_t* st = smem + 2 * kBBytes + stage * kRawBytes;
      const int64_t k0 = static_cast<int64_t>(kt) * kBK;
#pragma unroll
      for (int i = 0; i < kBM * 8 / kThreads; ++i) {
        const int u = tid + i * kThreads;
        const int r = u >> 3, c = u & 7;  // 8 threads per 128-byte row: coalesced
        const bool ok = m0 + r < cnt;
        const __nv_bfloat16* src = ok ? a + (m0 + r) * p.lda + k0 + 8 * c : a_all;
        cp_async16_zfill(st + r * 128 + ((c ^ (r & 7)) << 4), src, ok);
      }
      cp_async16_zfill(st + kABytes + tid * 16, wsrc + kt * (kBK / 2), true);
      cp_async16_zfill(st + kABytes + kBN * 16 + tid * 16, wsrc + kt * (kBK / 2) + 16, true);
      cp_async4(st + kABytes + kWBytes + tid * 4, ssrc + (kt >> 1) * 4);
    };

    // Row tid of B[buf] from this thread's own raw bytes of tile kt.
    const auto dequant = [&](int kt, int stage, int buf) {
      const uint8_t* st = smem + 2 * kBBytes + stage * kRawBytes;
      const uint4 wh[2] = {*reinterpret_cast<const uint4*>(st + kABytes + tid * 16),
                           *reinterpret_cast<const uint4*>(st + kABytes + kBN * 16 + tid * 16)};
      const uint32_t sw = *reinterpret_cast<const uint32_t*>(st + kABytes + kWBytes + tid * 4);
      uint8_t* brow = smem + buf * kBBytes + tid * 128;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float sf = v41::ue8m0_decode((sw >> (16 * (kt & 1) + 8 * h)) & 0xFFu);
        const __nv_bfloat162 scale2 = __floats2bfloat162_rn(sf, sf);
        const uint32_t words[4] = {wh[h].x, wh[h].y, wh[h].z, wh[h].w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          uint32_t o[4];
          e2m1x8_to_bf16(words[q], scale2, o);
          const int c = 4 * h + q;  // bf16 chunk: k 8c .. 8c + 7 of the tile
          *reinterpret_cast<uint4*>(brow + ((c ^ (tid & 7)) << 4)) = make_uint4(o[0], o[1], o[2], o[3]);
        }
      }
    };

    float acc[kBN / 2];
#pragma unroll
    for (int i = 0; i < kBN / 2; ++i) acc[i] = 0.0f;

#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < nk) load_tile(s, s);
      asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 2) : "memory");  // tile 0
    dequant(0, 0, 0);
    wgmma::fence_proxy_async_smem();

#pragma unroll 1
    for (int kt = 0; kt < nk; ++kt) {
      __syncthreads();  // B[kt % 2] and A of tile kt from every thread
      {
        const uint32_t a_tile = base + 2 * kBBytes + (kt % kStages) * kRawBytes + wg * 64 * 128;
        const uint32_t b_tile = base + (kt & 1) * kBBytes;
        wgmma::fence_operands(acc);
        wgmma::fence();
#pragma unroll
        for (int s = 0; s < kBK / 16; ++s)
          wgmma::bf16_ss<kBN>(acc, wgmma::desc_k_sw128_addr(a_tile + 32 * s),
                              wgmma::desc_k_sw128_addr(b_tile + 32 * s), 1);
        wgmma::commit_group();
        wgmma::wait_group<1>();  // tile kt - 1 done; tile kt keeps running
        wgmma::fence_operands(acc);
      }
      __syncthreads();  // every warpgroup is done reading tile kt - 1
      if (kt + kStages - 1 < nk) load_tile(kt + kStages - 1, (kt + kStages - 1) % kStages);
      asm volatile("cp.async.commit_group;\n" ::: "memory");
      asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 2) : "memory");  // tile kt + 1
      if (kt + 1 < nk) dequant(kt + 1, (kt + 1) % kStages, (kt + 1) & 1);
      wgmma::fence_proxy_async_smem();
    }
    wgmma::wait_group<0>();
    wgmma::fence_operands(acc);
    if (m0 + 64 * wg < cnt) {
      // d[4i + 2h + v] = D[16 w + g + 8 h][8 i + 2 t + v] of this warpgroup's 64 x 256 tile.
      const int64_t row = m0 + 64 * wg + 16 * ((tid >> 5) & 3) + (lane >> 2);
      const int64_t col0 = n0 + 2 * (lane & 3);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (row + 8 * h >= cnt) continue;
        float* yrow = p.y + (beg + row + 8 * h) * p.ldy;
#pragma unroll
        for (int i = 0; i < kBN / 8; ++i) {
          const int64_t col = col0 + 8 * i;
          if (col < p.n)
            *reinterpret_cast<float2*>(yrow + col) = make_float2(acc[4 * i + 2 * h], acc[4 * i + 2 * h + 1]);
        }
      }
    }
    __syncthreads();  // shared memory free for the next M tile
  }
#else
  __trap();  // sm_90a only; launch_grouped_mxfp4_gemm takes it only on Hopper with use_wgmma
#endif
}

// The wgmma kernel when requested and it applies; false: the other kernels.
bool launch_grouped_mxfp4_wgmma(const GroupedMxfp4GemmParams& p, cudaStream_t stream) {
  if (!p.use_wgmma || p.rows_hint <= 24 || p.k % 128 != 0 || p.n % 2 != 0 || p.ldy % 2 != 0 ||
      reinterpret_cast<uintptr_t>(p.y) % 8 != 0)
    return false;
  static const bool hopper = [] {
    if (device_cc_major() != 9) return false;
    MS_CUDA_CHECK(cudaFuncSetAttribute(grouped_mxfp4_gemm_wgmma_kernel,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       gwg::kSmemBytes));
    return true;
  }();
  if (!hopper) return false;
  const int64_t m_tiles = row_tiles_per_expert(p, gwg::kBM);
  const int64_t n_tiles = ceil_div(p.n, gwg::kBN);
  if (m_tiles > 65535 || n_tiles > 0x7FFFFFFF) return false;
  const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>(m_tiles),
                  static_cast<unsigned>(p.num_experts));
  MS_CUDA_CHECK(launch_kernel(grouped_mxfp4_gemm_wgmma_kernel, grid, gwg::kThreads, gwg::kSmemBytes,
                              stream, p));
  return true;
}

// ---------------------------------------------------------------------------------------------
// Swapped-operand wgmma grouped MXFP4 GEMM (GroupedMxfp4GemmParams::wgmma_rs, with use_wgmma).
//
// Per expert it computes D = W · A^T (D[weight row n][grouped row m] = y[m][n]): the weights are
// wgmma's A operand, taken from registers, so each thread dequantises exactly the fragment it
// feeds to the tensor cores (no bf16 weight tile in shared memory: the v1 kernel's 32 KB of
// dequantised stores per K tile, and the second read of those bytes by each warpgroup, are gone);
// the grouped activations are the B operand, K-major 128-byte swizzle, loaded by TMA into a ring
// (64-row boxes on one mbarrier per slot; the weights and scales by cp.async into the same slot).
//
// CTA = (128 weight rows, up to 192 grouped rows of one expert: one pass), 2 warpgroups (256
// threads), each warpgroup 64 weight rows x kTN rows of fp32 accumulators (kTN = the rows rounded
// up to 64: 64, 128 or 192, one specialisation per case so no wgmma is wasted on a short tail
// beyond the 64-row granule). Every pass decodes the weight tile again, so an expert with more
// rows than a pass pays the decode twice (often for a second pass of a few dozen rows): with
// GroupedMxfp4GemmParams::rs_max_pass = 224 a second kernel instantiation takes passes of up to
// 224 rows (a fourth shape, kTN = 224 for 193-224 rows; 112 accumulators). 256-row passes (128
// accumulators) do not compile cleanly: ptxas serialises the wgmma (C7512) or spills, with two
// fragment buffers as with three.
// blockIdx.x covers the weight rows of W, then those of W_b (w1 and w3 in one launch), blockIdx.y
// passes (192 or 224 rows; all full but an expert's last), blockIdx.z the expert.
//
// Shared memory per slot (6 slots): A bf16 [192 rows][64 k] swizzled (24 KB; 224 rows: 28 KB), the
// packed e2m1 weights [128 rows][32 B] (4 KB), one scale word per weight row (512 B; k % 128 == 0
// keeps the word aligned, and it serves two K tiles), padded to 29 KB (33 KB); then the slots'
// mbarriers. A comes in TMA boxes of 64 rows (224-row kernel: 32, so that 224 is whole boxes).
//
// Fragment of k16 step s (A-fragment layout of wgmma.h): thread (warp w, g = lane / 4,
// t = lane % 4) holds rows r = 16 w + g and r + 8 at k 16 s + 2 t (+1) and 16 s + 2 t + 8 (+9),
// i.e. packed byte 8 s + t and 8 s + t + 4 of the row's 32 tile bytes: byte t of word j = 2 s and
// j = 2 s + 1. So one K tile of a row is byte t of its eight words: two prmt-gathered words of
// eight nibbles, each decoded by e2m1x8_to_bf16 (the same exact products as the other kernels)
// with the scale of its 32-wide block (words 0-3: block 2 kt, words 4-7: block 2 kt + 1).
// With a_kperm the activations' columns are k-permuted within the tile (the quantisers'
// kperm64: column c = 16 s + 8 h + 2 t + v holds k = 16 t + 4 s + 2 h + v). wgmma sums over the
// columns, so fragment column c must hold the weight of k(c): thread t's pairs of step s are then
// k 16 t + 4 s (+1) (low, h = 0) and 16 t + 4 s + 2 (+3) (high, h = 1), packed bytes 8 t + 2 s
// and 8 t + 2 s + 1. All four steps come from bytes 8 t .. 8 t + 7 of the row (one 8-byte load;
// word q holds steps 2 q and 2 q + 1 in the same order e2m1x8_to_bf16 gives the gathered words),
// all in 32-wide block t / 2 of the tile: one scale byte per row and tile, no prmt gather
// (grs_dequant<true>; a second kernel instantiation, chosen on the host).
//
// Per K tile kt (fragments in three register buffers, F[kt % 3]):
//   wait for the slot's mbarrier (A of kt landed); wgmma x4 on (F[kt % 3], A of kt); commit;
//   wait_group 2 (tile kt - 2 done: F[(kt + 1) % 3] and, after the barrier, kt - 2's slot free)
//   cp.async.wait (own weight copies of tile kt + 1); barrier
//   load tile kt + 4 into kt - 2's slot (thread 0: TMA; everyone: cp.async of the weights)
//   dequantise tile kt + 1 into F[(kt + 1) % 3] while the wgmma of kt - 1 and kt run (two
//   buffers with four slots measured the same within 1-2%: 248.7 against 246.6 us for w1 + w3
//   at 12 experts x 192 rows, docs/perf/forward-gpu-2026-11-30-r7.md). The dequantisation and
//   the tensor cores still do not overlap well: without the wgmma the kernel takes 66 us,
//   without the dequantisation 86 us, with both 125 us (w1).
// Epilogue: 4-byte stores straight from the accumulators (8 consecutive columns of 4 rows per
// warp store: whole 32-byte sectors).
// Fused SwiGLU epilogue (GroupedMxfp4GemmParams::swiglu; instantiations of their own, kFuse): the
// CTA takes 64 weight rows of W into ring rows 0-63 (warpgroup 0) and the same 64 rows of W_b into
// ring rows 64-127 (warpgroup 1), so it holds g and u of the same intermediate columns; blockIdx.x
// covers the rows in tiles of 64, and the K loop is the unfused one (the same fp32 accumulators,
// bit for bit). After it the ring is idle: each warpgroup stores its accumulators there as fp32
// [grouped row][column] (pitch kEpiPitch = 68: a warp's stores hit 32 distinct banks), then every
// thread takes 8 consecutive columns of one row as swiglu_quant_vec_kernel does (swiglu_clamped,
// routing weight, quant_store8: the 4 lanes of a 32-wide block exchange its amax), a quarter-warp
// reading two rows of one block (conflict-free 16-byte loads), each warp writing 128 contiguous
// bytes of 4 rows (natural order).
// Probe-only knobs (tools/device/moe_rs_probe.cu; the build never sets them):
// MOESERVE_RS_PROBE 1 skips the dequantisation after tile 0, 2 the loads after the prologue,
// 3 the wgmma; MOESERVE_RS_STAGES sets the ring depth; MOESERVE_RS_WIDE_BUFS 3 gives the 224-row
// passes three fragment buffers; MOESERVE_RS_LOOP 1 gives the 192-row kernel the K loop of the
// 224-row one (see grs_pass).
// Build-time probe variant MOESERVE_RS_SS=1 (off; not measured yet; default PTX byte-identical):
// the hypothesis it tests is that in RS mode the decode (ALU, registers) and the tensor cores'
// register reads of the A fragments contend, so they do not overlap (decode alone 66 us, wgmma
// alone 86 us, both 125 us above; the K loop 1112 cycles per 64-wide tile at 192 rows against
// ~768 for the wgmma). In the variant all 256 threads decode each K tile of the 128 weight rows
// (the same e2m1x8_to_bf16 products) into a bf16 shared-memory tile [128 rows][64 k], K-major
// 128-byte swizzle (grs_decode_ss; with a_kperm column c holds the weight of k(c), as in the
// fragments), and both warpgroups issue wgmma with A and B from shared memory (wgmma::bf16_ss,
// each warpgroup's A descriptor at its 64 rows). Three such tiles after the ring's slots: tile
// kt + 2 is decoded while the wgmma of kt run (kSsBufs - 2 = 1 tile in flight), one
// __syncthreads per tile as before (grs_pass). The same operands, k16 steps, accumulators and
// epilogues (natural order, kperm, fused SwiGLU, 224-row passes, stream-K all take it): the output
// must be bit-identical to the RS kernel's (the probe's hashes). The ring defaults to 5 slots in
// the variant (MOESERVE_RS_STAGES): 6 slots of 33 KB plus 48 KB of weight tiles do not fit at
// 224 rows (kStages is shared by both pass maxima); with one tile of wgmma in flight instead of
// two, 5 slots load the same 4 tiles ahead as the default's 6 (5 x 29 KB + 48 KB = 194 KB at 192
// rows, 5 x 33 KB + 48 KB = 213 KB at 224). ptxas (sm_90a, no spills, no C75xx warnings):
// registers 165-188 for the 192-row kernels (RS: 236-254), 179-236 for the 224-row ones (RS:
// 250-255), 236 for stream-K (RS: 254-255).
// Build-time variant (off; measured SLOWER on the H200, r11: the probe's 192-row w1 at uniform
// routing 124.7 -> 155.7 us, kperm 109.1 -> 139.6 us, bit-identical output hashes; the DEP32 decode
// 64 x 6 step 48.8 -> 53.2 ms. Kept as a build variant for the record. Not profiled; a guess:
// each warpgroup issues its own weight and scale copies, more copy instructions per tile on
// the critical path). MOESERVE_RS_DECOUPLED 1 lets the two warpgroups run their K loops apart.
// By default every K tile ends with a __syncthreads, because warpgroup 0 copies the scales of all 128 weight rows and the
// single TMA issuer (thread 0) may refill a slot only when both warpgroups' wgmma are done with
// it, so a warpgroup that stalls (on its decode, its wgmma or the TMA) stalls the other. In the
// variant each warpgroup copies the weights and scales of its own 64 rows (even threads the
// scales) and syncs on its own named barrier (1 + wg, 128 threads); warpgroup 1 releases each
// slot's A rows on an "empty" mbarrier per slot (one arrival per tile, after its named barrier,
// i.e. after every warp's wait_group showed that tile's wgmma complete), and thread 0 waits on it
// before the TMA refills the slot. The same loads, decode and wgmma in the same order: the same
// bits. A slot's k-th use pairs with the empty barrier's k-th phase (warpgroup 1 arrives once for
// every tile of every pass, the tail tiles after the pass's last wait_group), and warpgroup 1 can
// be at most one phase ahead of thread 0's wait (the tile after needs thread 0's refill first), so
// the parity waits are unambiguous.
#ifndef MOESERVE_RS_PROBE
#define MOESERVE_RS_PROBE 0
#endif
#ifndef MOESERVE_RS_SS
#define MOESERVE_RS_SS 0
#endif
#ifndef MOESERVE_RS_STAGES
#define MOESERVE_RS_STAGES (MOESERVE_RS_SS ? 5 : 6)
#endif
#if MOESERVE_RS_SS && MOESERVE_RS_DECOUPLED
#error "MOESERVE_RS_SS has the one __syncthreads K loop only (no MOESERVE_RS_DECOUPLED)"
#endif
#ifndef MOESERVE_RS_WIDE_BUFS
#define MOESERVE_RS_WIDE_BUFS 2
#endif
#ifndef MOESERVE_RS_LOOP
#define MOESERVE_RS_LOOP 0
#endif
#ifndef MOESERVE_RS_DECOUPLED
#define MOESERVE_RS_DECOUPLED 0
#endif
// Measured and removed (r12, call 3): L2 eviction hints on these kernels' loads (the A tiles'
// TMA evict_last) changed nothing (probe, w1 + w3 k-permuted at 192 rows: rs 223.5 -> 220.9 us,
// stream-K 243.9 -> 241.5 us, same K-loop cycles per tile), so the A tiles were not missing L2.

// Stream-K form (GroupedMxfp4GemmParams::stream_k; grouped_mxfp4_gemm_rs_sk_kernel: the unfused
// epilogue, 192-row passes, both decodes). The grid above loses twice at the DEP32 decode share
// (12 experts of ~192 rows, 132 SMs, one CTA per SM): wave quantisation (w1 + w3: 36 x 12 = 432
// units = 3.27 waves, run as 4: 82%; w2: 40 x 12 = 480 = 3.64 waves: 91%), and the drawn counts'
// second passes (a third of the experts get 193-220 rows: 36 more units of a few rows each; the
// probe, w1 + w3: 277 us at the drawn counts against 247 us at 192 rows each).
// A persistent grid of G CTAs (sk_ctas; 0: the SM count, never more) shares the K tiles of all
// units instead. The units in a fixed order: for each expert (in order) its passes (ceil(count /
// 192), all of 192 rows but the last), for each pass the weight tiles (of W, then of W_b, as
// blockIdx.x above); a unit is nk = K / 64 K tiles, and the tiles of all units, concatenated in
// that order, are cut into G contiguous ranges. Every CTA derives the list from the offsets on the
// device (no host sync: the forward is captured in CUDA graphs; O(experts) integer arithmetic per
// segment, SkSchedule).
// Cost of a K tile: 1 + kTN / 64 for a pass of shape kTN (2, 3, 4 at 64, 128, 192 rows). The
// decode of the weight fragments is paid per tile whatever kTN, the wgmma in proportion to kTN
// (probe, w1 at 12 x 192 rows: the decode alone 66 us, the wgmma alone 86 us, both 125 us; a
// 64-row tile is decode-bound, about half of a 192-row one). With W the total cost, CTA i takes
// the tiles whose start cost P (the summed costs of the tiles before them) has i W <= P G <
// (i + 1) W: a contiguous range within one tile's cost of W / G. Its intersection with a unit is
// a segment [kt_begin, kt_end) of that unit's K tiles.
// A segment of a whole unit ends with the epilogue above. A unit cut between CTAs is owned by its
// "head", the segment holding kt = 0: the unit goes on past it into the next CTA's range, so the
// head ends its CTA's range: it is the CTA's LAST segment and runs last. Every other segment of a
// cut unit starts past the unit's first tile, whose earlier tiles are an earlier CTA's, so it
// starts its CTA's range: it is the CTA's FIRST segment (or only one) and runs first. A CTA
// holds at most one such "partial" segment, so its fp32 partial tile has a slot of its own in
// the workspace (slot = CTA index: G x 128 x 192 floats, thread t's accumulator i at i * 256 + t,
// coalesced) and a flag of its own (sk_flags[CTA index]). A partial stores its accumulators there
// (st.global.cg), then __syncthreads and thread 0 publishes (__threadfence, st.release.gpu of
// 1). The head, after its own K tiles: thread 0 waits for the flag of every later CTA whose range
// starts inside the unit (and holds tiles: a CTA's range may be empty when W < G tiles' cost), in
// CTA order (ld.acquire.gpu spin with __nanosleep) and resets each to 0 (no other write to it in
// this launch: the next launch finds it 0); __syncthreads; then every thread adds those slots
// (ld.global.cg) to its accumulators in CTA order, which is K order, and stores the tile. The
// cuts depend on the counts and G only, so the sums are the same bits every run and replay.
// No deadlock: only heads wait, and only for partial segments, which wait for nothing (a partial
// runs first in its CTA, right after pdl_wait, whose predecessor does not depend on this grid).
// So a head waits at most until the CTAs holding its partials are resident. G <= the SM count and
// one CTA fits an SM (one CTA per SM: the ring's shared memory), so the whole grid fits the GPU at
// once: a CTA not yet resident becomes resident as soon as the SMs that other work holds are
// free, and that work finishes on its own (a predecessor, the shared expert's side-stream
// kernels: none depends on this grid). With PDL the next kernel's CTAs are scheduled only once
// every CTA of this grid has exited (the implicit trigger; MOESERVE_PDL_EARLY_TRIGGER: once every
// CTA of this grid has passed pdl_wait, i.e. is resident), so they never take SMs this grid still
// needs. What would deadlock: a kernel on another stream that spins, holding SMs, until work
// ordered after this launch runs (none in this engine), or a context given fewer SMs than the
// device attribute reports (MPS thread limits): lower sk_ctas there. A head that waits longer
// than 10 s traps (a launch error on the host instead of a hang).

namespace grs {
constexpr int kThreads = 256;
constexpr int kBW = 128;  // weight rows per CTA (64 per warpgroup)
constexpr int kBK = 64;
constexpr int kStages = MOESERVE_RS_STAGES;
constexpr int kWBytes = kBW * kBK / 2;  // 4096
constexpr int kSBytes = kBW * 4;        // 512
static_assert(kBW * kBK / 2 == kThreads * 16);
constexpr int kEpiPitch = kBW / 2 + 4;  // fused epilogue: fp32 g and u tiles [row][64 columns]
// MOESERVE_RS_SS (see grs_decode_ss): kSsBufs decoded bf16 weight tiles [128 rows][64 k] after
// the ring's slots; kSsBufs - 2 tiles of wgmma stay in flight. (Four tiles, two in flight, would
// need 6 slots to load as far ahead, 64 KB more: no longer within 227 KB at 224 rows.)
constexpr int kSsBufs = 3;
constexpr int kSsTileBytes = kBW * kBK * 2;  // 16384
// The wider pass of GroupedMxfp4GemmParams::rs_max_pass (see above: 256 rows do not compile
// cleanly) and its fragment buffers: two (wait_group 1, as before the three-buffer ring: 1-2%
// slower at 192 rows), since with three the k-permuted unfused kernel spills (12 bytes, 255
// registers; the probe can set three).
constexpr int kWidePass = 224;
template <int kTN>
constexpr int kBufsFor = kTN > 192 ? MOESERVE_RS_WIDE_BUFS : 3;
// The ring of a kernel whose passes take up to kMaxTok grouped rows (192, or kWidePass): every
// slot holds kMaxTok rows of A, loaded in TMA boxes of kBoxRows rows: 64, or 32 where kMaxTok is
// no multiple of 64, so that every pass shape is whole boxes and nothing past it is loaded.
template <int kMaxTok>
struct Ring {
  static constexpr int kBoxRows = kMaxTok % 64 == 0 ? 64 : 32;
  static constexpr int kABytes = kMaxTok * kBK * 2;  // 24576 at 192 rows, 28672 at 224
  // 29 KB at 192 rows, 33 KB at 224
  static constexpr int kStageBytes = (kABytes + kWBytes + kSBytes + 1023) / 1024 * 1024;
  // MOESERVE_RS_SS: the decoded weight tiles after the slots (1024-aligned), then the mbarriers.
  static constexpr int kSsOffset = kStages * kStageBytes;
  static constexpr int kBarOffset = kSsOffset + (MOESERVE_RS_SS ? kSsBufs * kSsTileBytes : 0);
  static constexpr int kSmemBytes =
      kBarOffset + 16 * kStages + 1024;  // + full / empty mbarriers, alignment
  static_assert(kMaxTok % 32 == 0 && kMaxTok <= 256);
  static_assert(kABytes + kWBytes + kSBytes <= kStageBytes && kStageBytes % 1024 == 0);
  static_assert(kSmemBytes <= 227 * 1024);
  static_assert(2 * kMaxTok * kEpiPitch * 4 <= kStages * kStageBytes);
};

// Stream-K (see above): passes of kSkPass rows, a partial tile slot of kSkSlotFloats per CTA.
constexpr int kSkPass = 192;
constexpr int kSkSlotFloats = kBW * kSkPass;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
enum SkEpilogue : int { kSkWhole = 0, kSkPartial = 1, kSkHead = 2 };

// Where the concatenated K tiles (global tile index j) of a stream-K launch lie: nk tiles per
// unit, tp per pass (the weight tiles of W and W_b times nk), cost the total. Built by thread 0
// from the offsets (a few dozen loads for 12 experts) and the launch's shape, in shared memory.
struct SkSchedule {
  const int32_t* offsets;
  int experts;
  int ctas;
  int nk;
  int64_t tp;
  int64_t cost;

  // Cost of one K tile of a pass of `rows` rows (1..192): 1 + its shape / 64.
  __device__ static int64_t tile_cost(int64_t rows) { return 1 + (rows + 63) / 64; }
  __device__ int64_t count(int e) const { return offsets[e + 1] - offsets[e]; }
  // An expert's K tiles and their cost: its passes (all of 192 rows but the last) times tp.
  __device__ int64_t tiles(int64_t cnt) const { return tp * ((cnt + kSkPass - 1) / kSkPass); }
  __device__ int64_t expert_cost(int64_t cnt) const {
    const int64_t rem = cnt % kSkPass;
    return tp * (tile_cost(kSkPass) * (cnt / kSkPass) + (rem > 0 ? tile_cost(rem) : 0));
  }
  // The first tile of CTA c's range: the first tile j whose start cost P_j has P_j G >= c W
  // (c = ctas: the number of tiles).
  __device__ int64_t start(int c) const {
    const int64_t t = (static_cast<int64_t>(c) * cost + ctas - 1) / ctas;  // P_j >= t
    int64_t p = 0, j = 0;
    for (int e = 0; e < experts; ++e) {
      const int64_t cnt = count(e), ce = expert_cost(cnt);
      if (t < p + ce) {
        const int64_t r = t - p, full_pass = tile_cost(kSkPass) * tp;
        const int64_t full = full_pass * (cnt / kSkPass);
        const int64_t pass = r < full ? r / full_pass : cnt / kSkPass;
        const int64_t r2 = r < full ? r % full_pass : r - full;
        const int64_t w = r < full ? tile_cost(kSkPass) : tile_cost(cnt % kSkPass);
        return j + pass * tp + (r2 + w - 1) / w;  // the first tile starting at or past t
      }
      p += ce;
      j += tiles(cnt);
    }
    return j;
  }
  // Calls fn(c) for every CTA c > cta whose range starts before `end` and holds tiles, in order:
  // the partial segments of the unit [.., end) that CTA cta's head segment owns.
  template <typename Fn>
  __device__ void for_each_partial(int cta, int64_t end, Fn&& fn) const {
    int64_t s = start(cta + 1);
    for (int c = cta + 1; c < ctas && s < end; ++c) {
      const int64_t next = start(c + 1);
      if (next > s) fn(c);
      s = next;
    }
  }
};

// A stream-K CTA's state in shared memory (thread 0 writes it between barriers, so that none of
// it takes registers through the K loop): the schedule, the CTA's range [next, end) still to do,
// and the current segment: K tiles [kb, ke) of the unit of expert e (grouped rows [beg + m0,
// beg + m0 + rows)), weight tile wt (of W, then of W_b), its epilogue, and the unit's end in
// the concatenated tiles (a head's partials are the CTAs starting before it).
struct SkState {
  SkSchedule sched;
  int cta;
  int64_t next, end;
  int kb, ke;
  SkEpilogue epi;
  int e, wt;
  int64_t beg, m0, rows, unit_end;

  // The segment starting at tile `next` (next < end).
  __device__ void set_segment() {
    int64_t j0 = 0;
    e = 0;
    for (; e < sched.experts - 1; ++e) {  // the last expert holds every tile past the others'
      const int64_t te = sched.tiles(sched.count(e));
      if (next < j0 + te) break;
      j0 += te;
    }
    const int64_t i = next - j0, pass = i / sched.tp, r = i % sched.tp;
    wt = static_cast<int>(r / sched.nk);
    kb = static_cast<int>(r % sched.nk);
    ke = static_cast<int>(min(static_cast<int64_t>(sched.nk), kb + (end - next)));
    epi = kb > 0 ? kSkPartial : ke < sched.nk ? kSkHead : kSkWhole;
    beg = sched.offsets[e];
    m0 = pass * kSkPass;
    rows = min(static_cast<int64_t>(kSkPass), sched.count(e) - m0);
    unit_end = next - kb + sched.nk;
  }
};
#endif
}  // namespace grs

// Segment clocks for tools/device/moe_rs_probe.cu (compiled out unless MOESERVE_SK_CLOCKS; the
// build never sets it, so the kernels are unchanged otherwise). Thread 0 of each CTA (linear
// block index b < kSkClockCtas) records in g_sk_clock_cta[b] the globaltimer (ns) and clock64 at
// its start (after pdl_wait) and exit, and the number of passes / segments it ran; and for each
// of its first kSkClockSegs passes (the rs kernel: one per blockIdx.y pass; the stream-K kernel:
// one per segment) in g_sk_clock_seg[b * kSkClockSegs + i]: the epilogue kind (SkEpilogue; the rs
// kernel 0), the K tiles, the pass shape and rows, clock64 at grs_pass entry (t0), after the K
// loop's last wait_group (t1) and at its exit (t2), the cycles a head spent in sk_wait_flag
// (wait), and (MOESERVE_SK_CLOCKS=2 only) inside the K loop the cycles thread 0 spent waiting for
// the A tile (mbar_wait, a_wait), for its wgmma of kBufs - 1 tiles before (wait_group, mma_wait),
// for the weights (cp.async.wait_group, w_wait) and in the tile's __syncthreads (bar_wait). The
// probe zeroes both arrays before the one launch it reads.
// Measured (H200, r12 call 3, probe, w1 + w3 k-permuted, 12 experts; docs/perf/
// forward-gpu-2026-11-30-r12.md): the per-unit kernel's K loop takes 1112 cycles per 64-wide tile
// at 192-row passes (the wgmma alone ~768 at the tensor peak), 962 at 128 and 831 at 64 rows:
// a per-tile cost that the wgmma do not hide. The stream-K kernel's takes 1219-1299 at 192 rows
// (+10-17%), plus per CTA ~12 us of segment set-up and ~14 us per head epilogue; at the drawn
// counts its cost weights (2 / 3 / 4) put up to 7 units of 64-row passes on one CTA, whose tiles
// cost 0.73 of a 192-row tile, not 0.5: 376 us against 243 us for the per-unit grid.
#ifdef MOESERVE_SK_CLOCKS
constexpr int kSkClockCtas = 4096;
constexpr int kSkClockSegs = 16;
struct SkClockCta {
  unsigned long long gt0, gt1;
  long long clk0, clk1;
  int segs;
};
struct SkClockSeg {
  int kind, ktiles, shape, rows;
  long long t0, t1, t2, wait, a_wait, w_wait, bar_wait, mma_wait;
};
__device__ SkClockCta g_sk_clock_cta[kSkClockCtas];
__device__ SkClockSeg g_sk_clock_seg[kSkClockCtas * kSkClockSegs];
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Fragments of one K tile for the thread's rows r0 and r0 + 8 (f[s][i]: k16 step s, register i)
// from ring slot st (weights at kABytes, the size of its A rows, then the scales).
// kKperm: the activations are k-permuted (a_kperm), so the fragments are bytes 8 t .. 8 t + 7.
template <bool kKperm, int kABytes>
__device__ __forceinline__ void grs_dequant(const uint8_t* st, int r0, int t, int kt,
                                            uint32_t (&f)[4][4]) {
  // o[j] of word q = the pair of step 2 q + j / 2, k low (j even) / high (j odd), in both layouts.
  const auto place = [&](int q, int h, const uint32_t (&o)[4]) {
    f[2 * q][h] = o[0];
    f[2 * q][2 + h] = o[1];
    f[2 * q + 1][h] = o[2];
    f[2 * q + 1][2 + h] = o[3];
  };
  if constexpr (kKperm) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r0 + 8 * h;
      // Bytes 8 t .. 8 t + 7 of the row (word q: steps 2 q, 2 q + 1), and the scale byte of its
      // block t / 2 of the tile (the row's scale word holds blocks 2 kt, 2 kt + 1 at 2 (kt % 2)).
      const uint2 w = *reinterpret_cast<const uint2*>(st + kABytes + r * 32 + 8 * t);
      const float sf =
          v41::ue8m0_decode(st[kABytes + grs::kWBytes + r * 4 + 2 * (kt & 1) + (t >> 1)]);
      const __nv_bfloat162 s2 = __floats2bfloat162_rn(sf, sf);
      uint32_t o[4];
      e2m1x8_to_bf16(w.x, s2, o);
      place(0, h, o);
      e2m1x8_to_bf16(w.y, s2, o);
      place(1, h, o);
    }
  } else {
    const uint32_t sel = static_cast<uint32_t>(t) | (static_cast<uint32_t>(t + 4) << 4);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r0 + 8 * h;
      const uint4 lo = *reinterpret_cast<const uint4*>(st + kABytes + r * 32);
      const uint4 hi = *reinterpret_cast<const uint4*>(st + kABytes + r * 32 + 16);
      const uint32_t sw = *reinterpret_cast<const uint32_t*>(st + kABytes + grs::kWBytes + r * 4);
      const uint32_t x[2] = {prmt(prmt(lo.x, lo.y, sel), prmt(lo.z, lo.w, sel), 0x5410u),
                             prmt(prmt(hi.x, hi.y, sel), prmt(hi.z, hi.w, sel), 0x5410u)};
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const float sf = v41::ue8m0_decode((sw >> (16 * (kt & 1) + 8 * q)) & 0xFFu);
        uint32_t o[4];
        e2m1x8_to_bf16(x[q], __floats2bfloat162_rn(sf, sf), o);
        place(q, h, o);  // o[j] = the pair of word 4 q + j
      }
    }
  }
}

#if MOESERVE_RS_SS
// MOESERVE_RS_SS (probe-only build variant, see grs_pass): K tile kt of all 128 weight rows,
// decoded by the CTA's 256 threads from ring slot st (weights at kABytes, then the scales) into
// the bf16 tile wt [128 rows][64 columns], K-major 128-byte swizzle (chunk c of row r at byte
// r * 128 + ((c ^ (r % 8)) << 4): what desc_k_sw128 reads as wgmma's A operand, warpgroup wg from
// row 64 wg). Column c holds the weight that grs_dequant puts in fragment column c, decoded by the
// same e2m1x8_to_bf16 with the same scale, so the wgmma see the same operands bit for bit:
// - natural order: column c = k c, i.e. chunk j = packed word j (bytes 4 j .. 4 j + 3) whole, in
//   32-wide block j / 4;
// - kKperm (column c = 16 s + 8 h + 2 t + v holds k = 16 t + 4 s + 2 h + v, packed byte
//   8 t + 2 s + h): word (t, q) = bytes 8 t + 4 q .. 8 t + 4 q + 3 gives, by e2m1x8_to_bf16, the
//   pairs o[b] of byte b = 2 s' + h with s = 2 q + s', i.e. 32-bit word t of chunk 4 q + b
//   (grs_dequant's place()); so chunk 4 q + i = {o_t0[i], o_t1[i], o_t2[i], o_t3[i]}, the 4 x 4
//   transpose of four decoded words (words t = 0, 1 in block 0 of the tile, t = 2, 3 in block 1).
// Thread tid: row r = tid % 8 + 8 (tid / 16), half q = (tid / 8) % 2: chunks 4 q .. 4 q + 3 of
// its row, four decoded words, four 16-byte stores (a quarter-warp's 8 rows of one chunk hit 8
// distinct swizzled chunks: conflict-free), the same decode count per thread as the RS fragments.
template <bool kKperm, int kABytes>
__device__ __forceinline__ void grs_decode_ss(const uint8_t* st, uint8_t* wt, int tid, int kt) {
  const int r = (tid & 7) + 8 * (tid >> 4);
  const int q = (tid >> 3) & 1;
  const uint8_t* const sc = st + kABytes + grs::kWBytes + r * 4 + 2 * (kt & 1);  // blocks 0, 1
  uint8_t* const row = wt + r * 128;
  uint32_t o[4][4];  // o[u]: the four bf16 pairs of decoded word u
  if constexpr (kKperm) {
    const uint4 lo = *reinterpret_cast<const uint4*>(st + kABytes + r * 32);
    const uint4 hi = *reinterpret_cast<const uint4*>(st + kABytes + r * 32 + 16);
    const uint32_t w[4] = {q ? lo.y : lo.x, q ? lo.w : lo.z, q ? hi.y : hi.x, q ? hi.w : hi.z};
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const float sf = v41::ue8m0_decode(sc[b]);
      const __nv_bfloat162 s2 = __floats2bfloat162_rn(sf, sf);
      e2m1x8_to_bf16(w[2 * b], s2, o[2 * b]);
      e2m1x8_to_bf16(w[2 * b + 1], s2, o[2 * b + 1]);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
      *reinterpret_cast<uint4*>(row + (((4 * q + i) ^ (r & 7)) << 4)) =
          make_uint4(o[0][i], o[1][i], o[2][i], o[3][i]);
  } else {
    const uint4 x = *reinterpret_cast<const uint4*>(st + kABytes + r * 32 + 16 * q);
    const uint32_t w[4] = {x.x, x.y, x.z, x.w};
    const float sf = v41::ue8m0_decode(sc[q]);
    const __nv_bfloat162 s2 = __floats2bfloat162_rn(sf, sf);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      e2m1x8_to_bf16(w[i], s2, o[i]);
      *reinterpret_cast<uint4*>(row + (((4 * q + i) ^ (r & 7)) << 4)) =
          make_uint4(o[i][0], o[i][1], o[i][2], o[i][3]);
    }
  }
}
#endif

// mbarrier helpers: backend/cuda/mbarrier.cuh.
#if MOESERVE_RS_DECOUPLED
// The named barrier of warpgroup wg's 128 threads (ids 1 and 2; 0 is __syncthreads). Immediate
// ids, so ptxas reserves three barriers, not all sixteen.
__device__ __forceinline__ void wg_bar_sync(int wg) {
  if (wg == 0) {
    asm volatile("bar.sync 1, 128;\n" ::: "memory");
  } else {
    asm volatile("bar.sync 2, 128;\n" ::: "memory");
  }
}
#endif
// Box (c0, c1) of a 2-D tensor map into shared memory, completing on mbarrier `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int32_t c0,
                                            int32_t c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// Stream-K flags (see above): a release store of 1 by the partial's thread 0, an acquire spin by
// the head's.
__device__ __forceinline__ void sk_flag_release(int32_t* flag) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(flag), "r"(1) : "memory");
}
__device__ __forceinline__ int32_t sk_flag_acquire(const int32_t* flag) {
  int32_t v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(flag) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
// Waits until *flag is 1 (the partial published); after 10 s traps: the launch then fails on the
// host (a hang otherwise: see the deadlock conditions above).
__device__ __forceinline__ void sk_wait_flag(const int32_t* flag) {
  if (sk_flag_acquire(flag) != 0) return;
  const uint64_t t0 = global_timer_ns();
  while (sk_flag_acquire(flag) == 0) {
    __nanosleep(256);
    if (global_timer_ns() - t0 > 10'000'000'000ull) __trap();
  }
}
// (The device side of the segment clocks above.)
#ifdef MOESERVE_SK_CLOCKS
__device__ __forceinline__ int sk_clock_block() {
  return static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
}
// This CTA's current pass record (thread 0), or null past the arrays.
__device__ __forceinline__ SkClockSeg* sk_clock_seg() {
  const int b = sk_clock_block();
  if (threadIdx.x != 0 || b >= kSkClockCtas) return nullptr;
  const int i = g_sk_clock_cta[b].segs;
  return i < kSkClockSegs ? &g_sk_clock_seg[b * kSkClockSegs + i] : nullptr;
}
__device__ __forceinline__ void sk_clock_cta(bool start) {
  const int b = sk_clock_block();
  if (threadIdx.x != 0 || b >= kSkClockCtas) return;
  SkClockCta& c = g_sk_clock_cta[b];
  if (start) {
    c.gt0 = global_timer_ns();
    c.clk0 = clock64();
    c.segs = 0;
  } else {
    c.clk1 = clock64();
    c.gt1 = global_timer_ns();
  }
}
// Thread 0's in-loop wait clocks (a_wait, w_wait, bar_wait, mma_wait of the current pass), in
// shared memory so that nothing is held in registers across the K loop; only at
// MOESERVE_SK_CLOCKS=2 (the stream-K k-permuted kernel then spills 12 bytes: 255 registers
// without them; at 1 none of the rs / sk kernels spills, the in-loop waits read 0).
__shared__ long long g_sk_loop_clk[4];
// (32-bit %clock: one register less than clock64 in the hot loop; a wait is far below 2^32.)
__device__ __forceinline__ uint32_t sk_clock32() {
  uint32_t c;
  asm volatile("mov.u32 %0, %%clock;\n" : "=r"(c));
  return c;
}
#endif
#if defined(MOESERVE_SK_CLOCKS) && MOESERVE_SK_CLOCKS >= 2
#define SK_LOOP_T0() const uint32_t sk_t0_ = sk_clock32()
#define SK_LOOP_ADD(i)                                               \
  do {                                                               \
    if (threadIdx.x == 0) g_sk_loop_clk[i] += sk_clock32() - sk_t0_; \
  } while (0)
#else
#define SK_LOOP_T0() \
  do {               \
  } while (0)
#define SK_LOOP_ADD(i) \
  do {                 \
  } while (0)
#endif

// A partial segment's accumulators into CTA cta's slot (accumulator i of thread t at i * 256 + t:
// each i one coalesced 1 KB store), then its flag raised once the whole CTA's stores are done.
template <int kN>
__device__ __forceinline__ void sk_store_partial(const GroupedMxfp4GemmParams& p, int cta,
                                                 const float (&acc)[kN]) {
  float* const slot = p.sk_workspace + static_cast<int64_t>(cta) * grs::kSkSlotFloats + threadIdx.x;
#pragma unroll
  for (int i = 0; i < kN; ++i) __stcg(slot + i * grs::kThreads, acc[i]);
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    sk_flag_release(p.sk_flags + cta);
  }
}
// A head's accumulators plus the partial tiles of its unit (the later CTAs' slots, in CTA = K
// order); thread 0 waits for each flag and resets it first.
template <int kN>
__device__ __forceinline__ void sk_add_partials(const GroupedMxfp4GemmParams& p,
                                                const grs::SkState& seg, float (&acc)[kN]) {
  if (threadIdx.x == 0)
    seg.sched.for_each_partial(seg.cta, seg.unit_end, [&](int c) {
#ifdef MOESERVE_SK_CLOCKS
      const long long w0 = clock64();
      sk_wait_flag(p.sk_flags + c);
      if (SkClockSeg* const r = sk_clock_seg()) r->wait += clock64() - w0;
#else
      sk_wait_flag(p.sk_flags + c);
#endif
      p.sk_flags[c] = 0;
    });
  __syncthreads();
  seg.sched.for_each_partial(seg.cta, seg.unit_end, [&](int c) {
    const float* const slot =
        p.sk_workspace + static_cast<int64_t>(c) * grs::kSkSlotFloats + threadIdx.x;
#pragma unroll
    for (int i = 0; i < kN; ++i) acc[i] += __ldcg(slot + i * grs::kThreads);
  });
}

// One pass: rows [m0, m0 + rows) of expert e (rows <= kTN), weight rows [n0, n0 + 128) (kFuse:
// [n0, n0 + 64) of both sets), in the ring of a kernel with passes of up to kMaxTok rows.
// wexp, sexp: the expert's weights and scales in the set of the ring row this thread copies
// (tid / 2 and tid % 128). tc: K tiles this CTA loaded before the pass (ring slot and mbarrier
// phase of its kt-th tile follow tc + kt).
// kSk (the stream-K kernel): K tiles [seg.kb, seg.ke) only, then seg.epi: the epilogue below
// (kSkWhole), the partial tile into the CTA's workspace slot and its flag raised (kSkPartial), or
// the later CTAs' partial tiles of the unit added first (kSkHead). Without kSk: every K tile.
template <int kTN, int kMaxTok, bool kKperm, bool kFuse, bool kSk = false>
__device__ __forceinline__ void grs_pass(const GroupedMxfp4GemmParams& p, const CUtensorMap* tmap_a,
                                         const uint8_t* wexp, const uint8_t* sexp, float* y,
                                         uint8_t* smem, uint32_t base, int64_t beg, int64_t m0,
                                         int64_t rows, int64_t n0, uint32_t tc,
                                         const grs::SkState& seg = grs::SkState{}) {
  using namespace grs;
  using R = Ring<kMaxTok>;
  constexpr int kStageBytes = R::kStageBytes, kABytes = R::kABytes, kBoxRows = R::kBoxRows;
  [[maybe_unused]] constexpr int kBufs = kBufsFor<kTN>;  // (not with MOESERVE_RS_SS)
  static_assert(kTN <= kMaxTok && kTN % kBoxRows == 0);
  static_assert(!kSk || (!kFuse && kMaxTok == kSkPass));
  const int tid = static_cast<int>(threadIdx.x);
  const int wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  // The K tiles kb .. kb + nk - 1; kt below counts from kb (kb + kt: the tile of the weights).
  const int kb = kSk ? seg.kb : 0;
  const int nk = kSk ? seg.ke - seg.kb : static_cast<int>(p.k / kBK);
  // The copied rows within their set, from n0 (rows past n: row n - 1).
  const int wrow = kFuse ? (tid >> 1) % (kBW / 2) : tid >> 1;
  // The copied scale row: ring row tid (threads < 128); MOESERVE_RS_DECOUPLED: ring row tid / 2
  // (even threads), so each warpgroup copies its own rows' scales.
  const int srow = MOESERVE_RS_DECOUPLED ? (kFuse ? (tid >> 1) % (kBW / 2) : tid >> 1)
                                         : (kFuse ? tid % (kBW / 2) : tid & (kBW - 1));
  const uint8_t* const wsrc = wexp + min(n0 + wrow, p.n - 1) * (p.k / 2) + (tid & 1) * 16;
  const uint8_t* const ssrc = sexp + min(n0 + srow, p.n - 1) * (p.k / 32);
  const int32_t row0 = static_cast<int32_t>(beg + m0);
  const uint32_t bars = base + R::kBarOffset;  // one mbarrier (8 B) per ring slot
  [[maybe_unused]] const uint32_t empties = bars + 8 * kStages;  // MOESERVE_RS_DECOUPLED
  const int r0 = 64 * wg + 16 * warp + g;
  const auto slot = [&](int kt) { return (tc + static_cast<uint32_t>(kt)) % kStages; };
#ifdef MOESERVE_SK_CLOCKS
  if (SkClockSeg* const r = sk_clock_seg()) {
    r->kind = kSk ? static_cast<int>(seg.epi) : 0;
    r->ktiles = nk;
    r->shape = kTN;
    r->rows = static_cast<int>(rows);
    r->wait = 0;
    g_sk_loop_clk[0] = g_sk_loop_clk[1] = g_sk_loop_clk[2] = g_sk_loop_clk[3] = 0;
    r->t0 = clock64();
  }
#endif

  // The A rows by TMA (thread 0: kTN / kBoxRows boxes of kBoxRows rows x 64 k, 128-byte swizzle,
  // on the slot's mbarrier; rows past the pass are other experts' rows or zero fill past a_rows,
  // and their accumulator columns are never stored), the weights and scales by cp.async.
  const auto load_tile = [&](int kt) {
    const uint32_t sl = slot(kt);
    if (tid == 0) {
      mbar_expect_tx(bars + 8 * sl, kTN * 128);
#pragma unroll
      for (int b = 0; b < kTN / kBoxRows; ++b)
        tma_load_2d(base + sl * kStageBytes + b * kBoxRows * 128, tmap_a, (kb + kt) * kBK,
                    row0 + kBoxRows * b, bars + 8 * sl);
    }
    uint8_t* st = smem + sl * kStageBytes;
    cp_async16_zfill(st + kABytes + tid * 16, wsrc + (kb + kt) * (kBK / 2), true);
    if (MOESERVE_RS_DECOUPLED ? (tid & 1) == 0 : tid < kBW)
      cp_async4(st + kABytes + kWBytes + (MOESERVE_RS_DECOUPLED ? tid >> 1 : tid) * 4,
                ssrc + ((kb + kt) >> 1) * 4);
  };

  float acc[kTN / 2];
#pragma unroll
  for (int i = 0; i < kTN / 2; ++i) acc[i] = 0.0f;
#if MOESERVE_RS_SS
  // The weights as wgmma's A operand from shared memory (grs_decode_ss): tile kt decoded by all
  // threads into bf16 tile wb(kt) = kt % kSsBufs, read by each warpgroup at its 64 rows. Per tile:
  //   wait for the slot's mbarrier; wgmma x4 on (tile wb(kt), A of kt); commit
  //   wait_group kPend = kSsBufs - 2 (tile kt - kPend done: its slot and weight tile free after
  //   the barrier); cp.async.wait (own weight copies of tile kt + 2); barrier (also: every
  //   thread's stores of tile kt + 1, decoded in the step before, visible to the async proxy)
  //   load tile kt + kAhead into kt - kPend's slot
  //   decode tile kt + 2 into tile wb(kt + 2) (free: its last reader was kt + 2 - kSsBufs =
  //   kt - kPend), fence.proxy.async, while the wgmma of tiles kt - kPend + 1 .. kt run.
  // Decoding two tiles ahead lets the one barrier per tile order both the stores (before the
  // wgmma that read them) and the reuse (after the wgmma that read them). The same k16 steps in
  // the same order on the same accumulators: the output is the RS kernel's, bit for bit.
  constexpr int kPend = kSsBufs - 2;
  constexpr int kAhead = kStages - kPend;
  static_assert(kAhead >= 3, "MOESERVE_RS_SS: the ring must hold tiles kt .. kt + 2 and more");
  uint8_t* const wtiles = smem + R::kSsOffset;
  const uint32_t wtiles_addr = base + R::kSsOffset;
  const auto decode = [&](int kt, int buf) {
    grs_decode_ss<kKperm, kABytes>(smem + slot(kt) * kStageBytes, wtiles + buf * kSsTileBytes, tid,
                                   kb + kt);
  };
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < nk) load_tile(s);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  }
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kAhead - 2) : "memory");  // weights of 0, 1
  __syncthreads();
  decode(0, 0);
  if (nk > 1) decode(1, 1);
  if (MOESERVE_RS_PROBE == 1)
    for (int b = 1; b < kSsBufs; ++b) decode(0, b);
  wgmma::fence_proxy_async_smem();
  __syncthreads();
  int wb = 0;  // the weight tile of K tile kt
#pragma unroll 1
  for (int kt = 0; kt < nk; ++kt) {
    const uint32_t sl = slot(kt);
    if (MOESERVE_RS_PROBE != 2 || kt < kAhead) {
      SK_LOOP_T0();
      mbar_wait(bars + 8 * sl, ((tc + static_cast<uint32_t>(kt)) / kStages) & 1);  // A landed
      SK_LOOP_ADD(0);
    }
    const uint32_t a_tile = wtiles_addr + wb * kSsTileBytes + wg * 64 * 128;
    const uint32_t b_tile = base + sl * kStageBytes;
    wgmma::fence_operands(acc);
    wgmma::fence();
#pragma unroll
    for (int s = 0; s < kBK / 16; ++s)
      if (MOESERVE_RS_PROBE != 3)
        wgmma::bf16_ss<kTN>(acc, wgmma::desc_k_sw128_addr(a_tile + 32 * s),
                            wgmma::desc_k_sw128_addr(b_tile + 32 * s), 1);
    wgmma::commit_group();
    {
      SK_LOOP_T0();
      wgmma::wait_group<kPend>();
      SK_LOOP_ADD(3);
    }
    wgmma::fence_operands(acc);
    {
      SK_LOOP_T0();
      asm volatile("cp.async.wait_group %0;\n" ::"n"(kAhead - 3) : "memory");  // weights of kt + 2
      SK_LOOP_ADD(1);
    }
    {
      SK_LOOP_T0();
      __syncthreads();
      SK_LOOP_ADD(2);
    }
    if (kt + kAhead < nk && MOESERVE_RS_PROBE != 2) load_tile(kt + kAhead);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    if (kt + 2 < nk && MOESERVE_RS_PROBE != 1) {
      decode(kt + 2, wb + 2 < kSsBufs ? wb + 2 : wb + 2 - kSsBufs);
      wgmma::fence_proxy_async_smem();
    }
    wb = wb + 1 < kSsBufs ? wb + 1 : 0;
  }
#else
  // f[kt % kBufs]: the fragments of K tile kt. kBufs - 1 tiles of wgmma stay in flight while the
  // next tile is decoded, so a tile's slot is free kBufs - 1 tiles after its own and the ring
  // keeps kStages - kBufs + 1 tiles loaded ahead.
  uint32_t f[kBufs][4][4];
  constexpr int kAhead = kStages - kBufs + 1;

#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < nk) load_tile(s);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  }
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kAhead - 1) : "memory");  // weights of tile 0
  __syncthreads();
  grs_dequant<kKperm, kABytes>(smem + slot(0) * kStageBytes, r0, t, kb, f[0]);
  if (MOESERVE_RS_PROBE == 1)
#pragma unroll
    for (int b = 1; b < kBufs; ++b)
      grs_dequant<kKperm, kABytes>(smem + slot(0) * kStageBytes, r0, t, kb, f[b]);

  // K tile kt on fragments fc; the fragments of kt + 1 into fn.
  const auto step = [&](int kt, const uint32_t (&fc)[4][4], uint32_t (&fn)[4][4]) {
    const uint32_t sl = slot(kt);
    if (MOESERVE_RS_PROBE != 2 || kt < kAhead) {
      SK_LOOP_T0();
      mbar_wait(bars + 8 * sl, ((tc + static_cast<uint32_t>(kt)) / kStages) & 1);  // A landed
      SK_LOOP_ADD(0);
    }
    const uint32_t b_tile = base + sl * kStageBytes;
    wgmma::fence_operands(acc);
    wgmma::fence();
#pragma unroll
    for (int s = 0; s < kBK / 16; ++s)
      if (MOESERVE_RS_PROBE != 3)
        wgmma::bf16_rs<kTN>(acc, fc[s], wgmma::desc_k_sw128_addr(b_tile + 32 * s), 1);
    wgmma::commit_group();
    // Tile kt - kBufs + 1 done (three buffers: tiles kt - 1 and kt keep the tensor cores busy).
    {
      SK_LOOP_T0();
      wgmma::wait_group<kBufs - 1>();
      SK_LOOP_ADD(3);
    }
    wgmma::fence_operands(acc);
    {
      SK_LOOP_T0();
      asm volatile("cp.async.wait_group %0;\n" ::"n"(kAhead - 2) : "memory");  // weights of kt + 1
      SK_LOOP_ADD(1);
    }
#if MOESERVE_RS_DECOUPLED
    // This warpgroup's weights of kt + 1 visible to it, and its wgmma on tile kt - kBufs + 1 (the
    // slot that tile kt + kAhead refills) done; warpgroup 1 tells thread 0 so.
    wg_bar_sync(wg);
    const int done = kt - kBufs + 1;
    if (done >= 0) {
      if (tid == 128) mbar_arrive(empties + 8 * slot(done));
      if (tid == 0 && kt + kAhead < nk)
        mbar_wait(empties + 8 * slot(done), ((tc + static_cast<uint32_t>(done)) / kStages) & 1);
    }
#else
    {
      SK_LOOP_T0();
      __syncthreads();  // weights of kt + 1 visible; both warpgroups done with that tile's slot
      SK_LOOP_ADD(2);
    }
#endif
    if (kt + kAhead < nk && MOESERVE_RS_PROBE != 2) load_tile(kt + kAhead);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    if (kt + 1 < nk && MOESERVE_RS_PROBE != 1)
      grs_dequant<kKperm, kABytes>(smem + slot(kt + 1) * kStageBytes, r0, t, kb + kt + 1, fn);
  };
  // Tile kt + 1 is decoded while the wgmma of the kBufs - 1 tiles up to kt run. The two loops
  // below give the same PTX but for its register numbering, which ptxas's allocation follows:
  // with the explicit calls every 224-row kernel had its wgmma serialised (C7512, with two
  // fragment buffers or three), with the unrolled loop none has; the 192-row kernel keeps the
  // explicit calls, the code it was measured with (254 registers; the unrolled loop gives it 226
  // and another schedule: MOESERVE_RS_LOOP 1).
  if constexpr (kMaxTok > 192 || MOESERVE_RS_LOOP == 1) {
#pragma unroll 1
    for (int kt = 0; kt < nk; kt += kBufs)
#pragma unroll
      for (int b = 0; b < kBufs; ++b)
        if (kt + b < nk) step(kt + b, f[b], f[(b + 1) % kBufs]);
  } else {
#pragma unroll 1
    for (int kt = 0; kt < nk; kt += 3) {
      step(kt, f[0], f[1]);
      if (kt + 1 < nk) step(kt + 1, f[1], f[2]);
      if (kt + 2 < nk) step(kt + 2, f[2], f[0]);
    }
  }
#endif  // MOESERVE_RS_SS
  wgmma::wait_group<0>();
  wgmma::fence_operands(acc);
#ifdef MOESERVE_SK_CLOCKS
  if (SkClockSeg* const r = sk_clock_seg()) r->t1 = clock64();
#endif
#if MOESERVE_RS_DECOUPLED
  // Warpgroup 1 releases the tail tiles' slots too (one arrival per tile and use of a slot).
  wg_bar_sync(wg);
  if (tid == 128)
    for (int kt = max(nk - kBufs + 1, 0); kt < nk; ++kt) mbar_arrive(empties + 8 * slot(kt));
#endif
  if constexpr (kFuse) {
    // d[4i + 2h + v] = D[r0 + 8h][8i + 2t + v] -> tile wg (0: g, 1: u), row 8i + 2t + v, column
    // r0 + 8h - 64 wg (the same column in both tiles).
    __syncthreads();  // both warpgroups' wgmma are done reading the ring
    float* const tiles = reinterpret_cast<float*>(smem);  // [2][kTN][kEpiPitch]
    float* const mine = tiles + wg * kTN * kEpiPitch + 16 * warp + g;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < kTN / 8; ++i)
#pragma unroll
        for (int v = 0; v < 2; ++v)
          mine[(8 * i + 2 * t + v) * kEpiPitch + 8 * h] = acc[4 * i + 2 * h + v];
    __syncthreads();
    SwigluQuantParams out;  // quant_store8's view of the output (bf16)
    out.out = p.swiglu.out;
    out.ldo = p.swiglu.ldo;
    out.kperm64 = p.swiglu.kperm64;
    const float* const rw = p.swiglu.row_weight;
    // Lane: bits 0-1 the 8-column chunk of a 32-wide block, bit 3 the block, bits 2 and 4 the row
    // (with the warp: 32 rows per step).
    const int c = 32 * ((lane >> 3) & 1) + 8 * (lane & 3);
    const bool col_live = n0 + c < p.n;  // n % 32 == 0: a block is wholly in or out
    for (int m = 4 * (tid >> 5) + 2 * (lane >> 4) + ((lane >> 2) & 1); m < kTN; m += 32) {
      const bool live = col_live && m < rows;
      float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      if (live) {
        const auto* g4 = reinterpret_cast<const float4*>(tiles + m * kEpiPitch + c);
        const auto* u4 = reinterpret_cast<const float4*>(tiles + (kTN + m) * kEpiPitch + c);
        const float4 ga = g4[0], gb = g4[1], ua = u4[0], ub = u4[1];
        const float gs[8] = {ga.x, ga.y, ga.z, ga.w, gb.x, gb.y, gb.z, gb.w};
        const float us[8] = {ua.x, ua.y, ua.z, ua.w, ub.x, ub.y, ub.z, ub.w};
        const float w = rw != nullptr ? rw[beg + m0 + m] : 1.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          v[e] = swiglu_clamped(gs[e], us[e], p.swiglu.limit);
          if (rw != nullptr) v[e] *= w;
        }
      }
      quant_store8(out, beg + m0 + m, n0 + c, v, live);
    }
    wgmma::fence_proxy_async_smem();  // these generic accesses before the next pass's TMA writes
  } else {
    if constexpr (kSk) {
      if (seg.epi == kSkPartial) {
        sk_store_partial(p, seg.cta, acc);
      } else if (seg.epi == kSkHead) {
        sk_add_partials(p, seg, acc);
      }
    }
    // d[4i + 2h + v] = D[r0 + 8h][8i + 2t + v]: weight row (column of y) n0 + r0 + 8h, row
    // 8i + 2t + v.
    if (!kSk || seg.epi != kSkPartial) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t col = n0 + r0 + 8 * h;
        if (col >= p.n) continue;
        float* ycol = y + (beg + m0) * p.ldy + col;
#pragma unroll
        for (int i = 0; i < kTN / 8; ++i)
#pragma unroll
          for (int v = 0; v < 2; ++v) {
            const int r = 8 * i + 2 * t + v;
            if (r < rows) ycol[r * p.ldy] = acc[4 * i + 2 * h + v];
          }
      }
    }
  }
  __syncthreads();  // shared memory free for the next pass
#ifdef MOESERVE_SK_CLOCKS
  if (SkClockSeg* const r = sk_clock_seg()) {
    r->t2 = clock64();
    r->a_wait = g_sk_loop_clk[0];
    r->w_wait = g_sk_loop_clk[1];
    r->bar_wait = g_sk_loop_clk[2];
    r->mma_wait = g_sk_loop_clk[3];
    ++g_sk_clock_cta[sk_clock_block()].segs;
  }
#endif
}

// The ring in dynamic shared memory (1024-aligned: the 128-byte swizzle; `base` its shared-space
// address) with its mbarriers initialised.
template <int kMaxTok>
__device__ __forceinline__ uint8_t* grs_ring_init(uint32_t& base) {
  using namespace grs;
  constexpr int kBarOffset = Ring<kMaxTok>::kBarOffset;  // the slots (and SS weight tiles) before
  extern __shared__ uint8_t grs_smem_raw[];
  const auto raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(grs_smem_raw));
  base = (raw_addr + 1023u) & ~1023u;
  if (threadIdx.x == 0) {
    // The full barriers (TMA bytes), then the empty ones (MOESERVE_RS_DECOUPLED: warpgroup 1).
    for (int i = 0; i < 2 * kStages; ++i) mbar_init(base + kBarOffset + 8 * i, 1);
    mbar_init_fence();
  }
  __syncthreads();
  return grs_smem_raw + (base - raw_addr);
}
#endif

// kKperm: p.a_kperm; kFuse: p.swiglu; kMaxTok: rows per pass, 192 or kWidePass (p.rs_max_pass)
// (one instantiation each, so none carries another's decode, epilogue or pass shapes).
template <bool kKperm, bool kFuse, int kMaxTok>
__global__ void __launch_bounds__(grs::kThreads, 1)
    grouped_mxfp4_gemm_rs_kernel(const GroupedMxfp4GemmParams p,
                                 const __grid_constant__ CUtensorMap tmap_a) {
  pdl_wait();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace grs;
  uint32_t base;
#ifdef MOESERVE_SK_CLOCKS
  sk_clock_cta(true);
#endif
  uint8_t* const smem = grs_ring_init<kMaxTok>(base);
  // The CTA's weight rows from n0: kBW of one set (blockIdx.x covers W's tiles, then W_b's); kFuse:
  // 64 of W (ring rows 0-63, warpgroup 0) and the same 64 of W_b (ring rows 64-127, warpgroup 1).
  constexpr int kRows = kFuse ? kBW / 2 : kBW;
  const int64_t wtiles = (p.n + kRows - 1) / kRows;
  int64_t wt = blockIdx.x;
  const bool second = !kFuse && wt >= wtiles;
  if (second) wt -= wtiles;
  const int e = static_cast<int>(blockIdx.z);
  // The set of the ring rows this thread copies: weights of row tid / 2, scales of row tid % 128.
  const int tid = static_cast<int>(threadIdx.x);
  const bool w_in_b = kFuse ? tid >> 1 >= kRows : second;
  const bool s_in_b = kFuse ? (MOESERVE_RS_DECOUPLED ? tid >> 1 : tid & (kBW - 1)) >= kRows : second;
  const uint8_t* const wexp = (w_in_b ? p.w_b : p.w)[e];
  const uint8_t* const sexp = (s_in_b ? p.w_scale_b : p.w_scale)[e];
  float* const y = second ? p.y_b : p.y;
  const int64_t beg = p.offsets[e];
  const int64_t cnt = p.offsets[e + 1] - beg;
  const int64_t n0 = wt * kRows;
  uint32_t tc = 0;
  for (int64_t m0 = static_cast<int64_t>(blockIdx.y) * kMaxTok; m0 < cnt;
       m0 += static_cast<int64_t>(gridDim.y) * kMaxTok) {
    const int64_t rows = min(static_cast<int64_t>(kMaxTok), cnt - m0);
    // The pass shape: the rows rounded up to 64, past 192 the wide pass (rows <= kMaxTok).
    switch ((rows + 63) / 64) {
      case 1:
        grs_pass<64, kMaxTok, kKperm, kFuse>(p, &tmap_a, wexp, sexp, y, smem, base, beg, m0, rows,
                                             n0, tc);
        break;
      case 2:
        grs_pass<128, kMaxTok, kKperm, kFuse>(p, &tmap_a, wexp, sexp, y, smem, base, beg, m0, rows,
                                              n0, tc);
        break;
      case 3:
        grs_pass<192, kMaxTok, kKperm, kFuse>(p, &tmap_a, wexp, sexp, y, smem, base, beg, m0, rows,
                                              n0, tc);
        break;
      case 4:
        if constexpr (kMaxTok > 192)
          grs_pass<kMaxTok, kMaxTok, kKperm, kFuse>(p, &tmap_a, wexp, sexp, y, smem, base, beg, m0,
                                                    rows, n0, tc);
        break;
      default: break;
    }
    tc += static_cast<uint32_t>(p.k / kBK);
  }
#ifdef MOESERVE_SK_CLOCKS
  sk_clock_cta(false);
#endif
#else
  __trap();  // sm_90a only; launch_grouped_mxfp4_gemm takes it only on Hopper with wgmma_rs
#endif
}

// The stream-K form (see above; kKperm: p.a_kperm): grid G = p.sk_ctas CTAs (or the SM count),
// CTA blockIdx.x takes its range of the concatenated K tiles, segment by segment.
template <bool kKperm>
__global__ void __launch_bounds__(grs::kThreads, 1)
    grouped_mxfp4_gemm_rs_sk_kernel(const GroupedMxfp4GemmParams p,
                                    const __grid_constant__ CUtensorMap tmap_a) {
  pdl_wait();
  if (p.sk_exit_empty && p.offsets[p.num_experts] == 0) return;  // no unit (see kernels.h)
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace grs;
  __shared__ SkState sk;
#ifdef MOESERVE_SK_CLOCKS
  sk_clock_cta(true);
#endif
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t wtiles = (p.n + kBW - 1) / kBW;  // of one weight set
  if (tid == 0) {
    SkSchedule& s = sk.sched;
    s.offsets = p.offsets;
    s.experts = p.num_experts;
    s.ctas = static_cast<int>(gridDim.x);
    s.nk = static_cast<int>(p.k / kBK);
    s.tp = wtiles * (p.w_b != nullptr ? 2 : 1) * s.nk;
    s.cost = 0;
    for (int e = 0; e < p.num_experts; ++e) s.cost += s.expert_cost(s.count(e));
    sk.cta = static_cast<int>(blockIdx.x);
    sk.next = s.start(sk.cta);
    sk.end = s.start(sk.cta + 1);
  }
  uint32_t base;
  uint8_t* const smem = grs_ring_init<kSkPass>(base);  // (its barrier publishes sk)
  uint32_t tc = 0;
  for (;;) {
    if (tid == 0 && sk.next < sk.end) sk.set_segment();
    __syncthreads();
    if (sk.next >= sk.end) break;
    const bool second = sk.wt >= wtiles;
    const uint8_t* const wexp = (second ? p.w_b : p.w)[sk.e];
    const uint8_t* const sexp = (second ? p.w_scale_b : p.w_scale)[sk.e];
    float* const y = second ? p.y_b : p.y;
    const int64_t n0 = (second ? sk.wt - wtiles : sk.wt) * kBW;
    switch ((sk.rows + 63) / 64) {
      case 1:
        grs_pass<64, kSkPass, kKperm, false, true>(p, &tmap_a, wexp, sexp, y, smem, base, sk.beg,
                                                   sk.m0, sk.rows, n0, tc, sk);
        break;
      case 2:
        grs_pass<128, kSkPass, kKperm, false, true>(p, &tmap_a, wexp, sexp, y, smem, base, sk.beg,
                                                    sk.m0, sk.rows, n0, tc, sk);
        break;
      default:
        grs_pass<192, kSkPass, kKperm, false, true>(p, &tmap_a, wexp, sexp, y, smem, base, sk.beg,
                                                    sk.m0, sk.rows, n0, tc, sk);
        break;
    }
    // (grs_pass ends with a barrier: every thread has read the segment.)
    tc += static_cast<uint32_t>(sk.ke - sk.kb);
    __syncthreads();  // ... and its length here, before thread 0 moves on
    if (tid == 0) sk.next += sk.ke - sk.kb;
  }
#ifdef MOESERVE_SK_CLOCKS
  sk_clock_cta(false);
#endif
#else
  __trap();  // sm_90a only; launch_grouped_mxfp4_gemm takes it only on Hopper with wgmma_rs
#endif
}

// The driver's tensor map encoder, through the runtime's entry point query (so nothing links
// libcuda); null when the driver does not offer it.
PFN_cuTensorMapEncodeTiled_v12000 tmap_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// The activations [a_rows, k] (row stride lda) as a TMA map of box_rows x 64 bf16 boxes, 128-byte
// swizzle (the layout desc_k_sw128 reads).
bool make_tmap_a(CUtensorMap* map, const void* a, int64_t k, int64_t rows, int64_t lda,
                 int box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tmap_encoder();
  if (encode == nullptr || rows <= 0 || rows > 0x7FFFFFFF || k > 0x7FFFFFFF) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(lda) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t estr[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(a), dims, strides, box,
                estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The most rows of a pass (GroupedMxfp4GemmParams::rs_max_pass); whether p asks for a supported
// value (launch_grouped_mxfp4_gemm refuses others).
int rs_max_pass(const GroupedMxfp4GemmParams& p) {
  return p.rs_max_pass == 0 ? 192 : p.rs_max_pass;
}
bool rs_max_pass_ok(const GroupedMxfp4GemmParams& p) {
  return rs_max_pass(p) == 192 || rs_max_pass(p) == grs::kWidePass;
}
// Passes per expert in the swapped-operand kernel's grid (an expert of R rows runs
// ceil(R / max pass) passes, all full but the last).
int64_t rs_passes(const GroupedMxfp4GemmParams& p) {
  return row_tiles_per_expert(p, rs_max_pass(p));
}
int64_t rs_wtiles(const GroupedMxfp4GemmParams& p) {
  if (p.swiglu.out != nullptr) return ceil_div(p.n, grs::kBW / 2);  // 64 rows of both sets
  return ceil_div(p.n, grs::kBW) * (p.w_b != nullptr ? 2 : 1);
}

// The fused SwiGLU epilogue's conditions (GroupedMxfp4GemmParams::swiglu): both sets, no fp32
// outputs, whole 32-wide quantisation blocks (whole 64-wide tiles with kperm64), 16-byte stores.
bool swiglu_epilogue_ok(const GroupedMxfp4GemmParams& p) {
  const GroupedSwigluEpilogue& f = p.swiglu;
  return p.w_b != nullptr && p.y == nullptr && p.y_b == nullptr && p.n % 32 == 0 &&
         (!f.kperm64 || p.n % 64 == 0) && f.ldo >= p.n && f.ldo % 8 == 0 &&
         reinterpret_cast<uintptr_t>(f.out) % 16 == 0;
}

template <int kMaxTok>
void rs_smem_attributes() {
  for (auto* k : {grouped_mxfp4_gemm_rs_kernel<false, false, kMaxTok>,
                  grouped_mxfp4_gemm_rs_kernel<true, false, kMaxTok>,
                  grouped_mxfp4_gemm_rs_kernel<false, true, kMaxTok>,
                  grouped_mxfp4_gemm_rs_kernel<true, true, kMaxTok>})
    MS_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       grs::Ring<kMaxTok>::kSmemBytes));
}

void sk_smem_attributes() {
  for (auto* k : {grouped_mxfp4_gemm_rs_sk_kernel<false>, grouped_mxfp4_gemm_rs_sk_kernel<true>})
    MS_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       grs::Ring<grs::kSkPass>::kSmemBytes));
}

// The swapped-operand kernel for p (its passes, decode and epilogue) with its launch shape.
struct RsKernel {
  void (*kernel)(GroupedMxfp4GemmParams, CUtensorMap);
  int smem;      // dynamic shared memory
  int box_rows;  // of the tensor map
};
template <int kMaxTok>
RsKernel rs_kernel(const GroupedMxfp4GemmParams& p) {
  auto* const kernel = p.swiglu.out != nullptr
                           ? (p.a_kperm ? grouped_mxfp4_gemm_rs_kernel<true, true, kMaxTok>
                                        : grouped_mxfp4_gemm_rs_kernel<false, true, kMaxTok>)
                           : (p.a_kperm ? grouped_mxfp4_gemm_rs_kernel<true, false, kMaxTok>
                                        : grouped_mxfp4_gemm_rs_kernel<false, false, kMaxTok>);
  return {kernel, grs::Ring<kMaxTok>::kSmemBytes, grs::Ring<kMaxTok>::kBoxRows};
}

// Whether the swapped-operand kernel takes p: requested, its shape, alignment and grid limits,
// the fused epilogue's conditions when asked for, the tensor map's limits and encoder, and a
// Hopper device (grouped_mxfp4_rs_applies and launch_grouped_mxfp4_rs both ask this, so a
// caller's a_kperm and swiglu decisions match the launch).
bool rs_takes(const GroupedMxfp4GemmParams& p) {
  if (!p.use_wgmma || !p.wgmma_rs || !rs_max_pass_ok(p) || p.rows_hint <= 24 || p.k % 128 != 0 ||
      p.k > 0x7FFFFFFF || p.a_rows <= 0 || p.a_rows > 0x7FFFFFFF ||
      reinterpret_cast<uintptr_t>(p.y) % 4 != 0 ||
      (p.swiglu.out != nullptr && !swiglu_epilogue_ok(p)))
    return false;
  static const bool hopper = [] {
    if (device_cc_major() != 9) return false;
    rs_smem_attributes<192>();
    rs_smem_attributes<grs::kWidePass>();
    sk_smem_attributes();
    return true;
  }();
  return hopper && tmap_encoder() != nullptr && rs_passes(p) <= 65535 && rs_wtiles(p) <= 0x7FFFFFFF;
}

// The swapped-operand kernel when requested and it applies (both weight sets in one launch);
// with p.stream_k (checked by the caller) its stream-K form.
bool launch_grouped_mxfp4_rs(const GroupedMxfp4GemmParams& p, cudaStream_t stream) {
  if (!rs_takes(p)) return false;
  if (p.stream_k) {
    CUtensorMap tmap{};
    if (!make_tmap_a(&tmap, p.a, p.k, p.a_rows, p.lda, grs::Ring<grs::kSkPass>::kBoxRows))
      return false;
    auto* const kernel =
        p.a_kperm ? grouped_mxfp4_gemm_rs_sk_kernel<true> : grouped_mxfp4_gemm_rs_sk_kernel<false>;
    const int ctas = grouped_mxfp4_stream_k_workspace(p.sk_ctas).ctas;
    MS_CUDA_CHECK(launch_kernel(kernel, static_cast<unsigned>(ctas), grs::kThreads,
                                grs::Ring<grs::kSkPass>::kSmemBytes, stream, p, tmap));
    return true;
  }
  const dim3 grid(static_cast<unsigned>(rs_wtiles(p)), static_cast<unsigned>(rs_passes(p)),
                  static_cast<unsigned>(p.num_experts));
  const RsKernel k = rs_max_pass(p) == 192 ? rs_kernel<192>(p) : rs_kernel<grs::kWidePass>(p);
  CUtensorMap tmap{};
  if (!make_tmap_a(&tmap, p.a, p.k, p.a_rows, p.lda, k.box_rows)) return false;
  MS_CUDA_CHECK(launch_kernel(k.kernel, grid, grs::kThreads, k.smem, stream, p, tmap));
  return true;
}

__global__ void dequant_fp8_kernel(const uint8_t* w, const uint8_t* s, int64_t n, int64_t k,
                                   __nv_bfloat16* out) {
  pdl_wait();
  const int64_t total = n * k;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / k, c = i % k;
    const float v = v41::e4m3_decode(w[i]) * v41::ue8m0_decode(s[(r / 32) * (k / 32) + c / 32]);
    out[i] = __float2bfloat16_rn(v);
  }
}

int quant_grid(int64_t rows) {
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(rows, 1), 65535));
}

// The vector kernel (grid-stride over 8-column items, quant_items) when the pointers and pitches
// allow it and the items fit 32 bits, else the scalar one (a block per row). `rows` is the count,
// or with a device count (p.device_rows) its upper bound, e.g. every hit on a local expert: the grid
// is sized for the bound, capped at kVecBlocksPerSm per SM, and the blocks past the actual items
// find nothing to do.
template <typename P>
void launch_quant_rows(void (*vec_kernel)(P), void (*scalar_kernel)(P), bool vec, const P& p,
                       Stream stream) {
  const cudaStream_t s = as_cuda_stream(stream);
  const int64_t items = p.rows * (p.cols / 8);
  if (vec && items < (int64_t{1} << 31)) {
    static const int64_t max_blocks = int64_t{kVecBlocksPerSm} * device_sm_count();
    const int64_t blocks = std::min(ceil_div(items, 2 * kQuantThreads), max_blocks);
    MS_CUDA_CHECK(launch_kernel(vec_kernel, static_cast<unsigned>(blocks), kQuantThreads, 0, s, p));
  } else {
    MS_CUDA_CHECK(launch_kernel(scalar_kernel, quant_grid(p.rows), kQuantThreads, 0, s, p));
  }
}

// The scale output of kMxfp8 (the other output types ignore it).
template <typename P>
bool mxfp8_scales_ok(const P& p) {
  return p.out_type != ActivationType::kMxfp8 ||
         (p.out_scale != nullptr && p.ldo_scale >= p.cols / 32);
}

// The k-permuted output: bf16 only (the swapped-operand GEMM's A), whole 64-column tiles.
template <typename P>
bool kperm64_ok(const P& p) {
  return !p.kperm64 || (p.out_type == ActivationType::kBF16 && p.cols % 64 == 0);
}

void bad_args(const char* what, const char* need) {
  detail::cuda_call_failed(__FILE__, __LINE__, what, "bad arguments", need);
}

}  // namespace

void launch_act_quant_mxfp8(const ActQuantParams& p, Stream stream) {
  if (p.rows == 0 || p.cols == 0) return;
  if (p.cols % 32 != 0 || p.ldx < p.cols || p.ldo < p.cols || !mxfp8_scales_ok(p) || !kperm64_ok(p))
    bad_args("launch_act_quant_mxfp8",
             "cols % 32 == 0, ldx >= cols, ldo >= cols; kMxfp8: out_scale, ldo_scale >= cols/32; "
             "kperm64: kBF16, cols % 64 == 0");
  const bool vec = p.ldx % 4 == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0 &&
                   p.ldo % 8 == 0 && reinterpret_cast<uintptr_t>(p.out) % 16 == 0;
  launch_quant_rows(act_quant_vec_kernel, act_quant_kernel, vec, p, stream);
}

void launch_swiglu_quant_mxfp8(const SwigluQuantParams& p, Stream stream) {
  if (p.rows == 0 || p.cols == 0) return;
  const bool scales = p.in_row_scale != nullptr;
  if (p.cols % 32 != 0 || p.ld < p.cols || p.ldo < p.cols || !mxfp8_scales_ok(p) || !kperm64_ok(p) ||
      scales != (p.gate_col_scale != nullptr) || scales != (p.up_col_scale != nullptr) ||
      (scales && (p.group_rows < 1 || p.ld_col_scale < p.cols)))
    bad_args("launch_swiglu_quant_mxfp8",
             "cols % 32 == 0, ld >= cols, ldo >= cols; kMxfp8: out_scale, ldo_scale >= cols/32; "
             "kperm64: kBF16, cols % 64 == 0; in_row_scale, gate_col_scale, up_col_scale all set "
             "or none, then group_rows >= 1 and ld_col_scale >= cols");
  const bool vec = p.ld % 4 == 0 && reinterpret_cast<uintptr_t>(p.gate) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(p.up) % 16 == 0 && p.ldo % 8 == 0 &&
                   reinterpret_cast<uintptr_t>(p.out) % 16 == 0;
  launch_quant_rows(swiglu_quant_vec_kernel, swiglu_quant_kernel, vec, p, stream);
}

void launch_moe_group(const MoeGroupParams& p, Stream stream) {
  if (p.local <= 0 || p.local > 4096 || p.k <= 0 || p.replicas < 1 || p.experts_total < 0 ||
      p.rows * p.k * p.replicas > int64_t{1} << 30)
    bad_args("launch_moe_group", "0 < local <= 4096, k > 0, 1 <= replicas, rows * k * replicas <= 2^30");
  if (!p.ordered) {
    const size_t smem = sizeof(int32_t) * 2 * static_cast<size_t>(p.local);
    MS_CUDA_CHECK(
        launch_kernel(moe_group_kernel, 1, kGroupThreads, smem, as_cuda_stream(stream), p));
    return;
  }
  if (p.scratch == nullptr)
    bad_args("launch_moe_group", "ordered: scratch set (moe_group_scratch_ints(local))");
  // Range threads of at least 4 hits each, at most kGroupThreads.
  const int64_t hits = p.rows * p.k;
  const int T = static_cast<int>(std::clamp<int64_t>(ceil_div(hits, 4), 1, kGroupThreads));
  const int64_t H = std::max<int64_t>(ceil_div(hits, T), 1);
  if (!p.staged) {
    MS_CUDA_CHECK(launch_kernel(moe_group_ordered_kernel, 1, kGroupThreads, 0,
                                as_cuda_stream(stream), p, T, H));
    return;
  }
  const size_t smem = sizeof(int32_t) * (static_cast<size_t>(p.local) * T + p.local + 1);
  if (smem <= kGroupOrderedSmemBytes) {
    static const bool attr = [] {
      MS_CUDA_CHECK(cudaFuncSetAttribute(moe_group_ordered_staged_kernel<true>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kGroupOrderedSmemBytes)));
      return true;
    }();
    (void)attr;
    MS_CUDA_CHECK(launch_kernel(moe_group_ordered_staged_kernel<true>, 1, kGroupThreads, smem,
                                as_cuda_stream(stream), p, T, H));
    return;
  }
  MS_CUDA_CHECK(launch_kernel(moe_group_ordered_staged_kernel<false>, 1, kGroupThreads, 0,
                              as_cuda_stream(stream), p, T, H));
}

size_t moe_group_ordered_smem_bytes(int local, int64_t hits) {
  const int64_t T = std::clamp<int64_t>(ceil_div(hits, 4), 1, kGroupThreads);
  const size_t smem = sizeof(int32_t) * (static_cast<size_t>(local) * T + local + 1);
  return smem <= kGroupOrderedSmemBytes ? smem : 0;
}

int64_t moe_group_scratch_ints(int local) { return int64_t{local} * kGroupThreads; }

GroupedMxfp4Kernel launch_grouped_mxfp4_gemm(const GroupedMxfp4GemmParams& p, Stream stream) {
  if (p.num_experts == 0 || p.max_rows == 0 || p.n == 0) return GroupedMxfp4Kernel::kNone;
  // The fused epilogue writes neither y nor y_b (swiglu_epilogue_ok: both null, ldy unused).
  const bool fused = p.swiglu.out != nullptr;
  if (p.k % 32 != 0 || p.k <= 0 || p.lda % 8 != 0 || p.lda < p.k || (!fused && p.ldy < p.n) ||
      reinterpret_cast<uintptr_t>(p.a) % 16 != 0 || p.num_experts > 65535 ||
      (p.w_b != nullptr) != (p.w_scale_b != nullptr) ||
      (!fused && (p.w_b != nullptr) != (p.y_b != nullptr)) || !rs_max_pass_ok(p))
    bad_args("launch_grouped_mxfp4_gemm",
             "K % 32 == 0, lda % 8 == 0, lda >= K, a 16-byte aligned, w_b / w_scale_b both set or "
             "both null; without swiglu: ldy >= N, w_b / y_b both set or both null; rs_max_pass "
             "0, 192 or 224");
  const bool small = p.rows_hint <= 24;
  const int tm = small ? 16 : 64;
  const int64_t n_tiles = ceil_div(p.n, kTileN);
  // Skinny batches whose (column tile, expert) CTAs would not fill the GPU about four times over
  // split K over a 4-CTA cluster (one M tile per expert is the expected case at these hints).
  const bool split = small && p.k % 128 == 0 && n_tiles * p.num_experts < 4 * 132;
  const int64_t m_tiles = row_tiles_per_expert(p, tm);
  const dim3 grid(static_cast<unsigned>(n_tiles * (split ? kKSplit : 1)),
                  static_cast<unsigned>(m_tiles), static_cast<unsigned>(p.num_experts));
  if (grid.y > 65535) bad_args("launch_grouped_mxfp4_gemm", "max_rows / tile <= 65535");
  if (p.stream_k) {
    // The stream-K form has the unfused epilogue and 192-row passes only; its grid fits the GPU
    // at one CTA per SM (the no-deadlock condition) and its workspace is the launch's.
    const GroupedStreamKWorkspace need = grouped_mxfp4_stream_k_workspace(std::max(p.sk_ctas, 0));
    if (fused || rs_max_pass(p) != 192 || p.sk_ctas < 0 || p.sk_ctas > device_sm_count() ||
        p.sk_workspace == nullptr || p.sk_flags == nullptr || p.sk_workspace_floats < need.floats ||
        p.sk_flag_count < need.flags)
      bad_args("launch_grouped_mxfp4_gemm",
               "stream_k: swiglu off, rs_max_pass 0 or 192, 0 <= sk_ctas <= the SM count, "
               "sk_workspace and sk_flags set with grouped_mxfp4_stream_k_workspace(sk_ctas)'s "
               "floats and flags");
  }
  const cudaStream_t s = as_cuda_stream(stream);
  if (launch_grouped_mxfp4_rs(p, s))
    return p.stream_k ? GroupedMxfp4Kernel::kWgmmaRsStreamK : GroupedMxfp4Kernel::kWgmmaRs;
  // The other kernels read A in natural k order: permuted columns would be wrong results.
  if (p.a_kperm)
    bad_args("launch_grouped_mxfp4_gemm",
             "a_kperm only where the swapped-operand kernel takes the launch "
             "(grouped_mxfp4_rs_applies)");
  // Only that kernel has the SwiGLU epilogue.
  if (fused)
    bad_args("launch_grouped_mxfp4_gemm",
             "swiglu only where the swapped-operand kernel takes the launch "
             "(grouped_mxfp4_rs_applies): w_b set, y and y_b null, N % 32 == 0 (kperm64: "
             "N % 64 == 0), ldo >= N, ldo % 8 == 0, out 16-byte aligned");
  if (p.w_b != nullptr) {  // the other kernels take one weight set per launch
    GroupedMxfp4GemmParams one = p;
    one.w_b = nullptr;
    one.w_scale_b = nullptr;
    one.y_b = nullptr;
    launch_grouped_mxfp4_gemm(one, stream);
    one.w = p.w_b;
    one.w_scale = p.w_scale_b;
    one.y = p.y_b;
    return launch_grouped_mxfp4_gemm(one, stream);
  }
  if (launch_grouped_mxfp4_wgmma(p, s)) return GroupedMxfp4Kernel::kWgmma;
  if (launch_grouped_mxfp4_skinny(p, s)) return GroupedMxfp4Kernel::kSkinny;
  auto* const kernel = split                     ? grouped_mxfp4_gemm_split_kernel<16, 128>
                       : small && p.k % 128 == 0 ? grouped_mxfp4_gemm_kernel<16, 128>
                       : small                   ? grouped_mxfp4_gemm_kernel<16, 32>
                                                 : grouped_mxfp4_gemm_kernel<64, 32>;
  MS_CUDA_CHECK(launch_kernel(kernel, grid, kGemmThreads, 0, s, p));
  return GroupedMxfp4Kernel::kTable;
}

bool grouped_mxfp4_rs_applies(const GroupedMxfp4GemmParams& p) { return rs_takes(p); }

GroupedStreamKWorkspace grouped_mxfp4_stream_k_workspace(int sk_ctas) {
  GroupedStreamKWorkspace w;
  w.ctas = sk_ctas > 0 ? sk_ctas : device_sm_count();
  w.floats = int64_t{w.ctas} * grs::kSkSlotFloats;
  w.flags = w.ctas;
  return w;
}

void launch_dequant_fp8_block_to_bf16(const uint8_t* w, const uint8_t* w_scale, int64_t n,
                                      int64_t k, void* out, Stream stream) {
  if (n == 0) return;
  if (k % 32 != 0) bad_args("launch_dequant_fp8_block_to_bf16", "K % 32 == 0");
  const int64_t total = n * k;
  const int grid = static_cast<int>(std::min<int64_t>(ceil_div(total, 256), 65535));
  MS_CUDA_CHECK(launch_kernel(dequant_fp8_kernel, grid, 256, 0, as_cuda_stream(stream), w, w_scale,
                              n, k, static_cast<__nv_bfloat16*>(out)));
}

}  // namespace moeserve::cuda
