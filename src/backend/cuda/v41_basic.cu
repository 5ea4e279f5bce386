// V4.1 elementwise and small-reduction ops: RoPE (angles in double), clamped SwiGLU, mHC (mixes as
// a split-K partial-dot kernel + a per-row finish with sigmoid/softmax/Sinkhorn; collapse; expand),
// the Engram gate, the Engram row gather from host memory and its dequantisation, and the pinned
// host allocation the tables live in (cuMem HOST with 2 MB granules, else cudaHostAlloc).
#include <cuda.h>

#include <algorithm>

#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/v41_device.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void rope_kernel(RopeParams p) {
  const int half = p.rd / 2;
  const int64_t total = p.rows * p.heads * half;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int pair = static_cast<int>(i % half);
    const int64_t rh = i / half;
    const int h = static_cast<int>(rh % p.heads);
    const int64_t r = rh / p.heads;
    float* t = p.x + r * p.row_stride + h * p.head_stride + (p.head_dim - p.rd) + 2 * pair;
    double s, c;
    sincos(static_cast<double>(p.pos[r]) * p.freqs[pair], &s, &c);
    if (p.inverse) s = -s;
    const double a = t[0], b = t[1];
    t[0] = static_cast<float>(a * c - b * s);
    t[1] = static_cast<float>(a * s + b * c);
  }
}

__global__ void swiglu_kernel(SwigluParams p) {
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
constexpr int kMaxMix = (2 + kMaxHc) * kMaxHc;  // 24
constexpr int kMixChunk = kThreads;             // elements of f per block (one per thread)
constexpr int kMixRowsPerBlock = 8;

// scratch[r, split, 0..m) = partial f·fn_k; [.., m] = partial Σ f^2.
__global__ void __launch_bounds__(kThreads) hc_mix_partial_kernel(HcMixesParams p, int splits) {
  __shared__ float red[kThreads / 32][kMaxMix + 1];
  const int m = (2 + p.hc) * p.hc;
  const int64_t width = p.hc * p.dim;
  const int split = blockIdx.x;
  const int64_t k = static_cast<int64_t>(split) * kMixChunk + threadIdx.x;
  const bool in = k < width;
  float w[kMaxMix];
#pragma unroll
  for (int j = 0; j < kMaxMix; ++j) w[j] = (j < m && in) ? p.fn[j * width + k] : 0.0f;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kMixRowsPerBlock;
  for (int64_t r = r0; r < min(p.rows, r0 + kMixRowsPerBlock); ++r) {
    const float f = in ? p.x[r * p.ldx + k] : 0.0f;
    float v[kMaxMix + 1];
#pragma unroll
    for (int j = 0; j < kMaxMix; ++j) v[j] = warp_sum(f * w[j]);
    v[kMaxMix] = warp_sum(f * f);
    if (lane == 0) {
#pragma unroll
      for (int j = 0; j < kMaxMix; ++j) red[warp][j] = v[j];
      red[warp][m] = v[kMaxMix];
    }
    __syncthreads();
    if (threadIdx.x <= m) {
      float s = 0.0f;
      for (int i = 0; i < kThreads / 32; ++i) s += red[i][threadIdx.x];
      p.scratch[(r * splits + split) * (m + 1) + threadIdx.x] = s;
    }
    __syncthreads();
  }
}

// One warp per row: reduce the partials, then pre/post/comb. HC is a template constant so the
// coefficient arrays stay in registers (a runtime hc put them in local memory: 60 us per call).
template <int HC>
__global__ void hc_mix_finish_kernel(HcMixesParams p, int splits) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= p.rows) return;
  constexpr int hc = HC, m = (2 + HC) * HC;
  float mix[m + 1];
#pragma unroll
  for (int j = 0; j <= m; ++j) {
    float s = 0.0f;
    for (int sp = lane; sp < splits; sp += 32) s += p.scratch[(r * splits + sp) * (m + 1) + j];
    mix[j] = warp_sum(s);
  }
  if (lane != 0) return;
  const float inv = rsqrtf(mix[m] / static_cast<float>(hc * p.dim) + p.rms_eps);
  for (int j = 0; j < m; ++j) mix[j] *= inv;
  for (int k = 0; k < hc; ++k) {
    p.pre[r * hc + k] = 1.0f / (1.0f + expf(-(mix[k] * p.scale[0] + p.base[k]))) + p.hc_eps;
    p.post[r * hc + k] = 2.0f / (1.0f + expf(-(mix[hc + k] * p.scale[1] + p.base[hc + k])));
  }
  float c[HC * HC];
#pragma unroll
  for (int i = 0; i < hc * hc; ++i) c[i] = mix[2 * hc + i] * p.scale[2] + p.base[2 * hc + i];
  for (int j = 0; j < hc; ++j) {
    float mx = c[j * hc];
    for (int k = 1; k < hc; ++k) mx = fmaxf(mx, c[j * hc + k]);
    float sum = 0.0f;
    for (int k = 0; k < hc; ++k) sum += (c[j * hc + k] = expf(c[j * hc + k] - mx));
    for (int k = 0; k < hc; ++k) c[j * hc + k] = c[j * hc + k] / sum + p.hc_eps;
  }
#pragma unroll 1
  for (int it = 0; it < p.sinkhorn_iters; ++it) {
    if (it > 0) {
      for (int j = 0; j < hc; ++j) {
        float sum = 0.0f;
        for (int k = 0; k < hc; ++k) sum += c[j * hc + k];
        for (int k = 0; k < hc; ++k) c[j * hc + k] /= sum + p.hc_eps;
      }
    }
    for (int k = 0; k < hc; ++k) {
      float sum = 0.0f;
      for (int j = 0; j < hc; ++j) sum += c[j * hc + k];
      for (int j = 0; j < hc; ++j) c[j * hc + k] /= sum + p.hc_eps;
    }
  }
  for (int i = 0; i < hc * hc; ++i) p.comb[r * hc * hc + i] = c[i];
}

