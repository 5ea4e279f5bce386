// V4.1 sparse attention core (model.md §2.5) on Hopper warpgroup MMA (sm_90a wgmma.mma_async):
// the use_wgmma path of launch_sparse_attention. Same results as the mma.sync kernel in
// v41_attention.cu (same key list, sink-initialised online softmax, hi + lo split precision,
// inverse RoPE), a different structure: one work item per (query row, 64 heads), two warpgroups,
// and each 32-key tile dequantised ONCE per row (the mma.sync kernel decodes it once per 32 heads).
// The grid is persistent: at most one CTA per SM, each looping over items blockIdx.x + k gridDim.x.
// Halfway through an item's tiles the CTA prefetches the next item's q (128 KB) and key
// selections into L2, so the next prologue reads L2 and the q traffic of all CTAs spreads over
// the loops instead of bursting at wave starts; the epilogue's stores are never waited for (the
// next item's list compaction runs under them).
//
// Per item: list compaction (each thread loads its selections first, 2 barriers in all); the
// (cos, sin) table of the inverse RoPE (rd / 2 double sincos, once per row, not per element);
// q -> fp16 (16 float4 loads in flight per thread); the tile loop below; the epilogue: O / l into
// an fp32 staging tile in shared memory (over q, kt and the stage), then each warp stores 512
// contiguous bytes per instruction with the RoPE pairs rotated from the table. The epilogue's
// code is a short loop: the old per-element inline sincos made it ~100 KB of straight-line SASS,
// fetched from L2 once per CTA.
// With SparseAttentionParams::out_mxfp8_bf16 (the kOutMxfp8Bf16 instantiations) the epilogue writes
// the bf16 bits of the output's MXFP8 fake-quant instead of the fp32 values: the input of the
// attention's output projection (wo_a), which otherwise reads the fp32 output back through
// launch_act_quant_mxfp8 (at 384 rows and 64 heads a 50 MB fp32 write plus its read, per layer).
// A warp's store covers 128 consecutive channels of one head, so each 32-channel quantisation
// block is the 4 values of 8 consecutive lanes: the block's amax takes 3 shuffles, then the
// values are rounded with the act-quant kernel's functions (v41_device.cuh), bit for bit its
// output.
// With out_fp8_rows (kOutFp8Rows; 64 heads, so that an item is a whole row) it writes wo_a's
// row-scaled FP8 operand instead: pass 1 rounds each lane's 4 values as above and quantises them
// as launch_act_quant_fp8_rows does (block codes, scale code, reference code) back into the
// lane's own staging slot; a CTA max gives the row's reference code R; pass 2 stores the codes
// refolded onto R (4 bytes per lane) and the row scale. The launch it replaces read 64 KB of bf16
// per row and wrote 32 KB of codes (24 us per decode layer at 384 rows).
//
// Per tile of 32 keys (K = V: one fp16 copy serves both products):
//   S = Q . K^T   m64n32k16, A = q * scale * 2^8 (fp16; hi and lo parts in split precision) and
//                 B = the key tile, both K-major in shared memory. Warpgroup w covers channels
//                 [256 w, 256 w + 256) (16 k-steps), so each holds a partial S (64 heads x 32
//                 keys, 16 fp32 per thread); the partials are exchanged through shared memory and
//                 both warpgroups add them (s0 + s1 == s1 + s0: identical S in both).
//   softmax       in registers, redundantly in both warpgroups (identical m, l and P): thread
//                 (warp v, lane g * 4 + t) owns heads 16 v + g and 16 v + g + 8, the row max and
//                 sum are quad shuffles. m starts at the sink, l at 1.
//   O += P . V    m64n256k16, A = P * 2^8 from registers (the S accumulator layout is the A
//                 fragment layout; hi and lo parts in split precision), B = the same key tile
//                 read MN-major (imm-trans-b), warpgroup w owning output channels [256 w, +256):
//                 128 fp32 accumulators per thread.
// Each warpgroup reads only its own channel half of a key tile (S and P . V alike), which lets
// the S exchange live in the idle key buffer's own half (below).
//
// Shared memory (1024-aligned base; every wgmma operand in 128-byte-swizzle atoms: rows of 64
// fp16 = 128 B, 8 rows = 1024 B, the 16-byte chunk c of row r stored at chunk c ^ (r % 8)):
//   q      fp16 [1 or 2 parts (hi, lo)][8 panels][64 heads][64 channels]   64 KB per part
//          panel c holds channels [64 c, 64 c + 64): for S a K-major B (rows = keys, SBO 1024 B,
//          k-step = +32 B), for P . V an MN-major B (K = keys: 8-key groups at SBO 1024 B;
//          N = channels: 64-channel blocks at LBO = one panel, 4096 B).
//   kt     fp16 [kNB buffers][8 panels][32 keys][64 channels]               32 KB per buffer
//   stage  raw records of kStages tiles (cp.async; 528 B per key, FP4 use 288) 16.5 KB per slot
//   xch    (kNB == 3) fp32 partial S of both warpgroups                      16 KB
//   list   int32 [1024] compacted key ids
//   rope   double2 [256] (cos, sin) of the row's inverse RoPE angles                4 KB
//   O      (epilogue) fp32 [64 heads][520] staging tile at offset 0, over q, kt, the stage, xch
// hi + lo (kNB 2, 1 slot): 216.5 KiB; fp16 (kNB 2): 152.5 KiB; fp16 (kNB 3, 2 slots, xch):
// 217 KiB; + 1 KiB alignment slack.
// One CTA per SM (the 128 fp32 O accumulators per thread rule out two in any mode).
//
// Pipeline, kNB == 2 (hi + lo; buffer b = t & 1; all 256 threads):
//   1. wgmma.fence; issue S_t on kt[b]; commit; wait_group 0 (S_t and P . V_{t-1} done).
//   2. store the partial S into this warpgroup's half of kt[b ^ 1] (its own earlier wgmma on that
//      buffer are complete; the other warpgroup never reads that half); __syncthreads; add the
//      other half's partial.
//   3. online softmax; rescale O; P fragments.
//   4. wgmma.fence; issue P . V_t on kt[b]; commit (not waited: it overlaps 5).
//   5. cp.async.wait (raw tile t + 1); __syncthreads; dequantise tile t + 1 into kt[b ^ 1];
//      fence.proxy.async (generic stores -> async proxy reads); __syncthreads; cp.async of raw
//      tile t + 2 into the stage.
//   The dequantisation runs under P . V_t; S, the exchange and the softmax are exposed.
// Pipeline, kNB == 3 (fp16; tile u in kt[u % 3], raw tile u in slot u % 2):
//   1. wait_group 0: S_t and P . V_{t-1} (issued together in the previous iteration) done.
//   2. exchange through xch; the __syncthreads also publishes the tile decoded in the previous
//      iteration (t + 1).
//   3. online softmax; rescale O; P fragments.
//   4. wgmma.fence; issue S_{t+1} on kt[(t+1) % 3], commit; issue P . V_t on kt[t % 3], commit.
//   5. cp.async.wait (raw t + 2); __syncthreads (raw visible; kt[(t+2) % 3] = kt[(t-1) % 3] and
//      the other slot are no longer read; the exchange reads are done); cp.async of raw t + 3;
//      dequantise t + 2 into kt[(t+2) % 3]; fence.proxy.async.
//   Two barriers per tile; S_{t+1} and P . V_t both run under the dequantisation; each raw tile
//   has a whole iteration to land; the exchange, softmax and dequantisation are the chain.
// Tiles 0 .. kNB - 2 are dequantised before the loop (kNB == 3 also issues S_0 there).
#include <algorithm>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mbarrier.cuh"
#include "backend/cuda/v41_device.cuh"
#include "backend/cuda/wgmma.cuh"

namespace moeserve::cuda {
namespace attn_wg {

constexpr int kHd = 512;
constexpr int kHeads = 64;     // wgmma M: the heads of one CTA
constexpr int kThreads = 256;  // two warpgroups
constexpr int kTile = 32;      // keys per tile
constexpr int kMaxKeys = 1024;
constexpr int kGlobFlag = 1 << 30;
constexpr float kPow = 256.0f;
constexpr int kSwaRec = kHd + kHd / 32;       // FP8 record: 512 codes + 16 ue8m0 scales
constexpr int kGlobRec = kHd / 2 + kHd / 16;  // FP4 record: 256 B of nibbles + 32 e4m3 scales
constexpr int kSlot = kSwaRec;                // stage bytes per key
static_assert(kSwaRec % 16 == 0 && kGlobRec % 16 == 0, "records are whole 16-byte chunks");

constexpr uint32_t kQPanel = kHeads * 128;            // 8 KB: 64 heads x 64 channels
constexpr uint32_t kQPart = 8 * kQPanel;              // 64 KB: one fp16 copy of q
constexpr uint32_t kKtPanel = kTile * 128;            // 4 KB: 32 keys x 64 channels
constexpr uint32_t kKtBuf = 8 * kKtPanel;             // 32 KB: one key tile
constexpr uint32_t kHalfPanels = 4;                   // panels per warpgroup (256 channels)
constexpr uint32_t kStageBytes = kTile * kSlot;       // 16,896
constexpr int kItems = kTile * (kHd / 8) / kThreads;  // 8-channel items per thread per tile

constexpr uint32_t kXchBytes = 2 * kHeads * kTile * 4;  // 16 KB: both warpgroups' partial S

// kNB key-tile buffers: 2 (hi + lo; the exchange lives in the idle buffer) or 3 (fp16; the tile
// two ahead is dequantised while the tensor pipe runs S_{t+1} and P . V_t, own exchange buffer,
// two raw-record stage slots).
// Epilogue staging of O: fp32 [64 heads][kOStride] over q, kt and the stage (all idle once the
// last P . V is waited); the row pitch of 520 floats puts the 8 heads of one warp store (rows g and
// g + 4 on the same banks) in 2 wavefronts, the minimum for 256 bytes.
constexpr int kOStride = kHd + 8;
constexpr uint32_t kOBytes = kHeads * kOStride * 4;  // 130 KB
constexpr int kMaxRope = kHd / 2;                    // (cos, sin) pairs of the inverse RoPE
constexpr int kListRounds = kMaxKeys / kThreads;     // key-list entries per thread

// kNB key-tile buffers: 2 (hi + lo; the exchange lives in the idle buffer) or 3 (fp16; the tile
// two ahead is dequantised while the tensor pipe runs S_{t+1} and P . V_t, own exchange buffer,
// two raw-record stage slots).
template <bool kSplit, int kNB>
struct Smem {
  static_assert(kNB == 2 || kNB == 3, "two or three key-tile buffers");
  static constexpr int kStages = kNB == 3 ? 2 : 1;
  static constexpr uint32_t kQ = 0;
  static constexpr uint32_t kKt = kQ + (kSplit ? 2 : 1) * kQPart;
  static constexpr uint32_t kStage = kKt + kNB * kKtBuf;
  static constexpr uint32_t kXch = kStage + kStages * kStageBytes;
  static constexpr uint32_t kList = kXch + (kNB == 3 ? kXchBytes : 0);
  static constexpr uint32_t kRope = kList + sizeof(int32_t) * kMaxKeys;  // double2 [kMaxRope]
  static constexpr uint32_t kEnd = kRope + 16 * kMaxRope;
  static constexpr uint32_t kBytes = kEnd + 1024;  // + slack to align the base to 1024
  static_assert(kBytes <= 227 * 1024, "shared memory budget");
  static_assert(kKt % 1024 == 0 && kStage % 16 == 0 && kXch % 16 == 0 && kRope % 16 == 0,
                "alignment");
  static_assert(kOBytes <= kList, "the O staging tile lies below the key list and RoPE table");
};
// The instantiations launch_sparse_attention_wgmma takes: two key buffers with hi + lo, three in
// fp16 (S_{t+1} and P . V_t under one dequantisation, 2 barriers per tile). The three-buffer
// pipeline measured slower in r6 (attn_probe, 64 heads, 640 keys: 384 rows 360.7 vs 342.8 us);
// since the later changes to the loop it is the faster one at every row count the probe times
// (r11: 1 row 65.7 vs 70.6 us, 64 rows 67.0 vs 70.0, 384 rows 208.1 vs 209.4, 512 rows 274.7 vs
// 274.8; docs/perf/forward-gpu-2026-11-30-r11.md).
constexpr int kNBSplit = 2;
constexpr int kNBHalf = 3;

// Phase clocks for tools/device/attn_probe.cu (compiled out unless MOESERVE_ATTN_CLOCKS): thread
// 0 of each CTA adds the cycles since the previous mark to slot i (names in the probe).
#ifdef MOESERVE_ATTN_CLOCKS
__device__ unsigned long long g_wg_clocks[16];
#define WG_MARK(i)                                                              \
  do {                                                                          \
    if (threadIdx.x == 0) {                                                     \
      const long long now_ = clock64();                                         \
      atomicAdd(&g_wg_clocks[i], static_cast<unsigned long long>(now_ - clk_)); \
      clk_ = now_;                                                              \
    }                                                                           \
  } while (0)
#else
#define WG_MARK(i) \
  do {             \
  } while (0)
#endif

__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }

// (a, b) -> fp16 pairs hi, lo with a = hi.x + lo.x + O(2^-22 |a|) (b likewise).
__device__ __forceinline__ void split_pair(float a, float b, uint32_t* hi, uint32_t* lo) {
  const __half2 h = __floats2half2_rn(a, b);
  const float2 hf = __half22float2(h);
  *hi = h2_bits(h);
  *lo = h2_bits(__floats2half2_rn(a - hf.x, b - hf.y));
}

__device__ __forceinline__ void cp_async16(uint32_t smem_dst, const void* gmem_src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_dst), "l"(gmem_src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// Byte offset of the 16-byte chunk holding channels [8 oct, 8 oct + 8) of row `row` in a
// swizzled operand of 8 panels with `panel` bytes each (128 B per row).
__device__ __forceinline__ uint32_t swz(uint32_t panel, int row, int oct) {
  return static_cast<uint32_t>(oct >> 3) * panel + static_cast<uint32_t>(row) * 128u +
         (static_cast<uint32_t>((oct & 7) ^ (row & 7)) << 4);
}

// Issues the copies of keys [t0, t0 + kTile) of the list into the stage (commits a group): warp
// w copies keys w, w + 8, w + 16, w + 24, its lanes the record's 16-byte chunks (FP4: 18, SWA:
// 33, lane 0 taking the last). The four list entries are read before any copy is issued (one
// shared-memory latency per tile, not one per key).
__device__ __forceinline__ void stage_tile(const SparseAttentionParams& p, const int32_t* list,
                                           int nk, int t0, uint32_t stage) {
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  constexpr int kPerWarp = kTile / (kThreads / 32);
  int ids[kPerWarp];
#pragma unroll
  for (int k = 0; k < kPerWarp; ++k) {
    const int key = warp + 8 * k;
    ids[k] = t0 + key < nk ? list[t0 + key] : -1;
  }
#pragma unroll
  for (int k = 0; k < kPerWarp; ++k) {
    if (ids[k] < 0) continue;  // past the list (warp-uniform)
    const int id = ids[k];
    const bool glob = (id & kGlobFlag) != 0;
    const uint8_t* rec = glob ? p.glob + static_cast<int64_t>(id & ~kGlobFlag) * kGlobRec
                              : p.swa + static_cast<int64_t>(id) * kSwaRec;
    const int chunks = glob ? kGlobRec / 16 : kSwaRec / 16;
    const uint32_t dst = stage + static_cast<uint32_t>((warp + 8 * k) * kSlot);
    if (lane < chunks) cp_async16(dst + 16u * lane, rec + 16 * lane);
    if (lane + 32 < chunks) cp_async16(dst + 16u * (lane + 32), rec + 16 * (lane + 32));
  }
  cp_async_commit();
}

constexpr float kLog2e = 1.4426950408889634f;
// 2^x (MUFU.EX2; -inf -> +0, subnormal results flushed to zero).
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// One 16-byte global store (kept whole: the compiler splits a float4 assembled from selects).
__device__ __forceinline__ void st_global_v4(float* ptr, float4 v) {
  asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(ptr), "f"(v.x), "f"(v.y),
               "f"(v.z), "f"(v.w)
               : "memory");
}

// The MXFP8 fake-quant of 4 consecutive channels per lane as bf16 pairs lo, hi: lanes 8 i .. 8 i
// + 7 hold one 32-channel block (warp-collective: every lane calls it). The rule and operations
// of launch_act_quant_mxfp8's vector kernel (amax from 0 over |v| with fmaxf, which is
// order-independent; v41::mxfp8_scale and mxfp8_round2; bf16 round to nearest), so the bits are
// its kBF16 output's. Returns the block's amax; its scale in sc.
__device__ __forceinline__ float mxfp8_bf16x4(float4 v, v41::Mxfp8Scale& sc, __nv_bfloat162& lo,
                                              __nv_bfloat162& hi) {
  float a = 0.0f;
  a = fmaxf(a, fabsf(v.x));
  a = fmaxf(a, fabsf(v.y));
  a = fmaxf(a, fabsf(v.z));
  a = fmaxf(a, fabsf(v.w));
  a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 1));
  a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 2));
  a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 4));
  sc = v41::mxfp8_scale(a);
  lo = __float22bfloat162_rn(v41::mxfp8_round2(v.x, v.y, sc));
  hi = __float22bfloat162_rn(v41::mxfp8_round2(v.z, v.w, sc));
  return a;
}

// mxfp8_bf16x4's bits stored (one 8-byte store).
__device__ __forceinline__ void st_global_mxfp8_bf16x4(uint16_t* ptr, float4 v) {
  v41::Mxfp8Scale sc;
  __nv_bfloat162 lo, hi;
  mxfp8_bf16x4(v, sc, lo, hi);
  asm volatile("st.global.v2.b32 [%0], {%1, %2};\n" ::"l"(ptr),
               "r"(*reinterpret_cast<const uint32_t*>(&lo)),
               "r"(*reinterpret_cast<const uint32_t*>(&hi))
               : "memory");
}

// kOut, the epilogue's output: fp32, the MXFP8 fake-quant as bf16 bits, or row-scaled FP8.
constexpr int kOutF32 = 0, kOutMxfp8Bf16 = 1, kOutFp8Rows = 2;

// kOutFp8Rows, pass 1, per lane of 4 consecutive channels (a 32-channel block is 8 consecutive
// lanes; warp-collective): the values mxfp8_bf16x4 rounds (st_global_mxfp8_bf16x4's), widened
// back from bf16 exactly, then act_quant_fp8_rows's quantiser on them (fp8_rows.cu quant_chunk:
// the block's MXFP8 scale and codes of those values, and its reference code, maxed into m). So
// the codes, and after the refold onto the row's R the output, are that launch's on
// out_mxfp8_bf16 bit for bit (finite values). The quantiser's two block maxima need no shuffles
// here: the MXFP8 rounding is odd and monotone in |v| (e4m3 round-to-nearest-even with saturation,
// times a power of two; the bf16 rounding of its exact result is the identity), so the largest
// |rounded value| of the block is the rounded amax, and the largest code magnitude under the new
// scale is that value's code. (A first form reduced both over the 8 lanes: 6 more dependent
// shuffles per chunk; the attention grew by ~28 us per decode layer, more than the launch it
// replaced.)
__device__ __forceinline__ void fp8_rows_quant4(float4 v, uint32_t& q, uint32_t& code,
                                                uint32_t& m) {
  v41::Mxfp8Scale sc;
  __nv_bfloat162 lo, hi;
  const float a = mxfp8_bf16x4(v, sc, lo, hi);
  const float x[4] = {__low2float(lo), __high2float(lo), __low2float(hi), __high2float(hi)};
  const float a2 = v41::mxfp8_round(a, sc);  // the block's largest |x|
  const v41::Mxfp8Scale sc2 = v41::mxfp8_scale(a2);
  q = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) q |= v41::mxfp8_code(x[e], sc2) << (8 * e);
  const uint32_t mag = v41::mxfp8_code(a2, sc2) & 0x7Fu;  // the block's largest code magnitude
  code = sc2.code;
  m = max(m, v41::fp8_rows_block_ref(mag, sc2));
}

// The online softmax's shared steps for an S accumulator s[4 i + 2 h + v] (head row r0 + 8 h,
// key key0 + 8 i + 2 tq + v; the 4 lanes of a quad hold a row): keys at or past `limit` -> -inf,
// the rest times 2^-8; the row maxima over the quad; the new running maxima m_run and the
// factors alpha = exp(m_old - m_new) that rescale O and l.
template <int kN>
__device__ __forceinline__ void softmax_max(float (&s)[kN], int key0, int limit, int tq,
                                            float (&m_run)[2], float (&alpha)[2]) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int i = 0; i < kN / 4; ++i) {
#pragma unroll
    for (int v = 0; v < 2; ++v) {
      const bool valid = key0 + 8 * i + 2 * tq + v < limit;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float& x = s[4 * i + 2 * h + v];
        x = valid ? x * (1.0f / kPow) : -INFINITY;
        mx[h] = fmaxf(mx[h], x);
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    const float m_new = fmaxf(m_run[h], mx[h]);
    alpha[h] = expf(m_run[h] - m_new);
    m_run[h] = m_new;
  }
}
// l = l * alpha + the quad's sum of this tile's P.
__device__ __forceinline__ void softmax_sum(float (&sum)[2], const float (&alpha)[2],
                                            float (&l_run)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 1);
    sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 2);
    l_run[h] = l_run[h] * alpha[h] + sum[h];
  }
}

// Global-memory lines of [ptr, ptr + bytes) into L2 (fire and forget), spread over the CTA.
__device__ __forceinline__ void prefetch_l2(const void* ptr, int64_t bytes) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(ptr) & ~static_cast<uintptr_t>(127);
  const uintptr_t end = reinterpret_cast<uintptr_t>(ptr) + static_cast<uintptr_t>(bytes);
  for (uintptr_t a = first + 128u * threadIdx.x; a < end; a += 128u * kThreads)
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(a));
}

// e2m1 -> fp16 (exact), as in v41_attention.cu: the high bytes of the 8 fp16 values (every e2m1
// magnitude is an fp16 with a zero low byte) from one PRMT table lookup per 4 nibbles, each
// nibble's sign bit (bit 3) moved to bit 7 of its byte by one PRMT of x and x << 4 and merged in,
// then one PRMT per pair of values places the bytes (16 operations per 8 values; the earlier
// per-pair sign PRMT took 20; the same bits).
constexpr uint32_t kE2m1F16Hi0 = 0x3E3C3800u, kE2m1F16Hi1 = 0x46444240u;
__device__ __forceinline__ void e2m1x8_to_f16(uint32_t x, __half2 s2, uint32_t (&w)[4]) {
  const uint32_t m = x & 0x77777777u;
  const uint32_t x4 = x << 4;
  const uint32_t hi[2] = {
      __byte_perm(kE2m1F16Hi0, kE2m1F16Hi1, m) | (__byte_perm(x, x4, 0x1504u) & 0x80808080u),
      __byte_perm(kE2m1F16Hi0, kE2m1F16Hi1, m >> 16) | (__byte_perm(x, x4, 0x3726u) & 0x80808080u)};
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    const uint32_t v = __byte_perm(hi[b >> 1], 0u, (b & 1) != 0 ? 0x3424u : 0x1404u);
    w[b] = h2_bits(__hmul2(*reinterpret_cast<const __half2*>(&v), s2));
  }
}

// Dequantises the staged tile into kt (fp16, swizzled; zeros for keys past nk), with the values
// of decode_tile of v41_attention.cu. Item it of this thread is key 4 it + tid / 64, channels
// 8 (tid % 64) ..+8 (a warp stores 4 rows of 128 B: no bank conflicts; one key per warp, so the
// SWA / FP4 choice is warp-uniform). The shared-memory reads are issued before any conversion:
// the 8 list entries, then per group of kGroup items (8 = the whole tile; the three-buffer
// pipeline takes 4, its registers being short) the records' words and scales at addresses
// selected without branches. A thread thus waits a few shared-memory latencies per tile, not two
// per item (the old per-item branches serialised them: ~2,900 cycles per tile on the H200).
//   FP4: 8 e2m1 codes (4 bytes at 4 oct) times the e4m3 block scale (byte 256 + oct / 2), fp16.
//   SWA: 8 e4m3 codes (8 bytes at 8 oct) times the ue8m0 scale (byte 512 + oct / 4), through
//        fp32: code * 2^k is exact there, so one rounding to fp16 as the mma.sync kernel (whose
//        fp16 multiply also rounds the exact product once), for every scale (no range branch).
//        kF16Scale (SparseAttentionParams::swa_f16_scale): where 2^k is an fp16 value (k in
//        -24 .. 15, normal or subnormal) one fp16 multiply of the codes' exact fp16 values by it
//        instead (4 HMUL2 for 8 half -> float conversions, 8 FMUL and 4 packs): IEEE
//        multiplication rounds the same exact product once to nearest, so the same fp16 bits.
//        A template parameter: without it the code is the old one token for token (r17 measured
//        the same change behind a runtime flag slowing the default path by ~5%).
template <int kGroup, bool kF16Scale>
__device__ __forceinline__ void decode_tile(const int32_t* list, int nk, int t0,
                                            const uint8_t* stage, uint8_t* kt) {
  static_assert(kItems % kGroup == 0, "whole groups of items");
  const int kq = static_cast<int>(threadIdx.x) >> 6, oct = static_cast<int>(threadIdx.x) & 63;
  int ids[kItems];
#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    const int key = 4 * it + kq;
    ids[it] = t0 + key < nk ? list[t0 + key] : -1;
  }
#pragma unroll
  for (int g0 = 0; g0 < kItems; g0 += kGroup) {
    uint2 raw[kGroup];
    uint32_t sb[kGroup];
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      const int it = g0 + j;
      const uint8_t* rec = stage + (4 * it + kq) * kSlot;
      const bool glob = (ids[it] & kGlobFlag) != 0;  // -1 (past the list): any record, zeroed
      raw[j] = *reinterpret_cast<const uint2*>(rec + 8 * (glob ? oct >> 1 : oct));
      sb[j] = rec[glob ? kHd / 2 + oct / 2 : kHd + oct / 4];
    }
#pragma unroll
    for (int j = 0; j < kGroup; ++j) asm volatile("" : "+r"(raw[j].x), "+r"(raw[j].y), "+r"(sb[j]));
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      const int it = g0 + j, key = 4 * it + kq;
      uint32_t w[4];
      if (ids[it] < 0) {
#pragma unroll
        for (int b = 0; b < 4; ++b) w[b] = 0;
      } else if (ids[it] & kGlobFlag) {
        const __half_raw sr =
            __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(sb[j]), __NV_E4M3);
        e2m1x8_to_f16((oct & 1) != 0 ? raw[j].y : raw[j].x, __half2half2(__half(sr)), w);
      } else {
        bool done = false;
        if constexpr (kF16Scale) {
          if (const int k = static_cast<int>(sb[j]) - 127; k >= -24 && k <= 15) {
            const int bits = k >= -14 ? (k + 15) << 10 : 1 << (k + 24);  // 2^k as fp16 bits
            const __half2 s2 = __half2half2(__ushort_as_half(static_cast<unsigned short>(bits)));
#pragma unroll
            for (int b = 0; b < 4; ++b) {
              const uint32_t word = b < 2 ? raw[j].x : raw[j].y;
              const __half2_raw pr = __nv_cvt_fp8x2_to_halfraw2(
                  static_cast<__nv_fp8x2_storage_t>((word >> (16 * (b & 1))) & 0xFFFFu),
                  __NV_E4M3);
              w[b] = h2_bits(__hmul2(__half2(pr), s2));
            }
            done = true;
          }
        }
        if (!done) {
          const float sc = v41::ue8m0_decode(sb[j]);
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            const uint32_t word = b < 2 ? raw[j].x : raw[j].y;
            const __half2_raw pr = __nv_cvt_fp8x2_to_halfraw2(
                static_cast<__nv_fp8x2_storage_t>((word >> (16 * (b & 1))) & 0xFFFFu), __NV_E4M3);
            const float2 f = __half22float2(__half2(pr));
            w[b] = h2_bits(__floats2half2_rn(f.x * sc, f.y * sc));
          }
        }
      }
      *reinterpret_cast<uint4*>(kt + swz(kKtPanel, key, oct)) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

// Issues S = Q . K^T over this warpgroup's 256 channels into s (16 k-steps x kParts; commits
// nothing): k-step ks reads panel ks / 4, 16-channel slice ks % 4 (32 B into each 128-B row).
template <int kParts>
__device__ __forceinline__ void issue_s(float (&s)[16], uint32_t q_half, uint32_t kt_half) {
#pragma unroll
  for (int ks = 0; ks < 16; ++ks) {
    const uint32_t koff = static_cast<uint32_t>(ks >> 2) * kKtPanel + 32u * (ks & 3);
    const uint32_t qoff = static_cast<uint32_t>(ks >> 2) * kQPanel + 32u * (ks & 3);
    const uint64_t db = wgmma::desc_k_sw128_addr(kt_half + koff);
#pragma unroll
    for (int part = 0; part < kParts; ++part) {
      const uint64_t da = wgmma::desc_k_sw128_addr(q_half + part * kQPart + qoff);
      if (ks == 0 && part == 0) {
        wgmma::f16_ss_n32_zero(s, da, db);
      } else {
        wgmma::f16_ss_n32(s, da, db, 1);
      }
    }
  }
}

// kOut: what the epilogue writes (kOutF32: p.out; kOutMxfp8Bf16: p.out_mxfp8_bf16, the MXFP8
// fake-quant as bf16 bits; kOutFp8Rows: p.out_fp8_rows and p.out_row_scale, the row-scaled FP8
// operand of those values). kF16Scale: p.swa_f16_scale (decode_tile).
// Entry i of row t's key list (pos: the row's position), before compaction: the SWA entries first
// (the ring slot of the explicit index, or of position pos - i; -1 below the floor), then the FP4
// entries (| kGlobFlag); -1 for a missing selection and past the list.
__device__ __forceinline__ int key_id(const SparseAttentionParams& p, int64_t t, int pos, int i) {
  const int nlist = p.swa_k + p.glob_k;
  int id = -1;
  if (i < p.swa_k) {
    if (p.swa_idx) {
      id = p.swa_idx[t * p.swa_k + i];
    } else {
      // kp in [pos - 1023, pos]: 32-bit remainder once kp >= 0 (no 64-bit division call).
      const int64_t kp = static_cast<int64_t>(pos) - i;
      id = kp >= (p.swa_floor > 0 ? p.swa_floor : 0) ? static_cast<int>(kp) % p.ring_size : -1;
    }
  } else if (i < nlist) {
    const int gi = p.glob_idx[t * p.glob_k + (i - p.swa_k)];
    id = gi >= 0 ? (gi | kGlobFlag) : -1;
  }
  return id;
}

template <bool kSplit, int kNB, int kOut, bool kF16Scale>
__global__ void __launch_bounds__(kThreads, 1)
    sparse_attention_wgmma_kernel(SparseAttentionParams p) {
  pdl_wait();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Smem<kSplit, kNB>;
  constexpr int kParts = kSplit ? 2 : 1;
  constexpr int kDecodeGroup = kNB == 2 ? kItems : kItems / 2;
  extern __shared__ unsigned char smem_raw[];
  __shared__ int32_t warp_count[kListRounds][kThreads / 32];
  [[maybe_unused]] __shared__ uint32_t rows_red[kThreads / 32];  // kOutFp8Rows: the row's R
#ifdef MOESERVE_ATTN_CLOCKS
  long long clk_ = clock64();
#endif
  // 1024-aligned base: the swizzle atoms' XOR pattern is taken from address bits 7-9. Offsetting
  // smem_raw itself (not an integer round trip) keeps every pointer derived from smem known to
  // address shared memory: LDS / STS instead of generic loads and stores.
  const uint32_t raw_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t pad = (1024u - (raw_base & 1023u)) & 1023u;
  uint8_t* const smem = smem_raw + pad;
  const uint32_t sbase = raw_base + pad;
  int32_t* const list = reinterpret_cast<int32_t*>(smem + L::kList);
  double2* const rope = reinterpret_cast<double2*>(smem + L::kRope);
  // Raw records of tile u: stage slot u % kStages.
  const auto slot_off = [](int u) -> uint32_t {
    return L::kStage + static_cast<uint32_t>(u % L::kStages) * kStageBytes;
  };
  const auto kt_off = [](int u) -> uint32_t {
    return L::kKt + static_cast<uint32_t>(u % kNB) * kKtBuf;
  };

  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int wg = tid >> 7;     // warpgroup: channel half
  const int wtid = tid & 127;  // thread within the warpgroup
  const int g = lane >> 2, tq = lane & 3;
  const int r0 = 16 * (warp & 3) + g;  // heads r0 and r0 + 8 of the CTA (accumulator rows)

  // Work item w: row w / nhg, heads [64 (w % nhg), +64). This CTA takes items blockIdx.x,
  // blockIdx.x + gridDim.x, ... (grid: at most one CTA per SM).
  const int nhg = p.heads / kHeads;
  const int nwork = static_cast<int>(p.rows) * nhg;  // < 2^31 (sparse_attention_wgmma_fits)
  const auto prefetch_item = [&](int wi) {
    if (wi >= nwork) return;
    const int64_t tr = wi / nhg;
    prefetch_l2(p.q + (tr * p.heads + (wi % nhg) * kHeads) * kHd,
                static_cast<int64_t>(kHeads) * kHd * sizeof(float));
    if (p.glob_k > 0) prefetch_l2(p.glob_idx + tr * p.glob_k, sizeof(int32_t) * p.glob_k);
    if (p.swa_idx != nullptr) prefetch_l2(p.swa_idx + tr * p.swa_k, sizeof(int32_t) * p.swa_k);
  };
  // The first item's q streams into L2 under its list compaction.
  prefetch_item(static_cast<int>(blockIdx.x));

  // Descriptor bases. S: A = q part, this warpgroup's panels 4 wg..; B = kt[b], same panels.
  // P . V: B = kt[b] panels 4 wg.., MN-major (LBO = one panel: the next 64 channels; SBO = 1024
  // B: the next 8 keys); k-step ks (keys 16 ks..) starts 16 rows = 2048 B further.
  const uint32_t q_half = sbase + L::kQ + static_cast<uint32_t>(wg) * kHalfPanels * kQPanel;
  const uint32_t kt_half = sbase + static_cast<uint32_t>(wg) * kHalfPanels * kKtPanel;

  for (int w = static_cast<int>(blockIdx.x); w < nwork; w += static_cast<int>(gridDim.x)) {
    const int64_t t = w / nhg;
    const int h0 = static_cast<int>(w % nhg) * kHeads;
    const int pos = p.pos[t];

    // Ordered compaction of the valid key ids (as the mma.sync kernel): every thread loads its (up
    // to 4) selections first, then one barrier for the per-warp counts of all rounds. The first
    // barrier also orders the previous item's epilogue reads of the O staging (which overlays q,
    // kt and the stage) before this item's writes there.
    int ids[kListRounds];
#pragma unroll
    for (int k = 0; k < kListRounds; ++k) ids[k] = key_id(p, t, pos, tid + k * kThreads);
    uint32_t masks[kListRounds];
#pragma unroll
    for (int k = 0; k < kListRounds; ++k) {
      masks[k] = __ballot_sync(0xffffffffu, ids[k] >= 0);
      if (lane == 0) warp_count[k][warp] = __popc(masks[k]);
    }
    __syncthreads();
    int nk = 0;
#pragma unroll
    for (int k = 0; k < kListRounds; ++k) {
      int before = 0, sum = 0;
#pragma unroll
      for (int v = 0; v < kThreads / 32; ++v) {
        const int c = warp_count[k][v];
        before += v < warp ? c : 0;
        sum += c;
      }
      if (ids[k] >= 0) list[nk + before + __popc(masks[k] & ((1u << lane) - 1u))] = ids[k];
      nk += sum;
    }
    __syncthreads();  // the list is complete
    const int ntiles = (nk + kTile - 1) / kTile;
    WG_MARK(0);

    // Raw tiles 0 .. kStages - 1 in flight while q is converted.
#pragma unroll
    for (int u = 0; u < L::kStages; ++u)
      if (u < ntiles) stage_tile(p, list, nk, u * kTile, sbase + slot_off(u));

    // (cos, sin) of pos * freqs[j] for the epilogue's inverse RoPE, once per row (read after the
    // barriers below).
    if (p.freqs != nullptr) {
      for (int j = tid; j < p.rd / 2; j += kThreads) {
        double sn, co;
        sincos(static_cast<double>(pos) * p.freqs[j], &sn, &co);
        rope[j] = make_double2(co, sn);
      }
    }

    // q * scale (fp32, as the CPU) * 2^8 -> fp16 (hi, lo) into the swizzled A panels. Item i of
    // the CTA: head i / 64, channels 8 (i % 64) ..+8 (a warp reads 1 KB of one head); 16 items per
    // thread in two batches of 8, each batch's 16 float4 loads issued before any is converted.
    {
      const float* qrow = p.q + (t * p.heads + h0) * kHd;
      constexpr int kQItems = kHeads * (kHd / 8) / kThreads;
      constexpr int kBatch = 8;
#pragma unroll
      for (int b0 = 0; b0 < kQItems; b0 += kBatch) {
        float4 x[2 * kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          const int i = tid + (b0 + j) * kThreads;
          const float4* src = reinterpret_cast<const float4*>(qrow + (i >> 6) * kHd + 8 * (i & 63));
          x[2 * j] = __ldg(src);
          x[2 * j + 1] = __ldg(src + 1);
        }
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          const int i = tid + (b0 + j) * kThreads;
          const int head = i >> 6, oct = i & 63;
          const float v[8] = {x[2 * j].x,     x[2 * j].y,     x[2 * j].z,     x[2 * j].w,
                              x[2 * j + 1].x, x[2 * j + 1].y, x[2 * j + 1].z, x[2 * j + 1].w};
          uint32_t hi[4], lo[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float a = v[2 * e] * p.scale * kPow, bb = v[2 * e + 1] * p.scale * kPow;
            if constexpr (kSplit) {
              split_pair(a, bb, &hi[e], &lo[e]);
            } else {
              hi[e] = h2_bits(__floats2half2_rn(a, bb));
            }
          }
          const uint32_t o = L::kQ + swz(kQPanel, head, oct);
          *reinterpret_cast<uint4*>(smem + o) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
          if constexpr (kSplit)
            *reinterpret_cast<uint4*>(smem + o + kQPart) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
        }
      }
    }

    float o[128];  // O (this warpgroup's 256 channels), zeroed before any wgmma is issued
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    wgmma::fence_operands(o);

    // Tiles 0 .. kNB - 2 dequantised (the loop then keeps kNB - 1 tiles ahead of P . V).
    cp_async_wait_all();
    __syncthreads();  // everyone's raw tiles landed
#pragma unroll
    for (int u = 0; u < kNB - 1; ++u)
      if (u < ntiles)
        decode_tile<kDecodeGroup, kF16Scale>(list, nk, u * kTile, smem + slot_off(u),
                                             smem + kt_off(u));
    wgmma::fence_proxy_async_smem();  // q and kt: generic stores read by the async proxy
    __syncthreads();                  // kt complete; stage slots free
    if (kNB - 1 < ntiles) stage_tile(p, list, nk, (kNB - 1) * kTile, sbase + slot_off(kNB - 1));

    float m_run[2], l_run[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m_run[h] = p.sink[h0 + r0 + 8 * h];
      l_run[h] = 1.0f;  // exp(sink - m)
    }

    float s[16];  // S partial of the current tile
    if constexpr (kNB == 3) {
      // S_0 issued ahead (the loop issues S_{t+1} with P . V_t). Unconditional, as S_{t+1} in the
      // last iteration (a product of a stale buffer, never read): on every path into the loop s is
      // defined by a wgmma, which keeps ptxas from serialising the wgmma pipeline.
      wgmma::fence();
      issue_s<kParts>(s, q_half, kt_half + kt_off(0));
      wgmma::commit_group();
    }
    if (ntiles == 0) prefetch_item(w + static_cast<int>(gridDim.x));
    WG_MARK(1);

    for (int ti = 0; ti < ntiles; ++ti) {
      const int t0 = ti * kTile;

      // 1. S_t partial over this warpgroup's 256 channels. kNB == 2: issued here (kt[t % 2] was
      // completed at the end of the previous iteration). kNB == 3: issued with P . V_{t-1} in the
      // previous iteration, both ran under the dequantisation (waiting for S_t alone, wait_group 1,
      // makes ptxas serialise the wgmma pipeline). Either way S_t and P . V_{t-1} are waited here.
      if constexpr (kNB == 2) {
        wgmma::fence();
        issue_s<kParts>(s, q_half, kt_half + kt_off(ti));
        wgmma::commit_group();
      }
      wgmma::wait_group<0>();
      wgmma::fence_operands(o);
      wgmma::fence_operands(s);
      WG_MARK(2);

      // 2. Exchange the partials (thread-major float4s: a warp stores 512 contiguous bytes).
      // kNB == 2: through this warpgroup's half of the other key buffer (its own earlier wgmma on
      // it are complete; the other warpgroup never reads that half). kNB == 3: own buffer, whose
      // previous reads all precede the unconditional barrier of step 5.
      {
        const uint32_t xbase = kNB == 2 ? kt_off(ti + 1) : L::kXch;
        const uint32_t xhalf = kNB == 2 ? kHalfPanels * kKtPanel : kXchBytes / 2;
        float4* mine = reinterpret_cast<float4*>(smem + xbase + static_cast<uint32_t>(wg) * xhalf);
        const float4* theirs =
            reinterpret_cast<const float4*>(smem + xbase + static_cast<uint32_t>(wg ^ 1) * xhalf);
#pragma unroll
        for (int j = 0; j < 4; ++j)
          mine[j * 128 + wtid] = make_float4(s[4 * j], s[4 * j + 1], s[4 * j + 2], s[4 * j + 3]);
        __syncthreads();  // kNB == 3: also makes the tile decoded in the previous iteration visible
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float4 x = theirs[j * 128 + wtid];
          s[4 * j] += x.x;
          s[4 * j + 1] += x.y;
          s[4 * j + 2] += x.z;
          s[4 * j + 3] += x.w;
        }
      }
      WG_MARK(3);

      // 3. Online softmax. s[4 i + 2 h + v]: head r0 + 8 h, key t0 + 8 i + 2 tq + v.
      uint32_t ph[2][4], pl[2][4];
      {
        float alpha[2], sum[2] = {0.0f, 0.0f};
        softmax_max(s, t0, nk, tq, m_run, alpha);
        // P = exp(s - m): expf where P keeps ~2^-22 (hi + lo); with single fp16 P operands (which
        // round P to 2^-11 anyway) the hardware 2^x of (s - m) log2 e, one FFMA and one MUFU.EX2
        // instead of expf's ~8 instructions (relative error ~2^-21 for the arguments here).
        const float ml[2] = {m_run[0] * kLog2e, m_run[1] * kLog2e};
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const int h = (i >> 1) & 1;
          if constexpr (kSplit) {
            s[i] = expf(s[i] - m_run[h]);  // 0 for missing keys (-inf)
          } else {
            s[i] = ex2_approx(fmaf(s[i], kLog2e, -ml[h]));  // 0 for missing keys (-inf)
          }
          sum[h] += s[i];
        }
        softmax_sum(sum, alpha, l_run);
        // A fragments of k-step j (keys 16 j..): a[0] = (head r0, keys 16 j + 2 tq, +1) = s[8 j],
        // s[8 j + 1]; a[1] = head r0 + 8; a[2], a[3] the keys + 8.
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const float a = s[8 * j + 2 * r] * kPow, b = s[8 * j + 2 * r + 1] * kPow;
            if constexpr (kSplit) {
              split_pair(a, b, &ph[j][r], &pl[j][r]);
            } else {
              ph[j][r] = h2_bits(__floats2half2_rn(a, b));
              pl[j][r] = 0;
            }
          }
        }
        // Once the running maxima settle, alpha is exactly 1 for every row of the warp: skip the
        // multiplications by 1 (bit-identical).
        if (!__all_sync(0xffffffffu, alpha[0] == 1.0f && alpha[1] == 1.0f)) {
#pragma unroll
          for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
        }
      }
      WG_MARK(4);

      // 4. kNB == 3: S_{t+1} (its tile was completed before the exchange barrier) into s, then
      // O += P . V_t over this warpgroup's 256 channels (neither waited here). The rescaled O and
      // the P fragments are pinned before wgmma.fence (no register write may sink past it).
      wgmma::fence_operands(o);
      wgmma::fence_operands(s);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          asm volatile("" : "+r"(ph[j][r])::"memory");
          if constexpr (kSplit) asm volatile("" : "+r"(pl[j][r])::"memory");
        }
      }
      wgmma::fence();
      if constexpr (kNB == 3) {
        issue_s<kParts>(s, q_half, kt_half + kt_off(ti + 1));  // unconditional: see S_0
        wgmma::commit_group();
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint64_t dv = wgmma::desc_mn_sw128(kt_half + kt_off(ti) + 2048u * j, kKtPanel, 1024u);
        wgmma::f16_rs_n256_tb(o, ph[j], dv, 1);
        if constexpr (kSplit) wgmma::f16_rs_n256_tb(o, pl[j], dv, 1);
      }
      wgmma::commit_group();
      WG_MARK(5);
      // The next work item's q (and key selections) into L2 halfway through this row's tiles: its
      // prologue then reads L2, not HBM, and the q traffic of all CTAs spreads over the loop.
      if (ti == (ntiles >> 1)) prefetch_item(w + static_cast<int>(gridDim.x));

      // 5. Tile u = t + kNB - 1 into its buffer while the tensor pipe runs.
      const int u = ti + kNB - 1;
      if constexpr (kNB == 2) {
        if (u < ntiles) {
          cp_async_wait_all();
          __syncthreads();  // raw tile u visible; the exchange reads of kt[u % 2] are done
          WG_MARK(6);
          decode_tile<kDecodeGroup, kF16Scale>(list, nk, u * kTile, smem + slot_off(u),
                                               smem + kt_off(u));
          wgmma::fence_proxy_async_smem();
          WG_MARK(7);
          __syncthreads();  // kt[u % 2] complete for S_u; the stage is free
          if (u + 1 < ntiles) stage_tile(p, list, nk, (u + 1) * kTile, sbase + slot_off(u + 1));
          WG_MARK(8);
        }
      } else {
        cp_async_wait_all();  // raw tile u (the only group in flight)
        // Raw tile u visible; every thread's wgmma on kt[u % 3] (S_{t-1}, P . V_{t-1}) are
        // complete (waited in step 3); the exchange reads are done; slot (u + 1) % 2 was decoded
        // (tile u - 1) in the previous iteration. Unconditional: it also guards the exchange
        // buffer.
        __syncthreads();
        WG_MARK(6);
        if (u + 1 < ntiles) stage_tile(p, list, nk, (u + 1) * kTile, sbase + slot_off(u + 1));
        WG_MARK(8);
        if (u < ntiles) {
          decode_tile<kDecodeGroup, kF16Scale>(list, nk, u * kTile, smem + slot_off(u),
                                               smem + kt_off(u));
          wgmma::fence_proxy_async_smem();  // made visible by the next exchange barrier
        }
        WG_MARK(7);
      }
    }
    wgmma::wait_group<0>();
    wgmma::fence_operands(o);

    // Epilogue. out = O / (l 2^8), inverse RoPE on the trailing rd channels, through the O staging
    // tile: o[4 i + 2 h + v] is head r0 + 8 h, channel 256 wg + 8 i + 2 tq + v; then each warp
    // stores 512 contiguous bytes of one head per instruction (float4s), the RoPE pairs from the
    // table (kOutMxfp8Bf16: 256 bytes of bf16 bits, each lane's 4 values quantised with their
    // 32-channel block; kOutFp8Rows: below). The stores are not waited for: the next item starts
    // under them.
    __syncthreads();  // both warpgroups' wgmma are complete: q, kt and the stage are free
    {
      float* const ot = reinterpret_cast<float*>(smem);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float inv = 1.0f / (l_run[h] * kPow);
        float* const orow = ot + (r0 + 8 * h) * kOStride + 256 * wg + 2 * tq;
#pragma unroll
        for (int i = 0; i < 32; ++i)
          *reinterpret_cast<float2*>(orow + 8 * i) =
              make_float2(o[4 * i + 2 * h] * inv, o[4 * i + 2 * h + 1] * inv);
      }
    }
    __syncthreads();  // the staging tile is complete (and the RoPE table)
    {
      const float* const ot = reinterpret_cast<const float*>(smem);
      [[maybe_unused]] uint32_t rows_m = 0;  // kOutFp8Rows: this thread's largest reference code
      float* const out = kOut == kOutF32 ? p.out + (t * p.heads + h0) * kHd : nullptr;
      uint16_t* const out16 =
          kOut == kOutMxfp8Bf16 ? p.out_mxfp8_bf16 + (t * p.heads + h0) * kHd : nullptr;
      const int rope0 = p.freqs != nullptr ? kHd - p.rd : kHd;  // first rotated channel
      const auto rotate = [&](float& a, float& b, int c) {
        if (c >= rope0) {
          const double2 cs = rope[(c - rope0) >> 1];
          const double x0 = a, x1 = b;
          a = static_cast<float>(x0 * cs.x + x1 * cs.y);
          b = static_cast<float>(-x0 * cs.y + x1 * cs.x);
        }
      };
#pragma unroll 4
      for (int k = 0; k < kHeads * kHd / 4 / kThreads; ++k) {
        const int j = tid + k * kThreads;
        const int head = j >> 7, c = 4 * (j & 127);
        float4 v = *reinterpret_cast<const float4*>(ot + head * kOStride + c);
        if (c + 4 > rope0) {
          rotate(v.x, v.y, c);
          rotate(v.z, v.w, c + 2);
        }
        if constexpr (kOut == kOutMxfp8Bf16) {
          st_global_mxfp8_bf16x4(out16 + head * kHd + c, v);
        } else if constexpr (kOut == kOutFp8Rows) {
          // Pass 1: the chunk's codes and its block's scale code back into its own staging slot
          // (only this thread reads it again); the block's reference code into m.
          uint32_t q, code;
          fp8_rows_quant4(v, q, code, rows_m);
          *reinterpret_cast<uint2*>(const_cast<float*>(ot) + head * kOStride + c) =
              make_uint2(q, code);
        } else {
          st_global_v4(out + head * kHd + c, v);
        }
      }
      if constexpr (kOut == kOutFp8Rows) {
        // The item is the whole row (heads == kHeads): R = the row's largest reference code, then
        // pass 2 stores each chunk's codes refolded onto it (4 bytes per lane, 128 contiguous
        // bytes per warp) and thread 0 the row scale. rows_red is read after the barrier and
        // written again only in the next item's epilogue, many barriers later.
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) rows_m = max(rows_m, __shfl_xor_sync(0xFFFFFFFFu, rows_m, o));
        if (lane == 0) rows_red[warp] = rows_m;
        __syncthreads();
        uint32_t R = 0;
#pragma unroll
        for (int i = 0; i < kThreads / 32; ++i) R = max(R, rows_red[i]);
        uint8_t* const out8 = p.out_fp8_rows + t * static_cast<int64_t>(kHeads * kHd);
#pragma unroll 4
        for (int k = 0; k < kHeads * kHd / 4 / kThreads; ++k) {
          const int j = tid + k * kThreads;
          const int head = j >> 7, c = 4 * (j & 127);
          const uint2 qc = *reinterpret_cast<const uint2*>(ot + head * kOStride + c);
          const uint32_t q = v41::fp8_rows_refold4(qc.x, qc.y, R);
          asm volatile("st.global.b32 [%0], %1;\n" ::"l"(out8 + head * kHd + c), "r"(q) : "memory");
        }
        if (tid == 0) p.out_row_scale[t] = v41::ue8m0_decode(R);
      }
    }
    // No barrier: the next item's first list barrier orders these staging reads before its writes.
    WG_MARK(9);
  }  // work items
#else
  __trap();  // sm_90a only (wgmma); launch_sparse_attention takes this path only with use_wgmma.
#endif
}

// A persistent grid of at most one CTA per SM over the work items (row, 64 heads) of p, for the
// kernels of this file (kBytes of dynamic shared memory, set once per kernel).
template <auto kKernel, uint32_t kBytes, int kBlock>
void launch_persistent(const SparseAttentionParams& p, cudaStream_t stream) {
  static const int sms = [] {
    MS_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kBytes)));
    return device_sm_count();
  }();
  const int64_t items = p.rows * (p.heads / kHeads);
  if (items <= 0) return;
  const auto grid = static_cast<unsigned>(std::min<int64_t>(items, sms));
  MS_CUDA_CHECK(launch_kernel(kKernel, grid, kBlock, kBytes, stream, p));
}

// Persistent grid: one CTA per SM at most (218 KB of shared memory and 256 x ~200 registers allow
// one), each looping over work items (row, 64 heads), so a CTA's prologue and epilogue run under
// the memory traffic of its neighbouring items (q prefetched into L2, stores not waited for).
template <bool kSplit, int kNB, int kOut, bool kF16Scale>
void launch_output(const SparseAttentionParams& p, cudaStream_t stream) {
  launch_persistent<sparse_attention_wgmma_kernel<kSplit, kNB, kOut, kF16Scale>,
                    Smem<kSplit, kNB>::kBytes, kThreads>(p, stream);
}

// The fp32 output, the MXFP8 bf16 one when out_mxfp8_bf16 is set, or the row-scaled FP8 one when
// out_fp8_rows is; in single fp16 precision
// with swa_f16_scale, kF16Scale's instantiations (split precision ignores it). Each its own
// instantiation: the default path's code is untouched by the others.
// Calls f(std::integral_constant<int, kOut>) with the kOut p asks for (both kernels' launchers).
template <typename F>
void with_out_kind(const SparseAttentionParams& p, F&& f) {
  if (p.out_fp8_rows != nullptr) {
    f(std::integral_constant<int, kOutFp8Rows>{});
  } else if (p.out_mxfp8_bf16 != nullptr) {
    f(std::integral_constant<int, kOutMxfp8Bf16>{});
  } else {
    f(std::integral_constant<int, kOutF32>{});
  }
}
template <bool kSplit, int kNB, bool kF16Scale>
void launch_outputs(const SparseAttentionParams& p, cudaStream_t stream) {
  with_out_kind(p, [&](auto out) { launch_output<kSplit, kNB, decltype(out)::value, kF16Scale>(p, stream); });
}
template <bool kSplit, int kNB>
void launch(const SparseAttentionParams& p, cudaStream_t stream) {
  if (!kSplit && p.swa_f16_scale) {
    launch_outputs<kSplit, kNB, !kSplit>(p, stream);
  } else {
    launch_outputs<kSplit, kNB, false>(p, stream);
  }
}
// ---- The warp-specialised kernel (SparseAttentionParams::warp_specialized; single fp16) --------
//
// Four warpgroups with their own roles (512 threads, one CTA per SM, persistent over (row, 64
// heads) items), each 64-key tile dequantised once and S computed once over all 512 channels (the
// kernel above splits S by channel halves, exchanges the partials and runs the softmax twice,
// with the dequantisation on the same warps' path):
//   WG 0 (consumer A): S = Q . K^T (m64n64k16, 32 k-steps), the online softmax, P (fp16, * 2^8)
//        into shared memory for WG 1 and from registers into O[:, 0:256) += P . V (m64n128k16).
//   WG 1 (consumer B): rescales its O[:, 256:512) by the factors WG 0 leaves in shared memory, then
//        O += P . V with P from shared memory; the inverse RoPE channels are all in its half. It
//        also builds the key list of the next item (two list slots) and the RoPE table.
//   WG 2, 3 (producers): q -> fp16 (half the heads each) once WG 0's last S of the previous item
//        is done; then for each tile, 32 keys each: a thread holds one key and 128 of its channels
//        (so the 8 lanes of a store phase write 8 rows of the swizzled tile: no bank conflicts),
//        its records' loads all issued before the first is used, the next tile's lines prefetched
//        into L2, dequantised into one of two fp16 key tiles.
// Handoffs: mbarriers full[2] / empty[2] (key tiles; a tile's valid-key count and last-tile flag
// travel in kmeta[buffer]), q_full / q_empty (the q tile), list_full[2] / list_empty[2] (the key
// lists); named barriers between the consumers for P (ready / free) and the epilogue (1 / l, the
// row's FP8 reference code).
// The epilogue works from the accumulators (no shared-memory staging, so the producers fill the
// next item's tiles meanwhile): out = O / (l 2^8), inverse RoPE, and each 32-channel block's
// MXFP8 quantisation across the 4 lanes of a quad (each lane holds 8 of its channels), with the
// operations, hence the bits, of the kernel above's kOutMxfp8Bf16 / kOutFp8Rows epilogues.
// P . V runs as two m64n128k16 halves per k-step: with 512 threads the launch gives 128 registers
// per thread, too few for ptxas to place an n256 instruction, though setmaxnreg raises the
// consumers' budgets above that.
// Precision: single fp16 operands as the kernel above without split precision; S is summed over
// 512 channels in one accumulator (the kernel above: two halves of 256 added), so results agree
// with it to fp32 rounding, not bit for bit.
namespace ws {

constexpr int kThreads = 512;
constexpr int kTile = 64;                          // keys per tile
constexpr uint32_t kKPanel = kTile * 128;          // 8 KB: 64 keys x 64 channels
constexpr uint32_t kKBuf = 8 * kKPanel;            // 64 KB: one key tile (fp16)
constexpr int kMaxRd = 64;                         // RoPE channels this kernel takes
constexpr int kListRounds = kMaxKeys / 128;        // key-list entries per WG 1 thread

struct Smem {
  static constexpr uint32_t kQ = 0;                     // fp16 [8 panels][64 heads][64]
  static constexpr uint32_t kK = kQ + kQPart;           // fp16 [2][8 panels][64 keys][64]
  static constexpr uint32_t kP = kK + 2 * kKBuf;        // fp16 [64 heads][64 keys], swizzled
  static constexpr uint32_t kList = kP + kHeads * 128;  // int32 [2][kMaxKeys]
  static constexpr uint32_t kRope = kList + 2 * 4 * kMaxKeys;  // double2 [2][kMaxRd / 2]
  static constexpr uint32_t kAlpha = kRope + 2 * 16 * (kMaxRd / 2);  // float [64]
  static constexpr uint32_t kLinv = kAlpha + 4 * kHeads;             // float [2][64]
  static constexpr uint32_t kRed = kLinv + 2 * 4 * kHeads;           // uint32 [8]
  static constexpr uint32_t kMeta = kRed + 32;  // int32 [2] (tiles), int32 [2] (list lengths)
  // full[2], empty[2], q_full, q_empty, list_full[2], list_empty[2]
  static constexpr uint32_t kBars = kMeta + 16;
  static constexpr uint32_t kEnd = kBars + 8 * 11;
  static constexpr uint32_t kBytes = kEnd + 1024;
  static_assert(kBytes <= 227 * 1024, "shared memory budget");
  static_assert(kK % 1024 == 0 && kP % 1024 == 0 && kRope % 16 == 0 && kBars % 8 == 0,
                "alignment");
};
enum Bar : uint32_t { kFull0 = 0, kEmpty0 = 2, kQFull = 4, kQEmpty = 5, kListFull0 = 6, kListEmpty0 = 8 };
// Named barriers (0 is __syncthreads).
enum NamedBar : uint32_t { kListBar = 1, kPFree = 2, kPReady = 3, kEpi1 = 4, kEpi2 = 5 };

__device__ __forceinline__ void named_sync(uint32_t id, uint32_t n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void named_arrive(uint32_t id, uint32_t n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
template <uint32_t kRegs>
__device__ __forceinline__ void regs_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <uint32_t kRegs>
__device__ __forceinline__ void regs_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// One key's 8 channels [8 oct, 8 oct + 8) as fp16 (decode_tile's values and operations without
// kF16Scale): raw = the record's 8 bytes at 8 oct (SWA) or 8 (oct / 2) (FP4), sb its block scale
// byte; not valid (past the list): zeros.
__device__ __forceinline__ uint4 decode8(bool valid, bool glob, uint2 raw, uint32_t sb, int oct) {
  uint32_t w[4];
  if (!valid) {
#pragma unroll
    for (int b = 0; b < 4; ++b) w[b] = 0;
  } else if (glob) {
    const __half_raw sr = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(sb), __NV_E4M3);
    e2m1x8_to_f16((oct & 1) != 0 ? raw.y : raw.x, __half2half2(__half(sr)), w);
  } else {
    const float sc = v41::ue8m0_decode(sb);
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const uint32_t word = b < 2 ? raw.x : raw.y;
      const __half2_raw pr = __nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>((word >> (16 * (b & 1))) & 0xFFFFu), __NV_E4M3);
      const float2 f = __half22float2(__half2(pr));
      w[b] = h2_bits(__floats2half2_rn(f.x * sc, f.y * sc));
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The record of key id (kGlobFlag: FP4 main entry, else SWA ring entry).
__device__ __forceinline__ const uint8_t* record(const SparseAttentionParams& p, int id) {
  return (id & kGlobFlag) != 0 ? p.glob + static_cast<int64_t>(id & ~kGlobFlag) * kGlobRec
                               : p.swa + static_cast<int64_t>(id) * kSwaRec;
}

// A lane's 8 values of one 32-channel block: channels 8 i + 2 tq, +1 for 4 consecutive i, the
// block being the 4 lanes of a quad (warp-collective). MXFP8 fake-quant as bf16 pairs b[k] (values
// 2k, 2k + 1) with mxfp8_bf16x4's operations (amax by fmaxf, order-independent; the same rounding
// per value), so the same bits. Returns the block's amax; its scale in sc.
__device__ __forceinline__ float mxfp8_bf16x8_quad(const float (&v)[8], v41::Mxfp8Scale& sc,
                                                   __nv_bfloat162 (&b)[4]) {
  float a = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) a = fmaxf(a, fabsf(v[e]));
  a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 1));
  a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 2));
  sc = v41::mxfp8_scale(a);
#pragma unroll
  for (int k = 0; k < 4; ++k) b[k] = __float22bfloat162_rn(v41::mxfp8_round2(v[2 * k], v[2 * k + 1], sc));
  return a;
}

// fp8_rows_quant4 for the quad layout: codes q[0] (values 0..3) and q[1] (4..7), the block's
// scale code, its reference code maxed into m.
__device__ __forceinline__ void fp8_rows_quant8_quad(const float (&v)[8], uint32_t (&q)[2],
                                                     uint32_t& code, uint32_t& m) {
  v41::Mxfp8Scale sc;
  __nv_bfloat162 b[4];
  const float a = mxfp8_bf16x8_quad(v, sc, b);
  const float a2 = v41::mxfp8_round(a, sc);  // the block's largest |x|
  const v41::Mxfp8Scale sc2 = v41::mxfp8_scale(a2);
  q[0] = q[1] = 0;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float x = (e & 1) != 0 ? __high2float(b[e >> 1]) : __low2float(b[e >> 1]);
    q[e >> 2] |= v41::mxfp8_code(x, sc2) << (8 * (e & 3));
  }
  const uint32_t mag = v41::mxfp8_code(a2, sc2) & 0x7Fu;
  code = sc2.code;
  m = max(m, v41::fp8_rows_block_ref(mag, sc2));
}

// The consumers' epilogue from the accumulators: o[4 i + 2 h + v] is head r0 + 8 h, channel
// cbase + 8 i + 2 tq + v; out = o * inv[h] (fp32), then the inverse RoPE (double, from the
// table) on channels >= rope0, as the kernel above's staging epilogue. kOutFp8Rows: the row's
// reference code R is reduced over both consumer warpgroups (cwarp 0..7, red_s, kEpi2), so both
// call this with the same kOut.
template <int kOut>
__device__ __forceinline__ void epilogue_store(const SparseAttentionParams& p, const float (&o)[128],
                                               const float (&inv)[2], int64_t t, int h0, int cbase,
                                               int r0, int tq, int lane, int cwarp,
                                               const double2* rope, int rope0, uint32_t* red_s) {
  const auto value_pair = [&](int i, int h, float& a, float& b) {
    a = o[4 * i + 2 * h] * inv[h];
    b = o[4 * i + 2 * h + 1] * inv[h];
    const int c = cbase + 8 * i + 2 * tq;
    if (rope != nullptr && c >= rope0) {
      const double2 cs = rope[(c - rope0) >> 1];
      const double x0 = a, x1 = b;
      a = static_cast<float>(x0 * cs.x + x1 * cs.y);
      b = static_cast<float>(-x0 * cs.y + x1 * cs.x);
    }
  };
  if constexpr (kOut == kOutF32) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float* const out = p.out + (t * p.heads + h0 + r0 + 8 * h) * kHd + cbase + 2 * tq;
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        float a, b;
        value_pair(i, h, a, b);
        *reinterpret_cast<float2*>(out + 8 * i) = make_float2(a, b);
      }
    }
  } else if constexpr (kOut == kOutMxfp8Bf16) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint16_t* const out = p.out_mxfp8_bf16 + (t * p.heads + h0 + r0 + 8 * h) * kHd + cbase + 2 * tq;
#pragma unroll
      for (int blk = 0; blk < 8; ++blk) {
        float v[8];
#pragma unroll
        for (int k = 0; k < 4; ++k) value_pair(4 * blk + k, h, v[2 * k], v[2 * k + 1]);
        v41::Mxfp8Scale sc;
        __nv_bfloat162 b[4];
        mxfp8_bf16x8_quad(v, sc, b);
#pragma unroll
        for (int k = 0; k < 4; ++k)
          *reinterpret_cast<__nv_bfloat162*>(out + 8 * (4 * blk + k)) = b[k];
      }
    }
  } else {
    // Pass 1: codes and block scale codes in registers, the reference codes maxed into m.
    uint32_t q[2][8][2], code[2][8], m = 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int blk = 0; blk < 8; ++blk) {
        float v[8];
#pragma unroll
        for (int k = 0; k < 4; ++k) value_pair(4 * blk + k, h, v[2 * k], v[2 * k + 1]);
        fp8_rows_quant8_quad(v, q[h][blk], code[h][blk], m);
      }
    }
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, s));
    if (lane == 0) red_s[cwarp] = m;
    named_sync(kEpi2, 256);
    uint32_t R = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) R = max(R, red_s[i]);
    // Pass 2: the codes refolded onto R, 2 bytes (channels 8 i + 2 tq, +1) per store.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint8_t* const out = p.out_fp8_rows + t * static_cast<int64_t>(kHeads * kHd) +
                           (r0 + 8 * h) * kHd + cbase + 2 * tq;
#pragma unroll
      for (int blk = 0; blk < 8; ++blk) {
#pragma unroll
        for (int wd = 0; wd < 2; ++wd) {
          const uint32_t x = v41::fp8_rows_refold4(q[h][blk][wd], code[h][blk], R);
          const int i = 4 * blk + 2 * wd;
          asm volatile("st.global.b16 [%0], %1;\n" ::"l"(out + 8 * i),
                       "h"(static_cast<uint16_t>(x & 0xFFFFu))
                       : "memory");
          asm volatile("st.global.b16 [%0], %1;\n" ::"l"(out + 8 * (i + 1)),
                       "h"(static_cast<uint16_t>(x >> 16))
                       : "memory");
        }
      }
    }
    if (cwarp == 0 && lane == 0) p.out_row_scale[t] = v41::ue8m0_decode(R);
  }
}

// q * scale * 2^8 -> fp16 into the A panels, half `half` of them (heads 32 half ..+32): item i of
// the 2,048 is head 32 half + i / 64, channels 8 (i % 64) ..+8; 16 per thread of a warpgroup in
// batches of kBatch (2 kBatch float4 loads in flight).
template <int kBatch>
__device__ __forceinline__ void convert_q_half(const SparseAttentionParams& p, uint8_t* smem,
                                               int64_t t, int h0, int half, int wtid) {
  const float* qrow = p.q + (t * p.heads + h0) * kHd;
  constexpr int kPer = kHeads * (kHd / 8) / 256;
#pragma unroll 1
  for (int b0 = 0; b0 < kPer; b0 += kBatch) {
    float4 x[2 * kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = 2048 * half + wtid + (b0 + j) * 128;
      const float4* src = reinterpret_cast<const float4*>(qrow + (i >> 6) * kHd + 8 * (i & 63));
      x[2 * j] = __ldg(src);
      x[2 * j + 1] = __ldg(src + 1);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = 2048 * half + wtid + (b0 + j) * 128;
      const float v[8] = {x[2 * j].x,     x[2 * j].y,     x[2 * j].z,     x[2 * j].w,
                          x[2 * j + 1].x, x[2 * j + 1].y, x[2 * j + 1].z, x[2 * j + 1].w};
      uint32_t hi[4];
#pragma unroll
      for (int e = 0; e < 4; ++e)
        hi[e] = h2_bits(__floats2half2_rn(v[2 * e] * p.scale * kPow, v[2 * e + 1] * p.scale * kPow));
      *reinterpret_cast<uint4*>(smem + Smem::kQ + swz(kQPanel, i >> 6, i & 63)) =
          make_uint4(hi[0], hi[1], hi[2], hi[3]);
    }
  }
}

// Ordered compaction of item w's valid key ids (as the kernel above) into `list` over one
// warpgroup (named barrier kListBar); returns their count.
__device__ __forceinline__ int build_list(const SparseAttentionParams& p, int w, int nhg,
                                          int32_t* list, int32_t (&warp_count)[kListRounds][4],
                                          int wtid) {
  const int lane = wtid & 31, warp = wtid >> 5;
  const int64_t t = w / nhg;
  const int pos = p.pos[t];
  int ids[kListRounds];
#pragma unroll
  for (int r = 0; r < kListRounds; ++r) ids[r] = key_id(p, t, pos, wtid + r * 128);
  uint32_t masks[kListRounds];
#pragma unroll
  for (int r = 0; r < kListRounds; ++r) {
    masks[r] = __ballot_sync(0xffffffffu, ids[r] >= 0);
    if (lane == 0) warp_count[r][warp] = __popc(masks[r]);
  }
  named_sync(kListBar, 128);
  int nk = 0;
#pragma unroll
  for (int r = 0; r < kListRounds; ++r) {
    int before = 0, sum = 0;
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const int c = warp_count[r][v];
      before += v < warp ? c : 0;
      sum += c;
    }
    if (ids[r] >= 0) list[nk + before + __popc(masks[r] & ((1u << lane) - 1u))] = ids[r];
    nk += sum;
  }
  named_sync(kListBar, 128);  // warp_count read by all before the next build writes it
  return nk;
}

// Register budgets after setmaxnreg (the launch gives 128 to each of the 512 threads; the sum
// stays 512): consumer A 200 (O half 128, S 32, P 16), consumer B 168 (its FP8-rows epilogue
// still spills a few), each producer 72.
constexpr uint32_t kRegsA = 200, kRegsB = 168, kRegsP = 72;

// Phase clocks for tools/device/attn_ws_probe.cu (compiled out unless MOESERVE_ATTN_CLOCKS): the
// first thread of each warpgroup adds the cycles since its previous mark to slot i (names in the
// probe; producer 0.., consumer A 8.., consumer B 16..).
#ifdef MOESERVE_ATTN_CLOCKS
__device__ unsigned long long g_ws_clocks[24];
#define WS_MARK(i)                                                               \
  do {                                                                           \
    if (wtid == 0 && wg < 3) {                                                          \
      const long long now_ = clock64();                                          \
      atomicAdd(&g_ws_clocks[i], static_cast<unsigned long long>(now_ - clk_)); \
      clk_ = now_;                                                               \
    }                                                                            \
  } while (0)
#define WS_CLOCK_START long long clk_ = clock64()
#else
#define WS_MARK(i) \
  do {             \
  } while (0)
#define WS_CLOCK_START \
  do {                 \
  } while (0)
#endif
static_assert(kRegsA + kRegsB + 2 * kRegsP == 4 * 128, "register budget");

// kQInB (SparseAttentionParams::ws_q_in_b): consumer B converts q (both halves of the heads),
// the first item's before its first tile and item k + 1's after its epilogue of item k, once A's
// last S of item k is done (q_empty); the producers then go from an item's last tile straight to
// the next item's first. r25's phase clocks (docs/perf/forward-gpu-2026-12-07-r25.md): the
// producers are busy ~59k of ~72k cycles per 384-row item, 15.6k of them on q, while B waits
// ~29k for P. The same conversion of the same values: the same bits.
template <int kOut, bool kQInB>
__global__ void __launch_bounds__(kThreads, 1) sparse_attention_ws_kernel(SparseAttentionParams p) {
  pdl_wait();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Smem;
  extern __shared__ unsigned char smem_raw[];
  __shared__ int32_t warp_count[kListRounds][4];
  const uint32_t raw_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t pad = (1024u - (raw_base & 1023u)) & 1023u;
  uint8_t* const smem = smem_raw + pad;
  const uint32_t sbase = raw_base + pad;
  const uint32_t bars = sbase + L::kBars;
  const auto bar = [&](uint32_t i) { return bars + 8u * i; };
  int32_t* const lists = reinterpret_cast<int32_t*>(smem + L::kList);
  double2* const rope = reinterpret_cast<double2*>(smem + L::kRope);
  float* const alpha_s = reinterpret_cast<float*>(smem + L::kAlpha);
  float* const linv_s = reinterpret_cast<float*>(smem + L::kLinv);
  uint32_t* const red_s = reinterpret_cast<uint32_t*>(smem + L::kRed);
  volatile int32_t* const kmeta = reinterpret_cast<volatile int32_t*>(smem + L::kMeta);
  volatile int32_t* const list_n = kmeta + 2;

  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31;
  const int wg = tid >> 7, wtid = tid & 127, wwarp = wtid >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const int r0 = 16 * wwarp + g;  // consumers: heads r0 and r0 + 8 (accumulator rows)
  const int nhg = p.heads / kHeads;
  const int nwork = static_cast<int>(p.rows) * nhg;
  const int step = static_cast<int>(gridDim.x);

  if (tid == 0) {
    mbar_init(bar(kFull0), 256);
    mbar_init(bar(kFull0 + 1), 256);
    mbar_init(bar(kEmpty0), 256);
    mbar_init(bar(kEmpty0 + 1), 256);
    mbar_init(bar(kQFull), kQInB ? 128 : 256);
    mbar_init(bar(kQEmpty), 128);
    mbar_init(bar(kListFull0), 128);
    mbar_init(bar(kListFull0 + 1), 128);
    mbar_init(bar(kListEmpty0), 256);
    mbar_init(bar(kListEmpty0 + 1), 256);
    mbar_init_fence();
  }
  __syncthreads();

  if (wg >= 2) {
    // ---------------------------------------------------------------- producers
    regs_dec<kRegsP>();
    WS_CLOCK_START;
    const int pid = wg - 2;                     // producer 0 / 1
    const int ptid = tid - 256;  // 0..255 over both producers
    // This thread's key of every tile and its 128 channels: key 32 pid + 8 (warp % 4) + lane % 8,
    // channels [128 mb, 128 mb + 128), mb = lane / 8. The 8 lanes of a store phase hold 8 keys
    // (8 rows of the swizzled tile, distinct XOR patterns): the 16-byte stores are conflict-free.
    const int kk = 32 * pid + 8 * (wwarp & 3) + (lane & 7);
    const int mb = lane >> 3;
    int u = 0;                                  // tiles produced (buffer u % 2)
    int k = 0;                                  // items
    for (int w = static_cast<int>(blockIdx.x); w < nwork; w += step, ++k) {
      // The item's key list (WG 1 builds it into slot k % 2).
      mbar_wait(bar(kListFull0 + (k & 1)), static_cast<uint32_t>((k >> 1) & 1));
      const int32_t* const list = lists + (k & 1) * kMaxKeys;
      const int nk = list_n[k & 1];
      const int ntiles = nk > 0 ? (nk + kTile - 1) / kTile : 1;  // an empty item: one masked tile
      WS_MARK(0);
      // This thread's lines of a tile into L2 (the first tile now, the later ones during the tile
      // before).
      const auto prefetch_tile = [&](int t0) {
        if (t0 + kk < nk) {
          const int id = list[t0 + kk];
          const bool glob = (id & kGlobFlag) != 0;
          const uint8_t* rec = record(p, id);
          asm volatile("prefetch.global.L2 [%0];\n" ::"l"(rec + (glob ? 64 * mb : 128 * mb)));
          if (mb == 0) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(rec + (glob ? kHd / 2 : kHd)));
        }
      };
      prefetch_tile(0);
      WS_MARK(1);
      // q of the item (each producer half of the heads) as soon as WG 0's last S of the previous
      // item is done: WG 0 waits for q, then for the first tile, whose records are on their way
      // into L2 meanwhile. (kQInB: consumer B converts it instead.)
      if constexpr (!kQInB) {
        if (k >= 1) mbar_wait(bar(kQEmpty), static_cast<uint32_t>((k - 1) & 1));
        WS_MARK(5);
        convert_q_half<8>(p, smem, w / nhg, static_cast<int>(w % nhg) * kHeads, pid, wtid);
        wgmma::fence_proxy_async_smem();
        mbar_arrive(bar(kQFull));
        WS_MARK(6);
      }

      for (int ti = 0; ti < ntiles; ++ti, ++u) {
        const int t0 = ti * kTile;
        const int b = u & 1;
        // kk and mb opaque to the compiler here, so the stores' 16 offsets are computed per tile
        // rather than hoisted out of the loops into (spilled) registers.
        int kx = kk, mx = mb;
        asm volatile("" : "+r"(kx), "+r"(mx));
        uint8_t* const kt = smem + L::kK + static_cast<uint32_t>(b) * kKBuf;
        // The record's codes for channels [128 mb, +128) (FP4: 64 B; SWA: 128 B) and their scales
        // (FP4: 8 e4m3 bytes, one per 16 channels; SWA: 4 ue8m0 bytes, one per 32), all loads in
        // flight before the first is used.
        const int id = t0 + kx < nk ? list[t0 + kx] : -1;
        const bool ok = id >= 0, glob = ok && (id & kGlobFlag) != 0;
        uint4 r[8];
        uint2 sc = make_uint2(0u, 0u);
        if (glob) {
          const uint8_t* rec = record(p, id);
#pragma unroll
          for (int j = 0; j < 4; ++j) r[j] = __ldg(reinterpret_cast<const uint4*>(rec + 64 * mx + 16 * j));
          sc = __ldg(reinterpret_cast<const uint2*>(rec + kHd / 2 + 8 * mx));
#pragma unroll
          for (int j = 0; j < 4; ++j)
            asm volatile("" : "+r"(r[j].x), "+r"(r[j].y), "+r"(r[j].z), "+r"(r[j].w));
          asm volatile("" : "+r"(sc.x), "+r"(sc.y));
        } else if (ok) {
          const uint8_t* rec = record(p, id);
#pragma unroll
          for (int j = 0; j < 8; ++j) r[j] = __ldg(reinterpret_cast<const uint4*>(rec + 128 * mx + 16 * j));
          sc.x = __ldg(reinterpret_cast<const uint32_t*>(rec + kHd + 4 * mx));
#pragma unroll
          for (int j = 0; j < 8; ++j)
            asm volatile("" : "+r"(r[j].x), "+r"(r[j].y), "+r"(r[j].z), "+r"(r[j].w));
          asm volatile("" : "+r"(sc.x));
        }
        if (ti + 1 < ntiles) prefetch_tile(t0 + kTile);
        WS_MARK(2);
        if (u >= 2) mbar_wait(bar(kEmpty0 + b), static_cast<uint32_t>(((u >> 1) + 1) & 1));
        WS_MARK(3);
        // Octs 16 mb + 4 j + c (channels 8 oct ..+8) of key kk, decode8's values; one branch per
        // key kind (a thread holds one key), straight-line code within each.
        const auto store = [&](int j, int c, uint4 v) {
          *reinterpret_cast<uint4*>(kt + swz(kKPanel, kx, 16 * mx + 4 * j + c)) = v;
        };
        if (glob) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            // FP4: word c of block j's 16 bytes; the e4m3 scale of channels 16 (2 (4 mb + j) +
            // c / 2): byte 2 j + c / 2 of the 8.
            const uint32_t sw = j < 2 ? sc.x : sc.y;
            const uint32_t wds[4] = {r[j].x, r[j].y, r[j].z, r[j].w};
#pragma unroll
            for (int c = 0; c < 4; ++c) {
              const uint32_t sb = (sw >> (8 * (2 * (j & 1) + (c >> 1)))) & 0xFFu;
              store(j, c, decode8(true, true, make_uint2(wds[c], wds[c]), sb, c));
            }
          }
        } else if (ok) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            // SWA: bytes 8 c.. of block j's 32 (r[2 j], r[2 j + 1]); the ue8m0 scale byte j.
            const uint32_t sb = (sc.x >> (8 * j)) & 0xFFu;
#pragma unroll
            for (int c = 0; c < 4; ++c) {
              const uint4 q = c < 2 ? r[2 * j] : r[2 * j + 1];
              const uint2 raw = (c & 1) == 0 ? make_uint2(q.x, q.y) : make_uint2(q.z, q.w);
              store(j, c, decode8(true, false, raw, sb, c));
            }
          }
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) store(j, c, make_uint4(0u, 0u, 0u, 0u));
        }
        if (ptid == 0) kmeta[b] = min(kTile, max(nk - t0, 0)) | (ti + 1 == ntiles ? 1 << 16 : 0);
        wgmma::fence_proxy_async_smem();
        mbar_arrive(bar(kFull0 + b));
        WS_MARK(4);

        // The next item's q and key selections into L2 halfway through this one.
        if (ti == (ntiles >> 1) && w + step < nwork) {
          const int wn = w + step;
          const int64_t tn = wn / nhg;
          const float* qn = p.q + (tn * p.heads + (wn % nhg) * kHeads) * kHd;
          const uintptr_t q0 = reinterpret_cast<uintptr_t>(qn);
          for (int j = ptid; j < kHeads * kHd * 4 / 128; j += 256)
            asm volatile("prefetch.global.L2 [%0];\n" ::"l"(q0 + 128u * j));
          if (p.glob_k > 0 && ptid < (p.glob_k * 4 + 127) / 128)
            asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p.glob_idx + tn * p.glob_k + 32 * ptid));
        }
      }
      mbar_arrive(bar(kListEmpty0 + (k & 1)));  // this thread's reads of the list are done
    }
  } else if (wg == 0) {
    // ---------------------------------------------------------------- consumer A
    regs_inc<kRegsA>();
    WS_CLOCK_START;
    const uint32_t qa = sbase + L::kQ;
    int u = 0, k = 0;
    bool first = true;
    for (int w = static_cast<int>(blockIdx.x); w < nwork; w += step, ++k) {
      const int64_t t = w / nhg;
      const int h0 = static_cast<int>(w % nhg) * kHeads;
      float m_run[2], l_run[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        m_run[h] = p.sink[h0 + r0 + 8 * h];
        l_run[h] = 1.0f;
      }
      float o[128];
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] = 0.0f;
      wgmma::fence_operands(o);
      mbar_wait(bar(kQFull), static_cast<uint32_t>(k & 1));
      WS_MARK(8);
      for (;; ++u) {
        const int b = u & 1;
        const uint32_t kb = sbase + L::kK + static_cast<uint32_t>(b) * kKBuf;
        mbar_wait(bar(kFull0 + b), static_cast<uint32_t>((u >> 1) & 1));
        WS_MARK(9);
        const int meta = kmeta[b];
        const int kvalid = meta & 0xFFFF;
        const bool last = (meta >> 16) != 0;
        float s[32];
        wgmma::fence();
#pragma unroll
        for (int ks = 0; ks < 32; ++ks) {
          const uint32_t off = 32u * (ks & 3);
          const uint64_t da =
              wgmma::desc_k_sw128_addr(qa + static_cast<uint32_t>(ks >> 2) * kQPanel + off);
          const uint64_t db =
              wgmma::desc_k_sw128_addr(kb + static_cast<uint32_t>(ks >> 2) * kKPanel + off);
          if (ks == 0) {
            wgmma::f16_ss_n64_zero(s, da, db);
          } else {
            wgmma::f16_ss_n64(s, da, db);
          }
        }
        wgmma::commit_group();
        wgmma::wait_group<0>();
        wgmma::fence_operands(s);
        if (last) mbar_arrive(bar(kQEmpty));  // q is free for the next item
        WS_MARK(10);

        // Online softmax. s[4 i + 2 h + v]: head r0 + 8 h, key 8 i + 2 tq + v.
        float alpha[2], sum[2] = {0.0f, 0.0f};
        softmax_max(s, 0, kvalid, tq, m_run, alpha);
        const float ml[2] = {m_run[0] * kLog2e, m_run[1] * kLog2e};
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          const int h = (i >> 1) & 1;
          s[i] = ex2_approx(fmaf(s[i], kLog2e, -ml[h]));
          sum[h] += s[i];
        }
        softmax_sum(sum, alpha, l_run);
        // A fragments of k-step j (keys 16 j..): a[r] = s[8 j + 2 r], s[8 j + 2 r + 1] (* 2^8).
        uint32_t ph[4][4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r)
            ph[j][r] = h2_bits(__floats2half2_rn(s[8 * j + 2 * r] * kPow, s[8 * j + 2 * r + 1] * kPow));
        // P and the rescale factors for WG 1 (once it is done with the previous tile's).
        WS_MARK(11);
        if (!first) named_sync(kPFree, 256);
        first = false;
        WS_MARK(12);
        {
          uint8_t* const ps = smem + L::kP;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = r0 + 8 * h;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
              // keys 8 i + 2 tq, +1 of row `row`: chunk i of the 128-byte row, XOR row % 8 (= g).
              const uint32_t off = static_cast<uint32_t>(row) * 128u +
                                   (static_cast<uint32_t>(i ^ g) << 4) + 4u * static_cast<uint32_t>(tq);
              // ph[j][r]: j = i / 2, r = 2 (i % 2) + h (a[0]: row g keys 2tq; a[1]: row g + 8;
              // a[2]: row g, keys + 8; a[3]: row g + 8, keys + 8).
              *reinterpret_cast<uint32_t*>(ps + off) = ph[i >> 1][2 * (i & 1) + h];
            }
          }
          if (tq == 0) {
            alpha_s[r0] = alpha[0];
            alpha_s[r0 + 8] = alpha[1];
          }
        }
        wgmma::fence_proxy_async_smem();
        named_arrive(kPReady, 256);
        if (!__all_sync(0xffffffffu, alpha[0] == 1.0f && alpha[1] == 1.0f)) {
#pragma unroll
          for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
        }
        wgmma::fence_operands(o);
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) asm volatile("" : "+r"(ph[j][r])::"memory");
        WS_MARK(13);
        wgmma::fence();
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
          for (int n = 0; n < 2; ++n) {
            const uint64_t dv = wgmma::desc_mn_sw128(kb + 2 * n * kKPanel + 2048u * j, kKPanel, 1024u);
            wgmma::f16_rs_n128_tb(*reinterpret_cast<float(*)[64]>(o + 64 * n), ph[j], dv);
          }
        }
        wgmma::commit_group();
        wgmma::wait_group<0>();
        wgmma::fence_operands(o);
        mbar_arrive(bar(kEmpty0 + b));
        WS_MARK(14);
        if (last) {
          ++u;
          break;
        }
      }
      // Epilogue, channels [0, 256) (no RoPE channels: rd <= 64).
      float inv[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) inv[h] = 1.0f / (l_run[h] * kPow);
      if (tq == 0) {  // slot k % 2: WG 1 reads item k's after kEpi1 of item k, before item k + 1's
        linv_s[(k & 1) * kHeads + r0] = inv[0];
        linv_s[(k & 1) * kHeads + r0 + 8] = inv[1];
      }
      named_sync(kEpi1, 256);
      epilogue_store<kOut>(p, o, inv, t, h0, 0, r0, tq, lane, wtid >> 5, nullptr, kHd, red_s);
      WS_MARK(15);
    }
    if (!first) named_sync(kPFree, 256);  // WG 1's arrival after the CTA's last tile
  } else {
    // ---------------------------------------------------------------- consumer B
    regs_inc<kRegsB>();
    WS_CLOCK_START;
    int u = 0, k = 0;
    // The key list of item k (slot k % 2) for the producers: the first item's now, item k + 1's
    // at the start of item k, once the producers are done with slot (k + 1) % 2 (item k - 1's).
    const auto list_for = [&](int wl, int kl) {
      if (kl >= 2) mbar_wait(bar(kListEmpty0 + (kl & 1)), static_cast<uint32_t>(((kl >> 1) + 1) & 1));
      const int n = build_list(p, wl, nhg, lists + (kl & 1) * kMaxKeys, warp_count, wtid);
      if (wtid == 0) list_n[kl & 1] = n;
      mbar_arrive(bar(kListFull0 + (kl & 1)));
    };
    // kQInB: item wq's q (both halves) into the q panels, for A (q_full).
    const auto q_for = [&](int wq) {
      const int64_t tq_row = wq / nhg;
      const int hq = static_cast<int>(wq % nhg) * kHeads;
      convert_q_half<8>(p, smem, tq_row, hq, 0, wtid);
      convert_q_half<8>(p, smem, tq_row, hq, 1, wtid);
      wgmma::fence_proxy_async_smem();
      mbar_arrive(bar(kQFull));
    };
    if (static_cast<int>(blockIdx.x) < nwork) {
      list_for(static_cast<int>(blockIdx.x), 0);
      if constexpr (kQInB) q_for(static_cast<int>(blockIdx.x));
    }
    for (int w = static_cast<int>(blockIdx.x); w < nwork; w += step, ++k) {
      const int64_t t = w / nhg;
      const int h0 = static_cast<int>(w % nhg) * kHeads;
      // The inverse RoPE table of this item into slot k % 2 (read in this warpgroup's epilogue,
      // after kEpi1; slot k % 2 was last read before kEpi1 of item k - 1).
      if (p.freqs != nullptr && wtid < p.rd / 2) {
        double sn, co;
        sincos(static_cast<double>(p.pos[t]) * p.freqs[wtid], &sn, &co);
        rope[(k & 1) * (kMaxRd / 2) + wtid] = make_double2(co, sn);
      }
      if (w + step < nwork) list_for(w + step, k + 1);
      float o[128];
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] = 0.0f;
      wgmma::fence_operands(o);
      for (;; ++u) {
        const int b = u & 1;
        const uint32_t kb = sbase + L::kK + static_cast<uint32_t>(b) * kKBuf;
        mbar_wait(bar(kFull0 + b), static_cast<uint32_t>((u >> 1) & 1));
        const bool last = (kmeta[b] >> 16) != 0;
        WS_MARK(16);
        named_sync(kPReady, 256);
        WS_MARK(17);
        const float a0 = alpha_s[r0], a1 = alpha_s[r0 + 8];
        if (!__all_sync(0xffffffffu, a0 == 1.0f && a1 == 1.0f)) {
#pragma unroll
          for (int i = 0; i < 128; ++i) o[i] *= ((i >> 1) & 1) != 0 ? a1 : a0;
        }
        wgmma::fence_operands(o);
        wgmma::fence();
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint64_t da = wgmma::desc_k_sw128_addr(sbase + L::kP + 32u * j);
#pragma unroll
          for (int n = 0; n < 2; ++n) {
            const uint64_t dv =
                wgmma::desc_mn_sw128(kb + (4 + 2 * n) * kKPanel + 2048u * j, kKPanel, 1024u);
            wgmma::f16_ss_n128_tb(*reinterpret_cast<float(*)[64]>(o + 64 * n), da, dv);
          }
        }
        wgmma::commit_group();
        wgmma::wait_group<0>();
        wgmma::fence_operands(o);
        WS_MARK(18);
        mbar_arrive(bar(kEmpty0 + b));
        named_arrive(kPFree, 256);
        if (last) {
          ++u;
          break;
        }
      }
      named_sync(kEpi1, 256);
      WS_MARK(19);
      const float inv[2] = {linv_s[(k & 1) * kHeads + r0], linv_s[(k & 1) * kHeads + r0 + 8]};
      const int rope0 = p.freqs != nullptr ? kHd - p.rd : kHd;
      epilogue_store<kOut>(p, o, inv, t, h0, 256, r0, tq, lane, 4 + (wtid >> 5),
                           p.freqs != nullptr ? rope + (k & 1) * (kMaxRd / 2) : nullptr, rope0,
                           red_s);
      WS_MARK(20);
      if constexpr (kQInB) {
        if (w + step < nwork) {
          mbar_wait(bar(kQEmpty), static_cast<uint32_t>(k & 1));  // A's last S of item k is done
          q_for(w + step);
          WS_MARK(21);
        }
      }
    }
  }
#else
  __trap();  // sm_90a only
#endif
}

template <int kOut>
void launch(const SparseAttentionParams& p, cudaStream_t stream) {
  if (p.ws_q_in_b)
    launch_persistent<sparse_attention_ws_kernel<kOut, true>, Smem::kBytes, kThreads>(p, stream);
  else
    launch_persistent<sparse_attention_ws_kernel<kOut, false>, Smem::kBytes, kThreads>(p, stream);
}

// What this kernel takes beyond sparse_attention_wgmma_fits: single fp16 precision and at most
// kMaxRd RoPE channels (its table and the epilogue's rotated channels all in WG 1's half).
bool fits(const SparseAttentionParams& p) {
  return !p.split_precision && (p.freqs == nullptr || p.rd <= kMaxRd);
}

}  // namespace ws
}  // namespace attn_wg

// Shapes and devices the kernel takes: 64-head CTAs, and a Hopper device (the kernel is compiled
// for sm_90a only; the device of the first call is taken for all).
bool sparse_attention_wgmma_fits(const SparseAttentionParams& p) {
  return device_cc_major() == 9 && p.head_dim == attn_wg::kHd && p.heads % attn_wg::kHeads == 0 &&
         p.swa_k + p.glob_k <= attn_wg::kMaxKeys &&
         p.rows * (p.heads / attn_wg::kHeads) < (int64_t{1} << 31) &&
         (p.freqs == nullptr || (p.rd >= 0 && p.rd <= attn_wg::kHd && p.rd % 2 == 0));
}

void launch_sparse_attention_wgmma(const SparseAttentionParams& p, cudaStream_t stream) {
  if (p.warp_specialized && attn_wg::ws::fits(p)) {
    attn_wg::with_out_kind(p, [&](auto out) { attn_wg::ws::launch<decltype(out)::value>(p, stream); });
    return;
  }
  if (p.split_precision)
    attn_wg::launch<true, attn_wg::kNBSplit>(p, stream);
  else
    attn_wg::launch<false, attn_wg::kNBHalf>(p, stream);
}

}  // namespace moeserve::cuda
