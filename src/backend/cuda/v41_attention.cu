// V4.1 sparse attention core (model.md §2.5), correctness-first: one block per (query, 16 heads),
// 256 threads (16 per head, each owning 16 channel pairs of the 512). The query's key list (SWA
// ring records, FP8, then selected main entries, FP4) is compacted in order; tiles of 32 keys are
// dequantised into shared memory (fp32, exact) and consumed with an online softmax that starts
// from the sink (m = sink, l = 1); K = V. The trailing rd output channels get the inverse RoPE.
// NOTE: fp32 CUDA cores, no split over keys: decode batches of one query use heads/16 blocks.
#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/v41_device.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kHd = 512;
constexpr int kHeadsPerBlock = 16;
constexpr int kThreads = 256;
constexpr int kTile = 32;
constexpr int kMaxKeys = 1024;
constexpr int kGlobFlag = 1 << 30;
constexpr int kPairs = kHd / 32;  // channel pairs per thread

__global__ void __launch_bounds__(kThreads) sparse_attention_kernel(SparseAttentionParams p) {
  extern __shared__ float kt[];  // [kTile][kHd]
  __shared__ int32_t list[kMaxKeys];
  __shared__ int32_t warp_count[kThreads / 32];
  __shared__ float lgs[kHeadsPerBlock][kTile];
  const int64_t t = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int pos = p.pos[t];

  // Ordered compaction of the valid key ids.
  const int nlist = p.swa_k + p.glob_k;
  int base = 0;
  for (int start = 0; start < nlist; start += kThreads) {
    const int i = start + tid;
    int id = -1;
    if (i < p.swa_k) {
      if (p.swa_idx) {
        id = p.swa_idx[t * p.swa_k + i];
      } else {
        const int64_t kp = static_cast<int64_t>(pos) - i;
        id = kp >= (p.swa_floor > 0 ? p.swa_floor : 0) ? static_cast<int>(kp % p.ring_size) : -1;
      }
    } else if (i < nlist) {
      const int g = p.glob_idx[t * p.glob_k + (i - p.swa_k)];
      id = g >= 0 ? (g | kGlobFlag) : -1;
    }
    const bool valid = id >= 0;
    const uint32_t mask = __ballot_sync(0xffffffffu, valid);
    if (lane == 0) warp_count[warp] = __popc(mask);
    __syncthreads();
    int off = base;
    for (int w = 0; w < warp; ++w) off += warp_count[w];
    if (valid) list[off + __popc(mask & ((1u << lane) - 1u))] = id;
    int sum = 0;
    for (int w = 0; w < kThreads / 32; ++w) sum += warp_count[w];
    base += sum;
    __syncthreads();
  }
  const int nk = base;

  const int hl = tid / 16, sub = tid % 16;
  const int h = blockIdx.y * kHeadsPerBlock + hl;
  const float* qh = p.q + (t * p.heads + h) * kHd;
  float q[2 * kPairs], acc[2 * kPairs];
#pragma unroll
  for (int m = 0; m < kPairs; ++m) {
    const float2 v = *reinterpret_cast<const float2*>(qh + 2 * sub + 32 * m);
    q[2 * m] = v.x * p.scale;
    q[2 * m + 1] = v.y * p.scale;
    acc[2 * m] = acc[2 * m + 1] = 0.0f;
  }
  float run_max = p.sink[h], run_sum = 1.0f;
  constexpr int kSwaRec = kHd + kHd / 32;
  constexpr int kGlobRec = kHd / 2 + kHd / 16;

  for (int t0 = 0; t0 < nk; t0 += kTile) {
    __syncthreads();
    for (int i = tid; i < kTile * (kHd / 4); i += kThreads) {
      const int key = i / (kHd / 4), quad = i % (kHd / 4);
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (t0 + key < nk) {
        const int id = list[t0 + key];
        if (id & kGlobFlag) {
          const uint8_t* rec = p.glob + static_cast<int64_t>(id & ~kGlobFlag) * kGlobRec;
          const uint32_t b = *reinterpret_cast<const uint16_t*>(rec + 2 * quad);
          const float s = v41::e4m3_decode(rec[kHd / 2 + quad / 4]);
          v = make_float4(v41::e2m1_decode(b & 0xF) * s, v41::e2m1_decode((b >> 4) & 0xF) * s,
                          v41::e2m1_decode((b >> 8) & 0xF) * s, v41::e2m1_decode(b >> 12) * s);
        } else {
          const uint8_t* rec = p.swa + static_cast<int64_t>(id) * kSwaRec;
          const uint32_t b = *reinterpret_cast<const uint32_t*>(rec + 4 * quad);
          const float s = v41::ue8m0_decode(rec[kHd + quad / 8]);
          v = make_float4(v41::e4m3_decode(b & 0xFF) * s, v41::e4m3_decode((b >> 8) & 0xFF) * s,
                          v41::e4m3_decode((b >> 16) & 0xFF) * s, v41::e4m3_decode(b >> 24) * s);
        }
      }
      *reinterpret_cast<float4*>(kt + key * kHd + 4 * quad) = v;
    }
    __syncthreads();
    // Logits of the tile into shared memory (one 16-lane group per head), then the online softmax.
#pragma unroll 1
    for (int j = 0; j < kTile; ++j) {
      const float* kr = kt + j * kHd + 2 * sub;
      float d = 0.0f;
#pragma unroll
      for (int m = 0; m < kPairs; ++m) {
        const float2 kv = *reinterpret_cast<const float2*>(kr + 32 * m);
        d = fmaf(q[2 * m], kv.x, d);
        d = fmaf(q[2 * m + 1], kv.y, d);
      }
      d += __shfl_xor_sync(0xffffffffu, d, 8);
      d += __shfl_xor_sync(0xffffffffu, d, 4);
      d += __shfl_xor_sync(0xffffffffu, d, 2);
      d += __shfl_xor_sync(0xffffffffu, d, 1);
      if (sub == 0) lgs[hl][j] = t0 + j < nk ? d : -INFINITY;
    }
    __syncwarp();
    float tile_max = -INFINITY;
#pragma unroll 8
    for (int j = 0; j < kTile; ++j) tile_max = fmaxf(tile_max, lgs[hl][j]);
    const float new_max = fmaxf(run_max, tile_max);
    const float corr = expf(run_max - new_max);
    run_sum *= corr;
#pragma unroll
    for (int m = 0; m < 2 * kPairs; ++m) acc[m] *= corr;
#pragma unroll 2
    for (int j = 0; j < kTile; ++j) {
      const float pj = expf(lgs[hl][j] - new_max);
      run_sum += pj;
      const float* kr = kt + j * kHd + 2 * sub;
#pragma unroll
      for (int m = 0; m < kPairs; ++m) {
        const float2 kv = *reinterpret_cast<const float2*>(kr + 32 * m);
        acc[2 * m] = fmaf(pj, kv.x, acc[2 * m]);
        acc[2 * m + 1] = fmaf(pj, kv.y, acc[2 * m + 1]);
      }
    }
    run_max = new_max;
  }

  const float inv = 1.0f / run_sum;
  float* out = p.out + (t * p.heads + h) * kHd;
#pragma unroll
  for (int m = 0; m < kPairs; ++m) {
    const int c = 2 * sub + 32 * m;
    float a = acc[2 * m] * inv, b = acc[2 * m + 1] * inv;
    if (p.freqs != nullptr && c >= kHd - p.rd) {
      double s, co;
      sincos(static_cast<double>(pos) * p.freqs[(c - (kHd - p.rd)) / 2], &s, &co);
      const double x0 = a, x1 = b;
      a = static_cast<float>(x0 * co + x1 * s);
      b = static_cast<float>(-x0 * s + x1 * co);
    }
    *reinterpret_cast<float2*>(out + c) = make_float2(a, b);
  }
}

}  // namespace

void launch_sparse_attention(const SparseAttentionParams& p, Stream stream) {
  if (p.rows == 0) return;
  if (p.head_dim != kHd || p.heads % kHeadsPerBlock != 0 || p.swa_k + p.glob_k > kMaxKeys)
    detail::cuda_call_failed(__FILE__, __LINE__, "sparse attention shape",
                             "head_dim 512, heads % 16 == 0, swa_k + glob_k <= 1024", "");
  constexpr int smem = kTile * kHd * 4;
  static const bool configured = [] {
    MS_CUDA_CHECK(cudaFuncSetAttribute(sparse_attention_kernel,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)configured;
  const dim3 grid(static_cast<unsigned>(p.rows), static_cast<unsigned>(p.heads / kHeadsPerBlock));
  sparse_attention_kernel<<<grid, kThreads, smem, as_cuda_stream(stream)>>>(p);
  MS_CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda
