// V4.1 selection ops: indexer scores over FP4 index keys (bf16 tensor cores on a shared key
// tile), exact row top-k (histogram threshold on the top 12 bits of the order-preserving score bits across the whole GPU, warp-aggregated compaction of the entries at
// or above it, a per-row 64-bit radix select on (score bits, ~index) so ties go to the lower index,
// and a bitonic sort of the k survivors), candidate blocks, and top-k/top-p sampling.
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>

#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/v41_device.cuh"

namespace moeserve::cuda {
namespace {

// ---- indexer scores -----------------------------------------------------------------------------

constexpr int kIdxDim = 128;
constexpr int kIdxKeys = 64;         // keys per CTA (4 warps x 16)
constexpr int kIdxThreads = 128;
constexpr int kIdxHeadChunk = 32;    // heads per MMA pass
constexpr int kIdxRowsPerCta = 8;    // query rows sharing one key tile (no candidates)
constexpr int kIdxMaxHeads = 64;
constexpr int kIdxPad = kIdxDim + 8;  // bf16 pitch (272 B)
constexpr int kIdxSPad = kIdxKeys + 4;

// Tensor-core indexer scores: the CTA dequantises 64 FP4 key records to bf16 (exact) in shared
// memory once and reuses them for up to 8 query rows (rows with candidate lists gather their own
// keys). Each query row is split into bf16 hi + lo parts (exact for the FP4 index queries the
// model passes, 2^-16 relative otherwise), 32 heads at a time: S[h, key] = q_h . k in fp32 by
// WMMA, then score[key] = scale * sum_h w_h * relu(S[h, key]).
__global__ void __launch_bounds__(kIdxThreads)
    indexer_score_kernel(IndexerScoreParams p, int64_t cols) {
  using namespace nvcuda;
  __shared__ alignas(128) __nv_bfloat16 kt[kIdxKeys][kIdxPad];
  __shared__ alignas(128) __nv_bfloat16 qhi[kIdxHeadChunk][kIdxPad];
  __shared__ alignas(128) __nv_bfloat16 qlo[kIdxHeadChunk][kIdxPad];
  __shared__ alignas(128) float st[kIdxHeadChunk][kIdxSPad];
  __shared__ float acc_key[kIdxKeys];
  __shared__ int64_t key_id[kIdxKeys];
  constexpr int kRec = kIdxDim / 2 + kIdxDim / 32;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kIdxKeys;
  const int rows_here = p.candidates ? 1 : kIdxRowsPerCta;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * rows_here;

  // Key tile for row t (candidates) or for every row: ids, then 4 threads per key record.
  const auto load_keys = [&](int64_t t) {
    if (tid < kIdxKeys) {
      const int64_t c = c0 + tid;
      int64_t j = -1;
      if (c < cols) j = p.candidates ? p.candidates[t * p.n_cand + c] : c;
      key_id[tid] = (j >= 0 && j < p.n_keys) ? j : -1;
    }
    __syncthreads();
    for (int i = tid; i < kIdxKeys * 4; i += kIdxThreads) {
      const int key = i >> 2, part = i & 3;  // part: 32 dims = 16 bytes + 1 scale
      const int64_t j = key_id[key];
      uint32_t out[16];
      if (j >= 0) {
        const uint8_t* rec = p.keys + j * kRec;
        // Records are 68 B: only 4-byte aligned.
        const auto* w32 = reinterpret_cast<const uint32_t*>(rec + part * 16);
        const float s = v41::ue8m0_decode(rec[kIdxDim / 2 + part]);
        const uint32_t words[4] = {w32[0], w32[1], w32[2], w32[3]};
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            const uint32_t byte = (words[q] >> (8 * b)) & 0xFFu;
            const __nv_bfloat162 v = __floats2bfloat162_rn(v41::e2m1_decode(byte & 0xF) * s,
                                                           v41::e2m1_decode(byte >> 4) * s);
            out[q * 4 + b] = *reinterpret_cast<const uint32_t*>(&v);
          }
      } else {
#pragma unroll
        for (int q = 0; q < 16; ++q) out[q] = 0;
      }
      uint4* dst = reinterpret_cast<uint4*>(&kt[key][part * 32]);
#pragma unroll
      for (int q = 0; q < 4; ++q)
        dst[q] = make_uint4(out[q * 4], out[q * 4 + 1], out[q * 4 + 2], out[q * 4 + 3]);
    }
    __syncthreads();
  };

