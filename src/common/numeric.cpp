#include "common/numeric.h"

#include "common/check.h"

namespace moeserve {

uint8_t pow2_to_ue8m0(float pow2) {
  MS_CHECK_MSG(is_ue8m0_pow2(pow2), "{} is not a power of two in [2^-127, 2^127]", pow2);
  return float_to_ue8m0_floor(pow2);
}

void float_to_bf16(std::span<const float> in, std::span<uint16_t> out) {
  MS_CHECK_EQ(in.size(), out.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = float_to_bf16(in[i]);
}

void bf16_to_float(std::span<const uint16_t> in, std::span<float> out) {
  MS_CHECK_EQ(in.size(), out.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = bf16_to_float(in[i]);
}

void float_to_e4m3(std::span<const float> in, std::span<uint8_t> out) {
  MS_CHECK_EQ(in.size(), out.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = float_to_e4m3(in[i]);
}

void e4m3_to_float(std::span<const uint8_t> in, std::span<float> out) {
  MS_CHECK_EQ(in.size(), out.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = kE4m3ToFloat[in[i]];
}

void float_to_e5m2(std::span<const float> in, std::span<uint8_t> out) {
  MS_CHECK_EQ(in.size(), out.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = float_to_e5m2(in[i]);
}

void e5m2_to_float(std::span<const uint8_t> in, std::span<float> out) {
  MS_CHECK_EQ(in.size(), out.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = kE5m2ToFloat[in[i]];
}

void pack_e2m1(std::span<const uint8_t> codes, std::span<uint8_t> packed) {
  MS_CHECK_EQ(packed.size(), e2m1_packed_bytes(codes.size()));
  const size_t pairs = codes.size() / 2;
  for (size_t i = 0; i < pairs; ++i) packed[i] = pack_e2m1_pair(codes[2 * i], codes[2 * i + 1]);
  if (codes.size() % 2 != 0) packed[pairs] = pack_e2m1_pair(codes[2 * pairs], 0);
}

void unpack_e2m1(std::span<const uint8_t> packed, std::span<uint8_t> codes) {
  MS_CHECK_EQ(packed.size(), e2m1_packed_bytes(codes.size()));
  const size_t pairs = codes.size() / 2;
  for (size_t i = 0; i < pairs; ++i) {
    codes[2 * i] = e2m1_low(packed[i]);
    codes[2 * i + 1] = e2m1_high(packed[i]);
  }
  if (codes.size() % 2 != 0) codes[2 * pairs] = e2m1_low(packed[pairs]);
}

void float_to_e2m1_packed(std::span<const float> in, std::span<uint8_t> packed) {
  MS_CHECK_EQ(packed.size(), e2m1_packed_bytes(in.size()));
  const size_t pairs = in.size() / 2;
  for (size_t i = 0; i < pairs; ++i) {
    packed[i] = pack_e2m1_pair(float_to_e2m1(in[2 * i]), float_to_e2m1(in[2 * i + 1]));
  }
  if (in.size() % 2 != 0) packed[pairs] = pack_e2m1_pair(float_to_e2m1(in[2 * pairs]), 0);
}

void e2m1_packed_to_float(std::span<const uint8_t> packed, std::span<float> out) {
  MS_CHECK_EQ(packed.size(), e2m1_packed_bytes(out.size()));
  const size_t pairs = out.size() / 2;
  for (size_t i = 0; i < pairs; ++i) {
    out[2 * i] = kE2m1ToFloat[e2m1_low(packed[i])];
    out[2 * i + 1] = kE2m1ToFloat[e2m1_high(packed[i])];
  }
  if (out.size() % 2 != 0) out[2 * pairs] = kE2m1ToFloat[e2m1_low(packed[pairs])];
}

}  // namespace moeserve