__global__ void hc_collapse_kernel(HcCollapseParams p) {
  const int64_t total = p.rows * p.dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / p.dim, d = i % p.dim;
    float acc = 0.0f;
    for (int k = 0; k < p.hc; ++k)
      acc = fmaf(p.pre[r * p.hc + k], p.x[(r * p.hc + k) * p.dim + d], acc);
    p.out[i] = acc;
  }
}

__global__ void hc_expand_kernel(HcExpandParams p) {
  const int64_t total = p.rows * p.dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / p.dim, d = i % p.dim;
    float in[kMaxHc];
    for (int j = 0; j < p.hc; ++j) in[j] = p.x[(r * p.hc + j) * p.dim + d];
    const float y = p.y[i];
    for (int k = 0; k < p.hc; ++k) {
      float acc = p.post[r * p.hc + k] * y;
      for (int j = 0; j < p.hc; ++j) acc = fmaf(p.comb[(r * p.hc + j) * p.hc + k], in[j], acc);
      p.x[(r * p.hc + k) * p.dim + d] = acc;
    }
  }
}

// ---- Engram -------------------------------------------------------------------------------------

// One block per (row, stream).
__global__ void __launch_bounds__(kThreads) engram_gate_kernel(EngramGateParams p) {
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
  const int64_t total = p.n * p.dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / p.dim;
    const int c = static_cast<int>(i % p.dim);
    p.out[i] =
        v41::e4m3_decode(p.codes[i]) * v41::ue8m0_decode(p.scales[r * (p.dim / 32) + c / 32]);
  }
}

int grid_for(int64_t total) {
  return static_cast<int>(std::clamp<int64_t>(ceil_div(total, kThreads), 1, 132 * 16));
}

}  // namespace

void launch_rope(const RopeParams& p, Stream stream) {
  const int64_t total = p.rows * p.heads * (p.rd / 2);
  if (total == 0) return;
  rope_kernel<<<grid_for(total), kThreads, 0, as_cuda_stream(stream)>>>(p);
  MS_CUDA_CHECK_LAUNCH();
}

void launch_swiglu_clamped(const SwigluParams& p, Stream stream) {
  if (p.rows * p.cols == 0) return;
  swiglu_kernel<<<grid_for(p.rows * p.cols), kThreads, 0, as_cuda_stream(stream)>>>(p);
  MS_CUDA_CHECK_LAUNCH();
}

int64_t hc_mixes_scratch_floats(int64_t rows, int hc, int64_t dim) {
  const int64_t splits = ceil_div(hc * dim, kMixChunk);
  return rows * splits * ((2 + hc) * hc + 1);
}

void launch_hc_mixes(const HcMixesParams& p, Stream stream) {
  if (p.rows == 0) return;
  if (p.hc < 1 || p.hc > kMaxHc)
    detail::cuda_call_failed(__FILE__, __LINE__, "hc <= 4", "bad hc", "");
  const int splits = static_cast<int>(ceil_div(p.hc * p.dim, kMixChunk));
  const dim3 grid(static_cast<unsigned>(splits),
                  static_cast<unsigned>(ceil_div(p.rows, kMixRowsPerBlock)));
  hc_mix_partial_kernel<<<grid, kThreads, 0, as_cuda_stream(stream)>>>(p, splits);
  MS_CUDA_CHECK_LAUNCH();
  const auto finish = p.hc == 4   ? hc_mix_finish_kernel<4>
                      : p.hc == 3 ? hc_mix_finish_kernel<3>
                      : p.hc == 2 ? hc_mix_finish_kernel<2>
                                  : hc_mix_finish_kernel<1>;
  finish<<<static_cast<unsigned>(ceil_div(p.rows, 4)), 128, 0, as_cuda_stream(stream)>>>(p, splits);
  MS_CUDA_CHECK_LAUNCH();
}

void launch_hc_collapse(const HcCollapseParams& p, Stream stream) {
  if (p.rows * p.dim == 0) return;
  hc_collapse_kernel<<<grid_for(p.rows * p.dim), kThreads, 0, as_cuda_stream(stream)>>>(p);
  MS_CUDA_CHECK_LAUNCH();
}

void launch_hc_expand(const HcExpandParams& p, Stream stream) {
  if (p.rows * p.dim == 0) return;
  hc_expand_kernel<<<grid_for(p.rows * p.dim), kThreads, 0, as_cuda_stream(stream)>>>(p);
  MS_CUDA_CHECK_LAUNCH();
}

void launch_engram_gate(const EngramGateParams& p, Stream stream) {
  if (p.rows == 0) return;
  engram_gate_kernel<<<static_cast<unsigned>(p.rows * p.hc), kThreads, 0, as_cuda_stream(stream)>>>(
      p);
  MS_CUDA_CHECK_LAUNCH();
}

void launch_engram_gather(const EngramGatherParams& p, Stream stream) {
  if (p.n == 0) return;
  engram_gather_kernel<<<static_cast<unsigned>(ceil_div(p.n, 8)), 256, 0, as_cuda_stream(stream)>>>(
      p);
  MS_CUDA_CHECK_LAUNCH();
}

void launch_engram_dequant(const EngramDequantParams& p, Stream stream) {
  if (p.n == 0) return;
  engram_dequant_kernel<<<grid_for(p.n * p.dim), kThreads, 0, as_cuda_stream(stream)>>>(p);
  MS_CUDA_CHECK_LAUNCH();
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
