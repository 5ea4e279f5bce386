#include "common/numeric.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace moeserve {
namespace {

float from_bits(uint32_t bits) { return std::bit_cast<float>(bits); }
uint32_t to_bits(float x) { return std::bit_cast<uint32_t>(x); }
constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNan = std::numeric_limits<float>::quiet_NaN();
const float kNegSignalingNan = from_bits(0xFF800001u);

// ---- bf16 ---------------------------------------------------------------------------------------

TEST(Bf16, Goldens) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(float_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  // Ties to even: 1 + 2^-8 is halfway between 0x3F80 and 0x3F81 -> 0x3F80 (even).
  EXPECT_EQ(float_to_bf16(from_bits(0x3F808000u)), 0x3F80);
  EXPECT_EQ(float_to_bf16(from_bits(0x3F818000u)), 0x3F82);  // 0x3F81 odd -> up
  EXPECT_EQ(float_to_bf16(from_bits(0x3F808001u)), 0x3F81);  // above the tie
  EXPECT_EQ(float_to_bf16(from_bits(0x3F807FFFu)), 0x3F80);  // below the tie
  // Subnormals round the same way.
  EXPECT_EQ(float_to_bf16(from_bits(0x00010000u)), 0x0001);
  EXPECT_EQ(float_to_bf16(from_bits(0x00008000u)), 0x0000);
  EXPECT_EQ(float_to_bf16(from_bits(0x00018000u)), 0x0002);
  EXPECT_EQ(float_to_bf16(from_bits(0x80008001u)), 0x8001);
  // Inf stays inf, the largest float rounds to inf, NaN becomes the canonical quiet 0x7FFF.
  EXPECT_EQ(float_to_bf16(kInf), 0x7F80);
  EXPECT_EQ(float_to_bf16(-kInf), 0xFF80);
  EXPECT_EQ(float_to_bf16(from_bits(0x7F7FFFFFu)), 0x7F80);
  EXPECT_EQ(float_to_bf16(from_bits(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(float_to_bf16(kNan), 0x7FFF);
  EXPECT_EQ(float_to_bf16(kNegSignalingNan), 0x7FFF);
  EXPECT_EQ(float_to_bf16(from_bits(0x7F800001u)), 0x7FFF);  // would round to inf if not checked

  EXPECT_EQ(bf16_to_float(0x3F80), 1.0f);
  EXPECT_EQ(to_bits(bf16_to_float(0x8000)), 0x80000000u);
  EXPECT_EQ(bf16_to_float(0x0001), std::ldexp(1.0f, -133));  // min bf16 subnormal
  EXPECT_TRUE(std::isnan(bf16_to_float(0x7FFF)));
}

TEST(Bf16, EveryCodeRoundTrips) {
  for (uint32_t c = 0; c < 0x10000; ++c) {
    const auto code = static_cast<uint16_t>(c);
    const float f = bf16_to_float(code);
    if (std::isnan(f)) {
      EXPECT_EQ(float_to_bf16(f), 0x7FFF) << c;
    } else {
      EXPECT_EQ(float_to_bf16(f), code) << c;
    }
  }
}

// ---- e4m3 ---------------------------------------------------------------------------------------

TEST(E4m3, Goldens) {
  EXPECT_EQ(float_to_e4m3(1.0f), 0x38);     // exp 7, man 0
  EXPECT_EQ(float_to_e4m3(-3.0f), 0xC4);    // exp 8, man 4 (1.5 * 2)
  EXPECT_EQ(float_to_e4m3(240.0f), 0x77);   // 1.875 * 2^7
  EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);  // tie 1 / 1.125 -> even (1.0)
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3A);  // tie 1.125 / 1.25 -> even (1.25)
  EXPECT_EQ(float_to_e4m3(nextafterf(1.0625f, 2.0f)), 0x39);
  EXPECT_EQ(float_to_e4m3(432.0f), 0x7E);  // tie 416 (man 5) / 448 (man 6) -> 448
  EXPECT_EQ(float_to_e4m3(400.0f), 0x7C);  // tie 384 / 416 -> 384
  // Saturation: 448 is the max; everything above (incl. the 464 tie and inf) saturates.
  EXPECT_EQ(float_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(464.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(1e9f), 0x7E);
  EXPECT_EQ(float_to_e4m3(-500.0f), 0xFE);
  EXPECT_EQ(float_to_e4m3(kInf), 0x7E);
  EXPECT_EQ(float_to_e4m3(-kInf), 0xFE);
  // NaN -> 0x7F whatever its sign (CUDA canonical NaN).
  EXPECT_EQ(float_to_e4m3(kNan), 0x7F);
  EXPECT_EQ(float_to_e4m3(kNegSignalingNan), 0x7F);
  // Subnormals: grid 2^-9; min normal 2^-6.
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -9)), 0x01);
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -10)), 0x00);  // half of min subnormal: tie -> 0
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0001f, -10)), 0x01);
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.5f, -9)), 0x02);  // tie 1 / 2 steps -> 2
  EXPECT_EQ(float_to_e4m3(std::ldexp(2.5f, -9)), 0x02);  // tie 2 / 3 steps -> 2
  EXPECT_EQ(float_to_e4m3(std::ldexp(7.5f, -9)), 0x08);  // tie 7 / 8 steps -> 2^-6
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -6)), 0x08);
  EXPECT_EQ(float_to_e4m3(-std::ldexp(1.0f, -11)), 0x80);  // underflow keeps the sign
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(float_to_e4m3(from_bits(0x00000001u)), 0x00);  // float subnormal

  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x07), 7.0f * std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xFE), -448.0f);
  EXPECT_EQ(to_bits(e4m3_to_float(0x80)), 0x80000000u);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
  EXPECT_FALSE(std::isnan(e4m3_to_float(0x7D)));
}

TEST(E4m3, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    if ((code & 0x7F) == 0x7F) {
      EXPECT_EQ(float_to_e4m3(e4m3_to_float(code)), 0x7F);
    } else {
      EXPECT_EQ(float_to_e4m3(e4m3_to_float(code)), code) << c;
    }
  }
}

// ---- e5m2 ---------------------------------------------------------------------------------------

TEST(E5m2, Goldens) {
  EXPECT_EQ(float_to_e5m2(1.0f), 0x3C);
  EXPECT_EQ(float_to_e5m2(-1.5f), 0xBE);
  EXPECT_EQ(float_to_e5m2(1.125f), 0x3C);  // tie 1 / 1.25 -> even (1.0)
  EXPECT_EQ(float_to_e5m2(1.375f), 0x3E);  // tie 1.25 / 1.5 -> even (1.5)
  EXPECT_EQ(float_to_e5m2(57344.0f), 0x7B);
  EXPECT_EQ(float_to_e5m2(nextafterf(61440.0f, 0.0f)), 0x7B);
  EXPECT_EQ(float_to_e5m2(61440.0f), 0x7B);  // the tie to inf saturates
  EXPECT_EQ(float_to_e5m2(1e30f), 0x7B);
  EXPECT_EQ(float_to_e5m2(kInf), 0x7B);
  EXPECT_EQ(float_to_e5m2(-kInf), 0xFB);
  EXPECT_EQ(float_to_e5m2(kNan), 0x7F);
  EXPECT_EQ(float_to_e5m2(kNegSignalingNan), 0x7F);
  EXPECT_EQ(float_to_e5m2(std::ldexp(1.0f, -16)), 0x01);  // min subnormal
  EXPECT_EQ(float_to_e5m2(std::ldexp(1.0f, -17)), 0x00);  // tie -> 0
  EXPECT_EQ(float_to_e5m2(std::ldexp(1.5f, -16)), 0x02);  // tie 1 / 2 steps -> 2
  EXPECT_EQ(float_to_e5m2(std::ldexp(3.5f, -16)), 0x04);  // tie 3 / 4 steps -> 2^-14 (normal)
  EXPECT_EQ(float_to_e5m2(std::ldexp(1.0f, -14)), 0x04);
  EXPECT_EQ(float_to_e5m2(-0.0f), 0x80);
  EXPECT_EQ(float_to_e5m2(-std::ldexp(1.0f, -18)), 0x80);

  EXPECT_EQ(e5m2_to_float(0x7B), 57344.0f);
  EXPECT_EQ(e5m2_to_float(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(e5m2_to_float(0x7C), kInf);
  EXPECT_EQ(e5m2_to_float(0xFC), -kInf);
  EXPECT_TRUE(std::isnan(e5m2_to_float(0x7D)));
  EXPECT_TRUE(std::isnan(e5m2_to_float(0xFF)));
}

TEST(E5m2, EveryFiniteCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    const float f = e5m2_to_float(code);
    if (std::isnan(f)) {
      EXPECT_EQ(float_to_e5m2(f), 0x7F);
    } else if (std::isinf(f)) {
      EXPECT_EQ(float_to_e5m2(f), (code & 0x80) | 0x7B);
    } else {
      EXPECT_EQ(float_to_e5m2(f), code) << c;
    }
  }
}

// ---- ue8m0 --------------------------------------------------------------------------------------

TEST(Ue8m0, Goldens) {
  EXPECT_EQ(ue8m0_to_float(127), 1.0f);
  EXPECT_EQ(ue8m0_to_float(130), 8.0f);
  EXPECT_EQ(ue8m0_to_float(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(ue8m0_to_float(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(ue8m0_to_float(255)));

  EXPECT_EQ(float_to_ue8m0_floor(1.0f), 127);
  EXPECT_EQ(float_to_ue8m0_floor(1.5f), 127);
  EXPECT_EQ(float_to_ue8m0_floor(0.75f), 126);
  EXPECT_EQ(float_to_ue8m0_floor(-4.0f), 129);  // magnitude
  EXPECT_EQ(float_to_ue8m0_floor(std::ldexp(1.0f, -127)), 0);
  EXPECT_EQ(float_to_ue8m0_floor(std::ldexp(1.0f, -149)), 0);  // clipped to 2^-127
  EXPECT_EQ(float_to_ue8m0_floor(0.0f), 0);
  EXPECT_EQ(float_to_ue8m0_floor(std::ldexp(1.0f, 127)), 254);
  EXPECT_EQ(float_to_ue8m0_floor(kInf), 254);
  EXPECT_EQ(float_to_ue8m0_floor(kNan), 255);

  EXPECT_EQ(float_to_ue8m0_ceil(1.0f), 127);
  EXPECT_EQ(float_to_ue8m0_ceil(nextafterf(1.0f, 2.0f)), 128);
  EXPECT_EQ(float_to_ue8m0_ceil(nextafterf(2.0f, 0.0f)), 128);
  EXPECT_EQ(float_to_ue8m0_ceil(0.75f), 127);
  EXPECT_EQ(float_to_ue8m0_ceil(-3.0f), 129);
  EXPECT_EQ(float_to_ue8m0_ceil(std::ldexp(1.0f, -126)), 1);
  EXPECT_EQ(float_to_ue8m0_ceil(std::ldexp(1.5f, -127)), 1);  // float subnormal -> 2^-126
  EXPECT_EQ(float_to_ue8m0_ceil(std::ldexp(1.0f, -127)), 0);
  EXPECT_EQ(float_to_ue8m0_ceil(std::ldexp(1.0f, -140)), 0);
  EXPECT_EQ(float_to_ue8m0_ceil(0.0f), 0);
  EXPECT_EQ(float_to_ue8m0_ceil(std::ldexp(1.0f, 127)), 254);
  EXPECT_EQ(float_to_ue8m0_ceil(from_bits(0x7F7FFFFFu)), 254);  // 2^128 saturates
  EXPECT_EQ(float_to_ue8m0_ceil(kInf), 254);
  EXPECT_EQ(float_to_ue8m0_ceil(kNan), 255);
  // model.md §2.2: amax/448 with amax = 100 is 0.2232 = 1.786 * 2^-3 -> exponent -3 + 1 -> 2^-2.
  EXPECT_EQ(float_to_ue8m0_ceil(100.0f / 448.0f), 127 - 2);
}

TEST(Ue8m0, EveryCodeRoundTrips) {
  for (int c = 0; c < 255; ++c) {
    const auto code = static_cast<uint8_t>(c);
    const float f = ue8m0_to_float(code);
    EXPECT_TRUE(is_ue8m0_pow2(f));
    EXPECT_EQ(pow2_to_ue8m0(f), code);
    EXPECT_EQ(float_to_ue8m0_floor(f), code);
    EXPECT_EQ(float_to_ue8m0_ceil(f), code);
  }
  EXPECT_FALSE(is_ue8m0_pow2(3.0f));
  EXPECT_FALSE(is_ue8m0_pow2(-2.0f));
  EXPECT_FALSE(is_ue8m0_pow2(0.0f));
  EXPECT_FALSE(is_ue8m0_pow2(std::ldexp(1.0f, -128)));
  EXPECT_FALSE(is_ue8m0_pow2(kInf));
}

// mxfp8_scale_code_from_bits (the device quantisers' division-free scale rule) against the rule it
// replaces, float_to_ue8m0_ceil(max(amax, 1e-4) / 448), over amax >= 0 (the amax of a block is
// never negative, and never NaN after fmaxf): every mantissa at the clamp's exponent, at 1 and at
// 2^73, the mantissas around 1.75 at every exponent, amax below the clamp, +inf, and 4M random
// finite amax. MOESERVE_NUMERIC_EXHAUSTIVE=1 walks every float from 0 to +inf (2^31 + 1 values;
// 4 minutes in a Debug build; it passed when this was written).
TEST(Ue8m0, Mxfp8ScaleCodeFromBitsIsTheDivisionRule) {
  size_t checked = 0, wrong = 0;
  const auto check = [&](uint32_t amax_bits) {
    const float a = std::max(from_bits(amax_bits), 1e-4f);
    const uint32_t want = float_to_ue8m0_ceil(a / 448.0f);
    const uint32_t got = mxfp8_scale_code_from_bits(to_bits(a));
    ++checked;
    if (got != want && ++wrong <= 5)
      ADD_FAILURE() << "amax bits " << std::hex << amax_bits << ": got " << std::dec << got
                    << " want " << want;
  };
  for (const uint32_t e : {113u, 127u, 200u})
    for (uint32_t m = 0; m < (1u << 23); ++m) check(e << 23 | m);
  for (uint32_t e = 0; e < 255; ++e)
    for (const uint32_t m : {0u, 1u, 2u, 0x5FFFFEu, 0x5FFFFFu, 0x600000u, 0x600001u, 0x600002u,
                             0x7FFFFEu, 0x7FFFFFu})
      check(e << 23 | m);
  check(0x7F800000u);  // +inf
  check(0u);
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> finite(0u, 0x7F7FFFFFu);
  for (int i = 0; i < (1 << 22); ++i) check(finite(rng));
  const char* env = std::getenv("MOESERVE_NUMERIC_EXHAUSTIVE");
  if (env != nullptr && std::string(env) == "1")
    for (uint32_t b = 0; b <= 0x7F800000u; ++b) check(b);
  EXPECT_EQ(wrong, 0u) << "of " << checked;
  // The range the derivation states: 105 at the clamp, 247 at FLT_MAX, 254 for +inf.
  EXPECT_EQ(mxfp8_scale_code_from_bits(to_bits(1e-4f)), 105u);
  EXPECT_EQ(mxfp8_scale_code_from_bits(0x7F7FFFFFu), 247u);
  EXPECT_EQ(mxfp8_scale_code_from_bits(0x7F800000u), 254u);
}

TEST(Ue8m0DeathTest, Pow2RejectsOtherValues) {
  EXPECT_DEATH((void)pow2_to_ue8m0(3.0f), "not a power of two");
}

// ---- e2m1 ---------------------------------------------------------------------------------------

TEST(E2m1, Goldens) {
  const float grid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (uint8_t c = 0; c < 8; ++c) {
    EXPECT_EQ(float_to_e2m1(grid[c]), c);
    EXPECT_EQ(float_to_e2m1(-grid[c]), c | 0x8);
    EXPECT_EQ(e2m1_to_float(c), grid[c]);
    EXPECT_EQ(e2m1_to_float(c | 0x8), -grid[c]);
  }
  // Ties (model.md §2.3): .25, 1.25, 2.5, 5 round down (to the even code); .75, 1.75, 3.5 up.
  EXPECT_EQ(float_to_e2m1(0.25f), 0x0);  // 0
  EXPECT_EQ(float_to_e2m1(0.75f), 0x2);  // 1.0
  EXPECT_EQ(float_to_e2m1(1.25f), 0x2);  // 1.0
  EXPECT_EQ(float_to_e2m1(1.75f), 0x4);  // 2.0
  EXPECT_EQ(float_to_e2m1(2.5f), 0x4);   // 2.0
  EXPECT_EQ(float_to_e2m1(3.5f), 0x6);   // 4.0
  EXPECT_EQ(float_to_e2m1(5.0f), 0x6);   // 4.0
  EXPECT_EQ(float_to_e2m1(-5.0f), 0xE);
  EXPECT_EQ(float_to_e2m1(nextafterf(0.25f, 1.0f)), 0x1);
  EXPECT_EQ(float_to_e2m1(nextafterf(0.75f, 0.0f)), 0x1);
  EXPECT_EQ(float_to_e2m1(nextafterf(1.25f, 2.0f)), 0x3);
  EXPECT_EQ(float_to_e2m1(nextafterf(1.75f, 0.0f)), 0x3);
  EXPECT_EQ(float_to_e2m1(nextafterf(2.5f, 3.0f)), 0x5);
  EXPECT_EQ(float_to_e2m1(nextafterf(3.5f, 0.0f)), 0x5);
  EXPECT_EQ(float_to_e2m1(nextafterf(5.0f, 6.0f)), 0x7);
  // Saturation, inf, NaN (-> +6 as CUDA), signed zeros.
  EXPECT_EQ(float_to_e2m1(6.5f), 0x7);
  EXPECT_EQ(float_to_e2m1(-1e30f), 0xF);
  EXPECT_EQ(float_to_e2m1(kInf), 0x7);
  EXPECT_EQ(float_to_e2m1(-kInf), 0xF);
  EXPECT_EQ(float_to_e2m1(kNan), 0x7);
  EXPECT_EQ(float_to_e2m1(kNegSignalingNan), 0x7);
  EXPECT_EQ(float_to_e2m1(-0.0f), 0x8);
  EXPECT_EQ(float_to_e2m1(-0.1f), 0x8);
  EXPECT_EQ(float_to_e2m1(from_bits(0x00000001u)), 0x0);
  EXPECT_EQ(to_bits(e2m1_to_float(0x8)), 0x80000000u);
}

TEST(E2m1, EveryCodeRoundTrips) {
  for (uint8_t c = 0; c < 16; ++c) EXPECT_EQ(float_to_e2m1(e2m1_to_float(c)), c);
}

TEST(E2m1, PackingIsLowNibbleFirst) {
  EXPECT_EQ(pack_e2m1_pair(0x1, 0x2), 0x21);
  EXPECT_EQ(e2m1_low(0x21), 0x1);
  EXPECT_EQ(e2m1_high(0x21), 0x2);

  const std::vector<uint8_t> codes = {0x1, 0x2, 0x3, 0x4, 0xF};
  std::vector<uint8_t> packed(e2m1_packed_bytes(codes.size()));
  ASSERT_EQ(packed.size(), 3u);
  pack_e2m1(codes, packed);
  EXPECT_EQ(packed, (std::vector<uint8_t>{0x21, 0x43, 0x0F}));  // odd tail: high nibble 0
  std::vector<uint8_t> unpacked(codes.size());
  unpack_e2m1(packed, unpacked);
  EXPECT_EQ(unpacked, codes);

  // 0.5 -> 0x1 (low), -6 -> 0xF (high); 1.0 -> 0x2 (low), 0 -> 0x0 (high).
  const std::vector<float> values = {0.5f, -6.0f, 1.0f, 0.0f};
  std::vector<uint8_t> packed_values(2);
  float_to_e2m1_packed(values, packed_values);
  EXPECT_EQ(packed_values, (std::vector<uint8_t>{0xF1, 0x02}));
  std::vector<float> decoded(4);
  e2m1_packed_to_float(packed_values, decoded);
  EXPECT_EQ(decoded, values);
}

TEST(NumericSpans, ConvertElementwise) {
  const std::vector<float> in = {1.0f, -3.0f, 448.0f, 1e9f, std::ldexp(1.0f, -9)};
  std::vector<uint8_t> e4m3(in.size());
  float_to_e4m3(in, e4m3);
  EXPECT_EQ(e4m3, (std::vector<uint8_t>{0x38, 0xC4, 0x7E, 0x7E, 0x01}));
  std::vector<float> back(in.size());
  e4m3_to_float(e4m3, back);
  EXPECT_EQ(back, (std::vector<float>{1.0f, -3.0f, 448.0f, 448.0f, std::ldexp(1.0f, -9)}));

  std::vector<uint8_t> e5m2(in.size());
  float_to_e5m2(in, e5m2);
  EXPECT_EQ(e5m2, (std::vector<uint8_t>{0x3C, 0xC2, 0x5F, 0x7B, 0x18}));  // 2^-9 is normal here
  e5m2_to_float(e5m2, back);
  EXPECT_EQ(back[2], 448.0f);

  std::vector<uint16_t> bf16(in.size());
  float_to_bf16(in, bf16);
  EXPECT_EQ(bf16,
            (std::vector<uint16_t>{0x3F80, 0xC040, 0x43E0, 0x4E6E, 0x3B00}));  // 1e9: 0x4E6E6B28
  bf16_to_float(bf16, back);
  EXPECT_EQ(back[3], from_bits(0x4E6E0000u));
}

}  // namespace
}  // namespace moeserve
