// Row-scaled FP8 operands (kernels.h "Row-scaled FP8"): the MXFP8 activation quantiser with the
// refold onto one scale per row, the same refold of the checkpoint's FP8 weights, and the outer
// scaling of a GEMM run without its scales.
//
// The refold of a code q of a block with scale code s onto the row's reference code R:
// e4m3_rn(e4m3(q) * 2^(s - R)) (for activations s - R <= 1, kernels.h). The decode is exact (the hardware e4m3 -> f16 conversion), the
// product by a power of two is exact in fp32 (d = s - R is clamped at -40, where every e4m3 value
// rounds to 0 anyway: 448 * 2^-40 < 2^-10), and the encode is the saturating round-to-nearest-
// even cvt (v41::e4m3_encode's), so the host oracle in the tests is float_to_e4m3(e4m3_to_float(q)
// * 2^d) and the outputs are compared bit for bit.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/v41_device.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxCols = 65536;

// 2^d as a float for d in [-40, 6].
__device__ __forceinline__ float pow2(int d) { return __uint_as_float(static_cast<uint32_t>(127 + d) << 23); }

// The CTA's largest v (blockDim.x a multiple of 32; red holds blockDim.x / 32 words).
__device__ __forceinline__ uint32_t block_max_u32(uint32_t v, uint32_t* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  const int warp = threadIdx.x >> 5;
  if ((threadIdx.x & 31) == 0) red[warp] = v;
  __syncthreads();
  uint32_t m = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) m = max(m, red[w]);
  return m;
}

// One 8-column chunk of output row r (source row src, column c; `live`: c < cols, a 32-wide
// block's 4 lanes live together): the MXFP8 rule's scale (v41::mxfp8_scale, as
// launch_act_quant_mxfp8) and codes into q / code, and the block's reference code folded into m.
// The 4 lanes of a block are consecutive lanes of one warp (xor shuffles 1 and 2), so every lane
// of the warp calls it together.
__device__ __forceinline__ void quant_chunk(const ActQuantFp8RowsParams& p, int64_t r, int64_t src,
                                            float rs, int64_t c, bool live, uint2& q,
                                            uint32_t& code, uint32_t& m) {
  float v[8];
  // An empty row (row_index -1; with swiglu.skip_zero_weight, a zero routing weight): zeros.
  const bool empty =
      src < 0 || (p.swiglu.skip_zero_weight && p.swiglu.row_weight[r] == 0.0f);
  if (live && empty) {
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = 0.0f;
  } else if (live && p.swiglu.up != nullptr) {
    const ActQuantFp8RowsParams::SwigluInput& sw = p.swiglu;
    const v41::SwigluScales sc{sw.row_scale, sw.gate_col_scale, sw.up_col_scale,
                               sw.ld_col_scale, sw.group_rows};
    if (p.x_type == ActivationType::kBF16) {
      v41::swiglu8(static_cast<const uint16_t*>(p.x) + src * p.ldx + c,
                   static_cast<const uint16_t*>(sw.up) + src * p.ldx + c, r, c, sw.row_weight,
                   sw.limit, sc, v);
    } else {
      v41::swiglu8(static_cast<const float*>(p.x) + src * p.ldx + c,
                   static_cast<const float*>(sw.up) + src * p.ldx + c, r, c, sw.row_weight,
                   sw.limit, sc, v);
    }
  } else if (live && p.x_type == ActivationType::kBF16) {
    const uint4 raw = *reinterpret_cast<const uint4*>(
        static_cast<const __nv_bfloat16*>(p.x) + src * p.ldx + c);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      v[2 * e] = __uint_as_float(w[e] << 16);
      v[2 * e + 1] = __uint_as_float(w[e] & 0xFFFF0000u);
    }
  } else if (live) {
    const float4* x =
        reinterpret_cast<const float4*>(static_cast<const float*>(p.x) + src * p.ldx + c);
    const float4 x0 = x[0], x1 = x[1];
    v[0] = x0.x, v[1] = x0.y, v[2] = x0.z, v[3] = x0.w;
    v[4] = x1.x, v[5] = x1.y, v[6] = x1.z, v[7] = x1.w;
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = 0.0f;
  }
  if (live && p.in_row_scale != nullptr) {
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] *= rs * p.in_col_scale[c + e];
  }
  v41::fp8_rows_quant8(v, live, q, code, m);
}

