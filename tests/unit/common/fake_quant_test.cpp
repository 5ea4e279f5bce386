#include "common/fake_quant.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "common/numeric.h"

namespace moeserve {
namespace {

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> log_scale(-12.0f, 12.0f);
  std::vector<float> x(n);
  for (size_t b = 0; b < n; b += 16) {
    const float scale = std::exp2(log_scale(rng));  // blocks of very different magnitudes
    for (size_t i = b; i < b + 16 && i < n; ++i) x[i] = normal(rng) * scale;
  }
  return x;
}

void expect_bits_eq(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(a[i]), std::bit_cast<uint32_t>(b[i]))
        << i << ": " << a[i] << " vs " << b[i];
  }
}

// ---- fq_fp8_block32_pow2 --------------------------------------------------------------------

TEST(FqFp8Block32Pow2, HandGoldens) {
  std::vector<float> x(4 * 32, 0.0f);
  std::vector<float> want(4 * 32, 0.0f);
  // Block 0: amax = 100; 100/448 = 0.2232 = 1.786 * 2^-3 -> s = 2^(-3+1) = 0.25.
  x[0] = 100.0f;  // 400 -> tie 384 (man 4) / 416 (man 5) -> 384 -> 96
  want[0] = 96.0f;
  x[1] = -3.0f;  // -12 exact -> -3
  want[1] = -3.0f;
  x[2] = 0.3f;  // 1.2 -> grid step 0.125: 1.25 (1.2 > 1.1875) -> 0.3125
  want[2] = 0.3125f;
  x[3] = 0.001f;  // 0.004 -> subnormal grid 2^-9: 2.048 steps -> 2 -> 2^-8 * 0.25 = 2^-10
  want[3] = std::ldexp(1.0f, -10);
  // Block 1: amax = 448 -> 448/448 = 1.0, mantissa 0 -> s = 1.
  x[32] = 448.0f;  // 448
  want[32] = 448.0f;
  x[33] = -17.0f;  // tie 16 (man 0) / 18 (man 1) -> 16
  want[33] = -16.0f;
  x[34] = 0.001f;  // 0.512 steps of 2^-9 -> 1 -> 2^-9
  want[34] = std::ldexp(1.0f, -9);
  x[35] = -0.0f;  // -0 stays -0
  want[35] = -0.0f;
  // Block 2: amax = 449 -> 1.0022 -> s = 2; 449/2 = 224.5 -> grid step 16 -> 224 -> 448.
  x[64] = 449.0f;
  want[64] = 448.0f;
  x[65] = 3.0f;  // 1.5 -> 1.5 -> 3
  want[65] = 3.0f;
  // Block 3: all tiny, amax clamps to 1e-4: 1e-4/448 = 2.23e-7 = 1.87 * 2^-23 -> s = 2^-22.
  x[96] = 1e-5f;  // 1e-5 * 2^22 = 41.94 -> grid step 4 in [32, 64): 40 -> 40 * 2^-22
  want[96] = std::ldexp(40.0f, -22);
  x[97] = -1e-9f;  // -1e-9 * 2^22 = -0.0042 = -2.15 steps of 2^-9 -> -2 -> -2^-8 * 2^-22
  want[97] = -std::ldexp(1.0f, -30);
  x[98] = -1e-10f;  // -0.21 steps of 2^-9 -> -0
  want[98] = -0.0f;

  std::vector<float> out(x.size());
  fq_fp8_block32_pow2(x, out);
  expect_bits_eq(out, want);

  std::vector<uint8_t> codes(x.size()), scales(4);
  quantize_fp8_block32_pow2(x, codes, scales);
  EXPECT_EQ(scales, (std::vector<uint8_t>{125, 127, 128, 105}));  // 2^-2, 2^0, 2^1, 2^-22
  EXPECT_EQ(codes[0], 0x7C);                                      // 384
  EXPECT_EQ(codes[1], 0xD4);                                      // -12 = -1.5 * 2^3
  EXPECT_EQ(codes[3], 0x02);                                      // 2 * 2^-9
  EXPECT_EQ(codes[32], 0x7E);                                     // 448
  EXPECT_EQ(codes[35], 0x80);                                     // -0
  EXPECT_EQ(codes[96], 0x62);                                     // 40 = 1.25 * 2^5

  // In place.
  fq_fp8_block32_pow2(x, x);
  expect_bits_eq(x, want);
}

// ---- fq_fp4_block16_e4m3scale ---------------------------------------------------------------

TEST(FqFp4Block16E4m3Scale, HandGoldens) {
  std::vector<float> x(4 * 16, 0.0f);
  std::vector<float> want(4 * 16, 0.0f);
  // Block 0: amax = 3 -> 3/6 = 0.5, exact in e4m3 -> s = 0.5. x/s then e2m1 ties.
  const float b0[] = {3.0f, -1.0f, 0.4f, 0.125f, 0.375f, 1.25f, 1.75f, 2.5f, -2.6f};
  //                 x/s: 6    -2     0.8   0.25    0.75    2.5    3.5    5     -5.2
  //                 e2m1: 6   -2     1     0       1       2      4      4     -6
  const float w0[] = {3.0f, -1.0f, 0.5f, 0.0f, 0.5f, 1.0f, 2.0f, 2.0f, -3.0f};
  for (int i = 0; i < 9; ++i) {
    x[i] = b0[i];
    want[i] = w0[i];
  }
  // Block 1: amax = 1 -> 1/6 = 0.16667; e4m3 step in [0.125, 0.25) is 2^-6: 10.67 steps -> 11
  // -> s = 0.171875 (code 0x23). 1/s = 5.82 -> 6 -> 1.03125; -0.5/s = -2.91 -> -3 -> -0.515625;
  // 0.1/s = 0.58 -> 0.5 -> 0.0859375.
  x[16] = 1.0f;
  want[16] = 1.03125f;
  x[17] = -0.5f;
  want[17] = -0.515625f;
  x[18] = 0.1f;
  want[18] = 0.0859375f;
  // Block 2: tiny, amax = 0.003 < 6 * 2^-9 -> s = e4m3(2^-9) = 2^-9 (code 0x01).
  // 0.001 * 512 = 0.512 -> 0.5 -> 2^-10; -0.003 * 512 = -1.536 -> -1.5 -> -1.5 * 2^-9.
  x[32] = 0.001f;
  want[32] = std::ldexp(1.0f, -10);
  x[33] = -0.003f;
  want[33] = -std::ldexp(1.5f, -9);
  // Block 3: amax = 6000 -> 1000 saturates to s = 448; 6000/448 = 13.4 -> 6 -> 2688;
  // 1000/448 = 2.23 -> 2 -> 896.
  x[48] = 6000.0f;
  want[48] = 2688.0f;
  x[49] = 1000.0f;
  want[49] = 896.0f;

  std::vector<float> out(x.size());
  fq_fp4_block16_e4m3scale(x, out);
  expect_bits_eq(out, want);

  std::vector<uint8_t> packed(x.size() / 2), scales(4);
  quantize_fp4_block16_e4m3scale(x, packed, scales);
  EXPECT_EQ(scales, (std::vector<uint8_t>{0x30, 0x23, 0x01, 0x7E}));  // 0.5, 0.171875, 2^-9, 448
  EXPECT_EQ(packed[0], 0xC7);  // element 0: 6 (0x7) low, element 1: -2 (0xC) high
  EXPECT_EQ(packed[1], 0x02);  // 1 (0x2), 0 (0x0)
  EXPECT_EQ(packed[3], 0x66);  // x/s = 3.5, 5 -> 4 (0x6), 4 (0x6)
  EXPECT_EQ(packed[4], 0x0F);  // -6 (0xF), 0 (0x0)
}

// ---- fq_fp4_block32_ue8m0 -------------------------------------------------------------------

TEST(FqFp4Block32Ue8m0, HandGoldens) {
  std::vector<float> x(4 * 32, 0.0f);
  std::vector<float> want(4 * 32, 0.0f);
  // Block 0: amax = 5 -> 5/6 = 0.833 -> 2^ceil(-0.26) = 1. Ties: 5 -> 4, 3.5 -> 4, -2.5 -> -2.
  x[0] = 5.0f;
  want[0] = 4.0f;
  x[1] = 3.5f;
  want[1] = 4.0f;
  x[2] = -2.5f;
  want[2] = -2.0f;
  x[3] = 0.26f;  // -> 0.5
  want[3] = 0.5f;
  // Block 1: amax = 12 -> 12/6 = 2 exactly -> s = 2. 7/2 = 3.5 -> 4 -> 8; 1/2 = 0.5 -> 1.
  x[32] = 12.0f;
  want[32] = 12.0f;
  x[33] = 7.0f;
  want[33] = 8.0f;
  x[34] = -1.0f;
  want[34] = -1.0f;
  // Block 2: amax = 12.5 -> 2.083 -> s = 4. 12.5/4 = 3.125 -> 3 -> 12; 1/4 = 0.25 -> 0.
  x[64] = 12.5f;
  want[64] = 12.0f;
  x[65] = 1.0f;
  want[65] = 0.0f;
  // Block 3: all zero -> amax floor 6 * 2^-126 -> s = 2^-126; zeros stay zero.

  std::vector<float> out(x.size());
  fq_fp4_block32_ue8m0(x, out);
  expect_bits_eq(out, want);

  std::vector<uint8_t> packed(x.size() / 2), scales(4);
  quantize_fp4_block32_ue8m0(x, packed, scales);
  EXPECT_EQ(scales, (std::vector<uint8_t>{127, 128, 129, 1}));
  EXPECT_EQ(packed[0], 0x66);  // 4 (0x6), 4 (0x6)
  EXPECT_EQ(packed[1], 0x1C);  // -2 (0xC), 0.5 (0x1)
}

// ---- invariants -----------------------------------------------------------------------------

TEST(FakeQuant, DequantizeOfQuantizeIsFakeQuant) {
  // Cache record sizes: SWA row 512 -> 512 + 16 B, main entry 512 -> 256 + 32 B,
  // index key 128 -> 64 + 4 B.
  const std::vector<float> x = random_values(512, 1);
  std::vector<float> fq(x.size()), dq(x.size());

  std::vector<uint8_t> codes(512), fp8_scales(16);
  quantize_fp8_block32_pow2(x, codes, fp8_scales);
  dequantize_fp8_block32_pow2(codes, fp8_scales, dq);
  fq_fp8_block32_pow2(x, fq);
  expect_bits_eq(dq, fq);
  EXPECT_EQ(codes.size() + fp8_scales.size(), 528u);

  std::vector<uint8_t> packed(256), e4m3_scales(32);
  quantize_fp4_block16_e4m3scale(x, packed, e4m3_scales);
  dequantize_fp4_block16_e4m3scale(packed, e4m3_scales, dq);
  fq_fp4_block16_e4m3scale(x, fq);
  expect_bits_eq(dq, fq);
  EXPECT_EQ(packed.size() + e4m3_scales.size(), 288u);

  const std::vector<float> key = random_values(128, 2);
  std::vector<float> fq_key(128), dq_key(128);
  std::vector<uint8_t> key_packed(64), key_scales(4);
  quantize_fp4_block32_ue8m0(key, key_packed, key_scales);
  dequantize_fp4_block32_ue8m0(key_packed, key_scales, dq_key);
  fq_fp4_block32_ue8m0(key, fq_key);
  expect_bits_eq(dq_key, fq_key);
  EXPECT_EQ(key_packed.size() + key_scales.size(), 68u);
}

TEST(FakeQuant, IsIdempotentAndBounded) {
  const std::vector<float> x = random_values(1024, 3);
  std::vector<float> once(x.size()), twice(x.size());
  fq_fp8_block32_pow2(x, once);
  fq_fp8_block32_pow2(once, twice);
  expect_bits_eq(once, twice);
  // Error: half an e4m3 ulp (2^-4 relative) or half a subnormal step (s * 2^-10, s < 2 amax/448).
  for (size_t b = 0; b < x.size(); b += 32) {
    float amax = 0.0f;
    for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    for (size_t i = b; i < b + 32; ++i) {
      EXPECT_LE(std::fabs(once[i] - x[i]), std::fabs(x[i]) * 0x1p-4f + amax / 448.0f * 0x1p-9f)
          << i;
    }
  }
  fq_fp4_block32_ue8m0(x, once);
  fq_fp4_block32_ue8m0(once, twice);
  expect_bits_eq(once, twice);
}

// ---- checkpoint weights ---------------------------------------------------------------------

TEST(WeightDequant, Fp8Block32x32) {
  // 64x64 weight, all 1.0 (0x38) except three entries; 2x2 block scales 2^0, 2^1, 2^-1, 2^3.
  constexpr int64_t kN = 64;
  std::vector<uint8_t> weight(kN * kN, 0x38);
  const std::vector<uint8_t> scale = {127, 128, 126, 130};
  weight[5 * kN + 40] = 0xC4;   // -3 in block (0, 1): * 2 -> -6
  weight[40 * kN + 3] = 0x01;   // 2^-9 in block (1, 0): * 0.5 -> 2^-10
  weight[63 * kN + 63] = 0x7E;  // 448 in block (1, 1): * 8 -> 3584
  std::vector<float> out(kN * kN);
  dequantize_fp8_block_weight_rows(weight, scale, {kN, kN}, 0, kN, out);
  for (int64_t r = 0; r < kN; ++r) {
    for (int64_t c = 0; c < kN; ++c) {
      const float block_scale = r < 32 ? (c < 32 ? 1.0f : 2.0f) : (c < 32 ? 0.5f : 8.0f);
      float want = block_scale;
      if (r == 5 && c == 40) want = -6.0f;
      if (r == 40 && c == 3) want = std::ldexp(1.0f, -10);
      if (r == 63 && c == 63) want = 3584.0f;
      ASSERT_EQ(out[r * kN + c], want) << r << "," << c;
    }
  }
  // A row range crossing the block boundary.
  std::vector<float> rows(4 * kN);
  dequantize_fp8_block_weight_rows(weight, scale, {kN, kN}, 30, 4, rows);
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t c = 0; c < kN; ++c) EXPECT_EQ(rows[r * kN + c], out[(30 + r) * kN + c]);
  }
  // Ragged shape: [40, 36] has scales [2, 2]; entry (39, 35) is in block (1, 1).
  std::vector<uint8_t> ragged(40 * 36, 0x38);
  std::vector<float> ragged_out(40 * 36);
  dequantize_fp8_block_weight_rows(ragged, scale, {40, 36}, 0, 40, ragged_out);
  EXPECT_EQ(ragged_out[0], 1.0f);
  EXPECT_EQ(ragged_out[31], 1.0f);
  EXPECT_EQ(ragged_out[32], 2.0f);
  EXPECT_EQ(ragged_out[32 * 36], 0.5f);
  EXPECT_EQ(ragged_out[39 * 36 + 35], 8.0f);
}

TEST(WeightDequant, Mxfp4Rows) {
  // 2 rows x 64 inputs: packed [2, 32], scales [2, 2].
  std::vector<uint8_t> weight(2 * 32, 0x00);
  const std::vector<uint8_t> scale = {127, 129, 126, 127};  // row 0: 1, 4; row 1: 0.5, 1
  weight[0] = 0x21;        // row 0, elements 0 (0.5) and 1 (1.0), scale 1
  weight[16] = 0xF7;       // row 0, elements 32 (6) and 33 (-6), scale 4 -> 24, -24
  weight[32 + 15] = 0x9B;  // row 1, elements 30 (-1.5) and 31 (-0.5), scale 0.5
  weight[32 + 31] = 0x5C;  // row 1, elements 62 (-2) and 63 (3), scale 1
  std::vector<float> out(2 * 64);
  dequantize_mxfp4_weight_rows(weight, scale, {2, 64}, 0, 2, out);
  std::vector<float> want(2 * 64, 0.0f);
  want[0] = 0.5f;
  want[1] = 1.0f;
  want[32] = 24.0f;
  want[33] = -24.0f;
  want[64 + 30] = -0.75f;
  want[64 + 31] = -0.25f;
  want[64 + 62] = -2.0f;
  want[64 + 63] = 3.0f;
  EXPECT_EQ(out, want);

  std::vector<float> row1(64);
  dequantize_mxfp4_weight_rows(weight, scale, {2, 64}, 1, 1, row1);
  EXPECT_EQ(row1, std::vector<float>(want.begin() + 64, want.end()));
}

}  // namespace
}  // namespace moeserve
