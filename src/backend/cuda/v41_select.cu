// V4.1 selection ops: indexer scores over FP4 index keys (bf16 mma.sync on key tiles dequantised
// once per CTA by byte-table PRMTs, q fragments resident in registers, one launch for a whole
// batch of sequences; opt-in on sm_90a: warpgroup MMA with both operands in swizzled shared
// memory), exact row top-k (per-row radix select + bitonic sort of the survivors), candidate
// blocks, and top-k/top-p sampling.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/v41_device.cuh"
#include "backend/cuda/wgmma.cuh"

namespace moeserve::cuda {
namespace {

// ---- indexer scores -----------------------------------------------------------------------------

constexpr int kIdxDim = 128;
constexpr int kIdxThreads = 128;        // 4 warps
constexpr int kIdxTile = 64;            // keys per shared tile (4 sub-tiles of 16)
constexpr int kIdxChunk = 2048;         // score columns per CTA
constexpr int kIdxPitch = kIdxDim + 8;  // bf16 pitch (272 B): conflict-free ldmatrix and STS.128
constexpr int kIdxRec = kIdxDim / 2 + kIdxDim / 32;  // 68 B record
constexpr int kIdxMaxSlots = 8;
constexpr int kIdxHeadsPerLaunch = 32;

// Dynamic shared memory layout (bytes).
constexpr int kIdxSmemKt = 0;                                                  // bf16 [2][64][136]
constexpr int kIdxSmemPart = kIdxSmemKt + 2 * kIdxTile * kIdxPitch * 2;        // f32 [2][4][8][64]
constexpr int kIdxSmemW = kIdxSmemPart + 2 * 4 * kIdxMaxSlots * kIdxTile * 4;  // f32 [8][32]
constexpr int kIdxSmemId = kIdxSmemW + kIdxMaxSlots * kIdxHeadsPerLaunch * 4;  // i32 [2][64]
constexpr int kIdxSmemVis = kIdxSmemId + 2 * kIdxTile * 4;                     // i64 [8]
constexpr int kIdxSmemBytes = kIdxSmemVis + kIdxMaxSlots * 8;

struct IdxLaunch {
  int64_t width = 0;           // score columns per row
  int64_t blocks_per_seq = 0;  // row blocks per sequence (grid.x = sequences * blocks_per_seq)
  int head0 = 0;               // first head of this launch
  int heads_here = 0;          // <= 32
  bool accumulate = false;     // add to the scores of an earlier launch (heads > 32)
};

// acc[j] = the 16 keys from `rows` (a bf16 tile, pitch kIdxPitch) times B fragment set j of the
// queries (hi, + lo when kSplit == 2) over the 128 dims, for the active j.
template <int kNT, int kSplit>
__device__ __forceinline__ void idx_subtile_mma(float (&acc)[kNT][4], const __nv_bfloat16* rows,
                                                const uint32_t (&bq)[kNT][kSplit][8][2],
                                                const bool (&act)[kNT], int lane) {
#pragma unroll
  for (int j = 0; j < kNT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    uint32_t a[4];
    mma::ldsm_x4(a, rows + (lane & 15) * kIdxPitch + 16 * s + 8 * (lane >> 4));
#pragma unroll
    for (int j = 0; j < kNT; ++j)
      if (act[j])
#pragma unroll
        for (int k = 0; k < kSplit; ++k) mma::bf16_16816(acc[j], a, bq[j][k][s][0], bq[j][k][s][1]);
  }
}

__device__ __forceinline__ uint32_t bf162_bits(__nv_bfloat162 v) {
  return *reinterpret_cast<uint32_t*>(&v);
}

// e2m1 -> bf16 by byte tables (exact): the bf16 bits of the magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 as
// a low-byte and a high-byte table of 8 entries each, indexed by PRMT with the nibble's magnitude
// bits. NOTE: the dims leave in the order 0,4,1,5,2,6,3,7 within each group of 8 (word x holds
// nibbles n0..n7, n0 the low nibble): the pairs (n_i, n_i+4) have their sign bits 4i+3 and 4i+19
// exactly 16 apart, so one shift by 12 - 4i puts both on the bf16 sign bits 15 and 31. The dot
// product does not care about the order of the dims as long as the queries follow it (see the q
// fragments in indexer_mma_kernel). About 22 instructions per 8 dims instead of ~7 per dim for the
// fp32 bit-assembly it replaces; the tile bits are the same (x * 2^e is exact in bf16 for every
// ue8m0 code: 0.5 * 2^-127 is a bf16 subnormal, and bf16x2 multiplies keep subnormals).
constexpr uint32_t kE2m1Bf16Lo0 = 0xC0800000u, kE2m1Bf16Lo1 = 0xC0804000u;
constexpr uint32_t kE2m1Bf16Hi0 = 0x3F3F3F00u, kE2m1Bf16Hi1 = 0x40404040u;

// Eight e2m1 values (one record word) times the block scale `s2` as four bf16x2 words, dims in
// the order 0,4 | 1,5 | 2,6 | 3,7.
__device__ __forceinline__ uint4 e2m1x8_to_bf16(uint32_t x, __nv_bfloat162 s2) {
  const uint32_t idx = x & 0x77777777u;
  // Bytes [n1n0, n5n4, n3n2, n7n6]: nibbles n0, n1, n4, n5 in the low half, n2, n3, n6, n7 above.
  const uint32_t y = __byte_perm(idx, 0u, 0x3120);
  uint32_t o[4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t sel = h == 0 ? y : y >> 16;
    const uint32_t lo = __byte_perm(kE2m1Bf16Lo0, kE2m1Bf16Lo1, sel);  // lo(a), lo(b), lo(c), lo(d)
    const uint32_t hi = __byte_perm(kE2m1Bf16Hi0, kE2m1Bf16Hi1, sel);  // for nibbles a, b, c, d
    o[2 * h] = __byte_perm(lo, hi, 0x6240);                            // (a, c)
    o[2 * h + 1] = __byte_perm(lo, hi, 0x7351);                        // (b, d)
  }
  // o[i] = (n_i, n_i+4) after the reorder above: o0 = (n0, n4), o1 = (n1, n5), o2 = (n2, n6), ...
  uint32_t r[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t v = o[i] | ((x << (12 - 4 * i)) & 0x80008000u);
    r[i] = bf162_bits(__hmul2(*reinterpret_cast<const __nv_bfloat162*>(&v), s2));
  }
  return make_uint4(r[0], r[1], r[2], r[3]);
}

// One thread's half of a key record: 8 data words (64 dims) and the scale word.
struct IdxRaw {
  uint32_t w[8];
  uint32_t sc;
  int32_t id;  // sequence-local entry id, -1 = none
};

__device__ __forceinline__ void idx_load_raw(const uint8_t* keys, int64_t key_base, int64_t id,
                                             int64_t n_keys, int half, IdxRaw& r) {
  r.id = (id >= 0 && id < n_keys) ? static_cast<int32_t>(id) : -1;
  if (r.id >= 0) {
    // Records are 68 B: only 4-byte aligned.
    const auto* rec = reinterpret_cast<const uint32_t*>(keys + (key_base + id) * kIdxRec);
#pragma unroll
    for (int q = 0; q < 8; ++q) r.w[q] = __ldg(rec + 8 * half + q);
    r.sc = __ldg(rec + 16);
  } else {
#pragma unroll
    for (int q = 0; q < 8; ++q) r.w[q] = 0;
    r.sc = 0;
  }
}

// Dims [64 * half, 64 * half + 64) of key `key` to bf16 (exact) in the shared tile, each group of
// 8 dims in the e2m1x8_to_bf16 order.
__device__ __forceinline__ void idx_store_raw(const IdxRaw& r, __nv_bfloat16* kt, int32_t* key_id,
                                              int key, int half) {
  const __nv_bfloat162 s0 = __float2bfloat162_rn(v41::ue8m0_decode((r.sc >> (16 * half)) & 0xFFu));
  const __nv_bfloat162 s1 =
      __float2bfloat162_rn(v41::ue8m0_decode((r.sc >> (16 * half + 8)) & 0xFFu));
  uint4* dst = reinterpret_cast<uint4*>(kt + key * kIdxPitch + 64 * half);
#pragma unroll
  for (int q = 0; q < 8; ++q) dst[q] = e2m1x8_to_bf16(r.w[q], q < 4 ? s0 : s1);
  if (half == 0) key_id[key] = r.id;
}

// CTAs per SM the register budget is sized for (see kNT in indexer_mma_kernel).
constexpr int idx_min_ctas(bool cand, int split) { return cand && split == 1 ? 3 : 2; }

// Tensor-core indexer scores. S[t, key] = scale * sum_h w[t,h] relu(q[t,h] . key): per key tile
// an MMA with M = 16 keys (A: the dequantised tile, ldmatrix), N = 8 heads (B: q, resident in
// registers for the whole CTA), K = 128 dims.
//  - Without candidates (kCand false) the CTA holds kSlots = 8 / kSplit rows of one sequence and
//    warp w holds head group w (heads 8w..8w+7) of every row: 8 / kSplit MMAs per ldmatrix. Per 16
//    keys each warp reduces its 8 heads (quad shuffles) into shared partials; after the tile the
//    CTA adds the 4 warps' partials in warp order (deterministic) and writes the scores.
//  - With candidates every row has its own keys: the CTA holds one row, warp w all its head
//    groups and key sub-tile w of each tile.
// kSplit 2: q = hi + lo in bf16, both MMAs into the same accumulator. Columns past the rows'
// visible count are written -inf without MMA work (the causal upper triangle in prefill).
// Issue budget per key of a decode tile (6 rows x 32 heads, warp-instructions): 12 HMMA.16816, 2
// LDSM, ~12 for the key conversion (was ~20 with the per-dim fp32 assembly), ~30 for the epilogue
// (relu, weights, quad shuffles) and ~3 for the
// cross-warp pass. NOTE: FP8 mma.sync (m16n8k32 e4m3) is no faster here: on sm_90 ptxas lowers it
// to 12 F2FP conversions and two f16 HMMA.16816 (Hopper runs FP8 at full rate only through
// wgmma). IMMA.16832 (s8) is native, but with per-32-dim block scales on both sides every block's
// partial needs its own convert-and-FFMA per output, ~72 instructions per key against the 12 HMMA
// it saves.
template <int kSplit, bool kCand>
__global__ void __launch_bounds__(kIdxThreads, idx_min_ctas(kCand, kSplit))
    indexer_mma_kernel(IndexerScoreParams p, IdxLaunch L) {
  pdl_wait();
  // Accumulator tiles (8 heads each) per warp. NOTE: with candidates the tiles are the head groups
  // of one row, so 4 cover a launch's 32 heads; the q fragments then take 64 (kSplit 1) or 128
  // registers instead of 128 / 256, and with kSplit 1 three CTAs fit on an SM (candidate mode is
  // bound by the per-row key gathers and their conversion, which more resident warps hide better;
  // kSplit 2 would spill at 168 registers).
  constexpr int kNT = kCand ? kIdxHeadsPerLaunch / 8 : 8 / kSplit;
  constexpr int kSlots = kCand ? 1 : kNT;  // rows per CTA
  extern __shared__ __align__(16) uint8_t smem[];
  auto* kt_base = reinterpret_cast<__nv_bfloat16*>(smem + kIdxSmemKt);
  auto* part = reinterpret_cast<float*>(smem + kIdxSmemPart);
  auto* ws = reinterpret_cast<float*>(smem + kIdxSmemW);
  auto* key_id = reinterpret_cast<int32_t*>(smem + kIdxSmemId);
  auto* vis = reinterpret_cast<int64_t*>(smem + kIdxSmemVis);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t seq = blockIdx.x / L.blocks_per_seq;
  const int64_t blk = blockIdx.x % L.blocks_per_seq;
  int64_t row_begin = 0, seq_rows = p.rows, key_base = 0, n_keys = p.n_keys;
  if (p.n_seqs > 0) {
    const int64_t* e = p.seqs + seq * 4;
    row_begin = e[0];
    seq_rows = e[1];
    key_base = e[2];
    n_keys = e[3];
  }
  const int64_t r_first = blk * kSlots;
  if (r_first >= seq_rows) return;
  const int nrows = static_cast<int>(min(static_cast<int64_t>(kSlots), seq_rows - r_first));
  const int64_t row0 = row_begin + r_first;
  const int64_t c_begin = static_cast<int64_t>(blockIdx.y) * kIdxChunk;
  const int64_t c_end = min(L.width, c_begin + kIdxChunk);
  const int hg_count = (L.heads_here + 7) / 8;

  if (tid < kSlots) {
    const int64_t v =
        tid < nrows ? min(n_keys, (static_cast<int64_t>(p.pos[row0 + tid]) + 1) / p.ratio) : 0;
    vis[tid] = max(v, int64_t{0});
  }
  for (int i = tid; i < kSlots * kIdxHeadsPerLaunch; i += kIdxThreads) {
    const int r = i / kIdxHeadsPerLaunch, h = i % kIdxHeadsPerLaunch;
    ws[i] = (r < nrows && h < L.heads_here) ? p.w[(row0 + r) * p.heads + L.head0 + h] : 0.0f;
  }
  __syncthreads();
  int64_t max_vis = 0;
  for (int r = 0; r < kSlots; ++r) max_vis = max(max_vis, vis[r]);
  // Tiles with MMA work; the columns after them are -inf for every row of the CTA.
  const int64_t c_work = kCand ? c_end : min(c_end, max_vis);
  const int ntiles =
      c_work > c_begin ? static_cast<int>((c_work - c_begin + kIdxTile - 1) / kIdxTile) : 0;

  // q -> bf16 B fragments: tile j = (row slot, head group) -> heads hg*8 + g, the tile columns
  // 16s + 8h + 2t and + 1, which hold the dims 16s + 8h + t and + 4 (e2m1x8_to_bf16's order).
  uint32_t bq[kNT][kSplit][8][2];
  bool act[kNT];
#pragma unroll
  for (int j = 0; j < kNT; ++j) {
    const int slot = kCand ? 0 : j;
    const int hg = kCand ? j : warp;
    act[j] = slot < nrows && hg < hg_count;
    const int hl = hg * 8 + g;
    const bool valid = act[j] && hl < L.heads_here;
    const float* qp = p.q + ((row0 + slot) * p.heads + L.head0 + (valid ? hl : 0)) * kIdxDim;
#pragma unroll
    for (int s = 0; s < 8; ++s)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float2 v = make_float2(0.0f, 0.0f);
        if (valid) v = make_float2(qp[16 * s + 8 * h + t], qp[16 * s + 8 * h + t + 4]);
        const __nv_bfloat162 hi = __floats2bfloat162_rn(v.x, v.y);
        bq[j][0][s][h] = bf162_bits(hi);
        if constexpr (kSplit == 2)
          bq[j][kSplit - 1][s][h] =
              bf162_bits(__floats2bfloat162_rn(v.x - __low2float(hi), v.y - __high2float(hi)));
      }
  }

  // Key loading: thread -> key tid % 64, dims [64 * half, +64).
  const int my_key = tid & (kIdxTile - 1), my_half = tid >> 6;
  const int32_t* cand_row = kCand ? p.candidates + row0 * p.n_cand : nullptr;
  const auto key_of = [&](int it) -> int64_t {
    const int64_t c = c_begin + static_cast<int64_t>(it) * kIdxTile + my_key;
    if (c >= c_end) return -1;
    return kCand ? static_cast<int64_t>(cand_row[c]) : c;
  };
  const int64_t load_limit = kCand ? vis[0] : n_keys;
  IdxRaw raw;
  if (ntiles > 0) {
    idx_load_raw(p.keys, key_base, key_of(0), load_limit, my_half, raw);
    idx_store_raw(raw, kt_base, key_id, my_key, my_half);
  }
  __syncthreads();

  for (int it = 0; it < ntiles; ++it) {
    const int buf = it & 1;
    const int64_t k0 = c_begin + static_cast<int64_t>(it) * kIdxTile;
    if (it + 1 < ntiles) idx_load_raw(p.keys, key_base, key_of(it + 1), load_limit, my_half, raw);
    const __nv_bfloat16* kt = kt_base + buf * kIdxTile * kIdxPitch;

    if constexpr (!kCand) {
      float* pb = part + buf * (4 * kIdxMaxSlots * kIdxTile);
#pragma unroll 1
      for (int sub = 0; sub < 4; ++sub) {
        float acc[kNT][4];
        idx_subtile_mma<kNT, kSplit>(acc, kt + sub * 16 * kIdxPitch, bq, act, lane);
        // v[2j + kh]: this thread's two heads of row slot j, key g + 8 kh.
        float v[2 * kNT];
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
          const float2 wv =
              *reinterpret_cast<const float2*>(ws + j * kIdxHeadsPerLaunch + warp * 8 + 2 * t);
          v[2 * j] = wv.x * fmaxf(acc[j][0], 0.0f) + wv.y * fmaxf(acc[j][1], 0.0f);
          v[2 * j + 1] = wv.x * fmaxf(acc[j][2], 0.0f) + wv.y * fmaxf(acc[j][3], 0.0f);
        }
        // Transposing quad reduction: afterwards x[i] = quad sum of v[4i + t], i.e. row slot
        // 2i + (t >> 1), key g + 8 (t & 1).
        float u[kNT];
        const bool b0 = (t & 1) != 0, b1 = (t & 2) != 0;
#pragma unroll
        for (int i = 0; i < kNT; ++i) {
          const float send = b0 ? v[2 * i] : v[2 * i + 1];
          u[i] = (b0 ? v[2 * i + 1] : v[2 * i]) + __shfl_xor_sync(0xFFFFFFFFu, send, 1);
        }
#pragma unroll
        for (int i = 0; i < kNT / 2; ++i) {
          const float send = b1 ? u[2 * i] : u[2 * i + 1];
          const float x = (b1 ? u[2 * i + 1] : u[2 * i]) + __shfl_xor_sync(0xFFFFFFFFu, send, 2);
          const int slot = 2 * i + (t >> 1);
          pb[(warp * kIdxMaxSlots + slot) * kIdxTile + sub * 16 + g + 8 * (t & 1)] = x;
        }
      }
    } else {
      float acc[kNT][4];
      idx_subtile_mma<kNT, kSplit>(acc, kt + warp * 16 * kIdxPitch, bq, act, lane);
      float s0 = 0.0f, s1 = 0.0f;  // keys g, g + 8
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        if (!act[j]) continue;
        const float2 wv = *reinterpret_cast<const float2*>(ws + j * 8 + 2 * t);
        s0 += wv.x * fmaxf(acc[j][0], 0.0f) + wv.y * fmaxf(acc[j][1], 0.0f);
        s1 += wv.x * fmaxf(acc[j][2], 0.0f) + wv.y * fmaxf(acc[j][3], 0.0f);
      }
      s0 += __shfl_xor_sync(0xFFFFFFFFu, s0, 1);
      s1 += __shfl_xor_sync(0xFFFFFFFFu, s1, 1);
      s0 += __shfl_xor_sync(0xFFFFFFFFu, s0, 2);
      s1 += __shfl_xor_sync(0xFFFFFFFFu, s1, 2);
      if (t < 2) {
        const int kk = warp * 16 + g + 8 * t;
        const int64_t c = k0 + kk;
        if (c < c_end) {
          const int32_t j = key_id[buf * kIdxTile + kk];
          float* out = p.scores + row0 * p.ld + c;
          const float val = (t == 0 ? s0 : s1) * p.scale;
          const bool masked = j < 0 || j >= vis[0];
          *out = masked ? -INFINITY : (L.accumulate ? *out + val : val);
        }
      }
    }

    if (it + 1 < ntiles)
      idx_store_raw(raw, kt_base + (buf ^ 1) * kIdxTile * kIdxPitch, key_id + (buf ^ 1) * kIdxTile,
                    my_key, my_half);
    __syncthreads();

    if constexpr (!kCand) {
      const float* pb = part + buf * (4 * kIdxMaxSlots * kIdxTile);
      const int nw = min(4, hg_count);
      for (int i = tid; i < nrows * kIdxTile; i += kIdxThreads) {
        const int r = i / kIdxTile, kk = i % kIdxTile;
        const int64_t c = k0 + kk;
        if (c >= c_end) continue;
        float sum = 0.0f;
        for (int w = 0; w < nw; ++w) sum += pb[(w * kIdxMaxSlots + r) * kIdxTile + kk];
        float* out = p.scores + (row0 + r) * p.ld + c;
        const float val = sum * p.scale;
        *out = c >= vis[r] ? -INFINITY : (L.accumulate ? *out + val : val);
      }
    }
  }

  // Columns past every row's visible keys.
  if constexpr (!kCand) {
    const int64_t c_tail = c_begin + static_cast<int64_t>(ntiles) * kIdxTile;
    const int64_t n_tail = max(int64_t{0}, c_end - c_tail);
    for (int64_t i = tid; i < nrows * n_tail; i += kIdxThreads) {
      const int64_t r = i / n_tail, c = c_tail + i % n_tail;
      p.scores[(row0 + r) * p.ld + c] = -INFINITY;
    }
  }
}

// ---- indexer scores, Hopper warpgroup MMA ------------------------------------------------------
//
// Same scores as indexer_mma_kernel<1, false> (q_exact_bf16, no candidates, 32 heads), on sm_90a
// wgmma.mma_async: per 64-key tile one warpgroup computes D[key, n] = key . q_n with M = 64 keys
// (A: the dequantised tile), N = 32 * kRows query columns (B: heads of kRows rows of one
// sequence, n = 32 * row slot + head) and K = 128 dims (8 k16 steps), fp32 accumulators. Keys on
// M and heads on N keep the head reduction of a row inside each thread (8 heads) and a quad (two
// shuffles), as in the mma.sync kernel, and let one instruction per k-step cover all rows: the
// decode shape (6 rows) is m64n192k16, with no padding.
//
// Shared memory (1024-aligned base; every operand K-major with the 128-byte swizzle of
// wgmma::desc_k_sw128: rows of 64 bf16 = 128 B, 16-byte chunk c of row r stored at c ^ (r & 7)):
//   kt   bf16 [2 buffers][2 panels][64 keys][64 dims]  panel p holds dims [64p, 64p + 64)
//   q    bf16 [2 panels][kN columns][64 dims]
//   w    f32  [8][32]
//   vis  i64  [8]
// Within each group of 8 dims the elements are in e2m1x8_to_bf16's order (0,4,1,5,2,6,3,7), keys
// and queries alike, so the dot products are those of the natural order.
//
// Pipeline per tile t (one warpgroup per CTA, two CTAs per SM): issue the 8 wgmma on buffer t & 1
// and commit; while they run, convert tile t + 1 (raw words loaded during tile t - 1) into the
// other buffer and start the loads of tile t + 2; fence.proxy.async (the tile is read by the async
// proxy); wait; epilogue (relu, weights, head sums, scores); one CTA barrier. The second CTA of the
// SM keeps the tensor cores busy during this CTA's epilogue.
// NOTE: budget per 64-key tile at 6 rows (estimates, to be measured): the MMAs are 3.1 MFLOP,
// ~770 SM cycles at the dense bf16 rate; the conversion (~210 instructions per thread) and the
// epilogue (~260: 96 max, 96 FMA, 24 LDS.64, 9 shuffles, stores) issue in ~470 cycles on the 4
// schedulers, so with two CTAs alternating the tensor pipe is the limit. Shared-memory reads of
// the MMAs: (64 + 192) x 32 B per k-step, ~85 B/cycle of the 128. Not yet tried: A (keys) from
// registers (wgmma RS), converting straight into fragments, which drops the tile stores, the
// proxy fence and A's shared reads but double-buffers 2 x 32 fragment registers.
//
// kFp8 (IndexerScoreParams::use_fp8): the same kernel on e4m3 operands (wgmma m64nNk32, twice the
// bf16 rate). FP4 values are e2m1 codes times a power of two per 32 dims, and e4m3 holds e2m1
// times 2^d exactly over a wide range of d, so each vector's block scales fold into its e4m3
// values relative to one power of two per vector, which leaves the MMA and returns in the
// epilogue:
//   key j  (4 ue8m0 codes c_b, E = max c_b): stored c * 2^(c_b - E + 6); the MMA's sum for it is
//          then 2^(133 - E) times the true one, and the score is multiplied back by 2^(E - 133)
//          (kmul, one float per key of the tile). d = c_b - E + 6 <= 6 keeps 6 * 2^d <= 384 < 448;
//          exact for d >= -5 (block scales within 2^11 of the key's largest: 0.5 * 2^-5 is the
//          smallest normal e4m3 it needs); past that (a block more than 2^11 below the key's
//          largest, whose products are then below 2^-11 of that block's) the values round to
//          e4m3 through a slower per-value path.
//   query column n = (row, head) (fp32 values, FP4 fake-quant): the vector's max |q| M picks
//          s = floor(log2 M) - 8, the stored values are q * 2^-s (e4m3: M becomes 256 or 384), and
//          the head's weight w * 2^s (exact) carries the shift: w' relu(acc') = w relu(acc) times
//          the key's power of two, since relu commutes with positive scaling.
// So the products are exact, as with bf16; what differs is the sum: Hopper adds each k32 step's
// 32 products and the running accumulator aligned to the largest exponent with ~14 significant
// bits (truncating; fp8_wgmma_gemm.cu), where the bf16 path sums in fp32. A key's 128 dims are 4
// k32 steps. The e2m1 -> e4m3 conversion takes ~9 instructions per 8 dims (two PRMT table lookups
// with the block's shift folded into the table bytes, two PRMT sign replications, two LOP3) against
// ~22 for bf16, and the tiles and q are half the bytes.
constexpr int kWgThreads = 128;
constexpr int kWgTile = 64;       // keys per tile (wgmma M)
constexpr int kWgChunk = 4096;    // score columns per CTA (amortises the q tile fill)
constexpr int kWgRowBytes = 128;  // one 64-dim panel row of bf16
constexpr int kWgPanel = kWgTile * kWgRowBytes;  // 8 KB: one panel of a key tile
constexpr int kWgKtBuf = 2 * kWgPanel;           // 16 KB: one key tile (128 dims)
constexpr int kWgSmemKt = 0;
// kFp8: a key tile is one panel (64 keys x 128 e4m3 dims), q one panel per column.
__host__ __device__ constexpr int wg_kt_buf(bool fp8) { return fp8 ? kWgPanel : kWgKtBuf; }
__host__ __device__ constexpr int wg_smem_q(bool fp8) { return kWgSmemKt + 2 * wg_kt_buf(fp8); }
__host__ __device__ constexpr int wg_smem_w(int rows, bool fp8) {
  return wg_smem_q(fp8) + (fp8 ? 1 : 2) * 32 * rows * kWgRowBytes;
}
// kFp8: f32 [2 buffers][64 keys], each key's 2^(E - 133).
__host__ __device__ constexpr int wg_smem_kmul(int rows, bool fp8) {
  return wg_smem_w(rows, fp8) + kIdxMaxSlots * 32 * 4;
}
__host__ __device__ constexpr int wg_smem_vis(int rows, bool fp8) {
  return wg_smem_kmul(rows, fp8) + (fp8 ? 2 * kWgTile * 4 : 0);
}
// + 1024 for aligning the dynamic shared memory base to a swizzle atom.
__host__ __device__ constexpr int wg_smem_bytes(int rows, bool fp8) {
  return wg_smem_vis(rows, fp8) + kIdxMaxSlots * 8 + 1024;
}

// Dims [64 * half, 64 * half + 64) of one key (exact bf16) into panel `half` of a key tile, row
// `key`, 128-byte swizzled.
__device__ __forceinline__ void wg_store_key(const IdxRaw& r, uint8_t* tile, int key, int half) {
  const __nv_bfloat162 s0 = __float2bfloat162_rn(v41::ue8m0_decode((r.sc >> (16 * half)) & 0xFFu));
  const __nv_bfloat162 s1 =
      __float2bfloat162_rn(v41::ue8m0_decode((r.sc >> (16 * half + 8)) & 0xFFu));
  uint8_t* row = tile + half * kWgPanel + key * kWgRowBytes;
#pragma unroll
  for (int c = 0; c < 8; ++c)
    *reinterpret_cast<uint4*>(row + ((c ^ (key & 7)) << 4)) =
        e2m1x8_to_bf16(r.w[c], c < 4 ? s0 : s1);
}

// prmt.b32 in its default mode, all four selector nibbles as given (bit 3 of a nibble replicates
// the selected byte's sign bit over the result byte).
using v41::e2m1x8_to_e4m3;
using v41::e2m1x8_to_e4m3_rounded;
using v41::kE2m1E4m3Hi;
using v41::kE2m1E4m3Lo;

// 2^k as a float for k >= -149 (0 below).
__device__ __forceinline__ float pow2f(int k) {
  return k >= -126 ? __int_as_float((k + 127) << 23) : ldexpf(1.0f, k);
}

// kFp8: dims [64 * half, 64 * half + 64) of key `key` as e4m3 (see the kFp8 note above) into row
// `key` of the tile (128-byte swizzled: 16-byte chunk c = dims [16 c, 16 c + 16)); the half-0
// thread writes the key's 2^(E - 133) into kmul (0 for a missing key).
__device__ __forceinline__ void wg_store_key_fp8(const IdxRaw& r, uint8_t* tile, float* kmul,
                                                 int key, int half) {
  const int e = static_cast<int>(max(max(r.sc & 0xFFu, (r.sc >> 8) & 0xFFu),
                                     max((r.sc >> 16) & 0xFFu, r.sc >> 24)));
  uint8_t* row = tile + key * kWgRowBytes;
#pragma unroll
  for (int b = 0; b < 2; ++b) {
    const int d = static_cast<int>((r.sc >> (16 * half + 8 * b)) & 0xFFu) - e + 6;
    const uint32_t t0 = kE2m1E4m3Lo + static_cast<uint32_t>(d) * 0x08080800u;
    const uint32_t t1 = kE2m1E4m3Hi + static_cast<uint32_t>(d) * 0x08080808u;
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int q = 4 * b + 2 * c;  // record words q, q + 1: dims 64 half + 8 q .. + 16
      uint2 v0, v1;
      if (d >= -5) {
        v0 = e2m1x8_to_e4m3(r.w[q], t0, t1);
        v1 = e2m1x8_to_e4m3(r.w[q + 1], t0, t1);
      } else {
        v0 = e2m1x8_to_e4m3_rounded(r.w[q], d);
        v1 = e2m1x8_to_e4m3_rounded(r.w[q + 1], d);
      }
      const int chunk = 4 * half + 2 * b + c;
      *reinterpret_cast<uint4*>(row + ((chunk ^ (key & 7)) << 4)) =
          make_uint4(v0.x, v0.y, v1.x, v1.y);
    }
  }
  if (half == 0) kmul[key] = r.id >= 0 ? pow2f(e - 133) : 0.0f;
}

// The 8 fp32 query values q[row, head, dim0 .. dim0 + 8) (two 16-byte loads when q is 16-byte
// aligned).
__device__ __forceinline__ void idx_load_q8(const IndexerScoreParams& p, int64_t row, int head,
                                            int dim0, bool vec, float (&a)[8]) {
  const float* src = p.q + (row * p.heads + head) * kIdxDim + dim0;
  if (vec) {
    const float4 lo = __ldg(reinterpret_cast<const float4*>(src));
    const float4 hi = __ldg(reinterpret_cast<const float4*>(src) + 1);
    a[0] = lo.x, a[1] = lo.y, a[2] = lo.z, a[3] = lo.w;
    a[4] = hi.x, a[5] = hi.y, a[6] = hi.z, a[7] = hi.w;
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) a[j] = __ldg(src + j);
  }
}

// kFp8's query operand: columns n = 32 row slot + head of rows row0 .. row0 + nrows - 1 (kN / 32
// slots; slots past nrows are zero) as e4m3 in the B layout (one panel: column n's 128 dims in one
// swizzled row), each column shifted by its own 2^-s and its weight ws[n] by 2^s (the kFp8 note).
// Item i = (column n, 8 dims c8): the 16 items of a column are 16 consecutive lanes (their max: 4
// shuffles); kN * 16 is a multiple of the block, so every lane of a warp runs every step.
template <int kN>
__device__ __forceinline__ void wg_fill_q_fp8(const IndexerScoreParams& p, int64_t row0, int nrows,
                                              bool q_vec, uint8_t* qs, float* ws) {
  for (int i = threadIdx.x; i < kN * 16; i += kWgThreads) {
    const int n = i >> 4, c8 = i & 15;
    const int slot = n >> 5;
    float a[8] = {};
    if (slot < nrows) idx_load_q8(p, row0 + slot, n & 31, 8 * c8, q_vec, a);
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) m = fmaxf(m, fabsf(a[j]));
#pragma unroll
    for (int o = 1; o < 16; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
    // s = floor(log2 M) - 8 from M's exponent field (0: M is 0 or subnormal, s = 0), kept in
    // [-126, 126] so that 2^s and 2^-s are normal floats.
    const int ebits = static_cast<int>((__float_as_uint(m) >> 23) & 0xFFu);
    const int sh = ebits == 0 ? 0 : min(max(ebits - 135, -126), 126);
    const float inv = __int_as_float((127 - sh) << 23);
    uint32_t wv[4];  // e4m3 pairs, the first value in the low byte
#pragma unroll
    for (int j = 0; j < 4; ++j)
      wv[j] = static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(
          make_float2(a[2 * j] * inv, a[2 * j + 1] * inv), __NV_SATFINITE, __NV_E4M3));
    *reinterpret_cast<uint2*>(qs + n * kWgRowBytes + (((c8 >> 1) ^ (n & 7)) << 4) + 8 * (c8 & 1)) =
        make_uint2(wv[0] | (wv[1] << 16), wv[2] | (wv[3] << 16));
    if (c8 == 0)
      ws[n] = slot < nrows ? p.w[(row0 + slot) * p.heads + (n & 31)] * __int_as_float((127 + sh) << 23)
                           : 0.0f;
  }
}

// CTAs per SM the registers are sized for: 3 for kFp8 up to 6 row slots (168 registers, no
// spills; ~43 KB of shared memory each), else 2.
constexpr int wg_min_ctas(int rows, bool fp8) { return fp8 && rows <= 6 ? 3 : 2; }

template <int kRows, bool kFp8>
__global__ void __launch_bounds__(kWgThreads, wg_min_ctas(kRows, kFp8))
    indexer_wgmma_kernel(IndexerScoreParams p, IdxLaunch L) {
  pdl_wait();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(kRows % 2 == 0 && kRows <= kIdxMaxSlots, "row slots pair up in the quad reduction");
  constexpr int kN = 32 * kRows;  // wgmma N: query columns
  constexpr int kAcc = kN / 2;    // fp32 accumulators per thread
  constexpr int kKtBuf = wg_kt_buf(kFp8);
  extern __shared__ __align__(1024) uint8_t wg_smem_raw[];
  const uint32_t raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(wg_smem_raw));
  uint8_t* smem = wg_smem_raw + ((1024u - (raw_addr & 1023u)) & 1023u);
  uint8_t* kt = smem + kWgSmemKt;
  uint8_t* qs = smem + wg_smem_q(kFp8);
  auto* ws = reinterpret_cast<float*>(smem + wg_smem_w(kRows, kFp8));
  [[maybe_unused]] auto* kmul = reinterpret_cast<float*>(smem + wg_smem_kmul(kRows, kFp8));
  auto* vis = reinterpret_cast<int64_t*>(smem + wg_smem_vis(kRows, kFp8));

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t seq = blockIdx.x / L.blocks_per_seq;
  const int64_t blk = blockIdx.x % L.blocks_per_seq;
  int64_t row_begin = 0, seq_rows = p.rows, key_base = 0, n_keys = p.n_keys;
  if (p.n_seqs > 0) {
    const int64_t* e = p.seqs + seq * 4;
    row_begin = e[0];
    seq_rows = e[1];
    key_base = e[2];
    n_keys = e[3];
  }
  const int64_t r_first = blk * kRows;
  if (r_first >= seq_rows) return;
  const int nrows = static_cast<int>(min(static_cast<int64_t>(kRows), seq_rows - r_first));
  const int64_t row0 = row_begin + r_first;
  const int64_t c_begin = static_cast<int64_t>(blockIdx.y) * kWgChunk;
  const int64_t c_end = min(L.width, c_begin + kWgChunk);

  if (tid < kRows) {
    const int64_t v =
        tid < nrows ? min(n_keys, (static_cast<int64_t>(p.pos[row0 + tid]) + 1) / p.ratio) : 0;
    vis[tid] = max(v, int64_t{0});
  }
  const bool q_vec = (reinterpret_cast<uintptr_t>(p.q) & 15u) == 0;
  if constexpr (kFp8) {
    wg_fill_q_fp8<kN>(p, row0, nrows, q_vec, qs, ws);
  } else {
    for (int i = tid; i < kRows * 32; i += kWgThreads)
      ws[i] = i / 32 < nrows ? p.w[(row0 + i / 32) * p.heads + i % 32] : 0.0f;
    // q -> bf16 (exact: q_exact_bf16) in the B layout. Item i = (column n, panel, chunk c): 8
    // consecutive dims, 16 items per column, so consecutive threads read consecutive 32 B.
    for (int i = tid; i < kN * 16; i += kWgThreads) {
      const int n = i >> 4, panel = (i >> 3) & 1, c = i & 7;
      const int slot = n >> 5;
      float a[8] = {};
      if (slot < nrows) idx_load_q8(p, row0 + slot, n & 31, 64 * panel + 8 * c, q_vec, a);
      // Word j holds dims (j, j + 4) of the group: the key tile's order.
      const uint4 v = make_uint4(bf162_bits(__floats2bfloat162_rn(a[0], a[4])),
                                 bf162_bits(__floats2bfloat162_rn(a[1], a[5])),
                                 bf162_bits(__floats2bfloat162_rn(a[2], a[6])),
                                 bf162_bits(__floats2bfloat162_rn(a[3], a[7])));
      *reinterpret_cast<uint4*>(qs + panel * (kN * kWgRowBytes) + n * kWgRowBytes +
                                ((c ^ (n & 7)) << 4)) = v;
    }
  }
  __syncthreads();
  int64_t max_vis = 0;
  for (int r = 0; r < kRows; ++r) max_vis = max(max_vis, vis[r]);
  // Tiles with MMA work; the columns after them are -inf for every row of the CTA.
  const int64_t c_work = min(c_end, max_vis);
  const int ntiles =
      c_work > c_begin ? static_cast<int>((c_work - c_begin + kWgTile - 1) / kWgTile) : 0;

  // Key loading: thread -> key tid % 64, dims [64 * half, +64) (panel `half`).
  const int my_key = tid & (kWgTile - 1), my_half = tid >> 6;
  const auto key_of = [&](int it) -> int64_t {
    const int64_t c = c_begin + static_cast<int64_t>(it) * kWgTile + my_key;
    return c < c_end ? c : -1;
  };
  IdxRaw raw;
  // Tile `it`'s keys into buffer b.
  const auto store_key = [&](int b) {
    if constexpr (kFp8) {
      wg_store_key_fp8(raw, kt + b * kKtBuf, kmul + b * kWgTile, my_key, my_half);
    } else {
      wg_store_key(raw, kt + b * kKtBuf, my_key, my_half);
    }
  };
  if (ntiles > 0) {
    idx_load_raw(p.keys, key_base, key_of(0), n_keys, my_half, raw);
    store_key(0);
  }
  if (ntiles > 1) idx_load_raw(p.keys, key_base, key_of(1), n_keys, my_half, raw);
  wgmma::fence_proxy_async_smem();
  __syncthreads();

  // Descriptors of buffer 0 / the q panel 0; the k-step offsets are added to the address field
  // (bits 0-13, in 16-byte units; shared addresses stay below 2^18, so no carry leaves it).
  const uint64_t desc_kt = wgmma::desc_k_sw128(kt);
  const uint64_t desc_q = wgmma::desc_k_sw128(qs);
  // This thread's output: keys 16 warp + g + 8 (t & 1) of the tile, row slots 2i + (t >> 1).
  const int key_out = 16 * warp + g + 8 * (t & 1);
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;

  for (int it = 0; it < ntiles; ++it) {
    const int buf = it & 1;
    const int64_t k0 = c_begin + static_cast<int64_t>(it) * kWgTile;
    wgmma::fence_operands(acc);  // the previous epilogue's reads stay above the MMAs
    wgmma::fence();
    if constexpr (kFp8) {
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        // k32 step s: dims [32s, 32s + 32) = bytes [32 s, +32) of each row.
        const uint32_t off_a = buf * kKtBuf + s * 32, off_b = s * 32;
        wgmma::e4m3_ss<kN>(acc, desc_kt + (off_a >> 4), desc_q + (off_b >> 4), s > 0 ? 1 : 0);
      }
    } else {
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        // k-step s: dims [16s, 16s + 16) = panel s / 4, bytes [32 (s % 4), +32) of each row.
        const uint32_t off_a = buf * kKtBuf + (s >> 2) * kWgPanel + (s & 3) * 32;
        const uint32_t off_b = (s >> 2) * (kN * kWgRowBytes) + (s & 3) * 32;
        wgmma::bf16_ss<kN>(acc, desc_kt + (off_a >> 4), desc_q + (off_b >> 4), s > 0 ? 1 : 0);
      }
    }
    wgmma::commit_group();
    // Overlapped with the MMAs: buffer buf ^ 1 was last read by tile it - 1, waited for below.
    if (it + 1 < ntiles) store_key(buf ^ 1);
    if (it + 2 < ntiles) idx_load_raw(p.keys, key_base, key_of(it + 2), n_keys, my_half, raw);
    wgmma::fence_proxy_async_smem();
    wgmma::wait_group<0>();
    wgmma::fence_operands(acc);

    // v[2r + h]: row slot r, key g + 8h, this thread's 8 heads (column blocks 4r..4r+3, columns
    // 2t and 2t + 1 of each: heads 8j + 2t, + 1).
    float v[2 * kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float* a4 = acc + 4 * (4 * r + j);
        const float2 wv = *reinterpret_cast<const float2*>(ws + r * 32 + 8 * j + 2 * t);
        s0 += wv.x * fmaxf(a4[0], 0.0f) + wv.y * fmaxf(a4[1], 0.0f);
        s1 += wv.x * fmaxf(a4[2], 0.0f) + wv.y * fmaxf(a4[3], 0.0f);
      }
      v[2 * r] = s0;
      v[2 * r + 1] = s1;
    }
    // Transposing quad reduction (as in indexer_mma_kernel): u[i] = row slot i, key g + 8 (t & 1);
    // then x = row slot 2i + (t >> 1), the same key.
    float u[kRows];
    const bool b0 = (t & 1) != 0, b1 = (t & 2) != 0;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const float send = b0 ? v[2 * i] : v[2 * i + 1];
      u[i] = (b0 ? v[2 * i + 1] : v[2 * i]) + __shfl_xor_sync(0xFFFFFFFFu, send, 1);
    }
    const int64_t c = k0 + key_out;
    // kFp8: the key's 2^(E - 133) folded into the scale (both powers of two times p.scale).
    const float out_scale = kFp8 ? p.scale * kmul[buf * kWgTile + key_out] : p.scale;
#pragma unroll
    for (int i = 0; i < kRows / 2; ++i) {
      const float send = b1 ? u[2 * i] : u[2 * i + 1];
      const float x = (b1 ? u[2 * i + 1] : u[2 * i]) + __shfl_xor_sync(0xFFFFFFFFu, send, 2);
      const int slot = 2 * i + (t >> 1);
      if (slot < nrows && c < c_end)
        p.scores[(row0 + slot) * p.ld + c] = c >= vis[slot] ? -INFINITY : x * out_scale;
    }
    // Every thread's stores into buffer buf ^ 1 (and its proxy fence) before the next tile's
    // MMAs read it; every warp past its wait before tile it + 1 overwrites buffer buf.
    __syncthreads();
  }

  // Columns past every row's visible keys.
  const int64_t c_tail = c_begin + static_cast<int64_t>(ntiles) * kWgTile;
  const int64_t n_tail = max(int64_t{0}, c_end - c_tail);
  for (int64_t i = tid; i < nrows * n_tail; i += kWgThreads) {
    const int64_t r = i / n_tail, cc = c_tail + i % n_tail;
    p.scores[(row0 + r) * p.ld + cc] = -INFINITY;
  }
#else
  __trap();  // sm_90a only (wgmma); the launcher is only reached with use_wgmma.
#endif
}

// ---- indexer scores over per-row candidates, Hopper warpgroup MMA on e4m3 ----------------------
//
// IndexerScoreParams::cand_wgmma: the Reindex layers' scores (each row its own candidate list of
// key ids) on kFp8's operands (keys and queries with their block scales folded into e4m3, taken out
// again in the epilogue): one row per CTA, D[key, head] with M = 64 gathered keys (A) and N = 32
// heads (B, resident), K = 128 (four m64n32k32 steps), one warpgroup, several CTAs per SM.
// The mma.sync kernel's candidate form waits each tile on a dependent pair of loads (the id, then
// the record) with one tile of lookahead. Here:
//  - the chunk's candidate ids (checked against the row's visible keys: -1 = missing) go to shared
//    memory once, coalesced;
//  - the records travel through a ring of kCwStages tiles, issued kCwStages - 2 tiles before
//    their conversion, keys at a stride of 17 words (odd: the conversion's reads, 32 keys of a
//    warp at the same word, hit distinct banks). A tile is 8 groups of 8 candidates, 544 bytes of
//    ring each, copied as 34 16-byte chunks (thread i: chunks i, i + 128, i + 256 of the tile's
//    272). A group whose 8 ids are one whole candidate block (8 b .. 8 b + 7, all visible; what
//    launch_blocks_to_candidates writes) is 544 contiguous, 16-byte aligned bytes of the pool:
//    each chunk is one cp.async.cg. Any other group copies a chunk's 4 words one by one
//    (cp.async.ca, 4 bytes: the 68-byte records are only 4-byte aligned), zeros for missing keys.
//    (The first form copied every record 4 bytes at a time: ncu, 64 x 6: 360 us per Reindex
//    layer at 63% issue, with 9 copies and their address arithmetic per thread and tile.)
// Per tile it: the MMAs on kt[it & 1]; the copies of tile it + kCwStages into the slot tile it
// left (converted in the previous iteration, before its barrier); tile it + 1 converted into the
// other buffer (wg_store_key_fp8); wait for tile it + 2's copies; the epilogue (relu, weights, the
// head sum in a quad, -inf for missing keys); one CTA barrier (which also publishes tile it + 2's
// records to every thread).
constexpr int kCwChunk = 2048;  // candidate columns per CTA
constexpr int kCwStages = 5;    // record ring depth in tiles
constexpr int kCwKeyWords = kIdxRec / 4;  // 17
constexpr int kCwTileWords = kWgTile * kCwKeyWords;
constexpr int kCwGroupChunks = 8 * kIdxRec / 16;  // 34 16-byte chunks per group of 8 keys
constexpr int kCwTileChunks = 8 * kCwGroupChunks;  // 272
constexpr int kCwCopies = (kCwTileChunks + kWgThreads - 1) / kWgThreads;  // per thread per tile
constexpr int kCwSmemKt = 0;                                  // e4m3 [2][64 keys][128]
constexpr int kCwSmemQ = kCwSmemKt + 2 * kWgPanel;            // e4m3 [32 heads][128]
constexpr int kCwSmemRing = kCwSmemQ + 32 * kWgRowBytes;      // u32 [stages][64][17]
constexpr int kCwSmemIds = kCwSmemRing + kCwStages * kCwTileWords * 4;  // i32 [chunk]
constexpr int kCwSmemBlk = kCwSmemIds + kCwChunk * 4;         // u8 [chunk / 8]: whole blocks
constexpr int kCwSmemW = kCwSmemBlk + kCwChunk / 8;           // f32 [32]
constexpr int kCwSmemKmul = kCwSmemW + 32 * 4;                // f32 [2][64]
constexpr int kCwSmemBytes = kCwSmemKmul + 2 * kWgTile * 4 + 1024;  // + base alignment
static_assert(kCwSmemQ % 1024 == 0, "wgmma operands start on swizzle atoms");
static_assert(kIdxRec % 4 == 0 && kCwKeyWords % 2 == 1, "odd word stride per key");

__global__ void __launch_bounds__(kWgThreads, 4)
    indexer_cand_wgmma_kernel(IndexerScoreParams p, IdxLaunch L) {
  pdl_wait();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) uint8_t cw_smem_raw[];
  const uint32_t raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(cw_smem_raw));
  uint8_t* smem = cw_smem_raw + ((1024u - (raw_addr & 1023u)) & 1023u);
  uint8_t* kt = smem + kCwSmemKt;
  uint8_t* qs = smem + kCwSmemQ;
  auto* ring = reinterpret_cast<uint32_t*>(smem + kCwSmemRing);
  auto* ids = reinterpret_cast<int32_t*>(smem + kCwSmemIds);
  auto* blk = smem + kCwSmemBlk;
  auto* ws = reinterpret_cast<float*>(smem + kCwSmemW);
  auto* kmul = reinterpret_cast<float*>(smem + kCwSmemKmul);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t seq = blockIdx.x / L.blocks_per_seq;
  const int64_t r_in_seq = blockIdx.x % L.blocks_per_seq;
  int64_t row_begin = 0, seq_rows = p.rows, key_base = 0, n_keys = p.n_keys;
  if (p.n_seqs > 0) {
    const int64_t* e = p.seqs + seq * 4;
    row_begin = e[0];
    seq_rows = e[1];
    key_base = e[2];
    n_keys = e[3];
  }
  if (r_in_seq >= seq_rows) return;
  const int64_t row0 = row_begin + r_in_seq;
  const int64_t c_begin = static_cast<int64_t>(blockIdx.y) * kCwChunk;
  const int n_here = static_cast<int>(min(L.width - c_begin, static_cast<int64_t>(kCwChunk)));
  const int ntiles = (n_here + kWgTile - 1) / kWgTile;
  // Keys the row sees: ids at or past it are missing (-inf), as in the mma.sync kernel.
  const int64_t vis =
      max(int64_t{0}, min(n_keys, (static_cast<int64_t>(p.pos[row0]) + 1) / p.ratio));
  const int32_t* cand_row = p.candidates + row0 * p.n_cand + c_begin;
  for (int i = tid; i < ntiles * kWgTile; i += kWgThreads) {
    const int32_t id = i < n_here ? __ldg(cand_row + i) : -1;
    ids[i] = id >= 0 && id < vis ? id : -1;
  }
  const bool q_vec = (reinterpret_cast<uintptr_t>(p.q) & 15u) == 0;
  wg_fill_q_fp8<32>(p, row0, 1, q_vec, qs, ws);
  __syncthreads();  // ids
  const uint8_t* keys = p.keys + key_base * kIdxRec;
  // Groups of 8 candidates that are one whole visible block, 16-byte aligned in the pool.
  for (int gi = tid; gi < ntiles * 8; gi += kWgThreads) {
    const int32_t first = ids[8 * gi];
    bool whole = first >= 0 && first % 8 == 0 &&
                 (reinterpret_cast<uintptr_t>(keys + static_cast<int64_t>(first) * kIdxRec) & 15u) == 0;
#pragma unroll
    for (int j = 1; j < 8; ++j) whole = whole && ids[8 * gi + j] == first + j;
    blk[gi] = whole ? 1 : 0;
  }
  __syncthreads();  // blk

  // This thread's 16-byte chunks of every tile: chunk tid + 128 m = (group, chunk in the group).
  int cp_grp[kCwCopies], cp_off[kCwCopies];
#pragma unroll
  for (int m = 0; m < kCwCopies; ++m) {
    const int j = tid + kWgThreads * m;
    cp_grp[m] = j < kCwTileChunks ? j / kCwGroupChunks : -1;
    cp_off[m] = j % kCwGroupChunks;
  }
  const uint32_t ring_addr = async::smem_addr(ring);
  // The records of tile u into ring slot u % kCwStages; one commit group (empty past the tiles).
  const auto issue = [&](int u) {
    if (u < ntiles) {
      const uint32_t dst = ring_addr + (u % kCwStages) * (kCwTileWords * 4);
#pragma unroll
      for (int m = 0; m < kCwCopies; ++m) {
        if (cp_grp[m] < 0) continue;
        const int gi = u * 8 + cp_grp[m];
        const uint32_t d = dst + cp_grp[m] * (8 * kIdxRec) + 16 * cp_off[m];
        if (blk[gi]) {
          async::copy16(d, keys + static_cast<int64_t>(ids[8 * gi]) * kIdxRec + 16 * cp_off[m],
                        true);
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int w = 4 * cp_off[m] + e;  // word of the group: key w / 17, word w % 17
            const int kk = w / kCwKeyWords;
            const int32_t id = ids[8 * gi + kk];
            const bool ok = id >= 0;
            async::copy4(d + 4 * e,
                         keys + static_cast<int64_t>(ok ? id : 0) * kIdxRec +
                             4 * (w - kk * kCwKeyWords),
                         ok);
          }
        }
      }
    }
    async::commit();
  };
  // Key loading: thread -> key tid % 64 of each tile, record half tid / 64 (dims [64 h, +64)).
  const int my_key = tid & (kWgTile - 1), my_half = tid >> 6;
  // Tile u's records (landed, published by a barrier) into key buffer u & 1, as e4m3.
  const auto convert = [&](int u) {
    const uint32_t* src = ring + (u % kCwStages) * kCwTileWords + my_key * kCwKeyWords;
    IdxRaw r;
#pragma unroll
    for (int q = 0; q < 8; ++q) r.w[q] = src[8 * my_half + q];
    r.sc = src[16];
    r.id = ids[u * kWgTile + my_key];
    wg_store_key_fp8(r, kt + (u & 1) * kWgPanel, kmul + (u & 1) * kWgTile, my_key, my_half);
    // A missing key's mark: -1 (not wg_store_key_fp8's 0, which a flush-to-zero compare would
    // confuse with the smallest key scales' 2^-133).
    if (my_half == 0 && r.id < 0) kmul[(u & 1) * kWgTile + my_key] = -1.0f;
  };

#pragma unroll 1
  for (int s = 0; s < kCwStages; ++s) issue(s);
  async::wait<kCwStages - 2>();  // tiles 0 and 1
  __syncthreads();
  if (ntiles > 0) convert(0);
  wgmma::fence_proxy_async_smem();
  __syncthreads();

  const uint64_t desc_kt = wgmma::desc_k_sw128(kt);
  const uint64_t desc_q = wgmma::desc_k_sw128(qs);
  float acc[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) acc[i] = 0.0f;

  for (int it = 0; it < ntiles; ++it) {
    const int buf = it & 1;
    wgmma::fence_operands(acc);
    wgmma::fence();
#pragma unroll
    for (int s = 0; s < 4; ++s)
      wgmma::e4m3_ss<32>(acc, desc_kt + ((buf * kWgPanel + s * 32) >> 4), desc_q + ((s * 32) >> 4),
                         s > 0 ? 1 : 0);
    wgmma::commit_group();
    // Slot it % kCwStages: tile it, converted before the previous barrier.
    issue(it + kCwStages);
    if (it + 1 < ntiles) convert(it + 1);
    // Groups committed: tiles 0 .. it + kCwStages; tile it + 2's done with kCwStages - 2 pending.
    async::wait<kCwStages - 2>();
    wgmma::fence_proxy_async_smem();
    wgmma::wait_group<0>();
    wgmma::fence_operands(acc);

    // acc[4j + 2h + v]: key 16 warp + g + 8h, head 8j + 2t + v.
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 wv = *reinterpret_cast<const float2*>(ws + 8 * j + 2 * t);
      s0 += wv.x * fmaxf(acc[4 * j], 0.0f) + wv.y * fmaxf(acc[4 * j + 1], 0.0f);
      s1 += wv.x * fmaxf(acc[4 * j + 2], 0.0f) + wv.y * fmaxf(acc[4 * j + 3], 0.0f);
    }
    s0 += __shfl_xor_sync(0xFFFFFFFFu, s0, 1);
    s1 += __shfl_xor_sync(0xFFFFFFFFu, s1, 1);
    s0 += __shfl_xor_sync(0xFFFFFFFFu, s0, 2);
    s1 += __shfl_xor_sync(0xFFFFFFFFu, s1, 2);
    if (t < 2) {
      const int kk = 16 * warp + g + 8 * t;
      const int c = it * kWgTile + kk;
      if (c < n_here) {
        // kmul: the key's 2^(E - 133), -1 for a missing key.
        const float km = kmul[buf * kWgTile + kk];
        p.scores[row0 * p.ld + c_begin + c] =
            km < 0.0f ? -INFINITY : (t == 0 ? s0 : s1) * (p.scale * km);
      }
    }
    // Every thread's conversion into buffer buf ^ 1 (and its proxy fence) before the next tile's
    // MMAs read it, and tile it + 2's records, before its conversion; every warp past its wait
    // (and its kmul reads) before tile it + 1 overwrites buffer buf.
    __syncthreads();
  }
  async::wait<0>();  // no copy outlives the CTA
#else
  __trap();  // sm_90a only (wgmma); the launcher is only reached with use_wgmma.
#endif
}

__global__ void block_max_kernel(BlockMaxParams p, int64_t nb) {
  pdl_wait();
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
  pdl_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= p.rows * p.kb * p.block) return;
  const int e = static_cast<int>(i % p.block);
  const int32_t b = p.block_ids[i / p.block];
  const int64_t j = static_cast<int64_t>(b) * p.block + e;
  p.cand[i] = b >= 0 && j < p.n_keys ? static_cast<int32_t>(j) : -1;
}

// ---- top-k --------------------------------------------------------------------------------------

constexpr int kTkThreads = 512;
constexpr int kTkBins = 2048;  // 11-bit digits (then 11, then 10)
constexpr int kMaxK = 2048;
constexpr int64_t kTkCacheMax = 24576;  // rows up to this many scores are read once into smem
// Longer rows: candidates (key, index) whose top digit is at least the k-th's, compacted into
// shared memory after the first pass when at most this many (48 KB: three blocks per SM).
constexpr int64_t kTkCompactMax = 6144;

struct TkShared {
  uint32_t hist[kTkBins];
  uint64_t sel[kMaxK];
  uint32_t wsum[kTkThreads / 32];
  uint32_t found[3];  // digit, remaining k within it, total counted
  uint32_t n_sel;
  uint32_t eq_base;
  uint32_t n_cand;
};

__device__ __forceinline__ uint32_t ordered_bits(float v) {
  const uint32_t u = __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float from_ordered(uint32_t o) {
  return __uint_as_float((o & 0x80000000u) ? (o & 0x7FFFFFFFu) : ~o);
}
__device__ __forceinline__ bool tk_valid(float v) { return v == v && v != -INFINITY; }

// f(index, value) over src[0, n) by the whole block; float4 loads when aligned (four in flight
// per thread per unrolled step).
template <class F>
__device__ __forceinline__ void tk_for_each(const float* src, int64_t n, F&& f) {
  int64_t done = 0;
  if ((reinterpret_cast<uintptr_t>(src) & 15u) == 0) {
    const auto* s4 = reinterpret_cast<const float4*>(src);
    const int64_t n4 = n / 4;
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < n4; i += kTkThreads) {
      const float4 v = s4[i];
      f(4 * i, v.x);
      f(4 * i + 1, v.y);
      f(4 * i + 2, v.z);
      f(4 * i + 3, v.w);
    }
    done = n4 * 4;
  }
  for (int64_t i = done + threadIdx.x; i < n; i += kTkThreads) f(i, src[i]);
}

// The digit d of a complete histogram (nbins, descending) with sum_{b>d} < krem <= sum_{b>=d}:
// found = {d, krem - sum_{b>d}, total}. Thread t owns bins [nbins - (t+1) per, nbins - t per).
__device__ void tk_find_digit(TkShared& S, int nbins, uint32_t krem) {
  const int per = nbins / kTkThreads;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int top = nbins - tid * per;
  uint32_t s = 0;
  for (int b = 0; b < per; ++b) s += S.hist[top - 1 - b];
  uint32_t inc = s;
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t y = __shfl_up_sync(0xFFFFFFFFu, inc, o);
    if (lane >= o) inc += y;
  }
  if (lane == 31) S.wsum[warp] = inc;
  __syncthreads();
  uint32_t before = 0, total = 0;
  for (int w = 0; w < kTkThreads / 32; ++w) {
    const uint32_t x = S.wsum[w];
    if (w < warp) before += x;
    total += x;
  }
  const uint32_t ex = before + inc - s;
  if (ex < krem && ex + s >= krem) {
    uint32_t cum = ex;
    for (int b = 0; b < per; ++b) {
      const int bin = top - 1 - b;
      if (cum + S.hist[bin] >= krem) {
        S.found[0] = static_cast<uint32_t>(bin);
        S.found[1] = krem - cum;
        break;
      }
      cum += S.hist[bin];
    }
  }
  if (tid == 0) S.found[2] = total;
  __syncthreads();
}

// Exact row top-k, one block per row: radix select over the order-preserving score bits in three
// histogram passes (11 + 11 + 10 bits; smem histograms) finds the k-th largest key T and how many
// entries equal to T to take; a collect pass takes every key > T and the lowest-index entries
// == T (index-ordered block scan, only when T is tied across the cut); a bitonic sort of the k
// survivors on (key, ~index) gives the order. Rows up to kTkCacheMax scores are read from HBM once
// into shared memory. Longer rows are read twice where the k-th key's top digit leaves at most
// kTkCompactMax candidates (keys with a top digit >= its): the first pass, then a pass that
// compacts the candidates (order-preserving key bits and index; warp-aggregated slots, so in no
// particular order) into shared memory, which the other passes and the collect read instead of
// the row; only a cut inside a tie (taken in index order) reads the row once more. Otherwise
// (a huge tie at the cut, e.g. mostly zero scores and fewer positives than k) the row is
// streamed four times, as before.
__global__ void __launch_bounds__(kTkThreads) topk_radix_kernel(TopkParams p, bool cache) {
  pdl_wait();
  extern __shared__ __align__(16) uint8_t tk_smem[];
  TkShared& S = *reinterpret_cast<TkShared*>(tk_smem);
  float* rowc = reinterpret_cast<float*>(tk_smem + (sizeof(TkShared) + 15) / 16 * 16);
  // !cache: the candidates, keys [kTkCompactMax] then indices [kTkCompactMax].
  uint32_t* cand_o = reinterpret_cast<uint32_t*>(rowc);
  int32_t* cand_i = reinterpret_cast<int32_t*>(rowc) + kTkCompactMax;
  const int tid = threadIdx.x;
  const int64_t r = blockIdx.x;
  const int64_t n = p.n;
  const uint32_t k = static_cast<uint32_t>(p.k);
  const float* src = p.scores + r * p.ld;
  if (cache) {
    tk_for_each(src, n, [&](int64_t i, float v) { rowc[i] = v; });
    src = rowc;
  }
  // Pass 1: top 11 bits.
  for (int i = tid; i < kTkBins; i += kTkThreads) S.hist[i] = 0;
  if (tid == 0) {
    S.n_sel = 0;
    S.eq_base = 0;
  }
  __syncthreads();
  tk_for_each(src, n, [&](int64_t, float v) {
    if (tk_valid(v)) atomicAdd(&S.hist[ordered_bits(v) >> 21], 1u);
  });
  __syncthreads();
  tk_find_digit(S, kTkBins, k);
  const bool take_all = S.found[2] <= k;
  // f(index, key bits) for every valid entry of the row, or of the compacted candidates (which
  // hold every valid key whose top digit is >= d1: all that the passes and collect below use).
  bool compact = false;
  const auto each_key = [&](auto&& f) {
    if (compact) {
      const int nc = static_cast<int>(S.n_cand);
      for (int j = tid; j < nc; j += kTkThreads) f(static_cast<int64_t>(cand_i[j]), cand_o[j]);
    } else {
      tk_for_each(src, n, [&](int64_t i, float v) {
        if (tk_valid(v)) f(i, ordered_bits(v));
      });
    }
  };
  uint32_t thr = 1, k_eq = 0, cnt_eq = 0;  // valid keys are >= 0x00800000
  if (!take_all) {
    const uint32_t d1 = S.found[0], k1 = S.found[1];
    const uint32_t n_cand = (k - k1) + S.hist[d1];
    __syncthreads();
    if (!cache && n_cand <= kTkCompactMax) {
      if (tid == 0) S.n_cand = 0;
      __syncthreads();
      const int lane = tid & 31;
      tk_for_each(src, n, [&](int64_t i, float v) {
        const uint32_t o = ordered_bits(v);
        const bool want = tk_valid(v) && (o >> 21) >= d1;
        const unsigned act = __activemask();
        const unsigned m = __ballot_sync(act, want);
        if (m != 0) {
          const int leader = __ffs(m) - 1;
          uint32_t base = 0;
          if (lane == leader) base = atomicAdd(&S.n_cand, static_cast<uint32_t>(__popc(m)));
          base = __shfl_sync(act, base, leader);
          if (want) {
            const uint32_t j = base + static_cast<uint32_t>(__popc(m & ((1u << lane) - 1u)));
            cand_o[j] = o;
            cand_i[j] = static_cast<int32_t>(i);
          }
        }
      });
      __syncthreads();
      compact = true;
    }
    for (int i = tid; i < kTkBins; i += kTkThreads) S.hist[i] = 0;
    __syncthreads();
    each_key([&](int64_t, uint32_t o) {
      if ((o >> 21) == d1) atomicAdd(&S.hist[(o >> 10) & 0x7FFu], 1u);
    });
    __syncthreads();
    tk_find_digit(S, kTkBins, k1);
    const uint32_t pre = (d1 << 11) | S.found[0], k2 = S.found[1];
    __syncthreads();
    for (int i = tid; i < 1024; i += kTkThreads) S.hist[i] = 0;
    __syncthreads();
    each_key([&](int64_t, uint32_t o) {
      if ((o >> 10) == pre) atomicAdd(&S.hist[o & 0x3FFu], 1u);
    });
    __syncthreads();
    tk_find_digit(S, 1024, k2);
    thr = (pre << 10) | S.found[0];
    k_eq = S.found[1];
    cnt_eq = S.hist[S.found[0]];
  }
  const auto composite = [](uint32_t o, int64_t i) {
    return (static_cast<uint64_t>(o) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(i));
  };
  if (take_all || k_eq == cnt_eq) {
    // Every key >= thr is taken (k of them, or all valid ones).
    each_key([&](int64_t i, uint32_t o) {
      if (o >= thr) S.sel[atomicAdd(&S.n_sel, 1u)] = composite(o, i);
    });
  } else {
    // Ties at the cut: keys > thr anyhow, then == thr in index order until k_eq are taken.
    const int lane = tid & 31, warp = tid >> 5;
    for (int64_t base = 0; base < n; base += kTkThreads) {
      const int64_t i = base + tid;
      const float v = i < n ? src[i] : -INFINITY;
      const uint32_t o = ordered_bits(v);
      const bool ok = tk_valid(v);
      if (ok && o > thr) S.sel[atomicAdd(&S.n_sel, 1u)] = composite(o, i);
      const bool eq = ok && o == thr;
      const uint32_t m = __ballot_sync(0xFFFFFFFFu, eq);
      if (lane == 0) S.wsum[warp] = static_cast<uint32_t>(__popc(m));
      __syncthreads();
      uint32_t before = S.eq_base, total = 0;
      for (int w = 0; w < kTkThreads / 32; ++w) {
        if (w < warp) before += S.wsum[w];
        total += S.wsum[w];
      }
      const uint32_t rank = before + static_cast<uint32_t>(__popc(m & ((1u << lane) - 1u)));
      if (eq && rank < k_eq) S.sel[atomicAdd(&S.n_sel, 1u)] = composite(o, i);
      __syncthreads();
      if (tid == 0) S.eq_base += total;
      __syncthreads();
    }
  }
  __syncthreads();
  const uint32_t cnt = min(S.n_sel, k);
  uint32_t size = 1;
  while (size < cnt) size <<= 1;
  for (uint32_t i = cnt + tid; i < size; i += kTkThreads) S.sel[i] = 0;
  __syncthreads();
  // Bitonic sort, descending.
  for (uint32_t kk = 2; kk <= size; kk <<= 1) {
    for (uint32_t j = kk >> 1; j > 0; j >>= 1) {
      for (uint32_t i = tid; i < size; i += kTkThreads) {
        const uint32_t ixj = i ^ j;
        if (ixj > i) {
          const bool desc = (i & kk) == 0;
          const uint64_t a = S.sel[i], b = S.sel[ixj];
          if (desc ? a < b : a > b) {
            S.sel[i] = b;
            S.sel[ixj] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  for (uint32_t i = tid; i < k; i += kTkThreads) {
    const bool have = i < cnt;
    const uint64_t v = have ? S.sel[i] : 0;
    p.out_idx[r * k + i] = have ? static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(v)) : -1;
    if (p.out_val)
      p.out_val[r * k + i] = have ? from_ordered(static_cast<uint32_t>(v >> 32)) : -INFINITY;
  }
  if (p.out_count && tid == 0) p.out_count[r] = static_cast<int32_t>(cnt);
}

// ---- sampling -----------------------------------------------------------------------------------

// One warp per row over the sorted top-k (values descending).
__global__ void sample_kernel(SampleParams p, const int32_t* idx, const float* val,
                              const int32_t* count) {
  pdl_wait();
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

template <int kSplit, bool kCand>
void launch_indexer_mma(const IndexerScoreParams& p, const IdxLaunch& L, int64_t n_seqs,
                        cudaStream_t s) {
  const auto fn = indexer_mma_kernel<kSplit, kCand>;
  MS_CUDA_CHECK(
      cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, kIdxSmemBytes));
  const dim3 grid(static_cast<unsigned>(n_seqs * L.blocks_per_seq),
                  static_cast<unsigned>(ceil_div(L.width, kIdxChunk)));
  MS_CUDA_CHECK(launch_kernel(fn, grid, kIdxThreads, kIdxSmemBytes, s, p, L));
}

template <int kRows>
void launch_indexer_wgmma(const IndexerScoreParams& p, const IdxLaunch& L, int64_t n_seqs,
                          cudaStream_t s) {
  const auto fn = p.use_fp8 ? indexer_wgmma_kernel<kRows, true> : indexer_wgmma_kernel<kRows, false>;
  const int kSmem = wg_smem_bytes(kRows, p.use_fp8);
  MS_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const dim3 grid(static_cast<unsigned>(n_seqs * L.blocks_per_seq),
                  static_cast<unsigned>(ceil_div(L.width, kWgChunk)));
  MS_CUDA_CHECK(launch_kernel(fn, grid, kWgThreads, kSmem, s, p, L));
}

}  // namespace

bool indexer_cand_wgmma_applies(const IndexerScoreParams& p) {
  return p.candidates != nullptr && p.cand_wgmma && p.use_wgmma && p.use_fp8 && p.q_exact_bf16 &&
         p.heads == kIdxHeadsPerLaunch && p.head_dim == kIdxDim;
}

void launch_indexer_scores(const IndexerScoreParams& p, Stream stream) {
  const bool cand = p.candidates != nullptr;
  const bool batched = p.n_seqs > 0;
  const int64_t seq_rows = batched ? p.max_seq_rows : p.rows;
  const int64_t width = cand ? p.n_cand : (batched ? p.max_seq_keys : p.n_keys);
  if (p.rows == 0 || seq_rows <= 0 || width <= 0) return;
  if (p.head_dim != kIdxDim || p.heads < 1 || p.heads > 2 * kIdxHeadsPerLaunch)
    detail::cuda_call_failed(__FILE__, __LINE__, "indexer shape", "head_dim 128, heads <= 64", "");
  const cudaStream_t s = as_cuda_stream(stream);
  const int64_t n_seqs = batched ? p.n_seqs : 1;
  IdxLaunch L;
  L.width = width;
  if (p.use_wgmma && p.q_exact_bf16 && !cand && p.heads == kIdxHeadsPerLaunch) {
    // Row slots per CTA: the sequences' rows rounded up to even (the quad reduction pairs slots),
    // at most 8 (N = 256). Decode at 6 rows per sequence runs m64n192k16 with no padding.
    const int rows_cta = static_cast<int>(std::min<int64_t>(8, (seq_rows + 1) / 2 * 2));
    L.blocks_per_seq = ceil_div(seq_rows, rows_cta);
    L.head0 = 0;
    L.heads_here = kIdxHeadsPerLaunch;
    switch (rows_cta) {
      case 2:
        launch_indexer_wgmma<2>(p, L, n_seqs, s);
        break;
      case 4:
        launch_indexer_wgmma<4>(p, L, n_seqs, s);
        break;
      case 6:
        launch_indexer_wgmma<6>(p, L, n_seqs, s);
        break;
      default:
        launch_indexer_wgmma<8>(p, L, n_seqs, s);
        break;
    }
    return;
  }
  if (indexer_cand_wgmma_applies(p)) {
    L.blocks_per_seq = seq_rows;  // one row per CTA
    L.head0 = 0;
    L.heads_here = kIdxHeadsPerLaunch;
    const auto fn = indexer_cand_wgmma_kernel;
    MS_CUDA_CHECK(
        cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, kCwSmemBytes));
    const dim3 grid(static_cast<unsigned>(n_seqs * L.blocks_per_seq),
                    static_cast<unsigned>(ceil_div(L.width, kCwChunk)));
    MS_CUDA_CHECK(launch_kernel(fn, grid, kWgThreads, kCwSmemBytes, s, p, L));
    return;
  }
  const int slots = cand ? 1 : (p.q_exact_bf16 ? 8 : 4);
  L.blocks_per_seq = ceil_div(seq_rows, slots);
  // NOTE: more than 32 heads run as two launches of 32 (the second adds its partial sums) so that
  // the q fragments of a CTA always fit in registers.
  for (int h0 = 0; h0 < p.heads; h0 += kIdxHeadsPerLaunch) {
    L.head0 = h0;
    L.heads_here = std::min(kIdxHeadsPerLaunch, p.heads - h0);
    L.accumulate = h0 > 0;
    if (p.q_exact_bf16) {
      if (cand)
        launch_indexer_mma<1, true>(p, L, n_seqs, s);
      else
        launch_indexer_mma<1, false>(p, L, n_seqs, s);
    } else {
      if (cand)
        launch_indexer_mma<2, true>(p, L, n_seqs, s);
      else
        launch_indexer_mma<2, false>(p, L, n_seqs, s);
    }
  }
}

size_t topk_scratch_bytes(int64_t /*rows*/, int64_t /*n*/) { return 0; }

void launch_topk(const TopkParams& p, Stream stream) {
  if (p.rows == 0) return;
  if (p.k < 1 || p.k > kMaxK)
    detail::cuda_call_failed(__FILE__, __LINE__, "topk k", "1 <= k <= 2048", "");
  const bool cache = p.n <= kTkCacheMax;
  const size_t base = (sizeof(TkShared) + 15) / 16 * 16;
  const size_t smem = base + (cache ? static_cast<size_t>(p.n) * 4 : kTkCompactMax * 8);
  MS_CUDA_CHECK(cudaFuncSetAttribute(topk_radix_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(base + kTkCacheMax * 4)));
  MS_CUDA_CHECK(launch_kernel(topk_radix_kernel, static_cast<unsigned>(p.rows), kTkThreads, smem,
                              as_cuda_stream(stream), p, cache));
}

void launch_block_max_scores(const BlockMaxParams& p, Stream stream) {
  const int64_t nb = ceil_div(p.n, p.block);
  if (p.rows * nb == 0) return;
  MS_CUDA_CHECK(launch_kernel(block_max_kernel, static_cast<unsigned>(ceil_div(p.rows * nb, 256)),
                              256, 0, as_cuda_stream(stream), p, nb));
}

void launch_blocks_to_candidates(const BlocksToCandidatesParams& p, Stream stream) {
  const int64_t total = p.rows * p.kb * p.block;
  if (total == 0) return;
  MS_CUDA_CHECK(launch_kernel(blocks_to_cand_kernel, static_cast<unsigned>(ceil_div(total, 256)),
                              256, 0, as_cuda_stream(stream), p));
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
  MS_CUDA_CHECK(launch_kernel(sample_kernel, static_cast<unsigned>(ceil_div(p.rows, 4)), 128, 0,
                              as_cuda_stream(stream), p, idx, val, count));
}

}  // namespace moeserve::cuda
