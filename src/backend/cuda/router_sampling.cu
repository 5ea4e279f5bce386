// The MoE router (sqrt-softplus scores, bias-for-selection top-k, normalised weights; one block
// per token) and greedy sampling (row argmax split into segments that merge through a 64-bit
// atomicMax on (ordered value, inverted index), so ties go to the lowest index).
#include <algorithm>
#include <climits>

#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/kernels.h"

namespace moeserve::cuda {
namespace {

constexpr int kRouterThreads = 256;
constexpr int kMaxTopK = 16;
constexpr int kArgmaxThreads = 256;

__global__ void __launch_bounds__(kRouterThreads) moe_router_kernel(MoeRouterParams p) {
  pdl_wait();
  extern __shared__ float smem[];
  float* xs = smem;                       // [hidden]
  float* score = xs + (p.logits ? 0 : p.hidden);  // [num_experts] s = sqrt(softplus(z))
  float* select = score + p.num_experts;  // [num_experts] s + bias, -inf once taken
  __shared__ ArgMax warp_best[32];
  __shared__ int32_t chosen[kMaxTopK];

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int warps = blockDim.x >> 5;
  if (p.logits == nullptr) {
    const float* x = p.x + static_cast<int64_t>(blockIdx.x) * p.ldx;
    for (int64_t i = tid; i < p.hidden; i += blockDim.x) xs[i] = x[i];
  }
  __syncthreads();

  const auto put_score = [&](int64_t e, float dot) {
    const float z = dot / p.temperature;
    const float softplus = z > 20.0f ? z : log1pf(expf(z));
    const float s = sqrtf(softplus);
    score[e] = s;
    select[e] = s + (p.bias ? p.bias[e] : 0.0f);
  };
  if (p.logits != nullptr) {
    // Logits given (the forward's batched GEMM): one expert per thread, every lane busy.
    const float* z = p.logits + static_cast<int64_t>(blockIdx.x) * p.num_experts;
    for (int64_t e = tid; e < p.num_experts; e += blockDim.x) {
      float v = z[e];
      for (int s = 1; s < p.logit_slices; ++s) v += z[s * p.slice_stride + e];
      put_score(e, v);
    }
  } else {
    for (int64_t e = warp; e < p.num_experts; e += warps) {
      const float* w = p.gate_weight + e * p.hidden;
      float dot = 0.0f;
      for (int64_t i = lane; i < p.hidden; i += 32) dot = fmaf(xs[i], w[i], dot);
      dot = warp_sum(dot);
      if (lane == 0) put_score(e, dot);
    }
  }
  __syncthreads();

  for (int t = 0; t < p.top_k; ++t) {
    ArgMax best{-INFINITY, INT_MAX};
    for (int e = tid; e < p.num_experts; e += blockDim.x) {
      if (argmax_better(select[e], e, best.value, best.index)) best = {select[e], e};
    }
    best = warp_argmax(best);
    if (lane == 0) warp_best[warp] = best;
    __syncthreads();
    if (warp == 0) {
      best = lane < warps ? warp_best[lane] : ArgMax{-INFINITY, INT_MAX};
      best = warp_argmax(best);
      if (lane == 0) {
        chosen[t] = best.index;
        select[best.index] = -INFINITY;
      }
    }
    __syncthreads();
  }

  if (tid == 0) {
    float sum = 0.0f;
    for (int t = 0; t < p.top_k; ++t) sum += score[chosen[t]];
    const float norm = p.route_scale / (sum + 1e-20f);
    const int64_t base = static_cast<int64_t>(blockIdx.x) * p.top_k;
    for (int t = 0; t < p.top_k; ++t) {
      p.topk_ids[base + t] = chosen[t];
      p.topk_weights[base + t] = score[chosen[t]] * norm;
    }
  }
}

__device__ __forceinline__ uint64_t argmax_key(float v, int32_t index) {
  const uint32_t u = __float_as_uint(v);
  const uint32_t ordered = u ^ ((u >> 31) ? 0xFFFFFFFFu : 0x80000000u);
  return (static_cast<uint64_t>(ordered) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(index));
}

__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_segment_kernel(ArgmaxParams p, int64_t segment_len, bool vector_ok) {
  pdl_wait();
  __shared__ ArgMax warp_best[32];
  const int64_t row = blockIdx.y;
  const float* x = p.logits + row * p.ld;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * segment_len;
  const int64_t c1 = min(c0 + segment_len, p.cols);
  ArgMax best{-INFINITY, INT_MAX};
  if (vector_ok) {  // c0 and segment_len are multiples of 4, rows 16-byte aligned
    for (int64_t c = c0 + 4 * static_cast<int64_t>(threadIdx.x); c < c1; c += 4 * blockDim.x) {
      if (c + 3 < c1) {
        const float4 v = *reinterpret_cast<const float4*>(x + c);
        const float vs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if (vs[i] > best.value) best = {vs[i], static_cast<int32_t>(c + i)};
        }
      } else {
        for (int64_t i = c; i < c1; ++i) {
          if (x[i] > best.value) best = {x[i], static_cast<int32_t>(i)};
        }
      }
    }
  } else {
    for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x) {
      if (x[c] > best.value) best = {x[c], static_cast<int32_t>(c)};
    }
  }
  best = warp_argmax(best);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (lane == 0) warp_best[warp] = best;
  __syncthreads();
  if (warp == 0) {
    best = lane < static_cast<int>(blockDim.x >> 5) ? warp_best[lane] : ArgMax{-INFINITY, INT_MAX};
    best = warp_argmax(best);
    if (lane == 0 && best.index != INT_MAX) {
      atomicMax(reinterpret_cast<unsigned long long*>(p.scratch + row),
                static_cast<unsigned long long>(argmax_key(best.value, best.index)));
    }
  }
}

__global__ void argmax_finish_kernel(ArgmaxParams p) {
  pdl_wait();
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (row < p.rows)
    p.out[row] = static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(p.scratch[row]));
}

// launch_router_logits_f32: CTA (blockIdx.x, blockIdx.y, blockIdx.z) = (expert tile, row tile,
// slice); a tile is BM rows x 128 experts, 2 BM threads. Thread (ty, tx) = (tid / 16, tid % 16)
// owns 8 x 8 outputs: rows 4 ty .. + 4 and BM / 2 + 4 ty .. + 4, experts 4 tx .. + 4 and
// 64 + 4 tx .. + 4 (a warp's LDS.128 reads 2 distinct float4s of x and 16 of w: 1 and 2
// shared-memory wavefronts for 16 FFMA each). Per 16-wide k chunk the CTA loads the x and w
// tiles as float4s (tile row f / 4, k 4 (f % 4) .. + 4 of float4 f), stores them k-major (as[k][m],
// bs[k][n]; the next chunk's loads are in flight meanwhile), and the 16 k steps FFMA in increasing
// k, one accumulator per output.
constexpr int kRlN = 128;  // experts per tile
constexpr int kRlK = 16;

// Float4 i of a thread (tile row r0 + i * kStride, k 4 lq .. + 4) into the k-major tile t[k][row].
template <int N, int kStride, int P>
__device__ __forceinline__ void store_kmajor(float (&t)[kRlK][P], const float4 (&v)[N], int r0,
                                             int lq) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int r = r0 + i * kStride;
    t[4 * lq + 0][r] = v[i].x;
    t[4 * lq + 1][r] = v[i].y;
    t[4 * lq + 2][r] = v[i].z;
    t[4 * lq + 3][r] = v[i].w;
  }
}

