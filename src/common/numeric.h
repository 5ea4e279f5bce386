// Scalar number formats of the checkpoint and the caches (docs/checkpoint_format.md "Encodings"):
// bf16, fp8 e4m3fn, fp8 e5m2, ue8m0 scales and fp4 e2m1 (nibbles, packed two per byte). Encoders
// are bit-exact with CUDA's host conversions (cuda_bf16.h __float2bfloat16_rn, cuda_fp8.h
// __nv_cvt_float_to_fp8(.., __NV_SATFINITE, ..), cuda_fp4.h __nv_cvt_float_to_fp4(..,
// cudaRoundNearest), __nv_cvt_float_to_e8m0(.., __NV_SATFINITE, cudaRoundZero/PosInf)); see
// tests/unit/common/numeric_cuda_parity_test.cpp.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>

namespace moeserve {

inline constexpr float kE4m3Max = 448.0f;
inline constexpr float kE5m2Max = 57344.0f;
inline constexpr float kE2m1Max = 6.0f;
inline constexpr uint16_t kBf16CanonicalNan = 0x7FFF;  // what CUDA writes for any NaN input
inline constexpr uint8_t kE4m3Nan = 0x7F;              // 0xFF is NaN too; encoders write 0x7F
inline constexpr uint8_t kE5m2Nan = 0x7F;              // 0x7D..0x7F (+sign) are NaN
inline constexpr uint8_t kUe8m0Nan = 0xFF;
inline constexpr uint8_t kUe8m0Max = 0xFE;  // 2^127

namespace numeric_detail {

// Round-to-nearest-even of a float in [0, 2^22] to an integer, exact (no rounding-mode state).
constexpr float round_half_even_small(float v) { return (v + 0x1p23f) - 0x1p23f; }

constexpr float e4m3_decode(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80) << 24;
  const uint32_t exp = (code >> 3) & 0xF;
  const uint32_t man = code & 0x7;
  if (exp == 0xF && man == 0x7) return std::bit_cast<float>(sign | 0x7FC00000u);
  if (exp == 0) {
    const float mag = static_cast<float>(man) * 0x1p-9f;
    return sign ? -mag : mag;
  }
  return std::bit_cast<float>(sign | ((exp + 120) << 23) | (man << 20));
}

constexpr float e5m2_decode(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80) << 24;
  const uint32_t exp = (code >> 2) & 0x1F;
  const uint32_t man = code & 0x3;
  if (exp == 0x1F) return std::bit_cast<float>(sign | (man == 0 ? 0x7F800000u : 0x7FC00000u));
  if (exp == 0) {
    const float mag = static_cast<float>(man) * 0x1p-16f;
    return sign ? -mag : mag;
  }
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 21));
}

constexpr float ue8m0_decode(uint8_t code) {
  if (code == kUe8m0Nan) return std::bit_cast<float>(0x7FC00000u);
  if (code == 0) return std::bit_cast<float>(0x00400000u);  // 2^-127, a float subnormal
  return std::bit_cast<float>(static_cast<uint32_t>(code) << 23);
}

template <typename F>
constexpr std::array<float, 256> make_byte_table(F decode) {
  std::array<float, 256> table{};
  for (int i = 0; i < 256; ++i) table[i] = decode(static_cast<uint8_t>(i));
  return table;
}

}  // namespace numeric_detail

// Decode tables: index = code byte (e2m1: nibble, sign in bit 3).
inline constexpr std::array<float, 256> kE4m3ToFloat =
    numeric_detail::make_byte_table(numeric_detail::e4m3_decode);
inline constexpr std::array<float, 256> kE5m2ToFloat =
    numeric_detail::make_byte_table(numeric_detail::e5m2_decode);
inline constexpr std::array<float, 256> kUe8m0ToFloat =
    numeric_detail::make_byte_table(numeric_detail::ue8m0_decode);
inline constexpr std::array<float, 16> kE2m1ToFloat = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,
                                                       4.0f,  6.0f,  -0.0f, -0.5f, -1.0f, -1.5f,
                                                       -2.0f, -3.0f, -4.0f, -6.0f};

// ---- bf16 -------------------------------------------------------------------------------------

// Round to nearest even; +-inf stay inf, overflow rounds to inf, any NaN becomes 0x7FFF (quiet).
constexpr uint16_t float_to_bf16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return kBf16CanonicalNan;
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

constexpr float bf16_to_float(uint16_t code) {
  return std::bit_cast<float>(static_cast<uint32_t>(code) << 16);
}

// ---- fp8 e4m3fn (bias 7, no inf, NaN = S.1111.111, max 448, min subnormal 2^-9) -------------

