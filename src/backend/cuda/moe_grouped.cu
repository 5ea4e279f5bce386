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
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>

#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/v41_device.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kQuantThreads = 256;  // 8 warps, one 32-element block per warp at a time

// The MXFP8 rule of fq_fp8_block32_pow2: a block's power-of-two scale from its amax, then each
// value rounded to e4m3 at that scale (e4m3_encode saturates to ±448, the clamp of
// fake_quant.h, and keeps NaN).
struct Mxfp8Scale {
  float s, inv;
};
__device__ __forceinline__ Mxfp8Scale mxfp8_scale(float amax) {
  const float s = v41::ue8m0_decode(v41::fp8_block_scale_code(amax));
  return {s, 1.0f / s};
}
__device__ __forceinline__ float mxfp8_round(float v, Mxfp8Scale sc) {
  return v41::e4m3_decode(v41::e4m3_encode(v * sc.inv)) * sc.s;
}

// The fake-quant value of the lane's element within its warp's 32-element block.
__device__ __forceinline__ float mxfp8_fake_quant_lane(float v) {
  float a = fabsf(v);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
  return mxfp8_round(v, mxfp8_scale(a));
}

__device__ __forceinline__ void store_act(void* out, ActivationType type, int64_t i, float v) {
  if (type == ActivationType::kBF16) {
    static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
  } else {
    static_cast<float*>(out)[i] = v;
  }
}

__global__ void __launch_bounds__(kQuantThreads) act_quant_kernel(ActQuantParams p) {
  const int64_t rows = p.device_rows != nullptr ? *p.device_rows : p.rows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t blocks = p.cols / 32;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t src = p.row_index != nullptr ? p.row_index[r] : r;
    const float* x = p.x + src * p.ldx;
    for (int64_t b = warp; b < blocks; b += kQuantThreads / 32) {
      const float q = mxfp8_fake_quant_lane(x[b * 32 + lane]);
      store_act(p.out, p.out_type, r * p.ldo + b * 32 + lane, q);
    }
  }
}

// 8 consecutive elements per thread (two float4 loads, one 16-byte bf16 store): a 32-element
// block is 4 lanes, its amax two shuffles. The same float operations per element as
// mxfp8_fake_quant_lane, so bit-identical to it. grid (column chunks of 2048, row stride).
__device__ __forceinline__ void fake_quant8(float (&v)[8]) {
  float a = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) a = fmaxf(a, fabsf(v[e]));
  a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, 1));
  a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, 2));
  const Mxfp8Scale sc = mxfp8_scale(a);
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] = mxfp8_round(v[e], sc);
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

constexpr int kVecCols = kQuantThreads * 8;  // columns per block of the vector kernels

__global__ void __launch_bounds__(kQuantThreads) act_quant_vec_kernel(ActQuantParams p) {
  const int64_t rows = p.device_rows != nullptr ? *p.device_rows : p.rows;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kVecCols + threadIdx.x * 8;
  // cols % 32 == 0: a 4-lane group is wholly inside or outside the row, and the shuffles of
  // the groups past the end are never used (the whole warp still takes part).
  const bool live = c < p.cols;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t src = p.row_index != nullptr ? p.row_index[r] : r;
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (live) {
      const auto* x = reinterpret_cast<const float4*>(p.x + src * p.ldx + c);
      const float4 a = x[0], b = x[1];
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
      v[7] = b.w;
    }
    fake_quant8(v);
    if (live) store_act8(p.out, p.out_type, r * p.ldo + c, v);
  }
}

__global__ void __launch_bounds__(kQuantThreads) swiglu_quant_vec_kernel(SwigluQuantParams p) {
  const int64_t rows = p.device_rows != nullptr ? *p.device_rows : p.rows;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kVecCols + threadIdx.x * 8;
  const bool live = c < p.cols;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (live) {
      const auto* g4 = reinterpret_cast<const float4*>(p.gate + r * p.ld + c);
      const auto* u4 = reinterpret_cast<const float4*>(p.up + r * p.ld + c);
      const float4 ga = g4[0], gb = g4[1], ua = u4[0], ub = u4[1];
      const float gs[8] = {ga.x, ga.y, ga.z, ga.w, gb.x, gb.y, gb.z, gb.w};
      const float us[8] = {ua.x, ua.y, ua.z, ua.w, ub.x, ub.y, ub.z, ub.w};
      const float w = p.row_weight != nullptr ? p.row_weight[r] : 1.0f;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        // Same expression order as swiglu_quant_kernel.
        const float g = fminf(gs[e], p.limit);
        const float u = fminf(fmaxf(us[e], -p.limit), p.limit);
        v[e] = g / (1.0f + expf(-g)) * u;
        if (p.row_weight != nullptr) v[e] *= w;
      }
    }
    fake_quant8(v);
    if (live) store_act8(p.out, p.out_type, r * p.ldo + c, v);
  }
}

