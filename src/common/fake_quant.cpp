#include "common/fake_quant.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"
#include "common/numeric.h"

namespace moeserve {
namespace {

constexpr float kFp4E4m3ScaleFloor = 6.0f * 0x1p-9f;     // s >= 2^-9, e4m3's min subnormal
constexpr float kFp4Ue8m0ScaleFloor = 6.0f * 0x1p-126f;  // s >= 2^-126

// max |x| over a block; NaN elements are ignored.
float block_amax(const float* x, size_t n) {
  float amax = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    amax = a > amax ? a : amax;
  }
  return amax;
}

// ue8m0 code of s = 2^ceil(log2(amax/448)), amax = max(max|x|, 1e-4): the fp32 bits of amax/448
// (always a normal float) give exponent + (mantissa != 0), which is float_to_ue8m0_ceil.
uint8_t fp8_block_scale(const float* x) {
  const float amax = std::max(block_amax(x, kFp8Block), kFp8AmaxFloor);
  return float_to_ue8m0_ceil(amax / kE4m3Max);
}

uint8_t fp4_e4m3_block_scale(const float* x) {
  const float amax = std::max(block_amax(x, kFp4E4m3Block), kFp4E4m3ScaleFloor);
  return float_to_e4m3(amax / kE2m1Max);
}

uint8_t fp4_ue8m0_block_scale(const float* x) {
  const float amax = std::max(block_amax(x, kFp4Ue8m0Block), kFp4Ue8m0ScaleFloor);
  return float_to_ue8m0_ceil(amax / kE2m1Max);
}

// NOTE: for a power-of-two s, x * (1/s) is bit-identical to x / s (1/s is exact and both are the
// correctly rounded x * 2^-k), so the pow2 paths multiply; the e4m3-scale path must divide.
uint8_t fp8_code(float x, float inv_s) {
  return float_to_e4m3(std::clamp(x * inv_s, -kE4m3Max, kE4m3Max));
}

void check_blocks(size_t n, size_t block, size_t out_size) {
  MS_CHECK_MSG(n % block == 0, "size {} is not a multiple of the block {}", n, block);
  MS_CHECK_EQ(n, out_size);
}

}  // namespace

void fq_fp8_block32_pow2(std::span<const float> x, std::span<float> out) {
  check_blocks(x.size(), kFp8Block, out.size());
  for (size_t b = 0; b < x.size(); b += kFp8Block) {
    const uint8_t scale = fp8_block_scale(&x[b]);
    const float s = ue8m0_to_float(scale);
    const float inv_s = 1.0f / s;
    for (size_t i = b; i < b + kFp8Block; ++i) out[i] = e4m3_to_float(fp8_code(x[i], inv_s)) * s;
  }
}

void fq_fp4_block16_e4m3scale(std::span<const float> x, std::span<float> out) {
  check_blocks(x.size(), kFp4E4m3Block, out.size());
  for (size_t b = 0; b < x.size(); b += kFp4E4m3Block) {
    const float s = e4m3_to_float(fp4_e4m3_block_scale(&x[b]));
    for (size_t i = b; i < b + kFp4E4m3Block; ++i)
      out[i] = e2m1_to_float(float_to_e2m1(x[i] / s)) * s;
  }
}

void fq_fp4_block32_ue8m0(std::span<const float> x, std::span<float> out) {
  check_blocks(x.size(), kFp4Ue8m0Block, out.size());
  for (size_t b = 0; b < x.size(); b += kFp4Ue8m0Block) {
    const float s = ue8m0_to_float(fp4_ue8m0_block_scale(&x[b]));
    const float inv_s = 1.0f / s;
    for (size_t i = b; i < b + kFp4Ue8m0Block; ++i) {
      out[i] = e2m1_to_float(float_to_e2m1(x[i] * inv_s)) * s;
    }
  }
}

void quantize_fp8_block32_pow2(std::span<const float> x, std::span<uint8_t> codes,
                               std::span<uint8_t> scales) {
  check_blocks(x.size(), kFp8Block, codes.size());
  MS_CHECK_EQ(scales.size(), x.size() / kFp8Block);
  for (size_t b = 0; b < x.size(); b += kFp8Block) {
    const uint8_t scale = fp8_block_scale(&x[b]);
    scales[b / kFp8Block] = scale;
    const float inv_s = 1.0f / ue8m0_to_float(scale);
    for (size_t i = b; i < b + kFp8Block; ++i) codes[i] = fp8_code(x[i], inv_s);
  }
}

void quantize_fp4_block16_e4m3scale(std::span<const float> x, std::span<uint8_t> packed,
                                    std::span<uint8_t> scales) {
  check_blocks(x.size(), kFp4E4m3Block, packed.size() * 2);
  MS_CHECK_EQ(scales.size(), x.size() / kFp4E4m3Block);
  for (size_t b = 0; b < x.size(); b += kFp4E4m3Block) {
    const uint8_t scale = fp4_e4m3_block_scale(&x[b]);
    scales[b / kFp4E4m3Block] = scale;
    const float s = e4m3_to_float(scale);
    for (size_t i = b; i < b + kFp4E4m3Block; i += 2) {
      packed[i / 2] = pack_e2m1_pair(float_to_e2m1(x[i] / s), float_to_e2m1(x[i + 1] / s));
    }
  }
}

void quantize_fp4_block32_ue8m0(std::span<const float> x, std::span<uint8_t> packed,
                                std::span<uint8_t> scales) {
  check_blocks(x.size(), kFp4Ue8m0Block, packed.size() * 2);
  MS_CHECK_EQ(scales.size(), x.size() / kFp4Ue8m0Block);
  for (size_t b = 0; b < x.size(); b += kFp4Ue8m0Block) {
    const uint8_t scale = fp4_ue8m0_block_scale(&x[b]);
    scales[b / kFp4Ue8m0Block] = scale;
    const float inv_s = 1.0f / ue8m0_to_float(scale);
    for (size_t i = b; i < b + kFp4Ue8m0Block; i += 2) {
      packed[i / 2] = pack_e2m1_pair(float_to_e2m1(x[i] * inv_s), float_to_e2m1(x[i + 1] * inv_s));
    }
  }
}

void dequantize_fp8_block32_pow2(std::span<const uint8_t> codes, std::span<const uint8_t> scales,
                                 std::span<float> out) {
  check_blocks(out.size(), kFp8Block, codes.size());
  MS_CHECK_EQ(scales.size(), out.size() / kFp8Block);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = e4m3_to_float(codes[i]) * ue8m0_to_float(scales[i / kFp8Block]);
  }
}

void dequantize_fp4_block16_e4m3scale(std::span<const uint8_t> packed,
                                      std::span<const uint8_t> scales, std::span<float> out) {
  check_blocks(out.size(), kFp4E4m3Block, packed.size() * 2);
  MS_CHECK_EQ(scales.size(), out.size() / kFp4E4m3Block);
  for (size_t i = 0; i < packed.size(); ++i) {
    const float s = e4m3_to_float(scales[2 * i / kFp4E4m3Block]);
    out[2 * i] = e2m1_to_float(e2m1_low(packed[i])) * s;
    out[2 * i + 1] = e2m1_to_float(e2m1_high(packed[i])) * s;
  }
}

void dequantize_fp4_block32_ue8m0(std::span<const uint8_t> packed, std::span<const uint8_t> scales,
                                  std::span<float> out) {
  check_blocks(out.size(), kFp4Ue8m0Block, packed.size() * 2);
  MS_CHECK_EQ(scales.size(), out.size() / kFp4Ue8m0Block);
  for (size_t i = 0; i < packed.size(); ++i) {
    const float s = ue8m0_to_float(scales[2 * i / kFp4Ue8m0Block]);
    out[2 * i] = e2m1_to_float(e2m1_low(packed[i])) * s;
    out[2 * i + 1] = e2m1_to_float(e2m1_high(packed[i])) * s;
  }
}

void dequantize_fp8_block_weight_rows(std::span<const uint8_t> weight,
                                      std::span<const uint8_t> scale, WeightShape shape,
                                      int64_t first_row, int64_t num_rows, std::span<float> out) {
  const int64_t block = static_cast<int64_t>(kFp8Block);
  const int64_t scale_cols = (shape.cols + block - 1) / block;
  const int64_t scale_rows = (shape.rows + block - 1) / block;
  MS_CHECK_EQ(static_cast<int64_t>(weight.size()), shape.rows * shape.cols);
  MS_CHECK_EQ(static_cast<int64_t>(scale.size()), scale_rows * scale_cols);
  MS_CHECK_MSG(first_row >= 0 && num_rows >= 0 && first_row + num_rows <= shape.rows,
               "rows [{}, {}) outside [0, {})", first_row, first_row + num_rows, shape.rows);
  MS_CHECK_EQ(static_cast<int64_t>(out.size()), num_rows * shape.cols);
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t row = first_row + r;
    const uint8_t* w = weight.data() + row * shape.cols;
    const uint8_t* row_scales = scale.data() + (row / block) * scale_cols;
    float* o = out.data() + r * shape.cols;
    for (int64_t c = 0; c < shape.cols; ++c) {
      o[c] = e4m3_to_float(w[c]) * ue8m0_to_float(row_scales[c / block]);
    }
  }
}

void dequantize_mxfp4_weight_rows(std::span<const uint8_t> weight, std::span<const uint8_t> scale,
                                  WeightShape shape, int64_t first_row, int64_t num_rows,
                                  std::span<float> out) {
  const int64_t block = static_cast<int64_t>(kFp4Ue8m0Block);
  const int64_t scale_cols = (shape.cols + block - 1) / block;
  const int64_t packed_cols = shape.cols / 2;
  MS_CHECK_MSG(shape.cols % 2 == 0, "MXFP4 weight with odd in-dimension {}", shape.cols);
  MS_CHECK_EQ(static_cast<int64_t>(weight.size()), shape.rows * packed_cols);
  MS_CHECK_EQ(static_cast<int64_t>(scale.size()), shape.rows * scale_cols);
  MS_CHECK_MSG(first_row >= 0 && num_rows >= 0 && first_row + num_rows <= shape.rows,
               "rows [{}, {}) outside [0, {})", first_row, first_row + num_rows, shape.rows);
  MS_CHECK_EQ(static_cast<int64_t>(out.size()), num_rows * shape.cols);
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t row = first_row + r;
    const uint8_t* w = weight.data() + row * packed_cols;
    const uint8_t* row_scales = scale.data() + row * scale_cols;
    float* o = out.data() + r * shape.cols;
    for (int64_t p = 0; p < packed_cols; ++p) {
      const float s = ue8m0_to_float(row_scales[2 * p / block]);
      o[2 * p] = e2m1_to_float(e2m1_low(w[p])) * s;
      o[2 * p + 1] = e2m1_to_float(e2m1_high(w[p])) * s;
    }
  }
}

}  // namespace moeserve
