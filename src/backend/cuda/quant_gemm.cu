// Block-scaled weight GEMMs: y = x · dequant(W)^T for FP8 e4m3 weights with 32x32 ue8m0 block
// scales and MXFP4 (e2m1 + ue8m0 per 32 along K) weights. A straightforward tiled kernel, correct
// first: each 64x64 output tile walks K in steps of 32 (one scale block); the x tile is converted
// to bf16 and the W tile dequantised to bf16 (exact: e4m3/e2m1 times a power of two) in shared
// memory, then four warps multiply with bf16 WMMA (HMMA) into fp32 accumulators.
// NOTE: no pipelining, no wgmma, no split-K yet; skinny M (decode) underfills the GPU.
#include <cuda_bf16.h>
#include <mma.h>

#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/kernels.h"

namespace moeserve::cuda {
namespace {

constexpr int kTileM = 64;
constexpr int kTileN = 64;
constexpr int kTileK = 32;
constexpr int kPadK = kTileK + 8;  // bf16 row pitch in shared memory (80 B: WMMA-aligned)
constexpr int kPadN = kTileN + 4;  // fp32 pitch of the output staging tile
constexpr int kThreads = 128;      // 4 warps, 2x2, each a 32x32 sub-tile

enum class WeightFormat { kFp8Block32x32, kMxfp4 };

// e4m3fn code -> float (NaN for S.1111.111), same as common/numeric.h.
__device__ __forceinline__ float e4m3_to_float(uint32_t code) {
  const uint32_t sign = (code & 0x80u) << 24;
  const uint32_t exp = (code >> 3) & 0xFu;
  const uint32_t man = code & 0x7u;
  if (exp == 0) {
    const float mag = static_cast<float>(man) * 0x1p-9f;
    return sign ? -mag : mag;
  }
  if (exp == 0xF && man == 0x7) return __uint_as_float(sign | 0x7FC00000u);
  return __uint_as_float(sign | ((exp + 120u) << 23) | (man << 20));
}

// e2m1 nibble -> float: 0 .5 1 1.5 2 3 4 6, sign in bit 3.
__device__ __forceinline__ float e2m1_to_float(uint32_t nibble) {
  const uint32_t exp = (nibble >> 1) & 0x3u;
  const uint32_t man = nibble & 0x1u;
  const float mag = exp == 0 ? 0.5f * static_cast<float>(man)
                             : __uint_as_float(((exp + 126u) << 23) | (man << 22));
  return (nibble & 0x8u) ? -mag : mag;
}

// ue8m0 code -> 2^(code-127) (code 0 is 2^-127, a float subnormal; 255 is NaN).
__device__ __forceinline__ float ue8m0_to_float(uint32_t code) {
  if (code == 0) return __uint_as_float(0x00400000u);
  if (code == 0xFF) return __uint_as_float(0x7FC00000u);
  return __uint_as_float(code << 23);
}

template <typename XT>
__device__ __forceinline__ __nv_bfloat16 load_act(const XT* x, int64_t i);
template <>
__device__ __forceinline__ __nv_bfloat16 load_act<float>(const float* x, int64_t i) {
  return __float2bfloat16_rn(x[i]);
}
template <>
__device__ __forceinline__ __nv_bfloat16 load_act<__nv_bfloat16>(const __nv_bfloat16* x,
                                                                 int64_t i) {
  return x[i];
}

struct GemmArgs {
  const void* x;
  int64_t ldx;
  const uint8_t* w;
  const uint8_t* w_scale;
  float* y;
  int64_t ldy;
  int64_t m, n, k;
};

template <typename XT, WeightFormat kFormat>
__global__ void __launch_bounds__(kThreads) block_scaled_gemm_kernel(GemmArgs p) {
  pdl_wait();
  using namespace nvcuda;
  __shared__ alignas(128) __nv_bfloat16 a_tile[kTileM][kPadK];
  __shared__ alignas(128) __nv_bfloat16 b_tile[kTileN][kPadK];
  __shared__ alignas(128) float c_tile[kTileM][kPadN];

  const XT* x = static_cast<const XT*>(p.x);
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int warp_m = (warp >> 1) * 32;
  const int warp_n = (warp & 1) * 32;

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  const int64_t k_blocks = p.k / kTileK;
  for (int64_t kb = 0; kb < k_blocks; ++kb) {
    const int64_t k0 = kb * kTileK;
    // x tile: 64 x 32, consecutive threads along K (coalesced).
    for (int e = tid; e < kTileM * kTileK; e += kThreads) {
      const int r = e / kTileK;
      const int c = e % kTileK;
      const int64_t row = m0 + r;
      a_tile[r][c] = row < p.m ? load_act<XT>(x, row * p.ldx + k0 + c) : __float2bfloat16_rn(0.0f);
    }
    if constexpr (kFormat == WeightFormat::kFp8Block32x32) {
      // W tile: 64 rows x 32 bytes; each thread dequantises 16 bytes (one uint4).
      const int r = tid >> 1;
      const int c = (tid & 1) * 16;
      const int64_t row = n0 + r;
      if (row < p.n) {
        const uint4 raw = *reinterpret_cast<const uint4*>(p.w + row * p.k + k0 + c);
        const float scale = ue8m0_to_float(p.w_scale[(row / 32) * (p.k / 32) + kb]);
        const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            b_tile[r][c + q * 4 + b] =
                __float2bfloat16_rn(e4m3_to_float((words[q] >> (8 * b)) & 0xFFu) * scale);
          }
        }
      } else {
#pragma unroll
        for (int i = 0; i < 16; ++i) b_tile[r][c + i] = __float2bfloat16_rn(0.0f);
      }
    } else {
      // W tile: 64 rows x 16 packed bytes; each thread dequantises 8 bytes (16 nibbles).
      const int r = tid >> 1;
      const int c = (tid & 1) * 16;
      const int64_t row = n0 + r;
      if (row < p.n) {
        const uint2 raw = *reinterpret_cast<const uint2*>(p.w + row * (p.k / 2) + (k0 + c) / 2);
        const float scale = ue8m0_to_float(p.w_scale[row * (p.k / 32) + kb]);
        const uint32_t words[2] = {raw.x, raw.y};
#pragma unroll
        for (int q = 0; q < 2; ++q) {
#pragma unroll
          for (int b = 0; b < 8; ++b) {  // nibble b of the word: element 2*byte (low) then 2*byte+1
            b_tile[r][c + q * 8 + b] =
                __float2bfloat16_rn(e2m1_to_float((words[q] >> (4 * b)) & 0xFu) * scale);
          }
        }
      } else {
#pragma unroll
        for (int i = 0; i < 16; ++i) b_tile[r][c + i] = __float2bfloat16_rn(0.0f);
      }
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTileK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a_frag[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b_frag[2];
#pragma unroll
      for (int i = 0; i < 2; ++i)
        wmma::load_matrix_sync(a_frag[i], &a_tile[warp_m + i * 16][kk], kPadK);
#pragma unroll
      for (int j = 0; j < 2; ++j)
        wmma::load_matrix_sync(b_frag[j], &b_tile[warp_n + j * 16][kk], kPadK);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a_frag[i], b_frag[j], acc[i][j]);
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(&c_tile[warp_m + i * 16][warp_n + j * 16], acc[i][j], kPadN,
                              wmma::mem_row_major);
  __syncthreads();
  for (int e = tid; e < kTileM * kTileN; e += kThreads) {
    const int r = e / kTileN;
    const int c = e % kTileN;
    if (m0 + r < p.m && n0 + c < p.n) p.y[(m0 + r) * p.ldy + n0 + c] = c_tile[r][c];
  }
}

template <WeightFormat kFormat>
void launch_block_scaled_gemm(const GemmArgs& args, ActivationType x_type, Stream stream) {
  if (args.m == 0 || args.n == 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div(args.n, kTileN)),
                  static_cast<unsigned>(ceil_div(args.m, kTileM)));
  MS_CUDA_CHECK(launch_kernel(x_type == ActivationType::kF32
                                  ? block_scaled_gemm_kernel<float, kFormat>
                                  : block_scaled_gemm_kernel<__nv_bfloat16, kFormat>,
                              grid, kThreads, 0, as_cuda_stream(stream), args));
}

void check_args(const GemmArgs& a, ActivationType x_type, const char* what) {
  const bool ok = a.k % kTileK == 0 && a.k > 0 && a.m >= 0 && a.n >= 0 && a.ldx >= a.k &&
                  a.ldy >= a.n && reinterpret_cast<uintptr_t>(a.w) % 16 == 0 &&
                  (x_type == ActivationType::kF32 || x_type == ActivationType::kBF16);
  if (!ok)
    detail::cuda_call_failed(__FILE__, __LINE__, what, "bad arguments",
                             "K % 32 == 0, ldx >= K, ldy >= N, W 16-byte aligned, x fp32 or bf16");
}

}  // namespace

void launch_fp8_block_gemm(const Fp8BlockGemmParams& p, Stream stream) {
  const GemmArgs args{p.x, p.ldx, p.w, p.w_scale, p.y, p.ldy, p.m, p.n, p.k};
  check_args(args, p.x_type, "launch_fp8_block_gemm");
  launch_block_scaled_gemm<WeightFormat::kFp8Block32x32>(args, p.x_type, stream);
}

void launch_mxfp4_gemm(const Mxfp4GemmParams& p, Stream stream) {
  const GemmArgs args{p.x, p.ldx, p.w, p.w_scale, p.y, p.ldy, p.m, p.n, p.k};
  check_args(args, p.x_type, "launch_mxfp4_gemm");
  launch_block_scaled_gemm<WeightFormat::kMxfp4>(args, p.x_type, stream);
}

}  // namespace moeserve::cuda