  if (!p.candidates) load_keys(t0);
  for (int r = 0; r < rows_here; ++r) {
    const int64_t t = t0 + r;
    if (t >= p.rows) break;
    if (p.candidates) load_keys(t);
    if (tid < kIdxKeys) acc_key[tid] = 0.0f;
    for (int h0 = 0; h0 < p.heads; h0 += kIdxHeadChunk) {
      const int hn = min(kIdxHeadChunk, p.heads - h0);
      for (int i = tid; i < kIdxHeadChunk * kIdxDim; i += kIdxThreads) {
        const int h = i / kIdxDim, d = i % kIdxDim;
        const float v = h < hn ? p.q[(t * p.heads + h0 + h) * kIdxDim + d] : 0.0f;
        const __nv_bfloat16 hi = __float2bfloat16_rn(v);
        qhi[h][d] = hi;
        qlo[h][d] = __float2bfloat16_rn(v - __bfloat162float(hi));
      }
      __syncthreads();
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2];
      wmma::fill_fragment(acc[0], 0.0f);
      wmma::fill_fragment(acc[1], 0.0f);
#pragma unroll
      for (int kk = 0; kk < kIdxDim; kk += 16) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> bf;
        wmma::load_matrix_sync(bf, &kt[warp * 16][kk], kIdxPad);
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> ah, al;
          wmma::load_matrix_sync(ah, &qhi[m * 16][kk], kIdxPad);
          wmma::load_matrix_sync(al, &qlo[m * 16][kk], kIdxPad);
          wmma::mma_sync(acc[m], ah, bf, acc[m]);
          wmma::mma_sync(acc[m], al, bf, acc[m]);
        }
      }
#pragma unroll
      for (int m = 0; m < 2; ++m)
        wmma::store_matrix_sync(&st[m * 16][warp * 16], acc[m], kIdxSPad, wmma::mem_row_major);
      __syncthreads();
      // Two threads per key, 16 heads each, in head order; then the pair adds up.
      {
        const int key = tid >> 1, half = tid & 1;
        float a = 0.0f;
        for (int h = half * 16; h < half * 16 + 16 && h < hn; ++h)
          a = fmaf(p.w[t * p.heads + h0 + h], fmaxf(st[h][key], 0.0f), a);
        a += __shfl_xor_sync(0xFFFFFFFFu, a, 1);
        if (half == 0) acc_key[key] += a;
      }
      __syncthreads();
    }
    if (tid < kIdxKeys) {
      const int64_t c = c0 + tid;
      if (c < cols) {
        const int64_t visible = min(p.n_keys, (static_cast<int64_t>(p.pos[t]) + 1) / p.ratio);
        const int64_t j = key_id[tid];
        p.scores[t * p.ld + c] = (j < 0 || j >= visible) ? -INFINITY : acc_key[tid] * p.scale;
      }
    }
    __syncthreads();
  }
}

__global__ void block_max_kernel(BlockMaxParams p, int64_t nb) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= p.rows * nb) return;
  const int64_t t = i / nb, b = i % nb;
  const int64_t visible = min(p.n, (static_cast<int64_t>(p.pos[t]) + 1) / p.ratio);
  float m = -INFINITY;
  if (visible > 0 && b == (visible - 1) / p.block) {
    m = INFINITY;
  } else {
    for (int64_t j = b * p.block; j < min(p.n, (b + 1) * p.block); ++j)
      m = fmaxf(m, p.scores[t * p.ld + j]);
  }
  p.out[i] = m;
}

__global__ void blocks_to_cand_kernel(BlocksToCandidatesParams p) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= p.rows * p.kb * p.block) return;
  const int e = static_cast<int>(i % p.block);
  const int32_t b = p.block_ids[i / p.block];
  const int64_t j = static_cast<int64_t>(b) * p.block + e;
  p.cand[i] = b >= 0 && j < p.n_keys ? static_cast<int32_t>(j) : -1;
}

// ---- top-k --------------------------------------------------------------------------------------

constexpr int kBins = 4096;  // top 12 bits
constexpr int kTopkThreads = 256;
constexpr int kChunk = kTopkThreads * 16;
constexpr int kMaxK = 2048;

struct TopkScratch {
  uint32_t* hist;  // [rows, kBins]
  uint32_t* meta;  // [rows, 2]: threshold bin, compacted count
  uint64_t* cand;  // [rows, n]
};