template <int BM>
__global__ void __launch_bounds__(2 * BM, 128 / BM) router_logits_kernel(RouterLogitsParams p) {
  pdl_wait();
  constexpr int kThreads = 2 * BM;
  constexpr int kAL = BM * kRlK / 4 / kThreads;   // float4 loads of x per thread and chunk
  constexpr int kBL = kRlN * kRlK / 4 / kThreads;  // ... of w
  constexpr int kPA = BM + 4, kPB = kRlN + 4;      // pitches: 2-way conflicts on the stores
  __shared__ __align__(16) float as[2][kRlK][kPA];
  __shared__ __align__(16) float bs[2][kRlK][kPB];
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const int64_t e0 = static_cast<int64_t>(blockIdx.x) * kRlN;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * BM;
  const int64_t chunks = p.hidden / kRlK;
  const int64_t c0 = blockIdx.z * chunks / p.slices;
  const int64_t c1 = (blockIdx.z + 1) * chunks / p.slices;
  const int lq = tid & 3;
  // Rows and experts past the ends load the last one's values instead: they only feed outputs
  // that are not stored.
  const float* const xa = p.x + 4 * lq;
  const float* const wa = p.w + 4 * lq;
  const int64_t ra = t0 + (tid >> 2), rb = e0 + (tid >> 2);
  float4 a_next[kAL], b_next[kBL];
  const auto load = [&](int64_t c) {
#pragma unroll
    for (int i = 0; i < kAL; ++i) {
      const int64_t r = min(ra + i * (kThreads / 4), p.rows - 1);
      a_next[i] = __ldg(reinterpret_cast<const float4*>(xa + r * p.ldx + c * kRlK));
    }
#pragma unroll
    for (int i = 0; i < kBL; ++i) {
      const int64_t e = min(rb + i * (kThreads / 4), p.experts - 1);
      b_next[i] = __ldg(reinterpret_cast<const float4*>(wa + e * p.hidden + c * kRlK));
    }
  };
  const auto store = [&](int buf) {
    store_kmajor<kAL, kThreads / 4>(as[buf], a_next, tid >> 2, lq);
    store_kmajor<kBL, kThreads / 4>(bs[buf], b_next, tid >> 2, lq);
  };
  float acc[8][8] = {};
  if (c0 < c1) {
    load(c0);
    store(0);
  }
  __syncthreads();
  for (int64_t c = c0; c < c1; ++c) {
    const int buf = static_cast<int>((c - c0) & 1);
    if (c + 1 < c1) load(c + 1);
#pragma unroll
    for (int k = 0; k < kRlK; ++k) {
      const float4 a0 = *reinterpret_cast<const float4*>(&as[buf][k][4 * ty]);
      const float4 a1 = *reinterpret_cast<const float4*>(&as[buf][k][BM / 2 + 4 * ty]);
      const float4 b0 = *reinterpret_cast<const float4*>(&bs[buf][k][4 * tx]);
      const float4 b1 = *reinterpret_cast<const float4*>(&bs[buf][k][64 + 4 * tx]);
      const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
      const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    // The other buffer was last read in the previous chunk, before that chunk's barrier.
    if (c + 1 < c1) store(buf ^ 1);
    __syncthreads();
  }
  float* out = p.out + static_cast<int64_t>(blockIdx.z) * p.rows * p.experts;
  const bool vec = p.experts % 4 == 0 && reinterpret_cast<uintptr_t>(p.out) % 16 == 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t t = t0 + (i < 4 ? 4 * ty + i : BM / 2 + 4 * ty + i - 4);
    if (t >= p.rows) continue;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t e = e0 + 64 * h + 4 * tx;
      float* o = out + t * p.experts + e;
      if (vec && e + 3 < p.experts) {
        *reinterpret_cast<float4*>(o) =
            make_float4(acc[i][4 * h], acc[i][4 * h + 1], acc[i][4 * h + 2], acc[i][4 * h + 3]);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (e + j < p.experts) o[j] = acc[i][4 * h + j];
      }
    }
  }
}

}  // namespace

void launch_moe_router(const MoeRouterParams& p, Stream stream) {
  if (p.num_tokens == 0) return;
  if (p.top_k < 1 || p.top_k > kMaxTopK || p.top_k > p.num_experts || p.num_experts > 1024) {
    detail::cuda_call_failed(__FILE__, __LINE__, "launch_moe_router", "bad arguments",
                             "1 <= top_k <= min(16, num_experts), num_experts <= 1024");
  }
  if (p.logit_slices < 1 ||
      (p.logit_slices > 1 &&
       (p.logits == nullptr || p.slice_stride < p.num_tokens * p.num_experts))) {
    detail::cuda_call_failed(__FILE__, __LINE__, "launch_moe_router", "bad logit slices",
                             "logit_slices >= 1; more than one needs logits and slice_stride >= "
                             "num_tokens * num_experts");
  }
  const size_t smem =
      sizeof(float) * static_cast<size_t>((p.logits ? 0 : p.hidden) + 2 * p.num_experts);
  if (smem > 48 * 1024) {
    MS_CUDA_CHECK(cudaFuncSetAttribute(
        moe_router_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  MS_CUDA_CHECK(launch_kernel(moe_router_kernel, static_cast<unsigned>(p.num_tokens),
                              kRouterThreads, smem, as_cuda_stream(stream), p));
}

void launch_router_logits_f32(const RouterLogitsParams& p, Stream stream) {
  if (p.rows == 0 || p.experts == 0) return;
  if (p.hidden <= 0 || p.hidden % kRlK != 0 || p.slices < 1 || p.slices > p.hidden / kRlK ||
      p.ldx % 4 != 0 || p.ldx < p.hidden || reinterpret_cast<uintptr_t>(p.x) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(p.w) % 16 != 0 || p.slices > 65535) {
    detail::cuda_call_failed(__FILE__, __LINE__, "launch_router_logits_f32", "bad arguments",
                             "hidden % 16 == 0, 1 <= slices <= hidden / 16, ldx >= hidden and "
                             "ldx % 4 == 0, x and w 16-byte aligned");
  }
  // 64-row tiles for at most 64 rows (decode 64 x 1), else 128.
  const bool wide = p.rows > 64;
  const int bm = wide ? 128 : 64;
  const dim3 grid(static_cast<unsigned>(ceil_div(p.experts, kRlN)),
                  static_cast<unsigned>(ceil_div(p.rows, bm)), static_cast<unsigned>(p.slices));
  MS_CUDA_CHECK(wide ? launch_kernel(router_logits_kernel<128>, grid, 256, 0,
                                     as_cuda_stream(stream), p)
                     : launch_kernel(router_logits_kernel<64>, grid, 128, 0,
                                     as_cuda_stream(stream), p));
}

int router_logits_auto_slices(int64_t rows, int64_t experts, int64_t hidden) {
  const bool wide = rows > 64;
  const int64_t tiles = ceil_div(experts, kRlN) * ceil_div(rows, wide ? 128 : 64);
  const int64_t slots = static_cast<int64_t>(device_sm_count()) * (wide ? 1 : 2);
  const int64_t s = std::min<int64_t>({slots / std::max<int64_t>(tiles, 1), 32, hidden / kRlK / 4});
  return s >= 2 ? static_cast<int>(s) : 0;
}

void launch_argmax_rows(const ArgmaxParams& p, Stream stream) {
  if (p.rows == 0) return;
  if (p.cols <= 0 || p.cols > INT_MAX - 1) {
    detail::cuda_call_failed(__FILE__, __LINE__, "launch_argmax_rows", "bad arguments",
                             "0 < cols < 2^31 - 1");
  }
  // Enough blocks to fill the GPU (~4 per SM) when there are few rows, at least 2048 columns each.
  const int64_t target_blocks = 4 * 132;
  int64_t segments = ceil_div(target_blocks, p.rows);
  segments = std::max<int64_t>(1, std::min(segments, ceil_div(p.cols, 2048)));
  const int64_t segment_len = ceil_div(ceil_div(p.cols, segments), 4) * 4;
  segments = ceil_div(p.cols, segment_len);
  const bool vector_ok = p.ld % 4 == 0 && reinterpret_cast<uintptr_t>(p.logits) % 16 == 0;
  cudaStream_t s = as_cuda_stream(stream);
  MS_CUDA_CHECK(cudaMemsetAsync(p.scratch, 0, sizeof(uint64_t) * static_cast<size_t>(p.rows), s));
  const dim3 grid(static_cast<unsigned>(segments), static_cast<unsigned>(p.rows));
  MS_CUDA_CHECK(
      launch_kernel(argmax_segment_kernel, grid, kArgmaxThreads, 0, s, p, segment_len, vector_ok));
  MS_CUDA_CHECK(launch_kernel(argmax_finish_kernel, static_cast<unsigned>(ceil_div(p.rows, 256)),
                              256, 0, s, p));
}

}  // namespace moeserve::cuda