// Round to nearest even, saturating: |x| >= 448 (incl. inf) -> +-448. Any NaN -> 0x7F (positive,
// as CUDA). Underflow keeps the sign (-0 -> 0x80).
constexpr uint8_t float_to_e4m3(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  if (abs_bits > 0x7F800000u) return kE4m3Nan;
  if (abs_bits >= 0x43E00000u) return sign | 0x7E;  // 448; (448, 464] rounds to 448 too
  if (abs_bits < 0x3C800000u) {                     // below 2^-6: subnormal grid of 2^-9
    const float steps =
        numeric_detail::round_half_even_small(std::bit_cast<float>(abs_bits) * 512.0f);
    return sign | static_cast<uint8_t>(steps);  // 8 steps = 0x08 = 2^-6, the min normal
  }
  const uint32_t rounded = abs_bits + 0x7FFFFu + ((abs_bits >> 20) & 1u);
  return sign | static_cast<uint8_t>((rounded >> 20) - ((127u - 7u) << 3));
}

constexpr float e4m3_to_float(uint8_t code) { return kE4m3ToFloat[code]; }

// ---- fp8 e5m2 (bias 15, IEEE-like, max 57344, min subnormal 2^-16) ---------------------------

// Round to nearest even, saturating (finite mode): |x| >= 61440 (the tie to inf) and inf ->
// +-57344. Any NaN -> 0x7F (positive, as CUDA). Decoding keeps 0x7C/0xFC as +-inf.
constexpr uint8_t float_to_e5m2(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  if (abs_bits > 0x7F800000u) return kE5m2Nan;
  if (abs_bits >= 0x47700000u) return sign | 0x7B;  // 61440 and above
  if (abs_bits < 0x38800000u) {                     // below 2^-14: subnormal grid of 2^-16
    const float steps =
        numeric_detail::round_half_even_small(std::bit_cast<float>(abs_bits) * 65536.0f);
    return sign | static_cast<uint8_t>(steps);
  }
  const uint32_t rounded = abs_bits + 0xFFFFFu + ((abs_bits >> 21) & 1u);
  return sign | static_cast<uint8_t>((rounded >> 21) - ((127u - 15u) << 2));
}

constexpr float e5m2_to_float(uint8_t code) { return kE5m2ToFloat[code]; }

// ---- ue8m0 scales (value 2^(b-127), b = 255 is NaN) --------------------------------------------

// Power-of-two rounding of |x| downwards (CUDA cudaRoundZero, satfinite): exact for 2^k,
// k in [-127, 127]; below 2^-127 (incl. 0) -> 0; above 2^127 and inf -> 254; NaN -> 255.
constexpr uint8_t float_to_ue8m0_floor(float x) {
  const uint32_t abs_bits = std::bit_cast<uint32_t>(x) & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return kUe8m0Nan;
  const uint32_t exp = abs_bits >> 23;
  if (exp == 0xFF) return kUe8m0Max;
  return static_cast<uint8_t>(exp);  // float subnormals (exp 0) clip to 2^-127
}

// 2^ceil(log2|x|) (CUDA cudaRoundPosInf, satfinite), i.e. for a normal float the fp32-bits rule
// of model.md §2.2: exponent + (mantissa != 0). At most 2^-127 -> 0; above 2^127 and inf -> 254;
// NaN -> 255.
constexpr uint8_t float_to_ue8m0_ceil(float x) {
  const uint32_t abs_bits = std::bit_cast<uint32_t>(x) & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return kUe8m0Nan;
  const uint32_t exp = abs_bits >> 23;
  if (exp == 0) return abs_bits > 0x00400000u ? 1 : 0;  // (2^-127, 2^-126) -> 2^-126
  const uint32_t up = exp + ((abs_bits & 0x7FFFFFu) != 0 ? 1u : 0u);
  return static_cast<uint8_t>(up >= 0xFF ? kUe8m0Max : up);
}

#if defined(__CUDACC__)
#define MOESERVE_HOST_DEVICE __host__ __device__
#else
#define MOESERVE_HOST_DEVICE
#endif

// The MXFP8 activation block scale's ue8m0 code, float_to_ue8m0_ceil(a / 448) (fake_quant.h's
// fp8_block_scale), from the fp32 bits of a = max(amax, 1e-4), a finite float >= 1e-4 or +inf,
// without the division. a = 1.m * 2^(e - 127) (e = a_bits >> 23, normal since a >= 1e-4):
// - 1.m <= 1.75: the exact quotient a / 448 = (1.m / 1.75) * 2^(e - 135) lies in
//   (2^(e - 136), 2^(e - 135)] (1.m / 1.75 > 0.57), and rounding to nearest keeps it there, so
//   ceil(log2) = e - 135: code e - 8;
// - 1.m > 1.75 (mantissa bits > 0x600000, i.e. at least 1.75 + 2^-23): the quotient exceeds
//   2^(e - 135) by at least 2^-23 / 1.75 relative, more than the half ulp (2^-24) that rounding
//   could take off, and stays below 2^(e - 134): code e - 7;
// - +inf: inf / 448 = inf, which the satfinite encoder clamps to 254.
// Codes of finite a are in [105, 247] (1e-4 has e = 113). The device quantisers use it
// (v41::mxfp8_scale); Ue8m0.Mxfp8ScaleCodeFromBitsIsTheDivisionRule checks it against the division
// (every mantissa at several exponents, the boundary mantissas at every exponent, random floats;
// every a with MOESERVE_NUMERIC_EXHAUSTIVE=1).
MOESERVE_HOST_DEVICE constexpr uint32_t mxfp8_scale_code_from_bits(uint32_t a_bits) {
  if (a_bits >= 0x7F800000u) return kUe8m0Max;
  return (a_bits >> 23) - 8u + ((a_bits & 0x7FFFFFu) > 0x600000u ? 1u : 0u);
}

// Exact encoding of a power of two 2^k, k in [-127, 127]; pow2_to_ue8m0 MS_CHECKs that it is one.
[[nodiscard]] constexpr bool is_ue8m0_pow2(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  if (bits == 0x00400000u) return true;  // 2^-127
  return (bits & 0x807FFFFFu) == 0 && (bits >> 23) != 0 && (bits >> 23) != 0xFF;
}
[[nodiscard]] uint8_t pow2_to_ue8m0(float pow2);

constexpr float ue8m0_to_float(uint8_t code) { return kUe8m0ToFloat[code]; }

// ---- fp4 e2m1 (nibble S.EE.M, grid 0 .5 1 1.5 2 3 4 6) ---------------------------------------

// Round to nearest even (ties .25, 1.25, 2.5, 5 go down; .75, 1.75, 3.5 go up), saturating to
// +-6 (inf too). The sign is kept for zero results (-0 -> 0x8). NaN -> 0x7 (+6), as CUDA.
constexpr uint8_t float_to_e2m1(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return 0x7;
  const float a = std::bit_cast<float>(abs_bits);
  const int code = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) +
                   (a >= 3.5f) + (a > 5.0f);
  return static_cast<uint8_t>(((bits >> 28) & 0x8u) | static_cast<uint32_t>(code));
}

constexpr float e2m1_to_float(uint8_t nibble) { return kE2m1ToFloat[nibble & 0xF]; }

// Packing: element 2i in the low nibble, element 2i+1 in the high nibble.
constexpr uint8_t pack_e2m1_pair(uint8_t lo, uint8_t hi) {
  return static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
}
constexpr uint8_t e2m1_low(uint8_t byte) { return byte & 0xF; }
constexpr uint8_t e2m1_high(uint8_t byte) { return byte >> 4; }

// Bytes holding n packed e2m1 elements (an odd tail leaves the last high nibble 0).
constexpr size_t e2m1_packed_bytes(size_t n) { return (n + 1) / 2; }

// ---- span helpers (sizes are MS_CHECKed: out.size() == in.size() unless noted) ----------------

void float_to_bf16(std::span<const float> in, std::span<uint16_t> out);
void bf16_to_float(std::span<const uint16_t> in, std::span<float> out);
void float_to_e4m3(std::span<const float> in, std::span<uint8_t> out);
void e4m3_to_float(std::span<const uint8_t> in, std::span<float> out);
void float_to_e5m2(std::span<const float> in, std::span<uint8_t> out);
void e5m2_to_float(std::span<const uint8_t> in, std::span<float> out);

// codes: one nibble per byte; packed.size() == e2m1_packed_bytes(codes.size()).
void pack_e2m1(std::span<const uint8_t> codes, std::span<uint8_t> packed);
// codes.size() elements from packed (packed.size() == e2m1_packed_bytes(codes.size())).
void unpack_e2m1(std::span<const uint8_t> packed, std::span<uint8_t> codes);
// Encode floats straight into packed nibbles / decode packed nibbles to floats.
void float_to_e2m1_packed(std::span<const float> in, std::span<uint8_t> packed);
void e2m1_packed_to_float(std::span<const uint8_t> packed, std::span<float> out);

}  // namespace moeserve
