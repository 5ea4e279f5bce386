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