// A chunk's codes refolded onto the row's reference code R and stored (kperm_fp8 as asked).
__device__ __forceinline__ void store_chunk(const ActQuantFp8RowsParams& p, int64_t r, int64_t c,
                                            uint2 q, uint32_t code, uint32_t R) {
  q.x = v41::fp8_rows_refold4(q.x, code, R);
  q.y = v41::fp8_rows_refold4(q.y, code, R);
  if (p.kperm_fp8) {
    // Natural k [c, c + 8) of a 64-wide block is k = 16 t + 8 s + 4 j + e with 2 t + s =
    // (c % 64) / 8: words j = 0 and 1 go to columns 32 s + 4 t and 32 s + 16 + 4 t.
    const int64_t blk = c & ~int64_t{63};
    const int qi = static_cast<int>((c & 63) >> 3), t4 = qi >> 1, s2 = qi & 1;
    uint8_t* o = p.out + r * p.ldo + blk + 32 * s2 + 4 * t4;
    *reinterpret_cast<uint32_t*>(o) = q.x;
    *reinterpret_cast<uint32_t*>(o + 16) = q.y;
  } else {
    *reinterpret_cast<uint2*>(p.out + r * p.ldo + c) = q;
  }
}

// The activation quantiser: one CTA per row (grid-stride), the whole row in registers: chunk j
// of thread t is the 8 columns from 8 (j * blockDim + t), CPT chunks per thread (a 32-wide block
// is 4 lanes of one chunk). Per chunk quant_chunk; the row's largest reference code R by a block
// reduction; then each chunk's codes refolded and stored once.
template <int CPT>
__global__ void __launch_bounds__(1024) act_quant_fp8_rows_kernel(ActQuantFp8RowsParams p) {
  pdl_wait();
  __shared__ uint32_t red[32];
  const int64_t rows = p.device_rows != nullptr ? *p.device_rows : p.rows;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t src = p.row_index != nullptr ? p.row_index[r] : r;
    const float rs = p.in_row_scale != nullptr ? p.in_row_scale[r] : 1.0f;
    uint2 q[CPT];
    uint32_t code[CPT];
    uint32_t m = 0;
#pragma unroll
    for (int j = 0; j < CPT; ++j) {
      const int64_t c = (static_cast<int64_t>(j) * blockDim.x + threadIdx.x) * 8;
      quant_chunk(p, r, src, rs, c, c < p.cols, q[j], code[j], m);
    }
    const uint32_t R = block_max_u32(m, red);
#pragma unroll
    for (int j = 0; j < CPT; ++j) {
      const int64_t c = (static_cast<int64_t>(j) * blockDim.x + threadIdx.x) * 8;
      if (c < p.cols) store_chunk(p, r, c, q[j], code[j], R);
    }
    if (threadIdx.x == 0) p.row_scale[r] = v41::ue8m0_decode(R);
    __syncthreads();  // red is rewritten by the next row
  }
}

// The same quantiser with one WARP per row (kWarpRowsPerCta rows per CTA, grid-stride over row
// groups): chunk j of lane l is the 8 columns from 8 (32 j + l), CPL chunks per lane, R by warp
// shuffles (no CTA barrier). More rows in flight and more loads per thread than a CTA per row:
// for the padded experts' thousands of short rows. The same codes and row scales.
constexpr int kWarpRowsPerCta = 8;
template <int CPL>
__global__ void __launch_bounds__(32 * kWarpRowsPerCta) act_quant_fp8_rows_warp_kernel(
    ActQuantFp8RowsParams p) {
  pdl_wait();
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t warp = blockIdx.x * static_cast<int64_t>(kWarpRowsPerCta) + (threadIdx.x >> 5);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpRowsPerCta;
  const int64_t rows = p.device_rows != nullptr ? *p.device_rows : p.rows;
  for (int64_t r = warp; r < rows; r += warps) {
    const int64_t src = p.row_index != nullptr ? p.row_index[r] : r;
    const float rs = p.in_row_scale != nullptr ? p.in_row_scale[r] : 1.0f;
    uint2 q[CPL];
    uint32_t code[CPL];
    uint32_t m = 0;
#pragma unroll
    for (int j = 0; j < CPL; ++j) {
      const int64_t c = (static_cast<int64_t>(j) * 32 + lane) * 8;
      quant_chunk(p, r, src, rs, c, c < p.cols, q[j], code[j], m);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
#pragma unroll
    for (int j = 0; j < CPL; ++j) {
      const int64_t c = (static_cast<int64_t>(j) * 32 + lane) * 8;
      if (c < p.cols) store_chunk(p, r, c, q[j], code[j], m);
    }
    if (lane == 0) p.row_scale[r] = v41::ue8m0_decode(m);
  }
}

// One CTA per weight row (grid-stride): R over the row's 32x32-block scale row, then the codes
// refolded 4 at a time.
__global__ void __launch_bounds__(kThreads) fold_fp8_block_rows_kernel(const uint8_t* w,
                                                                       const uint8_t* w_scale,
                                                                       int64_t n, int64_t k,
                                                                       uint8_t* out,
                                                                       float* row_scale) {
  pdl_wait();
  __shared__ uint32_t red[kThreads / 32];
  const int64_t kb = k / 32;
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const uint8_t* s = w_scale + (r / 32) * kb;
    uint32_t m = 0;
    for (int64_t b = threadIdx.x; b < kb; b += kThreads) m = max(m, static_cast<uint32_t>(s[b]));
    const uint32_t R = block_max_u32(m, red);
    for (int64_t c = threadIdx.x * 4; c < k; c += kThreads * 4) {
      uint32_t q;
      memcpy(&q, w + r * k + c, 4);
      q = v41::fp8_rows_refold4(q, s[c / 32], R);
      memcpy(out + r * k + c, &q, 4);
    }
    if (threadIdx.x == 0) row_scale[r] = v41::ue8m0_decode(R);
    __syncthreads();
  }
}

// One CTA per weight row (grid-stride): R over the row's scale codes, then 8 elements (4 packed
// bytes, one 32-wide block) per thread and step: code = e4m3(e2m1 * 2^(s_b - R + 6)), the
// product exact in fp32 and the conversion round-to-nearest-even (exact where representable).
__global__ void __launch_bounds__(kThreads) fold_mxfp4_rows_kernel(const uint8_t* w,
                                                                   const uint8_t* w_scale,
                                                                   int64_t n, int64_t k,
                                                                   uint8_t* out,
                                                                   float* row_scale) {
  pdl_wait();
  __shared__ uint32_t red[kThreads / 32];
  const int64_t kb = k / 32;
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const uint8_t* s = w_scale + r * kb;
    uint32_t m = 0;
    for (int64_t b = threadIdx.x; b < kb; b += kThreads) m = max(m, static_cast<uint32_t>(s[b]));
    const int R = static_cast<int>(block_max_u32(m, red));
    for (int64_t c = threadIdx.x * 8; c < k; c += kThreads * 8) {
      const float f = pow2(max(static_cast<int>(s[c / 32]) - R + 6, -40));
      uint32_t packed;
      memcpy(&packed, w + r * (k / 2) + c / 2, 4);
      uint32_t q[2] = {0, 0};
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float v = v41::e2m1_decode((packed >> (4 * e)) & 0xFu) * f;
        const uint32_t code = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
        q[e / 4] |= code << (8 * (e % 4));
      }
      memcpy(out + r * k + c, q, 8);
    }
    if (threadIdx.x == 0) row_scale[r] = ldexpf(1.0f, R - 133);
    __syncthreads();
  }
}

// 16 bytes per item, grid-stride over rows x cols / 16 items; the item at column 0 writes the
// row's scale.
__global__ void gather_fp8_rows_kernel(GatherFp8RowsParams p) {
  pdl_wait();
  const int64_t per_row = p.cols / 16, items = p.rows * per_row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < items;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, j = i - r * per_row;
    const int64_t src = p.row_index[r];
    uint4 v = make_uint4(0, 0, 0, 0);
    if (src >= 0) v = *reinterpret_cast<const uint4*>(p.src + src * p.ld_src + j * 16);
    *reinterpret_cast<uint4*>(p.out + r * p.ldo + j * 16) = v;
    if (j == 0) {
      // A zero row's scale as act_quant_fp8_rows_kernel computes it: every block's reference
      // code is the MXFP8 rule's at amax 0.
      p.out_scale[r] = src >= 0 ? p.src_scale[src]
                                : v41::ue8m0_decode(v41::mxfp8_scale(
                                      v41::e4m3_decode(0u) * v41::mxfp8_scale(0.0f).s).code);
    }
  }
}

__global__ void scale_rows_cols_kernel(float* y, int64_t ldy, int64_t m, int64_t n,
                                       const float* row_scale, const float* col_scale) {
  pdl_wait();
  const int64_t total = m * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / n, c = i % n;
    y[r * ldy + c] *= row_scale[r] * col_scale[c];
  }
}

void bad_args(const char* what, const char* need) {
  detail::cuda_call_failed(__FILE__, __LINE__, what, "bad arguments", need);
}

unsigned row_grid(int64_t rows) {
  return static_cast<unsigned>(std::min<int64_t>(rows, int64_t{1} << 30));
}

}  // namespace

void launch_act_quant_fp8_rows(const ActQuantFp8RowsParams& p, Stream stream) {
  if (p.rows == 0) return;
  const size_t esize = p.x_type == ActivationType::kBF16 ? 2 : 4;
  if (p.cols <= 0 || p.cols % 32 != 0 || p.cols > kMaxCols || p.ldx < p.cols || p.ldo < p.cols ||
      p.rows < 0 || p.x == nullptr || p.out == nullptr || p.row_scale == nullptr ||
      (p.in_row_scale == nullptr) != (p.in_col_scale == nullptr) ||
      (p.swiglu.up != nullptr &&
       (p.in_row_scale != nullptr ||
        reinterpret_cast<uintptr_t>(p.swiglu.up) % 16 != 0 ||
        (p.swiglu.row_scale != nullptr &&
         (p.swiglu.gate_col_scale == nullptr || p.swiglu.up_col_scale == nullptr ||
          p.swiglu.group_rows < 1 || p.swiglu.ld_col_scale < p.cols)))) ||
      (p.swiglu.skip_zero_weight && (p.swiglu.up == nullptr || p.swiglu.row_weight == nullptr)) ||
      (p.kperm_fp8 && (p.cols % 64 != 0 || p.ldo % 4 != 0)) ||
      (p.min_chunks_per_thread != 0 && p.min_chunks_per_thread != 1 &&
       p.min_chunks_per_thread != 2 && p.min_chunks_per_thread != 4 &&
       p.min_chunks_per_thread != 8) ||
      (p.x_type != ActivationType::kF32 && p.x_type != ActivationType::kBF16) ||
      (p.ldx * esize) % 16 != 0 || reinterpret_cast<uintptr_t>(p.x) % 16 != 0 || p.ldo % 8 != 0 ||
      reinterpret_cast<uintptr_t>(p.out) % 8 != 0)
    bad_args("launch_act_quant_fp8_rows",
             "0 < cols <= 65536, cols % 32 == 0, ldx >= cols, ldo >= cols; x fp32 or bf16, "
             "16-byte aligned rows; out 8-byte aligned rows; out, row_scale set; in_row_scale and "
             "in_col_scale both set or both null; kperm_fp8: cols % 64 == 0; min_chunks_per_thread "
             "0, 1, 2, 4 or 8; swiglu: "
             "no in_row_scale, up 16-byte aligned, with row_scale both column scales, "
             "group_rows >= 1, ld_col_scale >= cols; skip_zero_weight with up and row_weight");
  // The warp-per-row kernel where asked and a lane's share fits (CPL 4, 8, 12, 16 or 24 chunks:
  // up to 6144 columns); a grid of at most 8 CTAs per SM with a device row count.
  const int64_t chunks = p.cols / 8;
  if (p.warp_per_row && chunks <= 32 * 24) {
    const int64_t per_lane = ceil_div(chunks, int64_t{32});
    auto* const wk = per_lane <= 4    ? act_quant_fp8_rows_warp_kernel<4>
                     : per_lane <= 8  ? act_quant_fp8_rows_warp_kernel<8>
                     : per_lane <= 12 ? act_quant_fp8_rows_warp_kernel<12>
                     : per_lane <= 16 ? act_quant_fp8_rows_warp_kernel<16>
                                      : act_quant_fp8_rows_warp_kernel<24>;
    const int64_t ctas = ceil_div(p.rows, int64_t{kWarpRowsPerCta});
    const unsigned wgrid = static_cast<unsigned>(
        p.device_rows != nullptr ? std::min<int64_t>(ctas, 8 * device_sm_count())
                                 : std::min<int64_t>(ctas, int64_t{1} << 30));
    MS_CUDA_CHECK(launch_kernel(wk, wgrid, 32 * kWarpRowsPerCta, 0, as_cuda_stream(stream), p));
    return;
  }
  // CPT chunks of 8 per thread with at most 1024 threads: 1 up to 8192 columns, else 2, 4, 8;
  // at least min_chunks_per_thread (fewer threads per row, more loads in flight per thread).
  const int cpt = std::max(chunks <= 1024 ? 1 : chunks <= 2048 ? 2 : chunks <= 4096 ? 4 : 8,
                           p.min_chunks_per_thread);
  const unsigned threads = static_cast<unsigned>((ceil_div(chunks, cpt) + 31) / 32 * 32);
  auto* const kernel = cpt == 1   ? act_quant_fp8_rows_kernel<1>
                       : cpt == 2 ? act_quant_fp8_rows_kernel<2>
                       : cpt == 4 ? act_quant_fp8_rows_kernel<4>
                                  : act_quant_fp8_rows_kernel<8>;
  // With a device row count, rows is only a bound (the MoE's every possible hit): a grid of at
  // most 8 CTAs per SM strides over the rows that exist.
  const unsigned grid = p.device_rows != nullptr
                            ? static_cast<unsigned>(std::min<int64_t>(p.rows, 8 * device_sm_count()))
                            : row_grid(p.rows);
  MS_CUDA_CHECK(launch_kernel(kernel, grid, threads, 0, as_cuda_stream(stream), p));
}

void launch_gather_fp8_rows(const GatherFp8RowsParams& p, Stream stream) {
  if (p.rows == 0) return;
  if (p.rows < 0 || p.cols <= 0 || p.cols % 16 != 0 || p.ld_src < p.cols || p.ldo < p.cols ||
      p.ld_src % 16 != 0 || p.ldo % 16 != 0 || p.src == nullptr || p.src_scale == nullptr ||
      p.row_index == nullptr || p.out == nullptr || p.out_scale == nullptr ||
      reinterpret_cast<uintptr_t>(p.src) % 16 != 0 || reinterpret_cast<uintptr_t>(p.out) % 16 != 0)
    bad_args("launch_gather_fp8_rows",
             "cols % 16 == 0, cols > 0; ld_src, ldo >= cols and % 16 == 0; src, out 16-byte "
             "aligned; src_scale, row_index, out_scale set");
  const int64_t items = p.rows * (p.cols / 16);
  const unsigned grid = static_cast<unsigned>(
      std::min<int64_t>((items + kThreads - 1) / kThreads, int64_t{16} * device_sm_count()));
  MS_CUDA_CHECK(launch_kernel(gather_fp8_rows_kernel, grid, kThreads, 0, as_cuda_stream(stream), p));
}

void launch_fold_mxfp4_rows(const uint8_t* w, const uint8_t* w_scale, int64_t n, int64_t k,
                            uint8_t* out, float* row_scale, Stream stream) {
  if (n == 0) return;
  if (n < 0 || k <= 0 || k % 32 != 0 || w == nullptr || w_scale == nullptr || out == nullptr ||
      row_scale == nullptr || reinterpret_cast<uintptr_t>(w) % 4 != 0 ||
      reinterpret_cast<uintptr_t>(out) % 8 != 0)
    bad_args("launch_fold_mxfp4_rows",
             "k % 32 == 0, k > 0; w (4-byte aligned), w_scale, out (8-byte aligned), row_scale set");
  MS_CUDA_CHECK(launch_kernel(fold_mxfp4_rows_kernel, row_grid(n), kThreads, 0,
                              as_cuda_stream(stream), w, w_scale, n, k, out, row_scale));
}

void launch_fold_fp8_block_rows(const uint8_t* w, const uint8_t* w_scale, int64_t n, int64_t k,
                                uint8_t* out, float* row_scale, Stream stream) {
  if (n == 0) return;
  if (n < 0 || k <= 0 || k % 32 != 0 || w == nullptr || w_scale == nullptr || out == nullptr ||
      row_scale == nullptr)
    bad_args("launch_fold_fp8_block_rows", "k % 32 == 0, k > 0; w, w_scale, out, row_scale set");
  MS_CUDA_CHECK(launch_kernel(fold_fp8_block_rows_kernel, row_grid(n), kThreads, 0,
                              as_cuda_stream(stream), w, w_scale, n, k, out, row_scale));
}

void launch_scale_rows_cols(float* y, int64_t ldy, int64_t m, int64_t n, const float* row_scale,
                            const float* col_scale, Stream stream) {
  if (m == 0 || n == 0) return;
  if (ldy < n) bad_args("launch_scale_rows_cols", "ldy >= n");
  const int grid = static_cast<int>(std::min<int64_t>((m * n + 255) / 256, 65535));
  MS_CUDA_CHECK(launch_kernel(scale_rows_cols_kernel, grid, 256, 0, as_cuda_stream(stream), y,
                              ldy, m, n, row_scale, col_scale));
}

}  // namespace moeserve::cuda