__global__ void __launch_bounds__(kQuantThreads) swiglu_quant_kernel(SwigluQuantParams p) {
  const int64_t rows = p.device_rows != nullptr ? *p.device_rows : p.rows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t blocks = p.cols / 32;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    for (int64_t b = warp; b < blocks; b += kQuantThreads / 32) {
      const int64_t c = b * 32 + lane;
      // Same expression order as launch_swiglu_clamped and the CPU expert.
      const float g = fminf(p.gate[r * p.ld + c], p.limit);
      const float u = fminf(fmaxf(p.up[r * p.ld + c], -p.limit), p.limit);
      float v = g / (1.0f + expf(-g)) * u;
      if (p.row_weight != nullptr) v *= p.row_weight[r];
      store_act(p.out, p.out_type, r * p.ldo + c, mxfp8_fake_quant_lane(v));
    }
  }
}

constexpr int kGroupThreads = 1024;

__global__ void __launch_bounds__(kGroupThreads) moe_group_kernel(MoeGroupParams p) {
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
  for (int64_t i = threadIdx.x; i < hits; i += blockDim.x) {
    int32_t id;
    float w;
    pick(i, &id, &w);
    if (id >= 0 && id < p.local) atomicAdd(&count[id], 1);
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
    if (id >= 0 && id < p.local) {
      const int32_t pos = atomicAdd(&cursor[id], 1);
      p.perm_row[pos] = static_cast<int32_t>(i / p.k);
      p.perm_weight[pos] = w;
      p.inv[i] = pos;
    } else {
      p.inv[i] = -1;
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
  grouped_mxfp4_gemm_body<kTM, kTK, 1>(p);
}

constexpr int kKSplit = 4;
template <int kTM, int kTK>
__global__ void __cluster_dims__(kKSplit, 1, 1) __launch_bounds__(kGemmThreads)
    grouped_mxfp4_gemm_split_kernel(GroupedMxfp4GemmParams p) {
  grouped_mxfp4_gemm_body<kTM, kTK, kKSplit>(p);
}

__global__ void dequant_fp8_kernel(const uint8_t* w, const uint8_t* s, int64_t n, int64_t k,
                                   __nv_bfloat16* out) {
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

// Row blocks of the vector kernels: all rows when the count is known on the host; when the count
// is read on the device, `rows` is only an upper bound (e.g. every hit on a local expert) and the
// blocks loop over the rows, so a few hundred keep the GPU busy without launching thousands that
// find nothing to do.
int vec_row_blocks(int64_t rows, bool device_count) {
  return device_count ? static_cast<int>(std::min<int64_t>(std::max<int64_t>(rows, 1), 256))
                      : quant_grid(rows);
}

// The vector kernel (8 elements per thread; grid: 2048-column chunks x row blocks) when the
// pointers and pitches allow it, else the scalar one (a block per row).
template <typename P>
void launch_quant_rows(void (*vec_kernel)(P), void (*scalar_kernel)(P), bool vec, const P& p,
                       Stream stream) {
  const cudaStream_t s = as_cuda_stream(stream);
  if (vec) {
    const dim3 grid(static_cast<unsigned>(ceil_div(p.cols, kVecCols)),
                    static_cast<unsigned>(vec_row_blocks(p.rows, p.device_rows != nullptr)));
    vec_kernel<<<grid, kQuantThreads, 0, s>>>(p);
  } else {
    scalar_kernel<<<quant_grid(p.rows), kQuantThreads, 0, s>>>(p);
  }
  MS_CUDA_CHECK_LAUNCH();
}

void bad_args(const char* what, const char* need) {
  detail::cuda_call_failed(__FILE__, __LINE__, what, "bad arguments", need);
}

}  // namespace

void launch_act_quant_mxfp8(const ActQuantParams& p, Stream stream) {
  if (p.rows == 0 || p.cols == 0) return;
  if (p.cols % 32 != 0 || p.ldx < p.cols || p.ldo < p.cols)
    bad_args("launch_act_quant_mxfp8", "cols % 32 == 0, ldx >= cols, ldo >= cols");
  const bool vec = p.ldx % 4 == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0 &&
                   p.ldo % 8 == 0 && reinterpret_cast<uintptr_t>(p.out) % 16 == 0;
  launch_quant_rows(act_quant_vec_kernel, act_quant_kernel, vec, p, stream);
}

void launch_swiglu_quant_mxfp8(const SwigluQuantParams& p, Stream stream) {
  if (p.rows == 0 || p.cols == 0) return;
  if (p.cols % 32 != 0 || p.ld < p.cols || p.ldo < p.cols)
    bad_args("launch_swiglu_quant_mxfp8", "cols % 32 == 0, ld >= cols, ldo >= cols");
  const bool vec = p.ld % 4 == 0 && reinterpret_cast<uintptr_t>(p.gate) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(p.up) % 16 == 0 && p.ldo % 8 == 0 &&
                   reinterpret_cast<uintptr_t>(p.out) % 16 == 0;
  launch_quant_rows(swiglu_quant_vec_kernel, swiglu_quant_kernel, vec, p, stream);
}

void launch_moe_group(const MoeGroupParams& p, Stream stream) {
  if (p.local <= 0 || p.local > 4096 || p.k <= 0)
    bad_args("launch_moe_group", "0 < local <= 4096, k > 0");
  const size_t smem = sizeof(int32_t) * 2 * static_cast<size_t>(p.local);
  moe_group_kernel<<<1, kGroupThreads, smem, as_cuda_stream(stream)>>>(p);
  MS_CUDA_CHECK_LAUNCH();
}

void launch_grouped_mxfp4_gemm(const GroupedMxfp4GemmParams& p, Stream stream) {
  if (p.num_experts == 0 || p.max_rows == 0 || p.n == 0) return;
  if (p.k % 32 != 0 || p.k <= 0 || p.lda % 8 != 0 || p.lda < p.k || p.ldy < p.n ||
      reinterpret_cast<uintptr_t>(p.a) % 16 != 0 || p.num_experts > 65535)
    bad_args("launch_grouped_mxfp4_gemm",
             "K % 32 == 0, lda % 8 == 0, lda >= K, ldy >= N, a 16-byte aligned");
  const bool small = p.rows_hint <= 24;
  const int tm = small ? 16 : 64;
  const int64_t n_tiles = ceil_div(p.n, kTileN);
  // Skinny batches whose (column tile, expert) CTAs would not fill the GPU about four times over
  // split K over a 4-CTA cluster (one M tile per expert is the expected case at these hints).
  const bool split = small && p.k % 128 == 0 && n_tiles * p.num_experts < 4 * 132;
  // M tiles per expert in the grid: twice the expected rows (rows_hint), at least 1; CTAs loop
  // over further tiles when an expert gets more rows.
  const int64_t m_tiles = std::min(ceil_div(p.max_rows, tm),
                                   std::max<int64_t>(1, ceil_div(2 * std::max<int64_t>(p.rows_hint, 1), tm)));
  const dim3 grid(static_cast<unsigned>(n_tiles * (split ? kKSplit : 1)),
                  static_cast<unsigned>(m_tiles), static_cast<unsigned>(p.num_experts));
  if (grid.y > 65535) bad_args("launch_grouped_mxfp4_gemm", "max_rows / tile <= 65535");
  const cudaStream_t s = as_cuda_stream(stream);
  if (split) {
    grouped_mxfp4_gemm_split_kernel<16, 128><<<grid, kGemmThreads, 0, s>>>(p);
  } else if (small && p.k % 128 == 0) {
    grouped_mxfp4_gemm_kernel<16, 128><<<grid, kGemmThreads, 0, s>>>(p);
  } else if (small) {
    grouped_mxfp4_gemm_kernel<16, 32><<<grid, kGemmThreads, 0, s>>>(p);
  } else {
    grouped_mxfp4_gemm_kernel<64, 32><<<grid, kGemmThreads, 0, s>>>(p);
  }
  MS_CUDA_CHECK_LAUNCH();
}

void launch_dequant_fp8_block_to_bf16(const uint8_t* w, const uint8_t* w_scale, int64_t n,
                                      int64_t k, void* out, Stream stream) {
  if (n == 0) return;
  if (k % 32 != 0) bad_args("launch_dequant_fp8_block_to_bf16", "K % 32 == 0");
  const int64_t total = n * k;
  const int grid = static_cast<int>(std::min<int64_t>(ceil_div(total, 256), 65535));
  dequant_fp8_kernel<<<grid, 256, 0, as_cuda_stream(stream)>>>(w, w_scale, n, k,
                                                               static_cast<__nv_bfloat16*>(out));
  MS_CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda
