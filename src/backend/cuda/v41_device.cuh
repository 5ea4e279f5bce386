// Device-side encoders/decoders of common/numeric.h and the block-quantisation rules of
// common/fake_quant.h, bit-exact with the host versions (tests/backend_ops/cuda_v41_ops_test.cpp
// compares the cache records byte for byte). Include only from src/backend/cuda/*.cu.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/numeric.h"

namespace moeserve::cuda::v41 {

__device__ __forceinline__ float e4m3_decode(uint32_t code) {
  const uint32_t sign = (code & 0x80u) << 24;
  const uint32_t exp = (code >> 3) & 0xFu;
  const uint32_t man = code & 0x7u;
  if (exp == 0) {
    const float mag = static_cast<float>(man) * 0x1p-9f;
    return sign ? -mag : mag;
  }
  if (exp == 0xF && man == 0x7) return __uint_as_float(sign | 0x7FC00000u);
  return __uint_as_float(sign | ((exp + 120u) << 23) | (man << 20));
}

__device__ __forceinline__ float e2m1_decode(uint32_t nibble) {
  const uint32_t exp = (nibble >> 1) & 0x3u;
  const uint32_t man = nibble & 0x1u;
  const float mag = exp == 0 ? 0.5f * static_cast<float>(man)
                             : __uint_as_float(((exp + 126u) << 23) | (man << 22));
  return (nibble & 0x8u) ? -mag : mag;
}

__device__ __forceinline__ float ue8m0_decode(uint32_t code) {
  if (code == 0) return __uint_as_float(0x00400000u);
  if (code == 0xFF) return __uint_as_float(0x7FC00000u);
  return __uint_as_float(code << 23);
}

// Saturating round-to-nearest-even e4m3 (numeric.h float_to_e4m3).
__device__ __forceinline__ uint32_t e4m3_encode(float x) {
  return static_cast<uint32_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// numeric.h float_to_e2m1: ties .25/1.25/2.5/5 down, .75/1.75/3.5 up, saturating, NaN -> +6.
__device__ __forceinline__ uint32_t e2m1_encode(float x) {
  const uint32_t bits = __float_as_uint(x);
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return 0x7u;
  const float a = __uint_as_float(abs_bits);
  const uint32_t code = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) +
                        (a >= 3.5f) + (a > 5.0f);
  return ((bits >> 28) & 0x8u) | code;
}

// numeric.h float_to_ue8m0_ceil.
__device__ __forceinline__ uint32_t ue8m0_ceil_encode(float x) {
  const uint32_t abs_bits = __float_as_uint(x) & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return 0xFFu;
  const uint32_t exp = abs_bits >> 23;
  if (exp == 0) return abs_bits > 0x00400000u ? 1u : 0u;
  const uint32_t up = exp + ((abs_bits & 0x7FFFFFu) != 0 ? 1u : 0u);
  return up >= 0xFFu ? 0xFEu : up;
}

// Scale codes of the three block rules (amax = max |x| of the block, NaN ignored by fmaxf).
__device__ __forceinline__ uint32_t fp8_block_scale_code(float amax) {
  return ue8m0_ceil_encode(__fdiv_rn(fmaxf(amax, 1e-4f), 448.0f));
}
__device__ __forceinline__ uint32_t fp4_e4m3_scale_code(float amax) {
  return e4m3_encode(__fdiv_rn(fmaxf(amax, 6.0f * 0x1p-9f), 6.0f));
}
__device__ __forceinline__ uint32_t fp4_ue8m0_scale_code(float amax) {
  return ue8m0_ceil_encode(__fdiv_rn(fmaxf(amax, 6.0f * 0x1p-126f), 6.0f));
}

// The MXFP8 rule of fq_fp8_block32_pow2: a block's power-of-two scale from its amax, then each
// value rounded to e4m3 at that scale (e4m3_encode saturates to ±448, the clamp of
// fake_quant.h, and keeps NaN). The kMxfp8 output stores the two halves of that rule: the e4m3
// code of v / s and the ue8m0 code of s, so e4m3 * s is the fake-quant value bit for bit. Every
// MXFP8 activation quantiser (launch_act_quant_mxfp8 and the epilogues that write its output)
// goes through these, so they agree bit for bit.
struct Mxfp8Scale {
  float s, inv;
  uint32_t code;  // ue8m0 code of s
};
// Branch- and division-free, bit for bit the rule above: the scale code from the bits of
// a = max(amax, 1e-4) (never NaN: fmaxf drops it) by mxfp8_scale_code_from_bits (common/numeric.h,
// which derives it and whose CPU test checks it against the division); s = 2^(code - 127) and
// 1 / s = 2^(127 - code) exactly (2^-127, a float subnormal, for code 254).
// CudaV41.Mxfp8ScaleRuleOnEdgeBlocks checks the quantisers' outputs on edge blocks on the device.
__device__ __forceinline__ Mxfp8Scale mxfp8_scale(float amax) {
  const uint32_t code = mxfp8_scale_code_from_bits(__float_as_uint(fmaxf(amax, 1e-4f)));
  const float inv = __uint_as_float(code == 0xFEu ? 0x00400000u : (254u - code) << 23);
  return {__uint_as_float(code << 23), inv, code};
}
__device__ __forceinline__ uint32_t mxfp8_code(float v, Mxfp8Scale sc) {
  return e4m3_encode(v * sc.inv);
}
// Two values: their e4m3 codes (one cvt), decoded by the hardware e4m3 -> f16 conversion (exact;
// e4m3 NaN -> f16 NaN, which the fp32 product turns into the canonical NaN, as e4m3_decode's
// quiet NaN times s does), times s.
__device__ __forceinline__ float2 mxfp8_round2(float a, float b, Mxfp8Scale sc) {
  uint16_t codes;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(codes) : "f"(b * sc.inv), "f"(a * sc.inv));
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(codes));
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h2));
  return make_float2(f.x * sc.s, f.y * sc.s);
}
__device__ __forceinline__ float mxfp8_round(float v, Mxfp8Scale sc) {
  return mxfp8_round2(v, 0.0f, sc).x;
}

// Row-scaled FP8 (kernels.h "Row-scaled FP8", fp8_rows.cu): the reference code of a 32-wide block
// whose MXFP8 codes under scale sc have the largest magnitude code mag (the MXFP8 rule on the
// block's own output amax, so that it depends on the MXFP8 values only, not on their encoding).
__device__ __forceinline__ uint32_t fp8_rows_block_ref(uint32_t mag, Mxfp8Scale sc) {
  return mxfp8_scale(e4m3_decode(mag) * sc.s).code;
}
// Four e4m3 codes (one word, the first in the low byte) of a block with scale code `code`
// refolded onto the row's reference code R: e4m3_rn(e4m3(q) * 2^(code - R)) (code - R <= 1 for
// activations; clamped at -40, where every e4m3 value rounds to 0). The decode is exact (the
// hardware e4m3 -> f16 conversion), the product by a power of two exact in fp32, the encode the
// saturating round-to-nearest-even cvt.
__device__ __forceinline__ uint32_t fp8_rows_refold4(uint32_t codes, uint32_t code, uint32_t R) {
  const int d = static_cast<int>(code) - static_cast<int>(R);
  if (d == 0) return codes;
  const float f = __uint_as_float(static_cast<uint32_t>(127 + max(d, -40)) << 23);
  uint32_t out = 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint16_t pair = static_cast<uint16_t>(codes >> (16 * h));
    uint32_t h2;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(pair));
    const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&h2));
    uint16_t q;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(q) : "f"(v.y * f), "f"(v.x * f));
    out |= static_cast<uint32_t>(q) << (16 * h);
  }
  return out;
}

// Row-scaled FP8, one 8-column chunk of a row (columns 8 lane-aligned: the 4 lanes of a 32-wide
// block are consecutive lanes of one warp, xor shuffles 1 and 2, so every lane of the warp calls
// it together; `live`: the chunk is inside the row, else v holds zeros): the block's MXFP8 scale
// (mxfp8_scale of its amax) and the 8 codes under it into q (the first column in q.x's low
// byte) and code, and the block's reference code (fp8_rows_block_ref) folded into m where live.
// The row's codes are then fp8_rows_refold4(q, code, R) with R the largest m of the row, its
// scale ue8m0_decode(R). launch_act_quant_fp8_rows and the fused mHC norm's output
// (HcExpandMixesParams::collapse_fp8) both go through this: the same codes.
__device__ __forceinline__ void fp8_rows_quant8(const float (&v)[8], bool live, uint2& q,
                                                uint32_t& code, uint32_t& m) {
  float a = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) a = fmaxf(a, fabsf(v[e]));
  a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, 1));
  a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, 2));
  const Mxfp8Scale sc = mxfp8_scale(a);
  uint32_t lo = 0, hi = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    lo |= mxfp8_code(v[e], sc) << (8 * e);
    hi |= mxfp8_code(v[4 + e], sc) << (8 * e);
  }
  q = make_uint2(lo, hi);
  code = sc.code;
  // The block's reference code: the MXFP8 rule on its own output's amax (sc.code, or one less
  // where rounding brought the amax down to 224 * s), so that R depends on the MXFP8 values only,
  // not on which of their two encodings the input gave.
  uint32_t mag = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) mag = max(mag, max((lo >> (8 * e)) & 0x7Fu, (hi >> (8 * e)) & 0x7Fu));
  mag = max(mag, __shfl_xor_sync(0xFFFFFFFFu, mag, 1));
  mag = max(mag, __shfl_xor_sync(0xFFFFFFFFu, mag, 2));
  const uint32_t ref = fp8_rows_block_ref(mag, sc);
  if (live) m = max(m, ref);
}

// ---- e2m1 -> e4m3 with a power-of-two shift (the FP8 indexer, v41_select.cu; the FP8 grouped
// GEMM probe, tools/device/moe_fp8_probe.cu) ----------------------------------------------------

__device__ __forceinline__ uint32_t prmt_b32(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// The e4m3 bytes of the e2m1 magnitudes 0, .5, 1, 1.5 (kE2m1E4m3Lo) and 2, 3, 4, 6 (kE2m1E4m3Hi).
constexpr uint32_t kE2m1E4m3Lo = 0x3C383000u, kE2m1E4m3Hi = 0x4C484440u;

// Eight e2m1 values (one record word, the low nibble first) times 2^d as eight e4m3 bytes in the
// natural order, for -5 <= d <= 6: the tables t0, t1 are kE2m1E4m3Lo/Hi with 8 d added to every
// nonzero byte (the exponent field; no byte leaves [0x08, 0x7C], so no carries between bytes).
// Signs: byte i takes the sign of nibble i, bit 4 i + 3 of x, which is the top bit of byte i / 2 of
// x << 4 (i even) or of x (i odd), replicated by PRMT's sign mode.
__device__ __forceinline__ uint2 e2m1x8_to_e4m3(uint32_t x, uint32_t t0, uint32_t t1) {
  const uint32_t m = x & 0x77777777u;
  const uint32_t xs = x << 4;
  const uint32_t lo = prmt_b32(t0, t1, m) | (prmt_b32(x, xs, 0x9D8Cu) & 0x80808080u);
  const uint32_t hi = prmt_b32(t0, t1, m >> 16) | (prmt_b32(x, xs, 0xBFAEu) & 0x80808080u);
  return make_uint2(lo, hi);
}

// The same for any d (d < -5: the values round to e4m3, subnormals included).
inline __device__ __noinline__ uint2 e2m1x8_to_e4m3_rounded(uint32_t x, int d) {
  constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  uint32_t w[2] = {0, 0};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t nib = (x >> (4 * i)) & 0xFu;
    const float v = ldexpf((nib & 8u) != 0 ? -kMag[nib & 7u] : kMag[nib & 7u], d);
    w[i >> 2] |= static_cast<uint32_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3))
                 << (8 * (i & 3));
  }
  return make_uint2(w[0], w[1]);
}

// splitmix64 -> 24-bit uniform in [0, 1) (cpu::sample_uniform).
__device__ __forceinline__ float sample_uniform(uint64_t seed) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * 0x1p-24f;
}

// The routed expert's clamped SwiGLU before its routing weight, in the order of
// launch_swiglu_clamped and the CPU expert: every SwiGLU quantiser (moe_grouped.cu's kernels and
// its fused epilogue, fp8_rows.cu's SwiGLU input) computes it through this, so they agree bit for
// bit.
__device__ __forceinline__ float swiglu_clamped(float g, float u, float limit) {
  g = fminf(g, limit);
  u = fminf(fmaxf(u, -limit), limit);
  return g / (1.0f + expf(-g)) * u;
}

// Eight SwiGLU inputs' values (row r, columns c .. c + 7 of fp32 gate g and up u, 16-byte
// aligned): with row_scale, the outer scales of an unscaled FP8 GEMM first (g * row_scale[r] *
// gate_col_scale[o + e], u likewise with up_col_scale, o = (r / group_rows) * ld_col_scale + c),
// then swiglu_clamped, then the routing weight row_weight[r] when set. launch_swiglu_quant_mxfp8
// and launch_act_quant_fp8_rows's SwiGLU input both take it, so they agree bit for bit.
struct SwigluScales {
  const float* row_scale;
  const float* gate_col_scale;
  const float* up_col_scale;
  int64_t ld_col_scale;
  int64_t group_rows;
};
__device__ __forceinline__ void swiglu8_values(float (&gs)[8], float (&us)[8], int64_t r, int64_t c,
                                               const float* row_weight, float limit,
                                               const SwigluScales& sc, float (&v)[8]);
__device__ __forceinline__ void swiglu8(const float* g, const float* u, int64_t r, int64_t c,
                                        const float* row_weight, float limit,
                                        const SwigluScales& sc, float (&v)[8]) {
  const float4 ga = reinterpret_cast<const float4*>(g)[0], gb = reinterpret_cast<const float4*>(g)[1];
  const float4 ua = reinterpret_cast<const float4*>(u)[0], ub = reinterpret_cast<const float4*>(u)[1];
  float gs[8] = {ga.x, ga.y, ga.z, ga.w, gb.x, gb.y, gb.z, gb.w};
  float us[8] = {ua.x, ua.y, ua.z, ua.w, ub.x, ub.y, ub.z, ub.w};
  swiglu8_values(gs, us, r, c, row_weight, limit, sc, v);
}
// The same from bf16 gate and up (bf16 bits as uint16_t, 16-byte aligned): each value widened
// exactly to fp32 first, so the result is swiglu8's on the widened values.
__device__ __forceinline__ void swiglu8(const uint16_t* g, const uint16_t* u, int64_t r, int64_t c,
                                        const float* row_weight, float limit,
                                        const SwigluScales& sc, float (&v)[8]) {
  const uint4 ga = *reinterpret_cast<const uint4*>(g), ua = *reinterpret_cast<const uint4*>(u);
  const uint32_t gw[4] = {ga.x, ga.y, ga.z, ga.w}, uw[4] = {ua.x, ua.y, ua.z, ua.w};
  float gs[8], us[8];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    gs[2 * e] = __uint_as_float(gw[e] << 16);
    gs[2 * e + 1] = __uint_as_float(gw[e] & 0xFFFF0000u);
    us[2 * e] = __uint_as_float(uw[e] << 16);
    us[2 * e + 1] = __uint_as_float(uw[e] & 0xFFFF0000u);
  }
  swiglu8_values(gs, us, r, c, row_weight, limit, sc, v);
}
__device__ __forceinline__ void swiglu8_values(float (&gs)[8], float (&us)[8], int64_t r, int64_t c,
                                               const float* row_weight, float limit,
                                               const SwigluScales& sc, float (&v)[8]) {
  if (sc.row_scale != nullptr) {
    const float rs = sc.row_scale[r];
    const int64_t o = (r / sc.group_rows) * sc.ld_col_scale + c;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      gs[e] = gs[e] * rs * sc.gate_col_scale[o + e];
      us[e] = us[e] * rs * sc.up_col_scale[o + e];
    }
  }
  const float w = row_weight != nullptr ? row_weight[r] : 1.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    v[e] = swiglu_clamped(gs[e], us[e], limit);
    if (row_weight != nullptr) v[e] *= w;
  }
}

}  // namespace moeserve::cuda::v41
