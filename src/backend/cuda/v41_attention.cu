// V4.1 sparse attention core (model.md §2.5) on fp16 tensor cores: one block per (query, 16
// heads), 8 warps. The query's key list (SWA ring records, FP8, then selected main entries, FP4)
// is compacted in order; tiles of 32 keys are dequantised to fp16 in shared memory twice: once
// for the logits of every key (kept in shared memory, <= 1024 per row), once for P . V after an
// exact softmax that starts from the sink. q and P are split into fp16 hi + lo parts (2^-22
// relative, about fp32: the output feeds wo_a's MXFP8 quantisation, where a 1e-5 error would
// move values across rounding points), and the dequantised cache values are exact in fp16 for
// the magnitudes kv_norm gives. K = V. The trailing rd output channels get the inverse RoPE.
// NOTE: the four head groups of a row each dequantise the row's keys (twice); a row-per-block
// variant with register-resident accumulators (mma.sync) would read them once.
#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>

#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/v41_device.cuh"

namespace moeserve::cuda {
namespace {

using namespace nvcuda;

constexpr int kHd = 512;
constexpr int kHeadsPerBlock = 16;
constexpr int kThreads = 256;  // 8 warps
constexpr int kTile = 32;      // keys per tile (2 x 16)
constexpr int kMaxKeys = 1024;
constexpr int kGlobFlag = 1 << 30;
constexpr int kQPad = kHd + 8;       // fp16 pitch of q / key rows (1040 B)
constexpr int kPPad = kTile + 8;     // fp16 pitch of the probability tile
// q * scale and P are multiplied by 2^8 before the fp16 split (exact), so the lo parts of most
// values stay normal fp16 (|q * scale| < 256 fits); the logits and the output are scaled back.
constexpr float kPow = 256.0f;
constexpr int kOPad = kHd + 4;       // fp32 pitch of the output staging
constexpr int kWarps = kThreads / 32;
constexpr int kDimsPerWarp = kHd / kWarps;  // 64 output channels per warp (4 fragments)
constexpr int kKSplit = kWarps / (kTile / 16);  // logits: K-dim parts per key fragment (4)

struct AttnSmem {
  int s_pitch;  // fp32 pitch of the logits rows
  size_t q_hi, q_lo, kt, sc, list, p_hi, p_lo, bytes;
};

AttnSmem attn_smem(int nk_cap) {
  AttnSmem a{};
  a.s_pitch = nk_cap + 4;
  size_t off = 0;
  const auto take = [&](size_t bytes) {
    const size_t at = off;
    off += (bytes + 127) / 128 * 128;
    return at;
  };
  a.q_hi = take(sizeof(__half) * kHeadsPerBlock * kQPad);
  a.q_lo = take(sizeof(__half) * kHeadsPerBlock * kQPad);
  // Key tile (fp16); the logits partials (8 x 16 x 16 fp32) and the output staging (fp32,
  // 16 x 516) reuse it.
  a.kt = take(std::max({sizeof(__half) * kTile * kQPad,
                        sizeof(float) * kHeadsPerBlock * kOPad, sizeof(float) * kWarps * 256}));
  a.sc = take(sizeof(float) * kHeadsPerBlock * a.s_pitch);
  a.list = take(sizeof(int32_t) * nk_cap);
  a.p_hi = take(sizeof(__half) * kHeadsPerBlock * kPPad);
  a.p_lo = take(sizeof(__half) * kHeadsPerBlock * kPPad);
  a.bytes = off;
  return a;
}

// v = hi + lo + O(2^-22 |v|) in fp16 (the callers pre-scale by kPow so that lo stays normal).
__device__ __forceinline__ void split_half(float v, __half* hi, __half* lo) {
  const __half h = __float2half_rn(v);
  *hi = h;
  *lo = __float2half_rn(v - __half2float(h));
}

// Dequantises keys [t0, t0 + kTile) of the list into kt (fp16; zeros past nk). Every
// thread first loads its 8 items (8 channels each), then decodes them.
__device__ __forceinline__ void load_key_tile(const SparseAttentionParams& p, const int32_t* list,
                                              int nk, int t0, __half (*kt)[kQPad]) {
  constexpr int kSwaRec = kHd + kHd / 32;
  constexpr int kGlobRec = kHd / 2 + kHd / 16;
  constexpr int kItems = kTile * (kHd / 8) / kThreads;
  uint2 raw[kItems];
  uint32_t sb[kItems];
  int kind[kItems];  // 0 none, 1 SWA (FP8), 2 global (FP4)
#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    const int i = threadIdx.x + it * kThreads;
    const int key = i / (kHd / 8), oct = i % (kHd / 8);
    kind[it] = 0;
    raw[it] = make_uint2(0, 0);
    sb[it] = 0;
    if (t0 + key < nk) {
      const int id = list[t0 + key];
      if (id & kGlobFlag) {
        const uint8_t* rec = p.glob + static_cast<int64_t>(id & ~kGlobFlag) * kGlobRec;
        raw[it].x = *reinterpret_cast<const uint32_t*>(rec + 4 * oct);
        sb[it] = rec[kHd / 2 + oct / 2];
        kind[it] = 2;
      } else {
        const uint8_t* rec = p.swa + static_cast<int64_t>(id) * kSwaRec;
        raw[it] = *reinterpret_cast<const uint2*>(rec + 8 * oct);
        sb[it] = rec[kHd + oct / 4];
        kind[it] = 1;
      }
    }
  }
#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    const int i = threadIdx.x + it * kThreads;
    const int key = i / (kHd / 8), oct = i % (kHd / 8);
    float v[8];
    if (kind[it] == 2) {
      const float s = v41::e4m3_decode(sb[it]);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = v41::e2m1_decode((raw[it].x >> (4 * e)) & 0xF) * s;
    } else {
      const float s = kind[it] == 1 ? v41::ue8m0_decode(sb[it]) : 0.0f;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        v[e] = v41::e4m3_decode((raw[it].x >> (8 * e)) & 0xFF) * s;
        v[4 + e] = v41::e4m3_decode((raw[it].y >> (8 * e)) & 0xFF) * s;
      }
    }
    uint32_t w[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const __half2 pr = __floats2half2_rn(v[2 * e], v[2 * e + 1]);
      w[e] = *reinterpret_cast<const uint32_t*>(&pr);
    }
    *reinterpret_cast<uint4*>(&kt[key][8 * oct]) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// One block per (query row, 16 heads). Pass 1: logits S = (q * scale) . k for every key of the
// row's list (fp16 tensor cores; q split into fp16 hi + lo) into shared memory.
// Softmax with the sink in fp32 (max over sink and logits; the sink adds exp(sink - max) to the
// denominator only). Pass 2: O = P . V over the same tiles (P split hi + lo; K = V), then O / sum
// and the inverse RoPE of the trailing rd channels (angles in double).
__global__ void __launch_bounds__(kThreads) sparse_attention_kernel(SparseAttentionParams p,
                                                                    AttnSmem lay) {
  extern __shared__ __align__(128) unsigned char smem[];
  auto* q_hi = reinterpret_cast<__half(*)[kQPad]>(smem + lay.q_hi);
  auto* q_lo = reinterpret_cast<__half(*)[kQPad]>(smem + lay.q_lo);
  auto* kt = reinterpret_cast<__half(*)[kQPad]>(smem + lay.kt);
  auto* ost = reinterpret_cast<float(*)[kOPad]>(smem + lay.kt);
  float* sc = reinterpret_cast<float*>(smem + lay.sc);
  int32_t* list = reinterpret_cast<int32_t*>(smem + lay.list);
  auto* p_hi = reinterpret_cast<__half(*)[kPPad]>(smem + lay.p_hi);
  auto* p_lo = reinterpret_cast<__half(*)[kPPad]>(smem + lay.p_lo);
  __shared__ int32_t warp_count[kThreads / 32];
  __shared__ float head_sum[kHeadsPerBlock];
  const int64_t t = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int pos = p.pos[t];
  const int h0 = blockIdx.y * kHeadsPerBlock;

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

  // q * scale (fp32, as the CPU), times 2^8, split into fp16 hi + lo.
  for (int i = tid; i < kHeadsPerBlock * kHd; i += kThreads) {
    const int h = i / kHd, c = i % kHd;
    split_half(p.q[(t * p.heads + h0 + h) * kHd + c] * p.scale * kPow, &q_hi[h][c], &q_lo[h][c]);
  }

  // Pass 1: logits. Warp w -> key fragment w % 2, channels [128 (w / 2), + 128); the four
  // partial fragments of a key fragment are added in channel order.
  float* part = reinterpret_cast<float*>(smem + lay.kt);
  for (int t0 = 0; t0 < nk; t0 += kTile) {
    __syncthreads();
    load_key_tile(p, list, nk, t0, kt);
    __syncthreads();
    const int nf = warp % (kTile / 16), kq = warp / (kTile / 16);
    constexpr int kSpan = kHd / kKSplit;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll 4
    for (int kk = kq * kSpan; kk < (kq + 1) * kSpan; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> ah, al;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> bk;
      wmma::load_matrix_sync(ah, &q_hi[0][kk], kQPad);
      wmma::load_matrix_sync(al, &q_lo[0][kk], kQPad);
      wmma::load_matrix_sync(bk, &kt[nf * 16][kk], kQPad);
      wmma::mma_sync(acc, ah, bk, acc);
      wmma::mma_sync(acc, al, bk, acc);
    }
    __syncthreads();  // kt is read by every warp before the partials overwrite it
    wmma::store_matrix_sync(part + warp * 256, acc, 16, wmma::mem_row_major);
    __syncthreads();
    for (int e = tid; e < kHeadsPerBlock * kTile; e += kThreads) {
      const int h = e / kTile, key = e % kTile;
      const int f = key / 16, col = key % 16;
      float v = 0.0f;
#pragma unroll
      for (int q = 0; q < kKSplit; ++q) v += part[(q * (kTile / 16) + f) * 256 + h * 16 + col];
      sc[h * lay.s_pitch + t0 + key] = v * (1.0f / kPow);
    }
  }
  __syncthreads();

  // Softmax numerators in place, warp w -> heads 2w, 2w + 1.
  for (int hh = 0; hh < kHeadsPerBlock / kWarps; ++hh) {
    const int h = warp * (kHeadsPerBlock / kWarps) + hh;
    float* row = sc + h * lay.s_pitch;
    const float sink = p.sink[h0 + h];
    float m = sink;
    for (int j = lane; j < nk; j += 32) m = fmaxf(m, row[j]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float sum = 0.0f;
    for (int j = lane; j < nk; j += 32) {
      const float e = expf(row[j] - m);
      row[j] = e;
      sum += e;
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) head_sum[h] = sum + expf(sink - m);
  }

  // Pass 2: O = P . V, warp w -> channels [64w, 64w + 64) (4 fragments).
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> oacc[kDimsPerWarp / 16];
#pragma unroll
  for (int i = 0; i < kDimsPerWarp / 16; ++i) wmma::fill_fragment(oacc[i], 0.0f);
  for (int t0 = 0; t0 < nk; t0 += kTile) {
    __syncthreads();
    load_key_tile(p, list, nk, t0, kt);
    for (int i = tid; i < kHeadsPerBlock * kTile; i += kThreads) {
      const int h = i / kTile, j = i % kTile;
      const float v = t0 + j < nk ? sc[h * lay.s_pitch + t0 + j] * kPow : 0.0f;
      split_half(v, &p_hi[h][j], &p_lo[h][j]);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTile; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> ph, pl;
      wmma::load_matrix_sync(ph, &p_hi[0][kk], kPPad);
      wmma::load_matrix_sync(pl, &p_lo[0][kk], kPPad);
#pragma unroll
      for (int i = 0; i < kDimsPerWarp / 16; ++i) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> bv;
        wmma::load_matrix_sync(bv, &kt[kk][warp * kDimsPerWarp + i * 16], kQPad);
        wmma::mma_sync(oacc[i], ph, bv, oacc[i]);
        wmma::mma_sync(oacc[i], pl, bv, oacc[i]);
      }
    }
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kDimsPerWarp / 16; ++i)
    wmma::store_matrix_sync(&ost[0][warp * kDimsPerWarp + i * 16], oacc[i], kOPad,
                            wmma::mem_row_major);
  __syncthreads();

  for (int i = tid; i < kHeadsPerBlock * (kHd / 2); i += kThreads) {
    const int h = i / (kHd / 2), c = 2 * (i % (kHd / 2));
    const float inv = 1.0f / (head_sum[h] * kPow);
    float a = ost[h][c] * inv, b = ost[h][c + 1] * inv;
    if (p.freqs != nullptr && c >= kHd - p.rd) {
      double s, co;
      sincos(static_cast<double>(pos) * p.freqs[(c - (kHd - p.rd)) / 2], &s, &co);
      const double x0 = a, x1 = b;
      a = static_cast<float>(x0 * co + x1 * s);
      b = static_cast<float>(-x0 * s + x1 * co);
    }
    *reinterpret_cast<float2*>(p.out + (t * p.heads + h0 + h) * kHd + c) = make_float2(a, b);
  }
}

constexpr int kF64Threads = 128;

// Key j's channel d as the CPU decodes it (exact in float).
__device__ __forceinline__ float key_value(const SparseAttentionParams& p, int id, int d) {
  constexpr int kSwaRec = kHd + kHd / 32;
  constexpr int kGlobRec = kHd / 2 + kHd / 16;
  if (id & kGlobFlag) {
    const uint8_t* rec = p.glob + static_cast<int64_t>(id & ~kGlobFlag) * kGlobRec;
    const uint32_t byte = rec[d / 2];
    return v41::e2m1_decode((d & 1) ? (byte >> 4) : (byte & 0xF)) *
           v41::e4m3_decode(rec[kHd / 2 + d / 16]);
  }
  const uint8_t* rec = p.swa + static_cast<int64_t>(id) * kSwaRec;
  return v41::e4m3_decode(rec[d]) * v41::ue8m0_decode(rec[kHd + d / 32]);
}

// deepseek_v41_layers.cpp attention_row in double: dot (q . k) * (1 / sqrt(hd)), m = max(sink,
// logits), denominator exp(sink - m) + sum exp(logit - m) in key order, acc[d] in key order,
// out = float(acc / den); then the inverse RoPE in double as Rope::apply.
__global__ void __launch_bounds__(kF64Threads) sparse_attention_f64_kernel(SparseAttentionParams p) {
  __shared__ int32_t list[kMaxKeys];
  __shared__ double logit[kMaxKeys];
  __shared__ float qs[kHd];
  __shared__ float os[kHd];
  __shared__ int nk_s;
  __shared__ double m_s, den_s;
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y;
  const int tid = threadIdx.x;
  const int pos = p.pos[t];
  if (tid == 0) {
    int nk = 0;
    for (int i = 0; i < p.swa_k; ++i) {
      int id;
      if (p.swa_idx) {
        id = p.swa_idx[t * p.swa_k + i];
      } else {
        const int64_t kp = static_cast<int64_t>(pos) - i;
        id = kp >= (p.swa_floor > 0 ? p.swa_floor : 0) ? static_cast<int>(kp % p.ring_size) : -1;
      }
      if (id >= 0) list[nk++] = id;
    }
    for (int i = 0; i < p.glob_k; ++i) {
      const int g = p.glob_idx[t * p.glob_k + i];
      if (g >= 0) list[nk++] = g | kGlobFlag;
    }
    nk_s = nk;
  }
  for (int d = tid; d < kHd; d += kF64Threads) qs[d] = p.q[(t * p.heads + h) * kHd + d];
  __syncthreads();
  const int nk = nk_s;
  const double scale = 1.0 / sqrt(static_cast<double>(kHd));
  for (int j = tid; j < nk; j += kF64Threads) {
    double dot = 0.0;
    for (int d = 0; d < kHd; ++d)
      dot = __dadd_rn(dot, __dmul_rn(static_cast<double>(qs[d]), key_value(p, list[j], d)));
    logit[j] = __dmul_rn(dot, scale);
  }
  __syncthreads();
  if (tid == 0) {
    const double sink = p.sink[h];
    double m = sink;
    for (int j = 0; j < nk; ++j) m = fmax(m, logit[j]);
    double den = exp(sink - m);
    for (int j = 0; j < nk; ++j) den = __dadd_rn(den, exp(logit[j] - m));
    m_s = m;
    den_s = den;
  }
  __syncthreads();
  for (int d = tid; d < kHd; d += kF64Threads) {
    double acc = 0.0;
    for (int j = 0; j < nk; ++j)
      acc = __dadd_rn(acc, __dmul_rn(exp(logit[j] - m_s), key_value(p, list[j], d)));
    os[d] = static_cast<float>(acc / den_s);
  }
  __syncthreads();
  float* out = p.out + (t * p.heads + h) * kHd;
  for (int i = tid; i < kHd / 2; i += kF64Threads) {
    const int c = 2 * i;
    float a = os[c], b = os[c + 1];
    if (p.freqs != nullptr && c >= kHd - p.rd) {
      const double angle = static_cast<double>(pos) * p.freqs[(c - (kHd - p.rd)) / 2];
      const double co = cos(angle), s = -sin(angle);
      const double x0 = a, x1 = b;
      a = static_cast<float>(__dsub_rn(__dmul_rn(x0, co), __dmul_rn(x1, s)));
      b = static_cast<float>(__dadd_rn(__dmul_rn(x0, s), __dmul_rn(x1, co)));
    }
    out[c] = a;
    out[c + 1] = b;
  }
}

}  // namespace

