// FP8 grouped MXFP4 GEMM (kernels.h launch_grouped_fp8_gemm): moe_fp8.cuh's K loop over the
// grouped rows of each expert, one CTA per (128 weight rows, pass of up to 192 rows, expert),
// then the epilogue y = D * 2^(ref - 127) * a_scale straight from the accumulators (4-byte stores:
// 8 consecutive weight rows of 4 grouped rows per warp store, whole 32-byte sectors, as the bf16
// rs kernel's). Rows past the expert's count are zero-filled in shared memory and not stored.
// Written in r13 without a device run; tools/device/moe_fp8_probe.cu times the same K loop.
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/moe_fp8.cuh"

namespace moeserve::cuda {
namespace {

__global__ void __launch_bounds__(mfp8::kThreads, 1) grouped_fp8_gemm_kernel(GroupedFp8GemmParams p) {
  pdl_wait();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  const int e = blockIdx.z;
  const int64_t row0 = p.offsets[e] + static_cast<int64_t>(blockIdx.y) * mfp8::kTN;
  const int64_t end = p.offsets[e + 1];
  if (row0 >= end) return;  // uniform per CTA
  const int rows = static_cast<int>(end - row0 < mfp8::kTN ? end - row0 : mfp8::kTN);
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                             ~uintptr_t{1023});
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * mfp8::kBW;
  const int wgi = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int r0 = 64 * wgi + 16 * warp + g;  // tile-local weight rows r0, r0 + 8
  const uint8_t* wref = p.w_ref[e] + n0;
  const int ref0 = wref[r0], ref1 = wref[r0 + 8];
  const uint8_t* a = p.a + row0 * p.lda;
  const uint8_t* w = p.w[e] + n0 * (p.k / 2);
  const uint8_t* ws = p.w_scale[e] + n0 * (p.k / 32);
  const auto load = [&](int kt, uint8_t* st) {
    mfp8::load_a(st, a, p.lda, rows, kt);
    mfp8::load_w(st, w, ws, p.k, kt);
  };
  float acc[96];
  mfp8::k_loop(smem, static_cast<int>(p.k / mfp8::kBK), r0, t, ref0, ref1, acc, load);
  // d[4i + 2h + v] = D[16 warp + g + 8h][8i + 2t + v]: weight row r0 + 8h (tile-local), grouped
  // row 8i + 2t + v of the pass.
  const float sc[2] = {ldexpf(1.0f, ref0 - 127), ldexpf(1.0f, ref1 - 127)};
#pragma unroll
  for (int i = 0; i < 24; ++i) {
#pragma unroll
    for (int v = 0; v < 2; ++v) {
      const int r = 8 * i + 2 * t + v;
      if (r >= rows) continue;
      const float as = p.a_scale[row0 + r];
      float* y = p.y + (row0 + r) * p.ldy + n0 + r0;
#pragma unroll
      for (int h = 0; h < 2; ++h) y[8 * h] = acc[4 * i + 2 * h + v] * (sc[h] * as);
    }
  }
#endif
}

__global__ void mxfp4_row_ref_kernel(const uint8_t* w_scale, int64_t n, int64_t kb, uint8_t* ref) {
  pdl_wait();
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < n;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int m = 0;
    for (int64_t b = 0; b < kb; ++b) m = max(m, static_cast<int>(w_scale[r * kb + b]));
    ref[r] = static_cast<uint8_t>(max(m, 6) - 6);
  }
}

void bad_args(const char* what, const char* need) {
  detail::cuda_call_failed(__FILE__, __LINE__, what, "bad arguments", need);
}

}  // namespace

void launch_grouped_fp8_gemm(const GroupedFp8GemmParams& p, Stream stream) {
  if (p.num_experts == 0 || p.max_rows == 0 || p.n == 0) return;
  if (p.n % mfp8::kBW != 0 || p.k <= 0 || p.k % mfp8::kBK != 0 || p.lda % 16 != 0 || p.lda < p.k ||
      p.ldy < p.n || reinterpret_cast<uintptr_t>(p.a) % 16 != 0 || p.num_experts > 65535 ||
      p.a == nullptr || p.a_scale == nullptr || p.offsets == nullptr || p.w == nullptr ||
      p.w_scale == nullptr || p.w_ref == nullptr || p.y == nullptr ||
      (p.max_rows + mfp8::kTN - 1) / mfp8::kTN > 65535)
    bad_args("launch_grouped_fp8_gemm",
             "n % 128 == 0, k % 128 == 0, lda % 16 == 0, lda >= k, ldy >= n, a 16-byte aligned, "
             "every pointer set, experts and passes <= 65535");
  static const bool hopper = [] {
    if (device_cc_major() != 9) return false;
    MS_CUDA_CHECK(cudaFuncSetAttribute(grouped_fp8_gemm_kernel,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       mfp8::kSmemBytes));
    return true;
  }();
  if (!hopper) bad_args("launch_grouped_fp8_gemm", "an sm_90 (Hopper) device");
  const dim3 grid(static_cast<unsigned>(p.n / mfp8::kBW),
                  static_cast<unsigned>((p.max_rows + mfp8::kTN - 1) / mfp8::kTN),
                  static_cast<unsigned>(p.num_experts));
  MS_CUDA_CHECK(launch_kernel(grouped_fp8_gemm_kernel, grid, mfp8::kThreads, mfp8::kSmemBytes,
                              as_cuda_stream(stream), p));
}

void launch_mxfp4_row_ref(const uint8_t* w_scale, int64_t n, int64_t k, uint8_t* ref,
                          Stream stream) {
  if (n == 0) return;
  if (k <= 0 || k % 32 != 0 || w_scale == nullptr || ref == nullptr)
    bad_args("launch_mxfp4_row_ref", "k % 32 == 0, k > 0, w_scale and ref set");
  const int grid = static_cast<int>(std::min<int64_t>((n + 255) / 256, 65535));
  MS_CUDA_CHECK(launch_kernel(mxfp4_row_ref_kernel, grid, 256, 0, as_cuda_stream(stream), w_scale,
                              n, k / 32, ref));
}

}  // namespace moeserve::cuda