TopkScratch topk_layout(void* base, int64_t rows) {
  auto* b = static_cast<uint8_t*>(base);
  TopkScratch s;
  s.hist = reinterpret_cast<uint32_t*>(b);
  s.meta = s.hist + rows * kBins;
  s.cand = reinterpret_cast<uint64_t*>(b + ((rows * kBins + rows * 2) * 4 + 15) / 16 * 16);
  return s;
}

__device__ __forceinline__ uint32_t ordered_bits(float v) {
  const uint32_t u = __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float from_ordered(uint32_t o) {
  return __uint_as_float((o & 0x80000000u) ? (o & 0x7FFFFFFFu) : ~o);
}

__global__ void __launch_bounds__(kTopkThreads) topk_hist_kernel(TopkParams p, TopkScratch s) {
  __shared__ uint32_t h[kBins];
  for (int i = threadIdx.x; i < kBins; i += blockDim.x) h[i] = 0;
  __syncthreads();
  const int64_t r = blockIdx.y;
  const float* row = p.scores + r * p.ld;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kChunk;
  const int64_t end = min(p.n, begin + kChunk);
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
    const float v = row[j];
    if (v != -INFINITY && v == v) atomicAdd(&h[ordered_bits(v) >> 20], 1u);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kBins; i += blockDim.x)
    if (h[i] != 0) atomicAdd(&s.hist[r * kBins + i], h[i]);
}

__global__ void __launch_bounds__(kTopkThreads) topk_threshold_kernel(TopkParams p, TopkScratch s) {
  __shared__ uint32_t part[kTopkThreads];
  const int64_t r = blockIdx.x;
  const uint32_t* h = s.hist + r * kBins;
  constexpr int per = kBins / kTopkThreads;
  uint32_t sum = 0;
  for (int i = 0; i < per; ++i) sum += h[threadIdx.x * per + i];
  part[threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t cum = 0;
    int bin = 0;
    for (int t = kTopkThreads - 1; t >= 0; --t) {
      if (cum + part[t] >= static_cast<uint32_t>(p.k)) {
        for (int b = (t + 1) * per - 1; b >= t * per; --b) {
          cum += h[b];
          if (cum >= static_cast<uint32_t>(p.k)) {
            bin = b;
            break;
          }
        }
        break;
      }
      cum += part[t];
    }
    s.meta[r * 2] = static_cast<uint32_t>(bin);
  }
}

__global__ void __launch_bounds__(kTopkThreads) topk_compact_kernel(TopkParams p, TopkScratch s) {
  const int64_t r = blockIdx.y;
  const float* row = p.scores + r * p.ld;
  const uint32_t bin = s.meta[r * 2];
  const int lane = threadIdx.x & 31;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kChunk;
  const int64_t end = min(p.n, begin + kChunk);
  for (int64_t base = begin; base < end; base += blockDim.x) {
    const int64_t j = base + threadIdx.x;
    float v = -INFINITY;
    if (j < end) v = row[j];
    const uint32_t o = ordered_bits(v);
    const bool take = j < end && v != -INFINITY && v == v && (o >> 20) >= bin;
    const uint32_t mask = __ballot_sync(0xffffffffu, take);
    if (mask == 0) continue;
    uint32_t off = 0;
    if (lane == 0) off = atomicAdd(&s.meta[r * 2 + 1], static_cast<uint32_t>(__popc(mask)));
    off = __shfl_sync(0xffffffffu, off, 0);
    if (take) {
      const uint32_t rank = __popc(mask & ((1u << lane) - 1u));
      s.cand[r * p.n + off + rank] =
          (static_cast<uint64_t>(o) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(j));
    }
  }
}

__global__ void __launch_bounds__(1024) topk_select_kernel(TopkParams p, TopkScratch s) {
  __shared__ uint32_t hist[256];
  __shared__ uint64_t sel[kMaxK];
  __shared__ uint64_t prefix_s;
  __shared__ uint32_t krem_s;
  __shared__ uint32_t nsel;
  const int64_t r = blockIdx.x;
  const uint32_t m = s.meta[r * 2 + 1];
  const uint64_t* c = s.cand + r * p.n;
  const uint32_t k = static_cast<uint32_t>(p.k);
  uint64_t prefix = 0;
  if (m > k) {
    uint64_t mask = 0;
    if (threadIdx.x == 0) {
      prefix_s = 0;
      krem_s = k;
    }
    for (int shift = 56; shift >= 0; shift -= 8) {
      for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
      __syncthreads();
      prefix = prefix_s;
      for (uint32_t i = threadIdx.x; i < m; i += blockDim.x) {
        const uint64_t v = c[i];
        if ((v & mask) == prefix) atomicAdd(&hist[(v >> shift) & 0xFF], 1u);
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        uint32_t cum = 0, krem = krem_s;
        int d = 255;
        for (; d > 0; --d) {
          if (cum + hist[d] >= krem) break;
          cum += hist[d];
        }
        krem_s = krem - cum;
        prefix_s = prefix | (static_cast<uint64_t>(d) << shift);
      }
      mask |= 0xFFull << shift;
      __syncthreads();
    }
    prefix = prefix_s;
  }
  if (threadIdx.x == 0) nsel = 0;
  __syncthreads();
  for (uint32_t i = threadIdx.x; i < m; i += blockDim.x) {
    const uint64_t v = c[i];
    if (v >= prefix) sel[atomicAdd(&nsel, 1u)] = v;
  }
  __syncthreads();
  const uint32_t cnt = min(nsel, k);
  uint32_t size = 1;
  while (size < cnt) size <<= 1;
  for (uint32_t i = cnt + threadIdx.x; i < size; i += blockDim.x) sel[i] = 0;
  __syncthreads();
  // Bitonic sort, descending.
  for (uint32_t kk = 2; kk <= size; kk <<= 1) {
    for (uint32_t j = kk >> 1; j > 0; j >>= 1) {
      for (uint32_t i = threadIdx.x; i < size; i += blockDim.x) {
        const uint32_t ixj = i ^ j;
        if (ixj > i) {
          const bool desc = (i & kk) == 0;
          const uint64_t a = sel[i], b = sel[ixj];
          if (desc ? a < b : a > b) {
            sel[i] = b;
            sel[ixj] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  for (uint32_t i = threadIdx.x; i < k; i += blockDim.x) {
    const bool have = i < cnt;
    const uint64_t v = have ? sel[i] : 0;
    p.out_idx[r * k + i] = have ? static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(v)) : -1;
    if (p.out_val)
      p.out_val[r * k + i] = have ? from_ordered(static_cast<uint32_t>(v >> 32)) : -INFINITY;
  }
  if (p.out_count && threadIdx.x == 0) p.out_count[r] = static_cast<int32_t>(cnt);
}

// ---- sampling -----------------------------------------------------------------------------------

// One warp per row over the sorted top-k (values descending).
__global__ void sample_kernel(SampleParams p, const int32_t* idx, const float* val,
                              const int32_t* count) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= p.rows) return;
  const int n = count[r];
  const int32_t* ids = idx + r * p.top_k;
  const float* v = val + r * p.top_k;
  if (p.temperature <= 0.0f || n <= 1) {
    if (lane == 0) p.out[r] = ids[0];
    return;
  }
  const float inv_t = 1.0f / p.temperature;
  const float top = v[0];
  const int per = (n + 31) / 32;
  const int b = min(n, lane * per), e = min(n, b + per);
  float local = 0.0f;
  for (int i = b; i < e; ++i) local += expf((v[i] - top) * inv_t);
  float incl = local;
  for (int o = 1; o < 32; o <<= 1) {
    const float y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  const float total = __shfl_sync(0xffffffffu, incl, 31);
  const float excl = incl - local;
  // keep = 1 + the first i with cum_i >= top_p * total.
  const float bound = p.top_p * total;
  int first = n - 1;
  float cum = excl;
  for (int i = b; i < e; ++i) {
    cum += expf((v[i] - top) * inv_t);
    if (cum >= bound) {
      first = i;
      break;
    }
  }
  for (int o = 16; o > 0; o >>= 1) first = min(first, __shfl_xor_sync(0xffffffffu, first, o));
  const int keep = first + 1;
  // The kept mass: cum at keep - 1.
  float kept = 0.0f;
  cum = excl;
  for (int i = b; i < e; ++i) {
    cum += expf((v[i] - top) * inv_t);
    if (i == keep - 1) kept = cum;
  }
  kept = warp_max(kept);
  const float target = v41::sample_uniform(p.seeds[r]) * kept;
  int pick = keep - 1;
  cum = excl;
  for (int i = b; i < min(e, keep); ++i) {
    cum += expf((v[i] - top) * inv_t);
    if (cum > target) {
      pick = i;
      break;
    }
  }
  for (int o = 16; o > 0; o >>= 1) pick = min(pick, __shfl_xor_sync(0xffffffffu, pick, o));
  if (lane == 0) p.out[r] = ids[pick];
}

}  // namespace

void launch_indexer_scores(const IndexerScoreParams& p, Stream stream) {
  const int64_t cols = p.candidates ? p.n_cand : p.n_keys;
  if (p.rows == 0 || cols == 0) return;
  if (p.head_dim != kIdxDim || p.heads > kIdxMaxHeads)
    detail::cuda_call_failed(__FILE__, __LINE__, "indexer shape", "head_dim 128, heads <= 64", "");
  const int rows_per_cta = p.candidates ? 1 : kIdxRowsPerCta;
  const dim3 grid(static_cast<unsigned>(ceil_div(cols, kIdxKeys)),
                  static_cast<unsigned>(ceil_div(p.rows, rows_per_cta)));
  indexer_score_kernel<<<grid, kIdxThreads, 0, as_cuda_stream(stream)>>>(p, cols);
  MS_CUDA_CHECK_LAUNCH();
}

size_t topk_scratch_bytes(int64_t rows, int64_t n) {
  return static_cast<size_t>(((rows * kBins + rows * 2) * 4 + 15) / 16 * 16 + rows * n * 8);
}

void launch_topk(const TopkParams& p, Stream stream) {
  if (p.rows == 0) return;
  if (p.k < 1 || p.k > kMaxK)
    detail::cuda_call_failed(__FILE__, __LINE__, "topk k", "1 <= k <= 2048", "");
  const cudaStream_t s = as_cuda_stream(stream);
  const TopkScratch sc = topk_layout(p.scratch, p.rows);
  MS_CUDA_CHECK(cudaMemsetAsync(sc.hist, 0, static_cast<size_t>(p.rows * (kBins + 2)) * 4, s));
  const dim3 grid(static_cast<unsigned>(std::max<int64_t>(1, ceil_div(p.n, kChunk))),
                  static_cast<unsigned>(p.rows));
  topk_hist_kernel<<<grid, kTopkThreads, 0, s>>>(p, sc);
  MS_CUDA_CHECK_LAUNCH();
  topk_threshold_kernel<<<static_cast<unsigned>(p.rows), kTopkThreads, 0, s>>>(p, sc);
  MS_CUDA_CHECK_LAUNCH();
  topk_compact_kernel<<<grid, kTopkThreads, 0, s>>>(p, sc);
  MS_CUDA_CHECK_LAUNCH();
  topk_select_kernel<<<static_cast<unsigned>(p.rows), 1024, 0, s>>>(p, sc);
  MS_CUDA_CHECK_LAUNCH();
}

void launch_block_max_scores(const BlockMaxParams& p, Stream stream) {
  const int64_t nb = ceil_div(p.n, p.block);
  if (p.rows * nb == 0) return;
  block_max_kernel<<<static_cast<unsigned>(ceil_div(p.rows * nb, 256)), 256, 0,
                     as_cuda_stream(stream)>>>(p, nb);
  MS_CUDA_CHECK_LAUNCH();
}

void launch_blocks_to_candidates(const BlocksToCandidatesParams& p, Stream stream) {
  const int64_t total = p.rows * p.kb * p.block;
  if (total == 0) return;
  blocks_to_cand_kernel<<<static_cast<unsigned>(ceil_div(total, 256)), 256, 0,
                          as_cuda_stream(stream)>>>(p);
  MS_CUDA_CHECK_LAUNCH();
}

size_t sample_scratch_bytes(int64_t rows, int64_t vocab, int top_k) {
  return topk_scratch_bytes(rows, vocab) + static_cast<size_t>(rows * top_k * 8 + rows * 4 + 64);
}

void launch_sample(const SampleParams& p, Stream stream) {
  if (p.rows == 0) return;
  auto* base = static_cast<uint8_t*>(p.scratch);
  const size_t tk = (topk_scratch_bytes(p.rows, p.vocab) + 15) / 16 * 16;
  auto* idx = reinterpret_cast<int32_t*>(base + tk);
  auto* val = reinterpret_cast<float*>(idx + p.rows * p.top_k);
  auto* count = reinterpret_cast<int32_t*>(val + p.rows * p.top_k);
  launch_topk({p.logits, p.rows, p.vocab, p.ld, p.top_k, idx, val, count, p.scratch}, stream);
  sample_kernel<<<static_cast<unsigned>(ceil_div(p.rows, 4)), 128, 0, as_cuda_stream(stream)>>>(
      p, idx, val, count);
  MS_CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda
