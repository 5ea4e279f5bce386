// Block quantisation of model.md §2.2–2.3 and the checkpoint's block-scaled weights
// (docs/checkpoint_format.md): fake-quant (quantise + dequantise, the QAT rules the reference
// applies to window KV, main/index cache entries and indexer queries), the same rules producing
// codes + scales for the caches, their dequantisers, and FP8 / MXFP4 weight dequantisers.
// Invariant: dequantize_X(quantize_X(x)) == fq_X(x) bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace moeserve {

inline constexpr size_t kFp8Block = 32;        // fq_fp8_block32_pow2 / checkpoint FP8 blocks
inline constexpr size_t kFp4E4m3Block = 16;    // fq_fp4_block16_e4m3scale
inline constexpr size_t kFp4Ue8m0Block = 32;   // fq_fp4_block32_ue8m0 / MXFP4
inline constexpr float kFp8AmaxFloor = 1e-4f;  // amax.clamp_min(1e-4)

// ---- fake quantisation (out may be the same span as x; sizes are multiples of the block) -------
// NaN elements do not enter amax; they come out NaN (fp8) or +6*s (fp4: e2m1 has no NaN, as CUDA).

// Window KV: per 32 values amax = max(max|x|, 1e-4), s = 2^ceil(log2(amax/448)),
// x_q = e4m3(clamp(x/s, +-448)) * s.
void fq_fp8_block32_pow2(std::span<const float> x, std::span<float> out);
// Main cache entry: per 16 values s = e4m3(max(amax, 6*2^-9) / 6), x_q = e2m1(x/s) * s.
// NOTE: the e4m3 scale saturates (amax/6 >= 448 gives s = 448); a plain torch cast overflows to
// NaN.
void fq_fp4_block16_e4m3scale(std::span<const float> x, std::span<float> out);
// Index keys / indexer queries: per 32 values s = 2^ceil(log2(max(amax, 6*2^-126) / 6)),
// x_q = e2m1(x/s) * s.
void fq_fp4_block32_ue8m0(std::span<const float> x, std::span<float> out);

// ---- the same rules, producing codes and scales -----------------------------------------------

// codes: x.size() e4m3 bytes; scales: x.size()/32 ue8m0 bytes (SWA row: 512 -> 512 + 16 B).
void quantize_fp8_block32_pow2(std::span<const float> x, std::span<uint8_t> codes,
                               std::span<uint8_t> scales);
// packed: x.size()/2 bytes of e2m1; scales: x.size()/16 e4m3 bytes (main entry: 512 -> 256 + 32 B).
void quantize_fp4_block16_e4m3scale(std::span<const float> x, std::span<uint8_t> packed,
                                    std::span<uint8_t> scales);
// packed: x.size()/2 bytes of e2m1; scales: x.size()/32 ue8m0 bytes (index key: 128 -> 64 + 4 B).
void quantize_fp4_block32_ue8m0(std::span<const float> x, std::span<uint8_t> packed,
                                std::span<uint8_t> scales);

// out.size() values; codes/packed/scales sized as for the matching quantize_*.
void dequantize_fp8_block32_pow2(std::span<const uint8_t> codes, std::span<const uint8_t> scales,
                                 std::span<float> out);
void dequantize_fp4_block16_e4m3scale(std::span<const uint8_t> packed,
                                      std::span<const uint8_t> scales, std::span<float> out);
void dequantize_fp4_block32_ue8m0(std::span<const uint8_t> packed, std::span<const uint8_t> scales,
                                  std::span<float> out);

// ---- checkpoint weights -----------------------------------------------------------------------

// Shape of a 2-D weight [rows = out, cols = in] in elements.
struct WeightShape {
  int64_t rows = 0;
  int64_t cols = 0;
};

// FP8 linear: weight e4m3 [rows, cols] + scale ue8m0 [ceil(rows/32), ceil(cols/32)];
// w = e4m3 * 2^(scale - 127) per 32x32 block. Writes rows [first_row, first_row + num_rows) to
// out (num_rows * cols floats, row-major).
void dequantize_fp8_block_weight_rows(std::span<const uint8_t> weight,
                                      std::span<const uint8_t> scale, WeightShape shape,
                                      int64_t first_row, int64_t num_rows, std::span<float> out);
// MXFP4 linear: weight e2m1 packed [rows, cols/2] (cols even) + scale ue8m0 [rows, ceil(cols/32)].
// Same row range and output layout as above.
void dequantize_mxfp4_weight_rows(std::span<const uint8_t> weight, std::span<const uint8_t> scale,
                                  WeightShape shape, int64_t first_row, int64_t num_rows,
                                  std::span<float> out);

}  // namespace moeserve