void launch_sparse_attention(const SparseAttentionParams& p, Stream stream) {
  if (p.rows == 0) return;
  if (p.head_dim != kHd || p.heads % kHeadsPerBlock != 0 || p.swa_k + p.glob_k > kMaxKeys)
    detail::cuda_call_failed(__FILE__, __LINE__, "sparse attention shape",
                             "head_dim 512, heads % 16 == 0, swa_k + glob_k <= 1024", "");
  const int nk_cap = std::max(kTile, (p.swa_k + p.glob_k + kTile - 1) / kTile * kTile);
  const AttnSmem lay = attn_smem(nk_cap);
  static const bool configured = [] {
    MS_CUDA_CHECK(cudaFuncSetAttribute(sparse_attention_kernel,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(attn_smem(kMaxKeys).bytes)));
    // Two blocks per SM fit at <= 640 keys (~113 KB each).
    MS_CUDA_CHECK(cudaFuncSetAttribute(sparse_attention_kernel,
                                       cudaFuncAttributePreferredSharedMemoryCarveout, 100));
    return true;
  }();
  (void)configured;
  const dim3 grid(static_cast<unsigned>(p.rows), static_cast<unsigned>(p.heads / kHeadsPerBlock));
  sparse_attention_kernel<<<grid, kThreads, lay.bytes, as_cuda_stream(stream)>>>(p, lay);
  MS_CUDA_CHECK_LAUNCH();
}

void launch_sparse_attention_f64(const SparseAttentionParams& p, Stream stream) {
  if (p.rows == 0) return;
  if (p.head_dim != kHd || p.swa_k + p.glob_k > kMaxKeys)
    detail::cuda_call_failed(__FILE__, __LINE__, "sparse attention shape",
                             "head_dim 512, swa_k + glob_k <= 1024", "");
  const dim3 grid(static_cast<unsigned>(p.rows), static_cast<unsigned>(p.heads));
  sparse_attention_f64_kernel<<<grid, kF64Threads, 0, as_cuda_stream(stream)>>>(p);
  MS_CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda
