// V4.1 sparse attention core (model.md §2.5), flash-decoding style on fp16 tensor cores (raw
// mma.sync m16n8k16, fp32 accumulators in registers). One block per (query row, 32 or 16 heads),
// 8 warps. The row's key list (SWA ring records, FP8, then the selected main entries, FP4) is
// compacted in order; tiles of 32 keys are dequantised ONCE into shared memory (fp16: exact for
// the magnitudes kv_norm gives) and used for both the logits and P . V (K = V), with an online
// softmax that starts from the sink (m = sink, l = 1). The next tile's records are loaded into
// registers while the current tile is computed.
//   split_precision (default): q * scale and P are split into fp16 hi + lo parts (x 2^8 so the lo
//   parts stay normal; 2^-22 relative, about fp32), two MMAs each: the output feeds wo_a's MXFP8
//   rounding (8,192 values per row), where a 1e-5 error moves values across rounding points.
//   Otherwise one fp16 MMA each (2^-11 relative, the precision class of FlashMLA's bf16 path).
// Warp layout (kMt = head m-tiles of 16 per block, kWpm = 8 / kMt warps per m-tile):
//   logits: warp -> m-tile w % kMt, channel slice w / kMt (512 / kWpm channels, q fragments held
//   in registers), all 32 keys; the kWpm partial sums are added in slice order in shared memory.
//   softmax: warp -> 16 kMt / 8 heads (running max and sum in registers).
//   P . V: warp -> m-tile w % kMt, output channels slice w / kMt (512 / kWpm channels).
// The trailing rd output channels get the inverse RoPE (angles in double).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/v41_device.cuh"

namespace moeserve::cuda {
namespace {

// Phase clocks for tools/device/attn_probe.cu (compiled out unless MOESERVE_ATTN_CLOCKS): thread
// 0 of each block adds the cycles since the previous mark to slot i.
#ifdef MOESERVE_ATTN_CLOCKS
__device__ unsigned long long g_attn_clocks[16];
#define ATTN_MARK(i)                                                     \
  do {                                                                   \
    if (threadIdx.x == 0) {                                              \
      const long long now_ = clock64();                                  \
      atomicAdd(&g_attn_clocks[i], static_cast<unsigned long long>(now_ - clk_)); \
      clk_ = now_;                                                       \
    }                                                                    \
  } while (0)
#else
#define ATTN_MARK(i) \
  do {               \
  } while (0)
#endif

// Tuning knobs the probe (tools/device/attn_probe.cu) compiles variants of: the decode loop's
// unroll and the blocks per SM the register budget is sized for.
#ifndef MOESERVE_ATTN_DECODE_UNROLL
#define MOESERVE_ATTN_DECODE_UNROLL 4
#endif
// Blocks per SM: the single-fp16 path (kSplit false) fits two in 128 registers (measured 24%
// faster at 384 rows: 361 vs 473 us); the hi + lo path would spill 516 bytes at 128 registers
// (measured slower: 555 vs 511 us), so it keeps one.
#ifndef MOESERVE_ATTN_MIN_BLOCKS
#define MOESERVE_ATTN_MIN_BLOCKS (kSplit ? 1 : 2)
#endif
#ifndef MOESERVE_ATTN_MT  // m-tiles (16 heads each) per block when heads % 32 == 0: 2 or 1
#define MOESERVE_ATTN_MT 2
#endif
// P . V: skip rescaling the output accumulators when every alpha of the warp is 1. Measured
// (attn_probe, 384 rows): single fp16 361.2 -> 356.0 us; hi + lo 513.8 -> 525.7 us, so only the
// single-fp16 path skips.
#ifndef MOESERVE_ATTN_ALPHA_SKIP
#define MOESERVE_ATTN_ALPHA_SKIP (!kSplit)
#endif
#define MOESERVE_PRAGMA_(x) _Pragma(#x)
#define MOESERVE_PRAGMA(x) MOESERVE_PRAGMA_(x)

constexpr int kHd = 512;
constexpr int kThreads = 256;  // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 32;  // keys per tile
constexpr int kMaxKeys = 1024;
constexpr int kGlobFlag = 1 << 30;
constexpr int kKPitch = kHd + 8;    // fp16 pitch of key rows (1040 B: ldmatrix rows hit distinct banks)
constexpr int kPPitch = kTile + 8;  // fp16 pitch of the probability rows
constexpr int kSPitch = kTile + 8;  // fp32 pitch of the logits partials
constexpr float kPow = 256.0f;
constexpr int kSwaRec = kHd + kHd / 32;      // FP8 record: 512 codes + 16 ue8m0 scales
constexpr int kGlobRec = kHd / 2 + kHd / 16;  // FP4 record: 256 B of nibbles + 32 e4m3 scales
constexpr int kItems = kTile * (kHd / 8) / kThreads;  // 8-channel items per thread per tile

// Shared memory (bytes, 128-aligned offsets).
constexpr size_t align128(size_t b) { return (b + 127) / 128 * 128; }
constexpr size_t kOffKt = 0;
constexpr size_t kOffPart = kOffKt + align128(sizeof(__half) * kTile * kKPitch);
constexpr size_t kOffPHi = kOffPart + align128(sizeof(float) * kWarps * 16 * kSPitch);
constexpr size_t kOffPLo = kOffPHi + align128(sizeof(__half) * 32 * kPPitch);
constexpr size_t kOffAlpha = kOffPLo + align128(sizeof(__half) * 32 * kPPitch);
constexpr size_t kOffSum = kOffAlpha + align128(sizeof(float) * 32);
constexpr size_t kOffList = kOffSum + align128(sizeof(float) * 32);
constexpr size_t kOffStage = kOffList + align128(sizeof(int32_t) * kMaxKeys);
constexpr size_t kStageBytes = align128(static_cast<size_t>(kTile) * kSwaRec);
constexpr size_t kSmemBytes = kOffStage + 2 * kStageBytes;

__device__ __forceinline__ uint32_t lds32(const __half* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }

// (a, b) -> fp16 pairs hi, lo with a = hi.x + lo.x + O(2^-22 |a|) (b likewise).
__device__ __forceinline__ void split_pair(float a, float b, uint32_t* hi, uint32_t* lo) {
  const __half2 h = __floats2half2_rn(a, b);
  const float2 hf = __half22float2(h);
  *hi = h2_bits(h);
  *lo = h2_bits(__floats2half2_rn(a - hf.x, b - hf.y));
}

// Cache records are staged in shared memory by cp.async (16-byte chunks, two tiles ahead), one
// 528-byte slot per key: SWA records fill it, global (FP4) records use the first 288 bytes.
constexpr int kSlot = kSwaRec;
static_assert(kSwaRec % 16 == 0 && kGlobRec % 16 == 0, "records are whole 16-byte chunks");

__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src) {
  const auto d = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(gmem_src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
__device__ __forceinline__ void cp_async_wait_1() { asm volatile("cp.async.wait_group 1;\n"); }

// Issues the copies of keys [t0, t0 + kTile) of the list into stage (always commits a group):
// warp w copies keys w, w + 8, ..., its lanes the record's 16-byte chunks (18 for an FP4
// record, 33 for an SWA one), so no thread divides by the chunk count.
__device__ __forceinline__ void stage_tile(const SparseAttentionParams& p, const int32_t* list,
                                           int nk, int t0, uint8_t* stage) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  for (int key = static_cast<int>(threadIdx.x) >> 5; key < kTile && t0 + key < nk; key += kWarps) {
    const int id = list[t0 + key];
    const bool glob = (id & kGlobFlag) != 0;
    const uint8_t* rec = glob ? p.glob + static_cast<int64_t>(id & ~kGlobFlag) * kGlobRec
                              : p.swa + static_cast<int64_t>(id) * kSwaRec;
    const int chunks = glob ? kGlobRec / 16 : kSwaRec / 16;
    for (int part = lane; part < chunks; part += 32)
      cp_async16(stage + key * kSlot + 16 * part, rec + 16 * part);
  }
  cp_async_commit();
}

// e2m1 -> fp16 (exact) without a table in memory: every e2m1 magnitude (0, .5, 1, 1.5, 2, 3, 4, 6)
// is an fp16 whose low byte is 0, so one PRMT over the 8 high bytes converts 4 nibbles' magnitude
// bits, a second PRMT places those bytes as the high bytes of two fp16 pairs, and the sign bits
// come from x and x << 4 by a third PRMT (nibble i's sign, bit 4i + 3, lands on bit 15 or 31).
constexpr uint32_t kE2m1F16Hi0 = 0x3E3C3800u, kE2m1F16Hi1 = 0x46444240u;
// The fp16 pairs of the 8 channels of one FP4 word x (low nibble first), times s2.
__device__ __forceinline__ void e2m1x8_to_f16(uint32_t x, __half2 s2, uint32_t (&w)[4]) {
  const uint32_t m = x & 0x77777777u;
  const uint32_t x4 = x << 4;
  const uint32_t hi[2] = {__byte_perm(kE2m1F16Hi0, kE2m1F16Hi1, m),
                          __byte_perm(kE2m1F16Hi0, kE2m1F16Hi1, m >> 16)};
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    // Channels 2b (low half) and 2b + 1 (high half).
    const uint32_t mag = __byte_perm(hi[b >> 1], 0u, (b & 1) != 0 ? 0x3424u : 0x1404u);
    const uint32_t sgn = __byte_perm(x, x4, 0x0040u + 0x1010u * static_cast<uint32_t>(b));
    const uint32_t v = mag | (sgn & 0x80008000u);
    w[b] = h2_bits(__hmul2(*reinterpret_cast<const __half2*>(&v), s2));
  }
}

// Decodes a staged tile into kt (fp16, zeros for missing keys). Item it of this thread is key
// (tid + 256 it) / 64, channels 8 ((tid + 256 it) % 64) ..+8. The products are exact in fp16
// whenever the float path of the CPU decoder is (e4m3 or e2m1 times a power-of-two or e4m3
// scale); scales outside fp16's normal range take the float path, rounded like the CPU's.
__device__ __forceinline__ void decode_tile(const int32_t* list, int nk, int t0,
                                            const uint8_t* stage, __half (*kt)[kKPitch]) {
  MOESERVE_PRAGMA(unroll MOESERVE_ATTN_DECODE_UNROLL)
  for (int it = 0; it < kItems; ++it) {
    const int i = static_cast<int>(threadIdx.x) + it * kThreads;
    const int key = i / (kHd / 8), oct = i % (kHd / 8);
    uint32_t w[4] = {0, 0, 0, 0};
    if (t0 + key < nk) {
      const uint8_t* rec = stage + key * kSlot;
      if (list[t0 + key] & kGlobFlag) {
        const uint32_t x = *reinterpret_cast<const uint32_t*>(rec + 4 * oct);
        const __half_raw sr = __nv_cvt_fp8_to_halfraw(
            static_cast<__nv_fp8_storage_t>(rec[kHd / 2 + oct / 2]), __NV_E4M3);
        e2m1x8_to_f16(x, __half2half2(__half(sr)), w);
      } else {
        const uint2 xy = *reinterpret_cast<const uint2*>(rec + 8 * oct);
        const float sc = v41::ue8m0_decode(rec[kHd + oct / 4]);
        if (sc >= 0x1p-14f && sc <= 0x1p15f) {
          const __half2 s2 = __float2half2_rn(sc);
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            const uint32_t word = b < 2 ? xy.x : xy.y;
            const __half2_raw pr = __nv_cvt_fp8x2_to_halfraw2(
                static_cast<__nv_fp8x2_storage_t>((word >> (16 * (b & 1))) & 0xFFFFu), __NV_E4M3);
            w[b] = h2_bits(__hmul2(__half2(pr), s2));
          }
        } else {
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            const uint32_t word = b < 2 ? xy.x : xy.y;
            const int sh = 16 * (b & 1);
            w[b] = h2_bits(__floats2half2_rn(v41::e4m3_decode((word >> sh) & 0xFFu) * sc,
                                             v41::e4m3_decode((word >> (sh + 8)) & 0xFFu) * sc));
          }
        }
      }
    }
    *reinterpret_cast<uint4*>(&kt[key][8 * oct]) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

template <int kMt, bool kSplit>
__global__ void __launch_bounds__(kThreads, MOESERVE_ATTN_MIN_BLOCKS)
    sparse_attention_kernel(SparseAttentionParams p) {
  pdl_wait();
  constexpr int kWpm = kWarps / kMt;       // warps per m-tile
  constexpr int kSlice = kHd / kWpm;       // channels per warp (logits and output)
  constexpr int kQSteps = kSlice / 16;     // k-steps of the logits per warp
  constexpr int kOTiles = kSlice / 8;      // n-tiles of the output per warp
  constexpr int kHeads = 16 * kMt;         // heads per block
  constexpr int kHeadsPerWarp = kHeads / kWarps;
  constexpr int kParts = kSplit ? 2 : 1;
  extern __shared__ __align__(128) unsigned char smem[];
  auto* kt = reinterpret_cast<__half(*)[kKPitch]>(smem + kOffKt);
  auto* part = reinterpret_cast<float(*)[16][kSPitch]>(smem + kOffPart);
  auto* p_hi = reinterpret_cast<__half(*)[kPPitch]>(smem + kOffPHi);
  auto* p_lo = reinterpret_cast<__half(*)[kPPitch]>(smem + kOffPLo);
  float* alpha_s = reinterpret_cast<float*>(smem + kOffAlpha);
  float* sum_s = reinterpret_cast<float*>(smem + kOffSum);
  int32_t* list = reinterpret_cast<int32_t*>(smem + kOffList);
  uint8_t* const stage0 = smem + kOffStage;  // tile ti's slots: stage0 + (ti & 1) kStageBytes
  __shared__ int32_t warp_count[kWarps];
  const int64_t t = blockIdx.x;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const int mt = warp % kMt, slice = warp / kMt;
  const int pos = p.pos[t];
  const int h0 = static_cast<int>(blockIdx.y) * kHeads;
#ifdef MOESERVE_ATTN_CLOCKS
  long long clk_ = clock64();
#endif

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
      const int gi = p.glob_idx[t * p.glob_k + (i - p.swa_k)];
      id = gi >= 0 ? (gi | kGlobFlag) : -1;
    }
    const bool valid = id >= 0;
    const uint32_t mask = __ballot_sync(0xffffffffu, valid);
    if (lane == 0) warp_count[warp] = __popc(mask);
    __syncthreads();
    int off = base;
    for (int w = 0; w < warp; ++w) off += warp_count[w];
    if (valid) list[off + __popc(mask & ((1u << lane) - 1u))] = id;
    int sum = 0;
    for (int w = 0; w < kWarps; ++w) sum += warp_count[w];
    base += sum;
    __syncthreads();
  }
  const int nk = base;
  ATTN_MARK(0);

  stage_tile(p, list, nk, 0, stage0);
  stage_tile(p, list, nk, kTile, stage0 + kStageBytes);

  // q * scale (fp32, as the CPU) * 2^8 as m16n8k16 A fragments: rows g / g + 8 of this warp's
  // m-tile, channels slice * kSlice + 16 ks + 2 tq (+8).
  uint32_t qf[kParts][kQSteps][4];
  {
    const float* qa = p.q + (t * p.heads + h0 + mt * 16 + g) * kHd + slice * kSlice + 2 * tq;
    const float* qb = qa + 8 * kHd;
#pragma unroll
    for (int ks = 0; ks < kQSteps; ++ks) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float* src = ((r & 1) ? qb : qa) + ks * 16 + ((r & 2) ? 8 : 0);
        const float2 v = *reinterpret_cast<const float2*>(src);
        const float a = v.x * p.scale * kPow, b = v.y * p.scale * kPow;
        if constexpr (kSplit) {
          split_pair(a, b, &qf[0][ks][r], &qf[1][ks][r]);
        } else {
          qf[0][ks][r] = h2_bits(__floats2half2_rn(a, b));
        }
      }
    }
  }

  float m_run[kHeadsPerWarp], l_run[kHeadsPerWarp];
#pragma unroll
  for (int i = 0; i < kHeadsPerWarp; ++i) {
    m_run[i] = p.sink[h0 + warp * kHeadsPerWarp + i];
    l_run[i] = 1.0f;  // exp(sink - m)
  }
  float o[kOTiles][4];
#pragma unroll
  for (int n = 0; n < kOTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  ATTN_MARK(1);
  for (int t0 = 0, ti = 0; t0 < nk; t0 += kTile, ++ti) {
    cp_async_wait_1();  // this thread's copies of tile ti have landed
    __syncthreads();    // everyone's have; the previous tile's P . V is done with kt and p
    ATTN_MARK(2);
    decode_tile(list, nk, t0, stage0 + (ti & 1) * kStageBytes, kt);
    ATTN_MARK(3);
    __syncthreads();
    ATTN_MARK(4);
    stage_tile(p, list, nk, t0 + 2 * kTile, stage0 + (ti & 1) * kStageBytes);
    ATTN_MARK(5);

    // Logits partials: 16 heads x 32 keys over this warp's channel slice.
    {
      float acc[4][4];
#pragma unroll
      for (int n = 0; n < 4; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < kQSteps; ++ks) {
        const int d = slice * kSlice + ks * 16 + 2 * tq;
#pragma unroll
        for (int n = 0; n < 4; ++n) {
          const uint32_t b0 = lds32(&kt[n * 8 + g][d]);
          const uint32_t b1 = lds32(&kt[n * 8 + g][d + 8]);
          mma::f16_16816(acc[n], qf[0][ks], b0, b1);
          if constexpr (kSplit) mma::f16_16816(acc[n], qf[kParts - 1][ks], b0, b1);
        }
      }
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        *reinterpret_cast<float2*>(&part[warp][g][n * 8 + 2 * tq]) = make_float2(acc[n][0], acc[n][1]);
        *reinterpret_cast<float2*>(&part[warp][g + 8][n * 8 + 2 * tq]) =
            make_float2(acc[n][2], acc[n][3]);
      }
    }
    ATTN_MARK(6);
    __syncthreads();
    ATTN_MARK(7);

    // Online softmax: lane = key of the tile; this warp's heads interleaved (independent
    // shuffle chains).
    {
      const bool valid = t0 + lane < nk;
      float sv[kHeadsPerWarp], mx[kHeadsPerWarp], es[kHeadsPerWarp], ev[kHeadsPerWarp];
#pragma unroll
      for (int i = 0; i < kHeadsPerWarp; ++i) {
        const int h = warp * kHeadsPerWarp + i;  // head within the block
        float v = 0.0f;
#pragma unroll
        for (int sl = 0; sl < kWpm; ++sl) v += part[sl * kMt + h / 16][h % 16][lane];
        sv[i] = valid ? v * (1.0f / kPow) : -INFINITY;
        mx[i] = sv[i];
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
        for (int i = 0; i < kHeadsPerWarp; ++i)
          mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], off));
      }
#pragma unroll
      for (int i = 0; i < kHeadsPerWarp; ++i) {
        const float m_new = fmaxf(m_run[i], mx[i]);
        mx[i] = expf(m_run[i] - m_new);  // alpha
        m_run[i] = m_new;
        ev[i] = valid ? expf(sv[i] - m_new) : 0.0f;
        es[i] = ev[i];
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
        for (int i = 0; i < kHeadsPerWarp; ++i) es[i] += __shfl_xor_sync(0xffffffffu, es[i], off);
      }
#pragma unroll
      for (int i = 0; i < kHeadsPerWarp; ++i) {
        const int h = warp * kHeadsPerWarp + i;
        l_run[i] = l_run[i] * mx[i] + es[i];
        const float v = ev[i] * kPow;
        const __half hi = __float2half_rn(v);
        p_hi[h][lane] = hi;
        if constexpr (kSplit) p_lo[h][lane] = __float2half_rn(v - __half2float(hi));
        if (lane == 0) alpha_s[h] = mx[i];
      }
    }
    ATTN_MARK(8);
    __syncthreads();
    ATTN_MARK(9);

    // O = O * alpha + P . V over this warp's output channels.
    {
      const int ra = mt * 16 + g, rb = ra + 8;
      const float aa = alpha_s[ra], ab = alpha_s[rb];
      // Once the running maxima settle, alpha is exactly 1 for every row of the warp: skip the
      // 4 kOTiles multiplications by 1 (bit-identical).
      if (!MOESERVE_ATTN_ALPHA_SKIP || !__all_sync(0xffffffffu, aa == 1.0f && ab == 1.0f)) {
#pragma unroll
        for (int n = 0; n < kOTiles; ++n) {
          o[n][0] *= aa;
          o[n][1] *= aa;
          o[n][2] *= ab;
          o[n][3] *= ab;
        }
      }
#pragma unroll
      for (int ks = 0; ks < kTile / 16; ++ks) {
        const int k0 = ks * 16 + 2 * tq;
        const uint32_t ph[4] = {lds32(&p_hi[ra][k0]), lds32(&p_hi[rb][k0]),
                                lds32(&p_hi[ra][k0 + 8]), lds32(&p_hi[rb][k0 + 8])};
        uint32_t pl[4] = {0, 0, 0, 0};
        if constexpr (kSplit) {
          pl[0] = lds32(&p_lo[ra][k0]);
          pl[1] = lds32(&p_lo[rb][k0]);
          pl[2] = lds32(&p_lo[ra][k0 + 8]);
          pl[3] = lds32(&p_lo[rb][k0 + 8]);
        }
        const int key = ks * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
        for (int np = 0; np < kOTiles / 2; ++np) {
          uint32_t b[4];
          mma::ldsm_x4_trans(b, &kt[key][slice * kSlice + np * 16 + (lane >> 4) * 8]);
          mma::f16_16816(o[2 * np], ph, b[0], b[1]);
          mma::f16_16816(o[2 * np + 1], ph, b[2], b[3]);
          if constexpr (kSplit) {
            mma::f16_16816(o[2 * np], pl, b[0], b[1]);
            mma::f16_16816(o[2 * np + 1], pl, b[2], b[3]);
          }
        }
      }
    }
    ATTN_MARK(10);
  }

  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < kHeadsPerWarp; ++i) sum_s[warp * kHeadsPerWarp + i] = l_run[i];
  }
  __syncthreads();

  // out = O / (l 2^8), inverse RoPE on the trailing rd channels.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = mt * 16 + g + 8 * half;
    const float inv = 1.0f / (sum_s[r] * kPow);
    float* out = p.out + (t * p.heads + h0 + r) * kHd;
#pragma unroll
    for (int n = 0; n < kOTiles; ++n) {
      const int c = slice * kSlice + n * 8 + 2 * tq;
      float a = o[n][2 * half] * inv, b = o[n][2 * half + 1] * inv;
      if (p.freqs != nullptr && c >= kHd - p.rd) {
        double sn, co;
        sincos(static_cast<double>(pos) * p.freqs[(c - (kHd - p.rd)) / 2], &sn, &co);
        const double x0 = a, x1 = b;
        a = static_cast<float>(x0 * co + x1 * sn);
        b = static_cast<float>(-x0 * sn + x1 * co);
      }
      *reinterpret_cast<float2*>(out + c) = make_float2(a, b);
    }
  }
  ATTN_MARK(11);
}

template <int kMt, bool kSplit>
void launch_flash(const SparseAttentionParams& p, cudaStream_t stream) {
  static const bool configured = [] {
    MS_CUDA_CHECK(cudaFuncSetAttribute(sparse_attention_kernel<kMt, kSplit>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kSmemBytes)));
    return true;
  }();
  (void)configured;
  const dim3 grid(static_cast<unsigned>(p.rows), static_cast<unsigned>(p.heads / (16 * kMt)));
  MS_CUDA_CHECK(
      launch_kernel(sparse_attention_kernel<kMt, kSplit>, grid, kThreads, kSmemBytes, stream, p));
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
  pdl_wait();
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

// The warpgroup-MMA kernel (v41_attention_wgmma.cu, sm_90a): the shapes it takes, and its launch.
bool sparse_attention_wgmma_fits(const SparseAttentionParams& p);
void launch_sparse_attention_wgmma(const SparseAttentionParams& p, cudaStream_t stream);

bool sparse_attention_wgmma_applies(const SparseAttentionParams& p) {
  return p.use_wgmma && sparse_attention_wgmma_fits(p) &&
         reinterpret_cast<uintptr_t>(p.out_mxfp8_bf16) % 8 == 0 &&
         (p.out_fp8_rows == nullptr) == (p.out_row_scale == nullptr) &&
         (p.out_fp8_rows == nullptr ||
          (p.heads == 64 && p.out_mxfp8_bf16 == nullptr &&
           reinterpret_cast<uintptr_t>(p.out_fp8_rows) % 4 == 0));
}

void launch_sparse_attention(const SparseAttentionParams& p, Stream stream) {
  if (p.rows == 0) return;
  if (p.head_dim != kHd || p.heads % 16 != 0 || p.swa_k + p.glob_k > kMaxKeys)
    detail::cuda_call_failed(__FILE__, __LINE__, "sparse attention shape",
                             "head_dim 512, heads % 16 == 0, swa_k + glob_k <= 1024", "");
  const cudaStream_t st = as_cuda_stream(stream);
  if (sparse_attention_wgmma_applies(p)) {
    launch_sparse_attention_wgmma(p, st);
    return;
  }
  // The MXFP8 bf16 and row-scaled FP8 outputs are the wgmma kernel's epilogues only (the
  // mma.sync kernel writes fp32).
  if (p.out_mxfp8_bf16 != nullptr || p.out_fp8_rows != nullptr || p.out_row_scale != nullptr)
    detail::cuda_call_failed(__FILE__, __LINE__, "launch_sparse_attention", "bad arguments",
                             "out_mxfp8_bf16 / out_fp8_rows: use_wgmma, a shape and device the "
                             "wgmma kernel takes (sparse_attention_wgmma_applies), 8-byte / "
                             "4-byte aligned; out_fp8_rows with out_row_scale, 64 heads and no "
                             "out_mxfp8_bf16");
  if (p.heads % 32 == 0 && MOESERVE_ATTN_MT == 2) {
    if (p.split_precision) launch_flash<MOESERVE_ATTN_MT, true>(p, st);
    else launch_flash<MOESERVE_ATTN_MT, false>(p, st);
  } else {
    if (p.split_precision) launch_flash<1, true>(p, st);
    else launch_flash<1, false>(p, st);
  }
}

void launch_sparse_attention_f64(const SparseAttentionParams& p, Stream stream) {
  if (p.rows == 0) return;
  if (p.head_dim != kHd || p.swa_k + p.glob_k > kMaxKeys)
    detail::cuda_call_failed(__FILE__, __LINE__, "sparse attention shape",
                             "head_dim 512, swa_k + glob_k <= 1024", "");
  if (p.out_mxfp8_bf16 != nullptr || p.out_fp8_rows != nullptr || p.out_row_scale != nullptr)
    detail::cuda_call_failed(__FILE__, __LINE__, "launch_sparse_attention_f64", "bad arguments",
                             "out_mxfp8_bf16, out_fp8_rows, out_row_scale unset (fp32 output "
                             "only)");
  const dim3 grid(static_cast<unsigned>(p.rows), static_cast<unsigned>(p.heads));
  MS_CUDA_CHECK(
      launch_kernel(sparse_attention_f64_kernel, grid, kF64Threads, 0, as_cuda_stream(stream), p));
}

}  // namespace moeserve::cuda
