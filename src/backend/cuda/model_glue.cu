#include "backend/cuda/model_glue.h"

#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/v41_device.cuh"

namespace moeserve::cuda {
namespace {

using v41::e2m1_decode;
using v41::ue8m0_decode;

constexpr int kThreads = 256;

__global__ void gather_rows_kernel(const float* src, int64_t ld_src, const int32_t* idx,
                                   int64_t cols, float* dst, int64_t ld_dst) {
  pdl_wait();
  const int64_t i = blockIdx.x;
  const float* s = src + static_cast<int64_t>(idx[i]) * ld_src;
  float* d = dst + i * ld_dst;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) d[c] = s[c];
}

__global__ void moe_combine_kernel(const float* src, const int32_t* inv, int k, int64_t cols,
                                   float* y) {
  pdl_wait();
  const int64_t t = blockIdx.x;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float acc = y[t * cols + c];
    for (int j = 0; j < k; ++j) {
      const int32_t r = inv[t * k + j];
      if (r >= 0) acc += src[static_cast<int64_t>(r) * cols + c];
    }
    y[t * cols + c] = acc;
  }
}

// Element i of the padded combine's src, fp32 or widened from bf16.
__device__ __forceinline__ float padded_src(const MoeCombinePaddedParams& p, int64_t i) {
  return p.src_bf16 ? __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(p.src)[i])
                                      << 16)
                    : static_cast<const float*>(p.src)[i];
}

// Token t's hits (slot or overflow rows, -1 none) and their row scales (1 off the slots) into
// shared memory, for the whole block.
__device__ __forceinline__ void load_padded_hits(const MoeCombinePaddedParams& p, int64_t t,
                                                 int32_t* hit, float* rs) {
  if (threadIdx.x < p.k) {
    const int32_t r = p.inv[t * p.k + threadIdx.x];
    hit[threadIdx.x] = r;
    rs[threadIdx.x] = r >= 0 && r < p.slot_rows ? p.row_scale[r] : 1.0f;
  }
  __syncthreads();
}

// launch_moe_combine_padded: one block per token, the token's hits added in j order per column.
__global__ void moe_combine_padded_kernel(MoeCombinePaddedParams p) {
  pdl_wait();
  const int64_t t = blockIdx.x;
  __shared__ int32_t hit[16];
  __shared__ float rs[16];
  load_padded_hits(p, t, hit, rs);
  for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x) {
    float acc = p.y[t * p.cols + c];
    for (int j = 0; j < p.k; ++j) {
      const int64_t r = hit[j];
      if (r < 0) continue;
      if (r < p.slot_rows)
        acc += padded_src(p, r * p.cols + c) * rs[j] * p.col_scale[(r / p.group_rows) * p.cols + c];
      else
        acc += p.overflow[(r - p.slot_rows) * p.cols + c];
    }
    p.y[t * p.cols + c] = acc;
  }
}

// The same sums, 4 columns per thread (cols % 4 == 0, 16-byte aligned rows): bit-identical.
__global__ void moe_combine_padded_vec_kernel(MoeCombinePaddedParams p) {
  pdl_wait();
  const int64_t t = blockIdx.x;
  __shared__ int32_t hit[16];
  __shared__ float rs[16];
  load_padded_hits(p, t, hit, rs);
  auto* yt = reinterpret_cast<float4*>(p.y + t * p.cols);
  for (int64_t c = threadIdx.x; c < p.cols / 4; c += blockDim.x) {
    float4 acc = yt[c];
    for (int j = 0; j < p.k; ++j) {
      const int64_t r = hit[j];
      if (r < 0) continue;
      float4 v;
      if (r < p.slot_rows) {
        float4 x;
        if (p.src_bf16) {
          const uint2 b = reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p.src) +
                                                         r * p.cols)[c];
          x = make_float4(__uint_as_float(b.x << 16), __uint_as_float(b.x & 0xFFFF0000u),
                          __uint_as_float(b.y << 16), __uint_as_float(b.y & 0xFFFF0000u));
        } else {
          x = reinterpret_cast<const float4*>(static_cast<const float*>(p.src) + r * p.cols)[c];
        }
        const float4 s =
            reinterpret_cast<const float4*>(p.col_scale + (r / p.group_rows) * p.cols)[c];
        v = make_float4(x.x * rs[j] * s.x, x.y * rs[j] * s.y, x.z * rs[j] * s.z,
                        x.w * rs[j] * s.w);
      } else {
        v = reinterpret_cast<const float4*>(p.overflow + (r - p.slot_rows) * p.cols)[c];
      }
      acc.x += v.x;
      acc.y += v.y;
      acc.z += v.z;
      acc.w += v.w;
    }
    yt[c] = acc;
  }
}

// The same sums, 4 columns per thread (cols % 4 == 0, 16-byte aligned rows): the hits of a token
// are added in the same order, so the result is bit-identical to moe_combine_kernel.
__global__ void moe_combine_vec_kernel(const float* src, const int32_t* inv, int k, int64_t cols,
                                       float* y) {
  pdl_wait();
  const int64_t t = blockIdx.x;
  __shared__ int32_t hit[16];
  if (threadIdx.x < k) hit[threadIdx.x] = inv[t * k + threadIdx.x];
  __syncthreads();
  auto* yt = reinterpret_cast<float4*>(y + t * cols);
  for (int64_t c = threadIdx.x; c < cols / 4; c += blockDim.x) {
    float4 acc = yt[c];
    for (int j = 0; j < k; ++j) {
      const int32_t r = hit[j];
      if (r < 0) continue;
      const float4 v = reinterpret_cast<const float4*>(src + static_cast<int64_t>(r) * cols)[c];
      acc.x += v.x;
      acc.y += v.y;
      acc.z += v.z;
      acc.w += v.w;
    }
    yt[c] = acc;
  }
}

__global__ void resolve_kernel(const int32_t* idx_in, const int32_t* cand, int64_t n_cand,
                               const int64_t* row_slot, int64_t slot_stride, int64_t rows, int k,
                               int32_t* out) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * k) return;
  const int64_t r = i / k;
  int64_t e = idx_in[i];
  if (cand != nullptr && e >= 0) e = cand[r * n_cand + e];
  out[i] = e < 0 ? -1 : static_cast<int32_t>(e + row_slot[r] * slot_stride);
}

__global__ void fp4_index_to_float_kernel(const uint8_t* rec, int64_t n, int dim, float* out) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * dim) return;
  const int64_t r = i / dim;
  const int c = static_cast<int>(i % dim);
  const uint8_t* p = rec + r * (dim / 2 + dim / 32);
  const uint32_t byte = p[c / 2];
  const uint32_t nib = (c % 2 == 0) ? (byte & 0xF) : (byte >> 4);
  out[i] = e2m1_decode(nib) * ue8m0_decode(p[dim / 2 + c / 32]);
}

__global__ void copy_records_kernel(const uint8_t* src, int64_t rec_bytes, const int64_t* dst_idx,
                                    uint8_t* dst) {
  pdl_wait();
  const int64_t i = blockIdx.x;
  const int64_t d = dst_idx[i];
  if (d < 0) return;
  for (int64_t b = threadIdx.x; b < rec_bytes; b += blockDim.x)
    dst[d * rec_bytes + b] = src[i * rec_bytes + b];
}

__global__ void fill_f32_kernel(float* x, int64_t n, float v) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = v;
}

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__global__ void fill_records_kernel(uint8_t* rec, int64_t total, int64_t code_bytes,
                                    int64_t rec_bytes, bool fp8_codes, int lo, int hi,
                                    uint64_t seed) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t b = i % rec_bytes;
  const uint64_t h = mix64(seed * 0x100000001B3ull + static_cast<uint64_t>(i));
  uint32_t v;
  if (b < code_bytes) {
    v = static_cast<uint32_t>(h & 0xFF);
    if (fp8_codes && (v & 0x7F) == 0x7F) v &= 0xFE;  // no NaN
  } else {
    v = static_cast<uint32_t>(lo + static_cast<int>(h % static_cast<uint64_t>(hi - lo + 1)));
  }
  rec[i] = static_cast<uint8_t>(v);
}

// Ascending sort of one row (k <= 2048; -1 entries last) in shared memory: a bitonic network
// over the next power of two, padded with INT32_MAX. Equal keys are equal values, so the
// network's instability does not show.
__global__ void sort_rows_kernel(int32_t* x, int k) {
  pdl_wait();
  __shared__ int32_t keys[2048];
  int32_t* row = x + static_cast<int64_t>(blockIdx.x) * k;
  int n2 = 1;
  while (n2 < k) n2 <<= 1;
  for (int i = threadIdx.x; i < n2; i += blockDim.x) {
    const int32_t v = i < k ? row[i] : -1;
    keys[i] = v < 0 ? 0x7FFFFFFF : v;
  }
  __syncthreads();
  for (int size = 2; size <= n2; size <<= 1) {
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < n2 / 2; i += blockDim.x) {
        const int lo = 2 * i - (i & (stride - 1));
        const int hi = lo + stride;
        const bool ascending = (lo & size) == 0;
        const int32_t a = keys[lo], b = keys[hi];
        if ((a > b) == ascending) {
          keys[lo] = b;
          keys[hi] = a;
        }
      }
      __syncthreads();
    }
  }
  for (int i = threadIdx.x; i < k; i += blockDim.x) row[i] = keys[i] == 0x7FFFFFFF ? -1 : keys[i];
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>(ceil_div(n, kThreads)); }

}  // namespace

void launch_gather_rows(const float* src, int64_t ld_src, const int32_t* idx, int64_t n,
                        int64_t cols, float* dst, int64_t ld_dst, Stream stream) {
  if (n == 0) return;
  MS_CUDA_CHECK(launch_kernel(gather_rows_kernel, static_cast<unsigned>(n), kThreads, 0,
                              as_cuda_stream(stream), src, ld_src, idx, cols, dst, ld_dst));
}

void launch_moe_combine(const float* src, const int32_t* inv, int64_t rows, int k, int64_t cols,
                        float* y, Stream stream) {
  if (rows == 0) return;
  const bool vec = k <= 16 && cols % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(y) % 16 == 0;
  MS_CUDA_CHECK(launch_kernel(vec ? moe_combine_vec_kernel : moe_combine_kernel,
                              static_cast<unsigned>(rows), kThreads, 0, as_cuda_stream(stream), src,
                              inv, k, cols, y));
}

void launch_moe_combine_padded(const MoeCombinePaddedParams& p, Stream stream) {
  if (p.rows == 0) return;
  if (p.k <= 0 || p.k > 16 || p.cols <= 0 || p.group_rows <= 0 || p.slot_rows < 0 ||
      p.src == nullptr || p.row_scale == nullptr || p.col_scale == nullptr || p.inv == nullptr ||
      p.y == nullptr)
    detail::cuda_call_failed(__FILE__, __LINE__, "launch_moe_combine_padded", "bad arguments",
                             "0 < k <= 16, cols > 0, group_rows > 0; src, row_scale, col_scale, "
                             "inv, y set");
  const auto aligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  const bool vec = p.cols % 4 == 0 &&
                   (p.src_bf16 ? reinterpret_cast<uintptr_t>(p.src) % 8 == 0 : aligned(p.src)) &&
                   aligned(p.col_scale) && aligned(p.y) &&
                   (p.overflow == nullptr || aligned(p.overflow));
  MS_CUDA_CHECK(launch_kernel(vec ? moe_combine_padded_vec_kernel : moe_combine_padded_kernel,
                              static_cast<unsigned>(p.rows), kThreads, 0, as_cuda_stream(stream),
                              p));
}

void launch_resolve_selection(const int32_t* idx_in, const int32_t* cand, int64_t n_cand,
                              const int64_t* row_slot, int64_t slot_stride, int64_t rows, int k,
                              int32_t* out, Stream stream) {
  if (rows * k == 0) return;
  MS_CUDA_CHECK(launch_kernel(resolve_kernel, blocks_for(rows * k), kThreads, 0,
                              as_cuda_stream(stream), idx_in, cand, n_cand, row_slot, slot_stride,
                              rows, k, out));
}

void launch_fp4_index_records_to_float(const uint8_t* rec, int64_t n, int dim, float* out,
                                       Stream stream) {
  if (n == 0) return;
  MS_CUDA_CHECK(launch_kernel(fp4_index_to_float_kernel, blocks_for(n * dim), kThreads, 0,
                              as_cuda_stream(stream), rec, n, dim, out));
}

void launch_copy_records(const uint8_t* src, int64_t n, int64_t rec_bytes, const int64_t* dst_idx,
                         uint8_t* dst, Stream stream) {
  if (n == 0) return;
  MS_CUDA_CHECK(launch_kernel(copy_records_kernel, static_cast<unsigned>(n), 128, 0,
                              as_cuda_stream(stream), src, rec_bytes, dst_idx, dst));
}

void launch_fill_f32(float* x, int64_t n, float value, Stream stream) {
  if (n == 0) return;
  MS_CUDA_CHECK(launch_kernel(fill_f32_kernel, blocks_for(n), kThreads, 0, as_cuda_stream(stream),
                              x, n, value));
}

void launch_sort_rows_ascending(int32_t* x, int64_t rows, int k, Stream stream) {
  if (rows == 0 || k == 0) return;
  if (k > 2048) detail::cuda_call_failed(__FILE__, __LINE__, "sort rows", "k <= 2048", "");
  MS_CUDA_CHECK(launch_kernel(sort_rows_kernel, static_cast<unsigned>(rows), 256, 0,
                              as_cuda_stream(stream), x, k));
}

void launch_fill_records(uint8_t* rec, int64_t n, int64_t code_bytes, int64_t scale_bytes,
                         bool fp8_codes, int scale_lo, int scale_hi, uint64_t seed, Stream stream) {
  const int64_t rec_bytes = code_bytes + scale_bytes;
  const int64_t total = n * rec_bytes;
  if (total == 0) return;
  MS_CUDA_CHECK(launch_kernel(fill_records_kernel, blocks_for(total), kThreads, 0,
                              as_cuda_stream(stream), rec, total, code_bytes, rec_bytes, fp8_codes,
                              scale_lo, scale_hi, seed));
}

}  // namespace moeserve::cuda
