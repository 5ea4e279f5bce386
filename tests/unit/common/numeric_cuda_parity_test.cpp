// Bit-exactness of common/numeric.h against CUDA's own host conversions: cuda_bf16.h
// __float2bfloat16_rn, cuda_fp8.h __nv_cvt_float_to_fp8(.., __NV_SATFINITE, E4M3/E5M2) and
// __nv_cvt_float_to_e8m0(.., __NV_SATFINITE, cudaRoundZero/cudaRoundPosInf), cuda_fp4.h
// __nv_cvt_float_to_fp4(.., __NV_E2M1, cudaRoundNearest), and the matching decoders.
// NOTE: CUDA's fp headers have portable host implementations, so this is plain host C++ built by
// the CXX compiler (no nvcc, no GPU). tests/unit/common/CMakeLists.txt adds the toolkit's include
// directory and MOESERVE_HAVE_CUDA_FP_HEADERS when find_package(CUDAToolkit) succeeds; otherwise
// every case GTEST_SKIPs. The device conversions (cvt.rn.satfinite.*) are specified to agree with
// these host paths; a GPU-side check belongs to the CUDA backend's tests.
// Inputs: every representable value of each format, the midpoints between neighbours and the
// overflow thresholds, each +-1 ulp and with both signs; float specials; 2M random floats (1M
// uniform bit patterns incl. NaN payloads and subnormals, 1M with exponents in [2^-30, 2^20]).
// MOESERVE_NUMERIC_EXHAUSTIVE=1 additionally walks all 2^32 floats (~25 s per format at -O2; all
// six encoders matched on every float when this was written).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/numeric.h"

#if defined(MOESERVE_HAVE_CUDA_FP_HEADERS) && __has_include(<cuda_fp8.h>) && \
    __has_include(<cuda_fp4.h>) && __has_include(<cuda_bf16.h>)
#define MOESERVE_CUDA_PARITY 1
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#else
#define MOESERVE_CUDA_PARITY 0
#endif

namespace moeserve {
namespace {

#if MOESERVE_CUDA_PARITY

uint32_t to_bits(float x) { return std::bit_cast<uint32_t>(x); }
float from_bits(uint32_t b) { return std::bit_cast<float>(b); }

// ---- CUDA references ----
uint16_t cuda_bf16(float x) {
  const __nv_bfloat16_raw r = __float2bfloat16_rn(x);
  return r.x;
}
uint8_t cuda_e4m3(float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); }
uint8_t cuda_e5m2(float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2); }
uint8_t cuda_e2m1(float x) { return __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest); }
uint8_t cuda_ue8m0_floor(float x) {
  return __nv_cvt_float_to_e8m0(x, __NV_SATFINITE, cudaRoundZero);
}
uint8_t cuda_ue8m0_ceil(float x) {
  return __nv_cvt_float_to_e8m0(x, __NV_SATFINITE, cudaRoundPosInf);
}

struct Format {
  const char* name;
  uint32_t (*ours)(float);
  uint32_t (*cuda)(float);
};

const Format kFormats[] = {
    {"bf16", [](float x) -> uint32_t { return float_to_bf16(x); },
     [](float x) -> uint32_t { return cuda_bf16(x); }},
    {"e4m3", [](float x) -> uint32_t { return float_to_e4m3(x); },
     [](float x) -> uint32_t { return cuda_e4m3(x); }},
    {"e5m2", [](float x) -> uint32_t { return float_to_e5m2(x); },
     [](float x) -> uint32_t { return cuda_e5m2(x); }},
    {"e2m1", [](float x) -> uint32_t { return float_to_e2m1(x); },
     [](float x) -> uint32_t { return cuda_e2m1(x); }},
    {"ue8m0_floor", [](float x) -> uint32_t { return float_to_ue8m0_floor(x); },
     [](float x) -> uint32_t { return cuda_ue8m0_floor(x); }},
    {"ue8m0_ceil", [](float x) -> uint32_t { return float_to_ue8m0_ceil(x); },
     [](float x) -> uint32_t { return cuda_ue8m0_ceil(x); }},
};

// Adds v, its neighbours and their negations.
void add_with_neighbours(float v, std::vector<float>& out) {
  for (const float s : {v, -v}) {
    out.push_back(s);
    out.push_back(std::nextafter(s, INFINITY));
    out.push_back(std::nextafter(s, -INFINITY));
  }
}

// Every finite grid value, every midpoint between neighbours, +-1 ulp, both signs.
void add_grid(std::vector<float> grid, std::vector<float>& out) {
  std::erase_if(grid, [](float v) { return !std::isfinite(v) || v < 0.0f; });
  std::sort(grid.begin(), grid.end());
  for (size_t i = 0; i < grid.size(); ++i) {
    add_with_neighbours(grid[i], out);
    if (i + 1 < grid.size()) {
      // The midpoint of two neighbours needs one more bit than the format: exact in float for
      // every format here except between the two largest bf16 exponents' ulps (then rounded).
      add_with_neighbours(static_cast<float>((double{grid[i]} + double{grid[i + 1]}) / 2), out);
    }
  }
}

std::vector<float> parity_inputs() {
  std::vector<float> in;
  std::vector<float> grid;
  for (uint32_t c = 0; c < 0x10000; ++c) grid.push_back(bf16_to_float(static_cast<uint16_t>(c)));
  add_grid(grid, in);
  grid.clear();
  for (int c = 0; c < 256; ++c) grid.push_back(e4m3_to_float(static_cast<uint8_t>(c)));
  grid.push_back(480.0f);  // the next value e4m3 would have: midpoint 464 is the saturation tie
  add_grid(grid, in);
  grid.clear();
  for (int c = 0; c < 256; ++c) grid.push_back(e5m2_to_float(static_cast<uint8_t>(c)));
  grid.push_back(65536.0f);  // midpoint 61440
  add_grid(grid, in);
  grid.clear();
  for (int c = 0; c < 16; ++c) grid.push_back(e2m1_to_float(static_cast<uint8_t>(c)));
  grid.push_back(8.0f);  // midpoint 7
  add_grid(grid, in);
  grid.clear();
  for (int c = 0; c < 256; ++c) grid.push_back(ue8m0_to_float(static_cast<uint8_t>(c)));
  add_grid(grid, in);

  for (const uint32_t bits :
       {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00000u, 0x7F800001u,
        0xFF800001u, 0x7FFFFFFFu, 0xFFFFFFFFu, 0x7FBFFFFFu, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x00800000u,
        0x807FFFFFu, 0x00000001u, 0x80000001u, 0x00400000u, 0x00400001u, 0x003FFFFFu}) {
    in.push_back(from_bits(bits));
  }

  std::mt19937 rng(20260914);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 1000000; ++i) in.push_back(from_bits(any_bits(rng)));
  std::uniform_int_distribution<uint32_t> exponent(127 - 30, 127 + 20);
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t r = any_bits(rng);
    in.push_back(from_bits((r & 0x807FFFFFu) | (exponent(rng) << 23)));
  }
  for (int i = 0; i < 20000; ++i) in.push_back(from_bits(any_bits(rng) & 0x807FFFFFu));
  return in;
}

std::string describe(float x) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%a (0x%08X)", static_cast<double>(x), to_bits(x));
  return buf;
}

TEST(NumericCudaParity, EncodersMatchOnBoundaryAndRandomInputs) {
  const std::vector<float> inputs = parity_inputs();
  ASSERT_GT(inputs.size(), 2000000u);
  for (const Format& f : kFormats) {
    int64_t mismatches = 0;
    for (const float x : inputs) {
      const uint32_t ours = f.ours(x);
      const uint32_t cuda = f.cuda(x);
      if (ours != cuda && ++mismatches <= 5) {
        ADD_FAILURE() << f.name << "(" << describe(x) << "): ours 0x" << std::hex << ours
                      << ", CUDA 0x" << cuda;
      }
    }
    EXPECT_EQ(mismatches, 0) << f.name << " over " << inputs.size() << " inputs";
  }
}

TEST(NumericCudaParity, DecodersMatchOnEveryCode) {
  const auto same = [](float ours, float cuda) {
    return (std::isnan(ours) && std::isnan(cuda)) || to_bits(ours) == to_bits(cuda);
  };
  for (uint32_t c = 0; c < 0x10000; ++c) {
    __nv_bfloat16_raw raw;
    raw.x = static_cast<uint16_t>(c);
    EXPECT_TRUE(same(bf16_to_float(raw.x), __bfloat162float(__nv_bfloat16(raw)))) << c;
  }
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<__nv_fp8_storage_t>(c);
    EXPECT_TRUE(
        same(e4m3_to_float(code), __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3)))))
        << "e4m3 " << c;
    EXPECT_TRUE(
        same(e5m2_to_float(code), __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E5M2)))))
        << "e5m2 " << c;
    EXPECT_TRUE(
        same(ue8m0_to_float(code), __bfloat162float(__nv_bfloat16(__nv_cvt_e8m0_to_bf16raw(code)))))
        << "ue8m0 " << c;
  }
  for (int c = 0; c < 16; ++c) {
    const auto code = static_cast<__nv_fp4_storage_t>(c);
    EXPECT_TRUE(
        same(e2m1_to_float(code), __half2float(__half(__nv_cvt_fp4_to_halfraw(code, __NV_E2M1)))))
        << "e2m1 " << c;
  }
}

TEST(NumericCudaParity, ExhaustiveWhenRequested) {
  const char* env = std::getenv("MOESERVE_NUMERIC_EXHAUSTIVE");
  if (env == nullptr || std::string(env) != "1") {
    GTEST_SKIP() << "set MOESERVE_NUMERIC_EXHAUSTIVE=1 to compare all 2^32 floats";
  }
  for (const Format& f : kFormats) {
    int64_t mismatches = 0;
    uint32_t bits = 0;
    do {
      const float x = from_bits(bits);
      if (f.ours(x) != f.cuda(x) && ++mismatches <= 5) {
        ADD_FAILURE() << f.name << "(" << describe(x) << ")";
      }
    } while (++bits != 0);
    EXPECT_EQ(mismatches, 0) << f.name;
  }
}

#else

TEST(NumericCudaParity, Skipped) {
  GTEST_SKIP() << "CUDA toolkit headers (cuda_fp8.h, cuda_fp4.h, cuda_bf16.h) not found at "
                  "configure time; CUDA parity of common/numeric.h not checked";
}

#endif

}  // namespace
}  // namespace moeserve
