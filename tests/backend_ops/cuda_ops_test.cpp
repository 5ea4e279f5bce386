// The V4.1-specific CUDA ops (backend/cuda/kernels.h) against their CPU references
// (backend/cpu/quant_ops.h) on random inputs, never zeros; outputs are poisoned with NaN first so
// an unwritten element fails. Tolerances are max|got - ref| / max|ref| and are stated per case.
// Every case skips (not fails) without a CUDA device; the CPU-only cases check the references.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "backend/backend.h"
#include "backend/cpu/quant_ops.h"
#include "common/fake_quant.h"
#include "common/numeric.h"

#ifdef MOESERVE_HAVE_CUDA
#include "backend/cuda/cublaslt_gemm.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_runtime.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/model_glue.h"
#endif

namespace moeserve {
namespace {

std::vector<float> random_floats(int64_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) {
    do {
      x = dist(rng);
    } while (x == 0.0f);
  }
  return v;
}

// Weights spread over many binades (subnormal e4m3 included): u * 2^e, u in [-1,1), e in [-8,8].
std::vector<uint8_t> random_e4m3(int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> e(-8, 8);
  std::vector<uint8_t> codes(static_cast<size_t>(n));
  for (auto& c : codes) {
    do {
      c = float_to_e4m3(std::ldexp(u(rng), e(rng)));
    } while ((c & 0x7F) == 0);
  }
  return codes;
}

std::vector<uint8_t> random_bytes(int64_t n, std::mt19937& rng, int lo, int hi) {
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<uint8_t> v(static_cast<size_t>(n));
  for (auto& b : v) b = static_cast<uint8_t>(d(rng));
  return v;
}

// max|got - ref| / max|ref|; +inf when any output is not finite (poisoned or broken).
double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0.0, den = 1e-30;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    num = std::max(num, std::abs(static_cast<double>(got[i]) - ref[i]));
    den = std::max(den, std::abs(static_cast<double>(ref[i])));
  }
  return num / den;
}

template <typename T>
TensorView host_view(std::vector<T>& v, DType dtype, Shape shape) {
  return TensorView(v.data(), dtype, shape);
}

struct GemmCase {
  int64_t m, n, k;
  bool bf16_x;
};

std::string gemm_name(const testing::TestParamInfo<GemmCase>& info) {
  const GemmCase& c = info.param;
  return std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k) +
         (c.bf16_x ? "_bf16" : "_f32");
}

const std::vector<GemmCase> kGemmCases = {
    {1, 64, 64, false},   {1, 64, 64, true},      {7, 100, 160, false},  {7, 100, 160, true},
    {64, 128, 256, true}, {130, 200, 512, false}, {130, 200, 512, true}, {3, 2304, 5120, true}};

// Activations for a case: fp32 values, plus their bf16 bits when the case uses bf16.
struct Activations {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
};

Activations make_activations(const GemmCase& c, std::mt19937& rng) {
  Activations a{random_floats(c.m * c.k, rng, -1.0f, 1.0f), {}};
  if (c.bf16_x) {
    a.bf16.resize(a.f32.size());
    float_to_bf16(a.f32, a.bf16);
    bf16_to_float(a.bf16, a.f32);  // the CPU sees exactly the GPU's operands
  }
  return a;
}

// ---- CPU references checked against common/fake_quant.h's weight dequantisers
// --------------------

TEST(QuantOpsCpu, Fp8BlockGemmMatchesDequantisedWeights) {
  std::mt19937 rng(5);
  const int64_t m = 3, n = 70, k = 96;
  auto x = random_floats(m * k, rng, -1, 1);
  auto w = random_e4m3(n * k, rng);
  auto s = random_bytes((n + 31) / 32 * (k / 32), rng, 118, 134);
  std::vector<float> y(static_cast<size_t>(m * n));
  cpu::fp8_block_gemm(host_view(x, DType::kF32, {m, k}), host_view(w, DType::kF8E4M3, {n, k}),
                      host_view(s, DType::kF8E8M0, {(n + 31) / 32, k / 32}),
                      host_view(y, DType::kF32, {m, n}));
  std::vector<float> wd(static_cast<size_t>(n * k));
  dequantize_fp8_block_weight_rows(w, s, {n, k}, 0, n, wd);
  std::vector<float> ref(y.size());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t kk = 0; kk < k; ++kk) acc += static_cast<double>(x[i * k + kk]) * wd[j * k + kk];
      ref[i * n + j] = static_cast<float>(acc);
    }
  EXPECT_LE(rel_err(y, ref), 1e-6);
}

TEST(QuantOpsCpu, Mxfp4GemmMatchesDequantisedWeights) {
  std::mt19937 rng(6);
  const int64_t m = 3, n = 40, k = 128;
  auto x = random_floats(m * k, rng, -1, 1);
  auto w = random_bytes(n * k / 2, rng, 0, 255);
  auto s = random_bytes(n * k / 32, rng, 118, 134);
  std::vector<float> y(static_cast<size_t>(m * n));
  cpu::mxfp4_gemm(host_view(x, DType::kF32, {m, k}), host_view(w, DType::kFp4E2m1, {n, k}),
                  host_view(s, DType::kF8E8M0, {n, k / 32}), host_view(y, DType::kF32, {m, n}));
  std::vector<float> wd(static_cast<size_t>(n * k));
  dequantize_mxfp4_weight_rows(w, s, {n, k}, 0, n, wd);
  std::vector<float> ref(y.size());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t kk = 0; kk < k; ++kk) acc += static_cast<double>(x[i * k + kk]) * wd[j * k + kk];
      ref[i * n + j] = static_cast<float>(acc);
    }
  EXPECT_LE(rel_err(y, ref), 1e-6);
}

TEST(QuantOpsCpu, RouterTiesGoToTheLowestExpert) {
  const int64_t h = 8, e = 6;
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<float> w(static_cast<size_t>(e * h), 0.01f);
  std::vector<float> bias(static_cast<size_t>(e), 0.0f);
  bias[4] = bias[1] = 0.5f;  // experts 1 and 4 tie on top, then 0, 2, 3, 5 tie
  std::vector<int32_t> ids(2);
  std::vector<float> wts(2);
  cpu::moe_router(host_view(x, DType::kF32, {1, h}), host_view(w, DType::kF32, {e, h}),
                  host_view(bias, DType::kF32, {e}), {2, 1.0f, 1.5f},
                  host_view(ids, DType::kI32, {1, 2}), host_view(wts, DType::kF32, {1, 2}));
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 4}));
  EXPECT_FLOAT_EQ(wts[0], 0.75f);
}

#ifdef MOESERVE_HAVE_CUDA

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA device visible: the CUDA op tests need a GPU";
    backend_ = make_cuda_backend(0);
    stream_ = cuda_backend_stream(*backend_);
  }

  // A device copy of host bytes.
  template <typename T>
  std::unique_ptr<DeviceBuffer> upload(const std::vector<T>& host) {
    auto buf = backend_->allocate(DType::kU8, {static_cast<int64_t>(host.size() * sizeof(T))});
    std::vector<T> copy = host;
    backend_->copy_from_host(
        buf->view(),
        TensorView(copy.data(), DType::kU8, {static_cast<int64_t>(host.size() * sizeof(T))}));
    return buf;
  }
  template <typename T>
  std::vector<T> download(const DeviceBuffer& buf) {
    std::vector<T> host(static_cast<size_t>(buf.view().nbytes() / sizeof(T)));
    backend_->copy_to_host(
        TensorView(host.data(), DType::kU8, {static_cast<int64_t>(buf.view().nbytes())}),
        buf.view());
    backend_->synchronize();
    return host;
  }
  std::unique_ptr<DeviceBuffer> poisoned_floats(int64_t n) {
    return upload(
        std::vector<float>(static_cast<size_t>(n), std::numeric_limits<float>::quiet_NaN()));
  }

  std::unique_ptr<Backend> backend_;
  void* stream_ = nullptr;
};

class CudaGemm : public CudaOps, public ::testing::WithParamInterface<GemmCase> {};

// bf16 activations: the GPU multiplies exactly the CPU's operands (weights are exact in bf16), so
// only the fp32 accumulation order differs: 1e-4. fp32 activations are rounded to bf16 on the GPU:
// 1e-2 (bf16-operand error, METHOD.md).
double gemm_tolerance(const GemmCase& c) { return c.bf16_x ? 1e-4 : 1e-2; }

TEST_P(CudaGemm, Fp8BlockScaledMatchesCpu) {
  const GemmCase c = GetParam();
  for (uint32_t seed : {1u, 2u}) {
    std::mt19937 rng(seed);
    const Activations x = make_activations(c, rng);
    const auto w = random_e4m3(c.n * c.k, rng);
    const auto s = random_bytes((c.n + 31) / 32 * (c.k / 32), rng, 118, 134);
    std::vector<float> ref(static_cast<size_t>(c.m * c.n));
    std::vector<float> xf = x.f32;
    std::vector<uint8_t> wc = w, sc = s;
    cpu::fp8_block_gemm(host_view(xf, DType::kF32, {c.m, c.k}),
                        host_view(wc, DType::kF8E4M3, {c.n, c.k}),
                        host_view(sc, DType::kF8E8M0, {(c.n + 31) / 32, c.k / 32}),
                        host_view(ref, DType::kF32, {c.m, c.n}));
    auto dx = c.bf16_x ? upload(x.bf16) : upload(x.f32);
    auto dw = upload(w);
    auto ds = upload(s);
    auto dy = poisoned_floats(c.m * c.n);
    cuda::launch_fp8_block_gemm(
        {dx->view().data(), c.bf16_x ? cuda::ActivationType::kBF16 : cuda::ActivationType::kF32,
         c.k, dw->view().data_as<uint8_t>(), ds->view().data_as<uint8_t>(),
         dy->view().data_as<float>(), c.n, c.m, c.n, c.k},
        stream_);
    EXPECT_LE(rel_err(download<float>(*dy), ref), gemm_tolerance(c)) << "seed " << seed;
  }
}

TEST_P(CudaGemm, Mxfp4MatchesCpu) {
  const GemmCase c = GetParam();
  for (uint32_t seed : {3u, 4u}) {
    std::mt19937 rng(seed);
    const Activations x = make_activations(c, rng);
    const auto w = random_bytes(c.n * c.k / 2, rng, 0, 255);
    const auto s = random_bytes(c.n * c.k / 32, rng, 118, 134);
    std::vector<float> ref(static_cast<size_t>(c.m * c.n));
    std::vector<float> xf = x.f32;
    std::vector<uint8_t> wc = w, sc = s;
    cpu::mxfp4_gemm(
        host_view(xf, DType::kF32, {c.m, c.k}), host_view(wc, DType::kFp4E2m1, {c.n, c.k}),
        host_view(sc, DType::kF8E8M0, {c.n, c.k / 32}), host_view(ref, DType::kF32, {c.m, c.n}));
    auto dx = c.bf16_x ? upload(x.bf16) : upload(x.f32);
    auto dw = upload(w);
    auto ds = upload(s);
    auto dy = poisoned_floats(c.m * c.n);
    cuda::launch_mxfp4_gemm(
        {dx->view().data(), c.bf16_x ? cuda::ActivationType::kBF16 : cuda::ActivationType::kF32,
         c.k, dw->view().data_as<uint8_t>(), ds->view().data_as<uint8_t>(),
         dy->view().data_as<float>(), c.n, c.m, c.n, c.k},
        stream_);
    EXPECT_LE(rel_err(download<float>(*dy), ref), gemm_tolerance(c)) << "seed " << seed;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaGemm, ::testing::ValuesIn(kGemmCases), gemm_name);

// ---- FP8 x FP8 wgmma GEMM (launch_fp8_wgmma_gemm) ------------------------------------------

// MXFP8 activations by the host rule (quantize_fp8_block32_pow2): every 32-block of a row gets its
// own magnitude (u * 2^e, e in [-4, 4]) so the per-block scales differ; `values` are the
// fake-quant values (e4m3 * 2^(scale - 127)), the CPU reference's fp32 input.
struct Mxfp8Rows {
  std::vector<uint8_t> codes, scales;
  std::vector<float> values;
};

Mxfp8Rows make_mxfp8_rows(int64_t m, int64_t k, std::mt19937& rng) {
  auto x = random_floats(m * k, rng, -1.0f, 1.0f);
  std::uniform_int_distribution<int> e(-4, 4);
  for (int64_t b = 0; b < m * k / 32; ++b) {
    const float f = std::ldexp(1.0f, e(rng));
    for (int64_t i = 0; i < 32; ++i) x[static_cast<size_t>(b * 32 + i)] *= f;
  }
  Mxfp8Rows a;
  a.codes.resize(x.size());
  a.scales.resize(x.size() / 32);
  a.values.resize(x.size());
  quantize_fp8_block32_pow2(x, a.codes, a.scales);
  dequantize_fp8_block32_pow2(a.codes, a.scales, a.values);
  return a;
}

struct WgmmaCase {
  int64_t m, n, k;
};

class CudaFp8Wgmma : public CudaOps, public ::testing::WithParamInterface<WgmmaCase> {
 protected:
  // y = A · W^T on the GPU (A codes [m, k] + scales [m, k/32], W [n, k] + scales [n/32, k/32]);
  // split_k 0 = the launcher's choice.
  std::vector<float> run_gemm(const WgmmaCase& c, const Mxfp8Rows& a, const std::vector<uint8_t>& w,
                              const std::vector<uint8_t>& ws, int split_k) {
    auto da = upload(a.codes);
    auto das = upload(a.scales);
    auto dw = upload(w);
    auto dws = upload(ws);
    auto dy = poisoned_floats(c.m * c.n);
    cuda::Fp8WgmmaGemmParams g;
    g.a = da->view().data_as<uint8_t>();
    g.lda = c.k;
    g.a_scale = das->view().data_as<uint8_t>();
    g.lda_scale = c.k / 32;
    g.w = dw->view().data_as<uint8_t>();
    g.w_scale = dws->view().data_as<uint8_t>();
    g.y = dy->view().data_as<float>();
    g.ldy = c.n;
    g.m = c.m;
    g.n = c.n;
    g.k = c.k;
    g.split_k = split_k;
    cuda::launch_fp8_wgmma_gemm(g, stream_);
    return download<float>(*dy);
  }
  std::vector<float> cpu_gemm(const WgmmaCase& c, Mxfp8Rows& a, std::vector<uint8_t>& w,
                              std::vector<uint8_t>& ws) {
    std::vector<float> ref(static_cast<size_t>(c.m * c.n));
    cpu::fp8_block_gemm(host_view(a.values, DType::kF32, {c.m, c.k}),
                        host_view(w, DType::kF8E4M3, {c.n, c.k}),
                        host_view(ws, DType::kF8E8M0, {c.n / 32, c.k / 32}),
                        host_view(ref, DType::kF32, {c.m, c.n}));
    return ref;
  }
};

// Random operands (weights over 16 binades with subnormals, activation blocks over 9) against the
// CPU's double reference. The products are exact; each k32 partial is summed in the tensor core
// with ~14 significant bits (truncated), a relative error of ~2^-13 of the block's largest
// product, and promoted / summed over K in fp32. Estimated max|err| / max|ref| ~ 3e-4 at these
// distributions (K = 5120); tolerance 2e-3. The measured value is printed for calibration. Both
// the launcher's K split and none (split_k 1).
TEST_P(CudaFp8Wgmma, MatchesCpu) {
  const WgmmaCase c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.m * 7 + c.n + c.k));
  Mxfp8Rows a = make_mxfp8_rows(c.m, c.k, rng);
  auto w = random_e4m3(c.n * c.k, rng);
  auto ws = random_bytes(c.n / 32 * (c.k / 32), rng, 118, 134);
  const std::vector<float> ref = cpu_gemm(c, a, w, ws);
  for (int split_k : {0, 1}) {
    const double err = rel_err(run_gemm(c, a, w, ws, split_k), ref);
    std::printf("  fp8 wgmma %ldx%ldx%ld split_k %d: max|err| / max|ref| = %.3g\n",
                static_cast<long>(c.m), static_cast<long>(c.n), static_cast<long>(c.k), split_k,
                err);
    EXPECT_LE(err, 2e-3) << "split_k " << split_k;
  }
}

// Operands whose k32 partials are exact in the tensor core (values in {1, 1.5, 2, 3, 4} with
// random signs: products on a 1/4 grid up to 16, partials up to 528, 12 significant bits) and whose
// scale products (2^-2 .. 2^2) keep the fp32 sum over K exact (a 2^-4 grid below 2^20): the
// result equals the reference bit for bit, so any layout, swizzle or scale-indexing slip shows,
// whatever the K split (the sum is exact in any order): automatic, none, 3 and 8 ranks.
TEST_P(CudaFp8Wgmma, ExactOnSmallValues) {
  const WgmmaCase c = GetParam();
  if (c.m * c.n * c.k > (int64_t{1} << 33)) GTEST_SKIP() << "the random case covers this shape";
  std::mt19937 rng(static_cast<uint32_t>(c.m + c.n * 3 + c.k));
  const float vals[] = {1.0f, 1.5f, 2.0f, 3.0f, 4.0f};
  std::uniform_int_distribution<int> pick(0, 9);
  const auto small_codes = [&](int64_t n) {
    std::vector<uint8_t> codes(static_cast<size_t>(n));
    for (auto& code : codes) {
      const int v = pick(rng);
      code = float_to_e4m3(v >= 5 ? -vals[v - 5] : vals[v]);
    }
    return codes;
  };
  Mxfp8Rows a;
  a.codes = small_codes(c.m * c.k);
  a.scales = random_bytes(c.m * c.k / 32, rng, 126, 128);
  a.values.resize(a.codes.size());
  dequantize_fp8_block32_pow2(a.codes, a.scales, a.values);
  auto w = small_codes(c.n * c.k);
  auto ws = random_bytes(c.n / 32 * (c.k / 32), rng, 126, 128);
  const std::vector<float> ref = cpu_gemm(c, a, w, ws);
  for (int split_k : {0, 1, 3, 8}) {
    const std::vector<float> got = run_gemm(c, a, w, ws, split_k);
    size_t diff = 0;
    for (size_t i = 0; i < ref.size(); ++i) diff += got[i] != ref[i];
    EXPECT_EQ(diff, 0u) << "split_k " << split_k << "; element 0: got " << got[0] << " ref "
                        << ref[0];
  }
}

// Pitched operands (lda > K, lda_scale > K/32, ldy > N) with the exact small values: the padding
// is never read (filled with NaN codes / scale 255) and never written (NaN poison stays).
TEST_F(CudaOps, Fp8WgmmaGemmPitchedOperands) {
  const int64_t m = 70, n = 256, k = 384, lda = k + 16, lds = k / 32 + 4, ldy = n + 2;
  std::mt19937 rng(77);
  const auto codes = [&](int64_t count) {
    std::uniform_int_distribution<int> pick(-4, 4);
    std::vector<uint8_t> c(static_cast<size_t>(count));
    for (auto& v : c) {
      int q = 0;
      while (q == 0) q = pick(rng);
      v = float_to_e4m3(static_cast<float>(q));
    }
    return c;
  };
  std::vector<uint8_t> a = codes(m * k), as = random_bytes(m * k / 32, rng, 126, 128);
  std::vector<uint8_t> w = codes(n * k), ws = random_bytes(n / 32 * (k / 32), rng, 126, 128);
  std::vector<float> av(a.size());
  dequantize_fp8_block32_pow2(a, as, av);
  std::vector<float> ref(static_cast<size_t>(m * n));
  cpu::fp8_block_gemm(host_view(av, DType::kF32, {m, k}), host_view(w, DType::kF8E4M3, {n, k}),
                      host_view(ws, DType::kF8E8M0, {n / 32, k / 32}),
                      host_view(ref, DType::kF32, {m, n}));
  std::vector<uint8_t> a_pitched(static_cast<size_t>(m * lda), 0x7F);   // NaN codes
  std::vector<uint8_t> as_pitched(static_cast<size_t>(m * lds), 0xFF);  // NaN scales
  for (int64_t r = 0; r < m; ++r) {
    std::copy_n(a.begin() + r * k, k, a_pitched.begin() + r * lda);
    std::copy_n(as.begin() + r * (k / 32), k / 32, as_pitched.begin() + r * lds);
  }
  auto da = upload(a_pitched);
  auto das = upload(as_pitched);
  auto dw = upload(w);
  auto dws = upload(ws);
  auto dy = poisoned_floats(m * ldy);
  cuda::Fp8WgmmaGemmParams g;
  g.a = da->view().data_as<uint8_t>();
  g.lda = lda;
  g.a_scale = das->view().data_as<uint8_t>();
  g.lda_scale = lds;
  g.w = dw->view().data_as<uint8_t>();
  g.w_scale = dws->view().data_as<uint8_t>();
  g.y = dy->view().data_as<float>();
  g.ldy = ldy;
  g.m = m;
  g.n = n;
  g.k = k;
  cuda::launch_fp8_wgmma_gemm(g, stream_);
  const auto got = download<float>(*dy);
  size_t diff = 0, pad_written = 0;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < n; ++c)
      diff += got[static_cast<size_t>(r * ldy + c)] != ref[static_cast<size_t>(r * n + c)];
    for (int64_t c = n; c < ldy; ++c)
      pad_written += !std::isnan(got[static_cast<size_t>(r * ldy + c)]);
  }
  EXPECT_EQ(diff, 0u);
  EXPECT_EQ(pad_written, 0u);
}

// Rows 1, 7, 64 (one warpgroup, BM = 64), 384 and 1000 (two, BM = 128; 1000 leaves a partial
// tile) on the model's dense projections: wq_a-like 1280x5120 and 512x5120, wq_b 32768x1280,
// wo_b 5120x8192, shared expert 2304x5120. 1000 rows only on the smaller weights (the CPU
// reference is a double loop).
std::vector<WgmmaCase> wgmma_cases() {
  std::vector<WgmmaCase> cases;
  const WgmmaCase shapes[] = {
      {0, 1280, 5120}, {0, 512, 5120}, {0, 32768, 1280}, {0, 5120, 8192}, {0, 2304, 5120}};
  for (int64_t m : {1, 7, 64, 384, 1000}) {
    for (WgmmaCase s : shapes) {
      if (m == 1000 && s.n * s.k > 20'000'000) continue;
      s.m = m;
      cases.push_back(s);
    }
  }
  cases.push_back({130, 256, 128});  // one K tile (no split possible), a partial second M tile
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaFp8Wgmma, ::testing::ValuesIn(wgmma_cases()),
                         [](const auto& info) {
                           return std::to_string(info.param.m) + "x" +
                                  std::to_string(info.param.n) + "x" + std::to_string(info.param.k);
                         });

// Shapes outside the kernel's limits abort as bad arguments (N % 128, K % 128).
TEST_F(CudaOps, Fp8WgmmaGemmRejectsBadShapes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  cuda::Fp8WgmmaGemmParams g;
  g.m = 4;
  g.n = 96;
  g.k = 128;
  g.lda = 128;
  g.lda_scale = 4;
  g.ldy = 96;
  EXPECT_DEATH(cuda::launch_fp8_wgmma_gemm(g, stream_), "bad arguments");
}

// ---- Row-scaled FP8 (kernels.h "Row-scaled FP8") --------------------------------------------

// The host oracle of the refold, from its definition: the code's value times 2^d (d = block scale
// code - the row's largest, <= 0), rounded to e4m3 (saturating, to nearest even).
uint8_t refold_code(uint8_t code, int d) {
  return float_to_e4m3(std::ldexp(e4m3_to_float(code), std::max(d, -40)));
}

// The row-scaled FP8 operand of fp32 x [rows, k] (pitch k) on the device: codes [rows, k] and row
// scales [rows] (launch_act_quant_fp8_rows; kperm_fp8 as asked).
struct DeviceRowScaled {
  std::unique_ptr<DeviceBuffer> codes, scale;
};
class CudaFp8Rows : public CudaOps {
 protected:
  DeviceRowScaled quantise_rows(const DeviceBuffer& x, int64_t rows, int64_t k, bool kperm = false) {
    DeviceRowScaled d{upload(std::vector<uint8_t>(static_cast<size_t>(rows * k))),
                      poisoned_floats(rows)};
    cuda::ActQuantFp8RowsParams q;
    q.x = x.view().data();
    q.ldx = k;
    q.rows = rows;
    q.cols = k;
    q.out = d.codes->view().data_as<uint8_t>();
    q.ldo = k;
    q.row_scale = d.scale->view().data_as<float>();
    q.kperm_fp8 = kperm;
    cuda::launch_act_quant_fp8_rows(q, stream_);
    return d;
  }
};

// Activations whose 32-wide blocks spread over 17 binades (2^-12 .. 2^4 times U(-1, 1)), so rows
// hold blocks 0, 1..9 (exact), 10..17 (rounded to the subnormal step) and more binades (zeros)
// below their largest.
std::vector<float> spread_rows(int64_t m, int64_t k, std::mt19937& rng) {
  auto x = random_floats(m * k, rng, -1.0f, 1.0f);
  std::uniform_int_distribution<int> e(-12, 4);
  for (int64_t b = 0; b < m * k / 32; ++b) {
    const float f = std::ldexp(1.0f, e(rng));
    for (int64_t i = 0; i < 32; ++i) x[static_cast<size_t>(b * 32 + i)] *= f;
  }
  return x;
}

// The host's row-scaled operand of x [m, k] from the definition (kernels.h): the MXFP8 values
// of each row (common/fake_quant.h), R = the largest scale code of the MXFP8 rule applied to those
// values again, each value rounded to e4m3 in units of 2^(R - 127).
struct RowScaled {
  std::vector<uint8_t> codes;
  std::vector<float> row_scale;
};
RowScaled host_row_scaled(const std::vector<float>& x, int64_t m, int64_t k) {
  RowScaled r;
  r.codes.resize(static_cast<size_t>(m * k));
  r.row_scale.resize(static_cast<size_t>(m));
  std::vector<uint8_t> scales(static_cast<size_t>(k / 32)), again(static_cast<size_t>(k));
  std::vector<float> vals(static_cast<size_t>(k));
  for (int64_t i = 0; i < m; ++i) {
    const std::span<uint8_t> codes(r.codes.data() + i * k, static_cast<size_t>(k));
    fq_fp8_block32_pow2(std::span<const float>(x.data() + i * k, static_cast<size_t>(k)), vals);
    quantize_fp8_block32_pow2(vals, again, scales);
    const uint8_t top = *std::max_element(scales.begin(), scales.end());
    for (int64_t c = 0; c < k; ++c)
      codes[static_cast<size_t>(c)] =
          float_to_e4m3(std::ldexp(vals[static_cast<size_t>(c)], 127 - static_cast<int>(top)));
    r.row_scale[static_cast<size_t>(i)] = ue8m0_to_float(top);
  }
  return r;
}

// launch_act_quant_fp8_rows against the host oracle, bit for bit (codes and row scales), from
// fp32, from bf16, and from fp32 with input scales (in_row_scale / in_col_scale, powers of two:
// the host scales first, in the kernel's order), at widths of 1, 2 and 4 chunks per thread, with
// pitched input and output rows whose padding stays untouched; the warp-per-row kernel
// (warp_per_row) at 4, 12 (9 live) and 24 (21 live) chunks per lane; and the CTA form held at 4
// chunks per thread (min_chunks_per_thread; 1024 columns: 32 threads, 2304: 96 threads with dead
// chunks, 5216). A count other than 0, 1, 2, 4, 8 is refused.
TEST_F(CudaOps, ActQuantFp8RowsMatchesHostRefold) {
  for (const int form : {0, 1, 2})  // CTA per row, warp per row, CTA at >= 4 chunks per thread
  for (const int variant : {0, 1, 2}) {
    const bool warp = form == 1;
    const std::vector<int64_t> widths =
        form > 0 ? std::vector<int64_t>{1024, 2304, 5216} : std::vector<int64_t>{5216, 12320, 32768};
    for (const int64_t k : widths) {
      SCOPED_TRACE(form == 1 ? "warp per row" : form == 2 ? "CTA, 4 chunks per thread" : "CTA per row");
      const bool bf16 = variant == 1, prescale = variant == 2;
      const int64_t m = 37, ldx = k + 8, ldo = k + 16;
      std::mt19937 rng(static_cast<uint32_t>(11 + variant * 7 + k));
      std::vector<float> x = spread_rows(m, k, rng);
      std::vector<uint16_t> xb(x.size());
      if (bf16) {
        float_to_bf16(x, xb);
        bf16_to_float(xb, x);  // the host sees the GPU's input values
      }
      std::vector<float> rs, cs;
      std::vector<float> xs = x;
      if (prescale) {
        std::uniform_int_distribution<int> e(-3, 3);
        for (int64_t r = 0; r < m; ++r) rs.push_back(std::ldexp(1.0f, e(rng)));
        for (int64_t c = 0; c < k; ++c) cs.push_back(std::ldexp(1.0f, e(rng)));
        for (int64_t r = 0; r < m; ++r)
          for (int64_t c = 0; c < k; ++c)
            xs[static_cast<size_t>(r * k + c)] *= rs[static_cast<size_t>(r)] * cs[static_cast<size_t>(c)];
      }
      const RowScaled want = host_row_scaled(xs, m, k);
      std::unique_ptr<DeviceBuffer> dx;
      if (bf16) {
        std::vector<uint16_t> pitched(static_cast<size_t>(m * ldx), 0x7FC0);  // NaN padding
        for (int64_t r = 0; r < m; ++r) std::copy_n(xb.begin() + r * k, k, pitched.begin() + r * ldx);
        dx = upload(pitched);
      } else {
        std::vector<float> pitched(static_cast<size_t>(m * ldx), std::nanf(""));
        for (int64_t r = 0; r < m; ++r) std::copy_n(x.begin() + r * k, k, pitched.begin() + r * ldx);
        dx = upload(pitched);
      }
      auto dout = upload(std::vector<uint8_t>(static_cast<size_t>(m * ldo), 0xA5));
      auto drs = poisoned_floats(m);
      std::unique_ptr<DeviceBuffer> drs_in, dcs_in;
      cuda::ActQuantFp8RowsParams p;
      p.x = dx->view().data();
      p.x_type = bf16 ? cuda::ActivationType::kBF16 : cuda::ActivationType::kF32;
      p.ldx = ldx;
      p.rows = m;
      p.cols = k;
      p.out = dout->view().data_as<uint8_t>();
      p.ldo = ldo;
      p.row_scale = drs->view().data_as<float>();
      if (prescale) {
        drs_in = upload(rs);
        dcs_in = upload(cs);
        p.in_row_scale = drs_in->view().data_as<float>();
        p.in_col_scale = dcs_in->view().data_as<float>();
      }
      p.warp_per_row = warp;
      p.min_chunks_per_thread = form == 2 ? 4 : 0;
      cuda::launch_act_quant_fp8_rows(p, stream_);
      const auto got = download<uint8_t>(*dout);
      const auto got_rs = download<float>(*drs);
      size_t diff = 0, pad = 0, rounded = 0, scale_diff = 0;
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t c = 0; c < k; ++c)
          diff += got[static_cast<size_t>(r * ldo + c)] != want.codes[static_cast<size_t>(r * k + c)];
        for (int64_t c = k; c < ldo; ++c) pad += got[static_cast<size_t>(r * ldo + c)] != 0xA5;
        scale_diff += got_rs[static_cast<size_t>(r)] != want.row_scale[static_cast<size_t>(r)];
      }
      // The oracle's refold changed some values (the case exercises the rounding, not only
      // shifts).
      std::vector<uint8_t> plain(static_cast<size_t>(k)), sc(static_cast<size_t>(k / 32));
      std::vector<float> vals(static_cast<size_t>(k));
      quantize_fp8_block32_pow2(std::span<const float>(xs.data(), static_cast<size_t>(k)), plain, sc);
      dequantize_fp8_block32_pow2(plain, sc, vals);
      for (int64_t c = 0; c < k; ++c)
        rounded += e4m3_to_float(want.codes[static_cast<size_t>(c)]) * want.row_scale[0] !=
                   vals[static_cast<size_t>(c)];
      EXPECT_EQ(diff, 0u) << "variant " << variant << " k " << k;
      EXPECT_EQ(scale_diff, 0u) << "variant " << variant << " k " << k;
      EXPECT_EQ(pad, 0u) << "variant " << variant << " k " << k;
      EXPECT_GT(rounded, 0u) << "variant " << variant << " k " << k;
      if (form == 2 && variant == 0 && k == 1024) {
        GTEST_FLAG_SET(death_test_style, "threadsafe");
        p.min_chunks_per_thread = 3;
        EXPECT_DEATH(cuda::launch_act_quant_fp8_rows(p, stream_), "bad arguments");
      }
    }
  }
}

// The MoE forms of launch_act_quant_fp8_rows: output row r reads x's row row_index[r], the row
// count comes from the device (rows past it stay untouched), and kperm_fp8 stores each 64-wide
// block's codes K-permuted (column 32 s + 16 j + 4 t + e holds k = 16 t + 8 s + 4 j + e). Bit for
// bit the host oracle's codes of the gathered rows, permuted; the same row scales. With a CTA and
// with a warp per row.
TEST_F(CudaOps, ActQuantFp8RowsGathersAndPermutes) {
  for (const bool warp : {false, true}) {
  SCOPED_TRACE(warp ? "warp per row" : "CTA per row");
  const int64_t src_rows = 29, m = 24, live = 19, k = 2304;
  std::mt19937 rng(41);
  const std::vector<float> x = spread_rows(src_rows, k, rng);
  std::vector<int32_t> idx(static_cast<size_t>(m));
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(src_rows - 1));
  for (auto& i : idx) i = pick(rng);
  const RowScaled all = host_row_scaled(x, src_rows, k);
  auto dx = upload(x);
  auto didx = upload(idx);
  auto dlive = upload(std::vector<int32_t>{static_cast<int32_t>(live)});
  auto dout = upload(std::vector<uint8_t>(static_cast<size_t>(m * k), 0xA5));
  auto drs = poisoned_floats(m);
  cuda::ActQuantFp8RowsParams p;
  p.x = dx->view().data();
  p.ldx = k;
  p.rows = m;
  p.cols = k;
  p.out = dout->view().data_as<uint8_t>();
  p.ldo = k;
  p.row_scale = drs->view().data_as<float>();
  p.row_index = didx->view().data_as<int32_t>();
  p.device_rows = dlive->view().data_as<int32_t>();
  p.kperm_fp8 = true;
  p.warp_per_row = warp;
  cuda::launch_act_quant_fp8_rows(p, stream_);
  const auto got = download<uint8_t>(*dout);
  const auto got_rs = download<float>(*drs);
  size_t diff = 0, untouched = 0;
  for (int64_t r = 0; r < m; ++r) {
    const int64_t src = idx[static_cast<size_t>(r)];
    for (int64_t c = 0; c < k; ++c) {
      const int64_t cc = c & 63, blk = c - cc;
      const int64_t s = cc >> 5, j = (cc >> 4) & 1, t = (cc >> 2) & 3, e = cc & 3;
      const uint8_t g = got[static_cast<size_t>(r * k + c)];
      if (r >= live) {
        untouched += g == 0xA5;
        continue;
      }
      diff += g != all.codes[static_cast<size_t>(src * k + blk + 16 * t + 8 * s + 4 * j + e)];
    }
    if (r < live) {
      EXPECT_EQ(got_rs[static_cast<size_t>(r)], all.row_scale[static_cast<size_t>(src)]) << r;
    } else {
      EXPECT_TRUE(std::isnan(got_rs[static_cast<size_t>(r)])) << r;
    }
  }
  EXPECT_EQ(diff, 0u);
  EXPECT_EQ(untouched, static_cast<size_t>((m - live) * k));
  }
}

// launch_fold_fp8_block_rows against the host oracle, bit for bit: 32x32-block scales over 41
// binades (so some blocks refold to zeros), a partial last 32-row block.
TEST_F(CudaOps, FoldFp8BlockRowsMatchesHostRefold) {
  const int64_t n = 80, k = 640;
  std::mt19937 rng(21);
  const auto w = random_e4m3(n * k, rng);
  const auto ws = random_bytes((n + 31) / 32 * (k / 32), rng, 100, 140);
  std::vector<uint8_t> want(w.size());
  std::vector<float> want_rs(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    const auto* s = ws.data() + (r / 32) * (k / 32);
    const uint8_t top = *std::max_element(s, s + k / 32);
    for (int64_t c = 0; c < k; ++c)
      want[static_cast<size_t>(r * k + c)] = refold_code(w[static_cast<size_t>(r * k + c)], s[c / 32] - top);
    want_rs[static_cast<size_t>(r)] = ue8m0_to_float(top);
  }
  auto dw = upload(w);
  auto dws = upload(ws);
  auto dout = upload(std::vector<uint8_t>(w.size(), 0xA5));
  auto drs = poisoned_floats(n);
  cuda::launch_fold_fp8_block_rows(dw->view().data_as<uint8_t>(), dws->view().data_as<uint8_t>(), n,
                                   k, dout->view().data_as<uint8_t>(), drs->view().data_as<float>(),
                                   stream_);
  EXPECT_EQ(download<uint8_t>(*dout), want);
  EXPECT_EQ(download<float>(*drs), want_rs);
}

// launch_grouped_fp8_gemm (the FP8 grouped MXFP4 GEMM) on 3 experts of 0, 77 and 200 grouped rows
// (200: a full 192-row pass and one of 8): the activations through launch_act_quant_fp8_rows
// (kperm_fp8), the weights' references through launch_mxfp4_row_ref (block scales over 17
// binades: some blocks take the rounded decode), against the CPU's double product of the MXFP8
// activation values and the MXFP4 weights. FP8 tensor-core sums and the refolds: tolerance 2e-3
// of max|ref| (printed). Columns past n (ldy > n) stay untouched. Written without a device run
// (r13).
TEST_F(CudaFp8Rows, GroupedGemmMatchesCpu) {
  const int64_t n = 256, k = 384, ldy = n + 4;  // 3 K tiles: a pair and the odd last one
  const std::vector<int32_t> offsets = {0, 0, 77, 277};
  const int experts = 3;
  const int64_t rows = offsets.back();
  std::mt19937 rng(51);
  const std::vector<float> x = spread_rows(rows, k, rng);
  std::vector<float> xq(x.size());
  fq_fp8_block32_pow2(x, xq);
  std::vector<std::vector<uint8_t>> w(experts), ws(experts);
  for (int e = 0; e < experts; ++e) {
    w[e] = random_bytes(n * k / 2, rng, 0, 255);
    ws[e] = random_bytes(n * k / 32, rng, 118, 134);
  }
  std::vector<float> ref(static_cast<size_t>(rows * n));
  for (int e = 0; e < experts; ++e) {
    for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0.0;
        for (int64_t c = 0; c < k; ++c) {
          const uint8_t byte = w[e][static_cast<size_t>(j * k / 2 + c / 2)];
          const double wv = e2m1_to_float(c % 2 == 0 ? byte & 0xF : byte >> 4) *
                            static_cast<double>(ue8m0_to_float(ws[e][static_cast<size_t>(j * k / 32 + c / 32)]));
          acc += wv * xq[static_cast<size_t>(r * k + c)];
        }
        ref[static_cast<size_t>(r * n + j)] = static_cast<float>(acc);
      }
    }
  }
  auto dx = upload(x);
  const DeviceRowScaled dq = quantise_rows(*dx, rows, k, /*kperm=*/true);
  const auto& da = dq.codes;
  const auto& das = dq.scale;
  std::vector<std::unique_ptr<DeviceBuffer>> keep;
  std::vector<const uint8_t*> wp, wsp, refp;
  for (int e = 0; e < experts; ++e) {
    keep.push_back(upload(w[e]));
    wp.push_back(keep.back()->view().data_as<uint8_t>());
    keep.push_back(upload(ws[e]));
    wsp.push_back(keep.back()->view().data_as<uint8_t>());
    keep.push_back(upload(std::vector<uint8_t>(static_cast<size_t>(n))));
    refp.push_back(keep.back()->view().data_as<uint8_t>());
    cuda::launch_mxfp4_row_ref(wsp.back(), n, k, const_cast<uint8_t*>(refp.back()), stream_);
  }
  auto dwp = upload(wp);
  auto dwsp = upload(wsp);
  auto drefp = upload(refp);
  auto doff = upload(offsets);
  auto dy = poisoned_floats(rows * ldy);
  cuda::GroupedFp8GemmParams g;
  g.a = da->view().data_as<uint8_t>();
  g.lda = k;
  g.a_scale = das->view().data_as<float>();
  g.offsets = doff->view().data_as<int32_t>();
  g.num_experts = experts;
  g.max_rows = 200;
  g.w = reinterpret_cast<const uint8_t* const*>(dwp->view().data());
  g.w_scale = reinterpret_cast<const uint8_t* const*>(dwsp->view().data());
  g.w_ref = reinterpret_cast<const uint8_t* const*>(drefp->view().data());
  g.y = dy->view().data_as<float>();
  g.ldy = ldy;
  g.n = n;
  g.k = k;
  cuda::launch_grouped_fp8_gemm(g, stream_);
  const auto got = download<float>(*dy);
  std::vector<float> packed(ref.size());
  size_t pad_written = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j)
      packed[static_cast<size_t>(r * n + j)] = got[static_cast<size_t>(r * ldy + j)];
    for (int64_t j = n; j < ldy; ++j) pad_written += !std::isnan(got[static_cast<size_t>(r * ldy + j)]);
  }
  const double err = rel_err(packed, ref);
  std::printf("  grouped fp8 gemm 3 experts (0 / 77 / 200 rows) x %ldx%ld: max|err| / max|ref| %.3g\n",
              static_cast<long>(n), static_cast<long>(k), err);
  EXPECT_LE(err, 2e-3);
  EXPECT_EQ(pad_written, 0u);
  // Bad shapes abort as bad arguments (k % 128).
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  g.k = 480;
  g.lda = 480;
  EXPECT_DEATH(cuda::launch_grouped_fp8_gemm(g, stream_), "bad arguments");
}

// launch_fold_mxfp4_rows (the padded FP8 experts' weights) against its definition, bit for bit:
// code = e4m3(e2m1 * 2^(max(s_b - R + 6, -40))), row_scale = 2^(R - 133), with block scales over
// 41 binades (so blocks below R - 14 take the rounded codes, and some round to zero). Then the
// exactness claim: every block with s_b >= R - 14 decodes (code * row_scale) to its MXFP4 value.
TEST_F(CudaOps, FoldMxfp4RowsMatchesDefinition) {
  const int64_t n = 40, k = 320;
  std::mt19937 rng(61);
  const auto w = random_bytes(n * k / 2, rng, 0, 255);
  const auto ws = random_bytes(n * k / 32, rng, 100, 140);
  std::vector<uint8_t> want(static_cast<size_t>(n * k));
  std::vector<float> want_rs(static_cast<size_t>(n));
  int64_t exact_checked = 0, rounded_blocks = 0;
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* s = ws.data() + r * (k / 32);
    const int R = *std::max_element(s, s + k / 32);
    want_rs[static_cast<size_t>(r)] = std::ldexp(1.0f, R - 133);
    for (int64_t c = 0; c < k; ++c) {
      const uint8_t byte = w[static_cast<size_t>(r * k / 2 + c / 2)];
      const float e = e2m1_to_float(c % 2 == 0 ? byte & 0xF : byte >> 4);
      want[static_cast<size_t>(r * k + c)] =
          float_to_e4m3(std::ldexp(e, std::max(static_cast<int>(s[c / 32]) - R + 6, -40)));
    }
    for (int64_t b = 0; b < k / 32; ++b) rounded_blocks += s[b] < R - 14;
  }
  auto dw = upload(w);
  auto dws = upload(ws);
  auto dout = upload(std::vector<uint8_t>(want.size(), 0xA5));
  auto drs = poisoned_floats(n);
  cuda::launch_fold_mxfp4_rows(dw->view().data_as<uint8_t>(), dws->view().data_as<uint8_t>(), n, k,
                               dout->view().data_as<uint8_t>(), drs->view().data_as<float>(),
                               stream_);
  const auto got = download<uint8_t>(*dout);
  const auto got_rs = download<float>(*drs);
  EXPECT_EQ(got, want);
  EXPECT_EQ(got_rs, want_rs);
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* s = ws.data() + r * (k / 32);
    const int R = *std::max_element(s, s + k / 32);
    for (int64_t c = 0; c < k; ++c) {
      if (s[c / 32] < R - 14) continue;
      const uint8_t byte = w[static_cast<size_t>(r * k / 2 + c / 2)];
      const double mx = e2m1_to_float(c % 2 == 0 ? byte & 0xF : byte >> 4) *
                        static_cast<double>(ue8m0_to_float(s[c / 32]));
      const double v = static_cast<double>(e4m3_to_float(got[static_cast<size_t>(r * k + c)])) *
                       got_rs[static_cast<size_t>(r)];
      ASSERT_EQ(v, mx) << "row " << r << " col " << c;
      ++exact_checked;
    }
  }
  std::printf("  fold mxfp4 rows: %ld values exact, %ld of %ld blocks below R - 14\n",
              static_cast<long>(exact_checked), static_cast<long>(rounded_blocks),
              static_cast<long>(n * k / 32));
  EXPECT_GT(rounded_blocks, 0);
  EXPECT_GT(exact_checked, n * k / 4);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(cuda::launch_fold_mxfp4_rows(dw->view().data_as<uint8_t>(),
                                            dws->view().data_as<uint8_t>(), n, 48,
                                            dout->view().data_as<uint8_t>(),
                                            drs->view().data_as<float>(), stream_),
               "bad arguments");
}

// launch_moe_pad_plan against a host oracle from kernels.h's definition: 5 experts of 0, 3, 4, 7
// and 9 grouped hits at C = 4 (empty, partly filled, full, and two overflowing), inv with misses
// (-1); grouped_bound past the count. Every output compared in full (the overflow lists up to
// their total).
TEST_F(CudaOps, MoePadPlanMatchesHost) {
  const int local = 5;
  const int64_t C = 4, hits = 30, bound = 28;
  const std::vector<int32_t> counts = {0, 3, 4, 7, 9};
  std::vector<int32_t> off(local + 1, 0);
  for (int e = 0; e < local; ++e) off[e + 1] = off[e] + counts[e];
  const int32_t total = off[local];
  std::mt19937 rng(71);
  std::vector<int32_t> perm_row(static_cast<size_t>(bound));
  for (auto& v : perm_row) v = static_cast<int32_t>(rng() % 1000);
  const std::vector<float> perm_w = random_floats(bound, rng, 0.1f, 1.0f);
  // inv: every grouped position once, the other hits -1, shuffled.
  std::vector<int32_t> inv(static_cast<size_t>(hits), -1);
  for (int32_t g = 0; g < total; ++g) inv[static_cast<size_t>(g)] = g;
  std::shuffle(inv.begin(), inv.end(), rng);
  // The oracle.
  std::vector<int32_t> ovp(local + 1, 0);
  for (int e = 0; e < local; ++e) ovp[e + 1] = ovp[e] + std::max<int32_t>(counts[e] - C, 0);
  const int32_t ov_total = ovp[local];
  std::vector<int32_t> w_pad_row(static_cast<size_t>(local * C), -1), w_ov_row(static_cast<size_t>(ov_total));
  std::vector<float> w_pad_w(static_cast<size_t>(local * C), 0.0f), w_ov_w(static_cast<size_t>(ov_total));
  std::vector<int32_t> pos_of(static_cast<size_t>(total));
  for (int e = 0; e < local; ++e)
    for (int32_t i = 0; i < counts[e]; ++i) {
      const int32_t g = off[e] + i;
      if (i < C) {
        pos_of[g] = static_cast<int32_t>(e * C + i);
        w_pad_row[static_cast<size_t>(e * C + i)] = perm_row[g];
        w_pad_w[static_cast<size_t>(e * C + i)] = perm_w[g];
      } else {
        const int32_t j = ovp[e] + i - static_cast<int32_t>(C);
        pos_of[g] = static_cast<int32_t>(local * C) + j;
        w_ov_row[j] = perm_row[g];
        w_ov_w[j] = perm_w[g];
      }
    }
  std::vector<int32_t> w_inv(static_cast<size_t>(hits));
  for (int64_t h = 0; h < hits; ++h)
    w_inv[static_cast<size_t>(h)] = inv[static_cast<size_t>(h)] < 0 ? -1 : pos_of[inv[static_cast<size_t>(h)]];
  auto doff = upload(off);
  auto dperm = upload(perm_row);
  auto dpw = upload(perm_w);
  auto dinv = upload(inv);
  auto dpad_row = upload(std::vector<int32_t>(static_cast<size_t>(local * C), 77));
  auto dpad_w = poisoned_floats(local * C);
  auto dpad_inv = upload(std::vector<int32_t>(static_cast<size_t>(hits), 77));
  auto dov_off = upload(std::vector<int32_t>(local + 1, 77));
  auto dov_row = upload(std::vector<int32_t>(static_cast<size_t>(bound), 77));
  auto dov_w = poisoned_floats(bound);
  cuda::MoePadPlanParams p;
  p.offsets = doff->view().data_as<int32_t>();
  p.perm_row = dperm->view().data_as<int32_t>();
  p.perm_weight = dpw->view().data_as<float>();
  p.inv = dinv->view().data_as<int32_t>();
  p.hits = hits;
  p.local = local;
  p.group_rows = C;
  p.grouped_bound = bound;
  p.pad_row = dpad_row->view().data_as<int32_t>();
  p.pad_weight = dpad_w->view().data_as<float>();
  p.pad_inv = dpad_inv->view().data_as<int32_t>();
  p.ov_offsets = dov_off->view().data_as<int32_t>();
  p.ov_row = dov_row->view().data_as<int32_t>();
  p.ov_weight = dov_w->view().data_as<float>();
  cuda::launch_moe_pad_plan(p, stream_);
  EXPECT_EQ(download<int32_t>(*dpad_row), w_pad_row);
  EXPECT_EQ(download<float>(*dpad_w), w_pad_w);
  EXPECT_EQ(download<int32_t>(*dpad_inv), w_inv);
  EXPECT_EQ(download<int32_t>(*dov_off), ovp);
  const auto ov_row = download<int32_t>(*dov_row);
  const auto ov_w = download<float>(*dov_w);
  EXPECT_EQ(std::vector<int32_t>(ov_row.begin(), ov_row.begin() + ov_total), w_ov_row);
  EXPECT_EQ(std::vector<float>(ov_w.begin(), ov_w.begin() + ov_total), w_ov_w);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  p.group_rows = 0;
  EXPECT_DEATH(cuda::launch_moe_pad_plan(p, stream_), "bad arguments");
}

// launch_moe_combine_padded against the host's sums in the kernel's order (y + Σ_j, each slot
// row's value (src * row_scale) * col_scale, each overflow row's as is): 3 experts x C = 4 slot
// rows, 5 overflow rows, 7 tokens x k = 3 hits with misses. Bit for bit, with fp32 and with bf16
// slot rows (src_bf16: the host sums the bf16 values).
TEST_F(CudaOps, MoeCombinePaddedMatchesHost) {
  for (const bool bf16 : {false, true})
  for (const int64_t cols : {int64_t{40}, int64_t{42}}) {  // the float4 kernel, the scalar one
  const int64_t C = 4, slots = 12, ov = 5, rows = 7;
  const int k = 3;
  std::mt19937 rng(81);
  auto src = random_floats(slots * cols, rng, -2.0f, 2.0f);
  std::vector<uint16_t> src_b(src.size());
  float_to_bf16(src, src_b);
  if (bf16) bf16_to_float(src_b, src);
  const auto ovf = random_floats(ov * cols, rng, -2.0f, 2.0f);
  std::vector<float> rs(static_cast<size_t>(slots)), cs(static_cast<size_t>(slots / C * cols));
  for (auto& v : rs) v = std::ldexp(1.0f, static_cast<int>(rng() % 9) - 4);
  for (auto& v : cs) v = std::ldexp(1.0f, static_cast<int>(rng() % 9) - 4);
  std::vector<int32_t> inv(static_cast<size_t>(rows * k));
  for (auto& v : inv) v = static_cast<int32_t>(rng() % (slots + ov + 1)) - 1;  // -1 .. 16
  const auto y0 = random_floats(rows * cols, rng, -1.0f, 1.0f);
  std::vector<float> want = y0;
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t c = 0; c < cols; ++c) {
      float acc = y0[static_cast<size_t>(t * cols + c)];
      for (int j = 0; j < k; ++j) {
        const int64_t r = inv[static_cast<size_t>(t * k + j)];
        if (r < 0) continue;
        acc += r < slots ? src[static_cast<size_t>(r * cols + c)] * rs[static_cast<size_t>(r)] *
                               cs[static_cast<size_t>((r / C) * cols + c)]
                         : ovf[static_cast<size_t>((r - slots) * cols + c)];
      }
      want[static_cast<size_t>(t * cols + c)] = acc;
    }
  auto dsrc = bf16 ? upload(src_b) : upload(src);
  auto dov = upload(ovf);
  auto drs = upload(rs);
  auto dcs = upload(cs);
  auto dinv = upload(inv);
  auto dy = upload(y0);
  cuda::MoeCombinePaddedParams p;
  p.src = dsrc->view().data();
  p.src_bf16 = bf16;
  p.row_scale = drs->view().data_as<float>();
  p.col_scale = dcs->view().data_as<float>();
  p.slot_rows = slots;
  p.group_rows = C;
  p.overflow = dov->view().data_as<float>();
  p.inv = dinv->view().data_as<int32_t>();
  p.rows = rows;
  p.k = k;
  p.cols = cols;
  p.y = dy->view().data_as<float>();
  cuda::launch_moe_combine_padded(p, stream_);
  EXPECT_EQ(download<float>(*dy), want) << "cols " << cols << " bf16 " << bf16;
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  p.k = 17;
  EXPECT_DEATH(cuda::launch_moe_combine_padded(p, stream_), "bad arguments");
  }
}

// launch_swiglu_quant_mxfp8's outer scales (in_row_scale, gate_col_scale / up_col_scale per group
// of group_rows rows) give the same bits as the same launch on inputs the host scaled first (the
// scales are powers of two, so each product is exact in either order): 12 rows in 3 groups, gate
// and up interleaved in one [rows, 2 cols] buffer, routing weights on; the fp32 output (MXFP8
// values). A missing column scale is refused.
TEST_F(CudaOps, SwigluQuantOuterScalesMatchPrescaledInputs) {
  const int64_t rows = 12, cols = 64, G = 4;
  std::mt19937 rng(91);
  const auto gu = random_floats(rows * 2 * cols, rng, -12.0f, 12.0f);
  const auto pw = random_floats(rows, rng, 0.1f, 1.0f);
  std::vector<float> rs(static_cast<size_t>(rows)), cs(static_cast<size_t>(rows / G * 2 * cols));
  for (auto& v : rs) v = std::ldexp(1.0f, static_cast<int>(rng() % 7) - 3);
  for (auto& v : cs) v = std::ldexp(1.0f, static_cast<int>(rng() % 7) - 3);
  std::vector<float> pre = gu;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < 2 * cols; ++c)
      pre[static_cast<size_t>(r * 2 * cols + c)] = gu[static_cast<size_t>(r * 2 * cols + c)] *
                                                    rs[static_cast<size_t>(r)] *
                                                    cs[static_cast<size_t>((r / G) * 2 * cols + c)];
  auto dgu = upload(gu);
  auto dpre = upload(pre);
  auto dpw = upload(pw);
  auto drs = upload(rs);
  auto dcs = upload(cs);
  auto out_a = poisoned_floats(rows * cols);
  auto out_b = poisoned_floats(rows * cols);
  cuda::SwigluQuantParams q;
  q.ld = 2 * cols;
  q.row_weight = dpw->view().data_as<float>();
  q.rows = rows;
  q.cols = cols;
  q.limit = 10.0f;
  q.out_type = cuda::ActivationType::kF32;
  q.ldo = cols;
  cuda::SwigluQuantParams plain = q;
  plain.gate = dpre->view().data_as<float>();
  plain.up = plain.gate + cols;
  plain.out = out_a->view().data();
  cuda::launch_swiglu_quant_mxfp8(plain, stream_);
  q.gate = dgu->view().data_as<float>();
  q.up = q.gate + cols;
  q.out = out_b->view().data();
  q.in_row_scale = drs->view().data_as<float>();
  q.gate_col_scale = dcs->view().data_as<float>();
  q.up_col_scale = q.gate_col_scale + cols;
  q.ld_col_scale = 2 * cols;
  q.group_rows = G;
  cuda::launch_swiglu_quant_mxfp8(q, stream_);
  const auto a = download<float>(*out_a);
  const auto b = download<float>(*out_b);
  EXPECT_EQ(a, b);
  EXPECT_TRUE(std::all_of(a.begin(), a.end(), [](float v) { return std::isfinite(v); }));
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  q.up_col_scale = nullptr;
  EXPECT_DEATH(cuda::launch_swiglu_quant_mxfp8(q, stream_), "bad arguments");
}

// launch_act_quant_fp8_rows with a SwiGLU input (ActQuantFp8RowsParams::swiglu: outer scales,
// clamp, routing weight) gives the codes and row scales of the two launches it replaces:
// launch_swiglu_quant_mxfp8 (fp32 MXFP8 values, the same scales) then launch_act_quant_fp8_rows
// on them. Bit for bit, on 12 rows in 3 groups with gates and ups over [-12, 12] (the clamp at
// 10 taken) and 1024 columns; from fp32 gate / up and from bf16 ones (the two passes then see the
// bf16 values widened); with a CTA per row (one chunk per thread, or at least two:
// min_chunks_per_thread) and a warp per row. A SwiGLU with an input scale is refused.
TEST_F(CudaFp8Rows, SwigluInputMatchesTwoPasses) {
  for (const bool bf16 : {false, true})
  for (const int form : {0, 1, 2}) {  // CTA per row, warp per row, CTA at >= 2 chunks per thread
  const bool warp = form == 1;
  SCOPED_TRACE(bf16 ? "bf16 gate / up" : "fp32 gate / up");
  SCOPED_TRACE(form == 1 ? "warp per row" : form == 2 ? "CTA, 2 chunks per thread" : "CTA per row");
  const int64_t rows = 12, cols = 1024, G = 4;
  std::mt19937 rng(97);
  auto gu = random_floats(rows * 2 * cols, rng, -12.0f, 12.0f);
  std::vector<uint16_t> gu_b(gu.size());
  float_to_bf16(gu, gu_b);
  if (bf16) bf16_to_float(gu_b, gu);
  auto dgu_b = upload(gu_b);
  const auto pw = random_floats(rows, rng, 0.1f, 1.0f);
  std::vector<float> rs(static_cast<size_t>(rows)), cs(static_cast<size_t>(rows / G * 2 * cols));
  for (auto& v : rs) v = std::ldexp(1.0f, static_cast<int>(rng() % 7) - 3);
  for (auto& v : cs) v = std::ldexp(1.0f, static_cast<int>(rng() % 7) - 3);
  auto dgu = upload(gu);
  auto dpw = upload(pw);
  auto drs = upload(rs);
  auto dcs = upload(cs);
  auto h32 = poisoned_floats(rows * cols);
  cuda::SwigluQuantParams sq;
  sq.gate = dgu->view().data_as<float>();
  sq.up = sq.gate + cols;
  sq.ld = 2 * cols;
  sq.row_weight = dpw->view().data_as<float>();
  sq.rows = rows;
  sq.cols = cols;
  sq.limit = 10.0f;
  sq.out = h32->view().data();
  sq.out_type = cuda::ActivationType::kF32;
  sq.ldo = cols;
  sq.in_row_scale = drs->view().data_as<float>();
  sq.gate_col_scale = dcs->view().data_as<float>();
  sq.up_col_scale = sq.gate_col_scale + cols;
  sq.ld_col_scale = 2 * cols;
  sq.group_rows = G;
  cuda::launch_swiglu_quant_mxfp8(sq, stream_);
  const DeviceRowScaled two = quantise_rows(*h32, rows, cols);
  auto codes = upload(std::vector<uint8_t>(static_cast<size_t>(rows * cols), 0xA5));
  auto scale = poisoned_floats(rows);
  cuda::ActQuantFp8RowsParams q;
  q.x = bf16 ? static_cast<const void*>(dgu_b->view().data_as<uint16_t>())
             : static_cast<const void*>(sq.gate);
  q.x_type = bf16 ? cuda::ActivationType::kBF16 : cuda::ActivationType::kF32;
  q.ldx = 2 * cols;
  q.rows = rows;
  q.cols = cols;
  q.out = codes->view().data_as<uint8_t>();
  q.ldo = cols;
  q.row_scale = scale->view().data_as<float>();
  q.swiglu.up = bf16 ? static_cast<const void*>(dgu_b->view().data_as<uint16_t>() + cols)
                     : static_cast<const void*>(sq.up);
  q.swiglu.row_weight = sq.row_weight;
  q.swiglu.limit = sq.limit;
  q.swiglu.row_scale = sq.in_row_scale;
  q.swiglu.gate_col_scale = sq.gate_col_scale;
  q.swiglu.up_col_scale = sq.up_col_scale;
  q.swiglu.ld_col_scale = sq.ld_col_scale;
  q.swiglu.group_rows = G;
  q.warp_per_row = warp;
  q.min_chunks_per_thread = form == 2 ? 2 : 0;
  cuda::launch_act_quant_fp8_rows(q, stream_);
  EXPECT_EQ(download<uint8_t>(*codes), download<uint8_t>(*two.codes));
  EXPECT_EQ(download<float>(*scale), download<float>(*two.scale));
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  q.in_row_scale = sq.in_row_scale;
  q.in_col_scale = sq.gate_col_scale;
  EXPECT_DEATH(cuda::launch_act_quant_fp8_rows(q, stream_), "bad arguments");
  }
}

// SwigluInput::skip_zero_weight (the padded experts' empty slot rows): rows with routing weight 0
// whose gate and up are exact zeros (as the padded GEMMs leave empty slots) give the same codes
// and row scales with and without it; with NaN in those rows' gate and up instead, the skipping
// launch still writes zero codes and the same scales there (the rows are not read), and every
// other row is unchanged. Both forms (CTA and warp per row), fp32 and bf16 inputs. Refused
// without row_weight.
TEST_F(CudaFp8Rows, SwigluInputSkipsZeroWeightRows) {
  const int64_t rows = 12, cols = 1024;
  const std::vector<int64_t> empty = {1, 5, 11};
  for (const bool bf16 : {false, true})
    for (const bool warp : {false, true}) {
      SCOPED_TRACE(std::string(bf16 ? "bf16" : "fp32") + (warp ? ", warp per row" : ", CTA"));
      std::mt19937 rng(98);
      auto gu = random_floats(rows * 2 * cols, rng, -12.0f, 12.0f);
      auto pw = random_floats(rows, rng, 0.1f, 1.0f);
      for (int64_t r : empty) {
        pw[static_cast<size_t>(r)] = 0.0f;
        std::fill_n(gu.begin() + r * 2 * cols, 2 * cols, 0.0f);
      }
      auto gu_nan = gu;
      for (int64_t r : empty)
        std::fill_n(gu_nan.begin() + r * 2 * cols, 2 * cols,
                    std::numeric_limits<float>::quiet_NaN());
      const auto device_input = [&](const std::vector<float>& v) {
        if (!bf16) return upload(v);
        std::vector<uint16_t> b(v.size());
        float_to_bf16(v, b);
        return upload(b);
      };
      auto dgu = device_input(gu), dgu_nan = device_input(gu_nan);
      auto dpw = upload(pw);
      const size_t esize = bf16 ? 2 : 4;
      const auto run = [&](const DeviceBuffer& in, bool skip) {
        auto codes = upload(std::vector<uint8_t>(static_cast<size_t>(rows * cols), 0xA5));
        auto scale = poisoned_floats(rows);
        cuda::ActQuantFp8RowsParams q;
        q.x = in.view().data();
        q.x_type = bf16 ? cuda::ActivationType::kBF16 : cuda::ActivationType::kF32;
        q.ldx = 2 * cols;
        q.rows = rows;
        q.cols = cols;
        q.out = codes->view().data_as<uint8_t>();
        q.ldo = cols;
        q.row_scale = scale->view().data_as<float>();
        q.swiglu.up = static_cast<const uint8_t*>(in.view().data()) + cols * esize;
        q.swiglu.row_weight = dpw->view().data_as<float>();
        q.swiglu.limit = 10.0f;
        q.swiglu.skip_zero_weight = skip;
        q.warp_per_row = warp;
        cuda::launch_act_quant_fp8_rows(q, stream_);
        return std::pair{download<uint8_t>(*codes), download<float>(*scale)};
      };
      const auto plain = run(*dgu, false);
      const auto skipped = run(*dgu, true);
      const auto skipped_nan = run(*dgu_nan, true);
      EXPECT_EQ(skipped.first, plain.first);
      EXPECT_EQ(skipped.second, plain.second);
      EXPECT_EQ(skipped_nan.first, plain.first);
      EXPECT_EQ(skipped_nan.second, plain.second);
      for (int64_t r : empty) {
        for (int64_t c = 0; c < cols; ++c)
          ASSERT_EQ(plain.first[static_cast<size_t>(r * cols + c)], 0) << r;
        EXPECT_TRUE(std::isfinite(plain.second[static_cast<size_t>(r)])) << r;
      }
      size_t nonzero = 0;  // live rows: not an all-zero output
      for (uint8_t v : plain.first) nonzero += v != 0;
      EXPECT_GT(nonzero, static_cast<size_t>(rows * cols / 2));
    }
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto x = upload(std::vector<float>(static_cast<size_t>(2 * 2 * 64), 1.0f));
  auto codes = upload(std::vector<uint8_t>(2 * 64));
  auto scale = poisoned_floats(2);
  cuda::ActQuantFp8RowsParams q;
  q.x = x->view().data();
  q.ldx = 128;
  q.rows = 2;
  q.cols = 64;
  q.out = codes->view().data_as<uint8_t>();
  q.ldo = 64;
  q.row_scale = scale->view().data_as<float>();
  q.swiglu.up = static_cast<const float*>(x->view().data()) + 64;
  q.swiglu.skip_zero_weight = true;  // without row_weight
  EXPECT_DEATH(cuda::launch_act_quant_fp8_rows(q, stream_), "bad arguments");
}

// launch_act_quant_fp8_rows with row_index -1 (an empty slot row of the padded experts) writes a
// row of zero codes; the other rows are the gathered rows' codes and scales, bit for bit.
TEST_F(CudaFp8Rows, EmptyRowIndexGivesZeroRow) {
  const int64_t rows = 3, k = 256;
  std::mt19937 rng(95);
  const auto x = spread_rows(rows, k, rng);
  auto dx = upload(x);
  const DeviceRowScaled plain = quantise_rows(*dx, rows, k);
  auto didx = upload(std::vector<int32_t>{2, -1, 0});
  auto dcodes = upload(std::vector<uint8_t>(static_cast<size_t>(rows * k), 0xA5));
  auto dscale = poisoned_floats(rows);
  cuda::ActQuantFp8RowsParams q;
  q.x = dx->view().data();
  q.ldx = k;
  q.rows = rows;
  q.cols = k;
  q.row_index = didx->view().data_as<int32_t>();
  q.out = dcodes->view().data_as<uint8_t>();
  q.ldo = k;
  q.row_scale = dscale->view().data_as<float>();
  cuda::launch_act_quant_fp8_rows(q, stream_);
  const auto want = download<uint8_t>(*plain.codes);
  const auto want_s = download<float>(*plain.scale);
  const auto got = download<uint8_t>(*dcodes);
  const auto got_s = download<float>(*dscale);
  for (int64_t c = 0; c < k; ++c) {
    ASSERT_EQ(got[static_cast<size_t>(c)], want[static_cast<size_t>(2 * k + c)]) << c;
    ASSERT_EQ(got[static_cast<size_t>(k + c)], 0) << c;
    ASSERT_EQ(got[static_cast<size_t>(2 * k + c)], want[static_cast<size_t>(c)]) << c;
  }
  EXPECT_EQ(got_s[0], want_s[2]);
  EXPECT_TRUE(std::isfinite(got_s[1]));
  EXPECT_EQ(got_s[2], want_s[0]);
}

// launch_gather_fp8_rows after launch_act_quant_fp8_rows over the source rows gives the bits of
// launch_act_quant_fp8_rows with the same row_index (the padded experts' two forms): codes and
// scales of repeated rows, of empty rows (-1: zero codes, the kernel's zero-row scale), into a
// pitched output whose padding stays untouched; bad arguments are refused.
TEST_F(CudaFp8Rows, GatherAfterQuantMatchesQuantWithRowIndex) {
  const int64_t src_rows = 23, m = 61, k = 5120, ldo = k + 32;
  std::mt19937 rng(96);
  const auto x = spread_rows(src_rows, k, rng);
  auto dx = upload(x);
  std::vector<int32_t> idx(static_cast<size_t>(m));
  std::uniform_int_distribution<int32_t> pick(-4, static_cast<int32_t>(src_rows - 1));
  for (auto& i : idx) i = std::max(pick(rng), -1);  // ~1 in 7 empty, repeats
  ASSERT_GT(std::count(idx.begin(), idx.end(), -1), 0);
  auto didx = upload(idx);
  // The direct form: one quantiser row per output row.
  auto want_codes = upload(std::vector<uint8_t>(static_cast<size_t>(m * k), 0x5A));
  auto want_scale = poisoned_floats(m);
  cuda::ActQuantFp8RowsParams q;
  q.x = dx->view().data();
  q.ldx = k;
  q.rows = m;
  q.cols = k;
  q.row_index = didx->view().data_as<int32_t>();
  q.out = want_codes->view().data_as<uint8_t>();
  q.ldo = k;
  q.row_scale = want_scale->view().data_as<float>();
  cuda::launch_act_quant_fp8_rows(q, stream_);
  // Each source row once, then the gather.
  const DeviceRowScaled once = quantise_rows(*dx, src_rows, k);
  auto got_codes = upload(std::vector<uint8_t>(static_cast<size_t>(m * ldo), 0xA5));
  auto got_scale = poisoned_floats(m);
  cuda::GatherFp8RowsParams g;
  g.src = once.codes->view().data_as<uint8_t>();
  g.ld_src = k;
  g.src_scale = once.scale->view().data_as<float>();
  g.row_index = didx->view().data_as<int32_t>();
  g.rows = m;
  g.cols = k;
  g.out = got_codes->view().data_as<uint8_t>();
  g.ldo = ldo;
  g.out_scale = got_scale->view().data_as<float>();
  cuda::launch_gather_fp8_rows(g, stream_);
  const auto want = download<uint8_t>(*want_codes);
  const auto want_s = download<float>(*want_scale);
  const auto got = download<uint8_t>(*got_codes);
  const auto got_s = download<float>(*got_scale);
  size_t diff = 0, pad = 0, nonzero = 0;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < ldo; ++c) {
      const uint8_t v = got[static_cast<size_t>(r * ldo + c)];
      if (c >= k) {
        pad += v != 0xA5;
        continue;
      }
      diff += v != want[static_cast<size_t>(r * k + c)];
      nonzero += v != 0;
    }
    EXPECT_EQ(got_s[static_cast<size_t>(r)], want_s[static_cast<size_t>(r)]) << r;
    EXPECT_TRUE(std::isfinite(got_s[static_cast<size_t>(r)])) << r;
  }
  EXPECT_EQ(diff, 0u);
  EXPECT_EQ(pad, 0u);
  EXPECT_GT(nonzero, static_cast<size_t>(m * k / 2));  // live rows, not an all-zero output
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  g.cols = k - 8;
  EXPECT_DEATH(cuda::launch_gather_fp8_rows(g, stream_), "bad arguments");
  g.cols = k;
  g.ldo = k + 8;
  EXPECT_DEATH(cuda::launch_gather_fp8_rows(g, stream_), "bad arguments");
}

struct RowScaledCase {
  int64_t m, n, k;
};

class CudaFp8RowScaled : public CudaFp8Rows, public ::testing::WithParamInterface<RowScaledCase> {};

// The whole row-scaled path on random operands (activation blocks over 17 binades, weight blocks
// over 17): launch_act_quant_fp8_rows, launch_fold_fp8_block_rows and the cuBLASLt
// kFp8RowScaled GEMM, with cuBLASLt's outer scales and with the separate scaling kernel.
// (1) Against the double product of the host's refolded operands: only the GEMM's summation
//     differs. cuBLASLt's FP8 tensor-core accumulation (products aligned to the largest with
//     ~14 bits, as launch_fp8_wgmma_gemm's) measured 1.1e-4 .. 4.4e-4 of max|ref| on the H200;
//     tolerance 2e-3, launch_fp8_wgmma_gemm's (printed).
// (2) Against the CPU's MXFP8 linear (cpu::fp8_block_gemm on the MXFP8 values), same tolerance;
//     and the two references themselves (the refold's own error: values >= 10 binades below
//     their row's largest rounded, <= 2^-10 / 224 of the row's largest |value| per operand)
//     within 1e-4 of max|ref|.
TEST_P(CudaFp8RowScaled, MatchesCpu) {
  const RowScaledCase c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.m * 5 + c.n + c.k * 3));
  const std::vector<float> x = spread_rows(c.m, c.k, rng);
  auto w = random_e4m3(c.n * c.k, rng);
  auto ws = random_bytes(c.n / 32 * (c.k / 32), rng, 118, 134);
  // (1)'s reference: the host's refolded operands.
  const RowScaled ha = host_row_scaled(x, c.m, c.k);
  std::vector<uint8_t> hw(w.size());
  std::vector<float> hw_rs(static_cast<size_t>(c.n));
  for (int64_t r = 0; r < c.n; ++r) {
    const auto* s = ws.data() + (r / 32) * (c.k / 32);
    const uint8_t top = *std::max_element(s, s + c.k / 32);
    for (int64_t j = 0; j < c.k; ++j)
      hw[static_cast<size_t>(r * c.k + j)] = refold_code(w[static_cast<size_t>(r * c.k + j)], s[j / 32] - top);
    hw_rs[static_cast<size_t>(r)] = ue8m0_to_float(top);
  }
  std::vector<float> ref1(static_cast<size_t>(c.m * c.n));
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double acc = 0.0;
      for (int64_t t = 0; t < c.k; ++t)
        acc += static_cast<double>(e4m3_to_float(ha.codes[static_cast<size_t>(i * c.k + t)])) *
               e4m3_to_float(hw[static_cast<size_t>(j * c.k + t)]);
      ref1[static_cast<size_t>(i * c.n + j)] = static_cast<float>(
          acc * ha.row_scale[static_cast<size_t>(i)] * hw_rs[static_cast<size_t>(j)]);
    }
  }
  // (2)'s reference: the MXFP8 values times the block-scaled weight.
  std::vector<float> xq(x.size());
  fq_fp8_block32_pow2(x, xq);
  std::vector<float> ref2(static_cast<size_t>(c.m * c.n));
  cpu::fp8_block_gemm(host_view(xq, DType::kF32, {c.m, c.k}),
                      host_view(w, DType::kF8E4M3, {c.n, c.k}),
                      host_view(ws, DType::kF8E8M0, {c.n / 32, c.k / 32}),
                      host_view(ref2, DType::kF32, {c.m, c.n}));

  auto dx = upload(x);
  const DeviceRowScaled dq = quantise_rows(*dx, c.m, c.k);
  const auto& da = dq.codes;
  const auto& das = dq.scale;
  auto dw = upload(w);
  auto dws = upload(ws);
  auto dw8 = upload(std::vector<uint8_t>(w.size()));
  auto dwrs = poisoned_floats(c.n);
  cuda::launch_fold_fp8_block_rows(dw->view().data_as<uint8_t>(), dws->view().data_as<uint8_t>(),
                                   c.n, c.k, dw8->view().data_as<uint8_t>(),
                                   dwrs->view().data_as<float>(), stream_);
  cuda::CublasLtGemm lt(stream_);
  for (const bool post : {false, true}) {
    auto dy = poisoned_floats(c.m * c.n);
    cuda::LtGemmParams g;
    g.precision = cuda::GemmPrecision::kFp8RowScaled;
    g.a = da->view().data();
    g.lda = c.k;
    g.b = dw8->view().data();
    g.ldb = c.k;
    g.c = dy->view().data_as<float>();
    g.ldc = c.n;
    g.m = c.m;
    g.n = c.n;
    g.k = c.k;
    g.a_scale = das->view().data_as<float>();
    g.b_scale = dwrs->view().data_as<float>();
    g.force_post_scale = post;
    lt.run(g);
    const auto got = download<float>(*dy);
    const double e1 = rel_err(got, ref1), e2 = rel_err(got, ref2);
    std::printf("  fp8 row-scaled %ldx%ldx%ld %s: vs refolded operands %.3g, vs MXFP8 %.3g\n",
                static_cast<long>(c.m), static_cast<long>(c.n), static_cast<long>(c.k),
                post ? "post-scaled" : (lt.last_fp8_outer_scales() ? "outer scales" : "post-scaled (no outer-scale algorithm)"),
                e1, e2);
    EXPECT_LE(e1, 2e-3) << "post " << post;
    EXPECT_LE(e2, 2e-3) << "post " << post;
  }
  const double refold = rel_err(ref1, ref2);
  std::printf("  refold alone: %.3g\n", refold);
  EXPECT_LE(refold, 1e-4);
}

// The strided-batched form (the attention's wo_a: groups side by side in the output, one
// a_scale for all, then one scaling pass) against the double product of the GPU's own operands
// (downloaded): only the GEMM's summation differs, tolerance 2e-3 as above. And its `unscaled`
// form, which is the scaled output before the scaling pass, bit for bit.
TEST_F(CudaFp8Rows, BatchedGemmMatchesDoubleProduct) {
  const int64_t m = 48, n = 256, k = 512, groups = 3;
  std::mt19937 rng(31);
  const std::vector<float> x = spread_rows(m, groups * k, rng);
  auto w = random_e4m3(groups * n * k, rng);
  auto ws = random_bytes(groups * n / 32 * (k / 32), rng, 118, 134);
  auto dx = upload(x);
  const DeviceRowScaled dq = quantise_rows(*dx, m, groups * k);
  const auto& da = dq.codes;
  const auto& das = dq.scale;
  auto dw = upload(w);
  auto dws = upload(ws);
  auto dw8 = upload(std::vector<uint8_t>(w.size()));
  auto dwrs = poisoned_floats(groups * n);
  cuda::launch_fold_fp8_block_rows(dw->view().data_as<uint8_t>(), dws->view().data_as<uint8_t>(),
                                   groups * n, k, dw8->view().data_as<uint8_t>(),
                                   dwrs->view().data_as<float>(), stream_);
  auto dy = poisoned_floats(m * groups * n);
  cuda::CublasLtGemm lt(stream_);
  cuda::LtGemmParams g;
  g.precision = cuda::GemmPrecision::kFp8RowScaled;
  g.a = da->view().data();
  g.lda = groups * k;
  g.b = dw8->view().data();
  g.ldb = k;
  g.c = dy->view().data_as<float>();
  g.ldc = groups * n;
  g.m = m;
  g.n = n;
  g.k = k;
  g.batch = groups;
  g.stride_a = k;
  g.stride_b = n * k;
  g.stride_c = n;
  g.a_scale = das->view().data_as<float>();
  g.b_scale = dwrs->view().data_as<float>();
  lt.run(g);
  const auto a8 = download<uint8_t>(*da);
  const auto as = download<float>(*das);
  const auto w8 = download<uint8_t>(*dw8);
  const auto wrs = download<float>(*dwrs);
  std::vector<float> ref(static_cast<size_t>(m * groups * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t gi = 0; gi < groups; ++gi) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0.0;
        for (int64_t t = 0; t < k; ++t)
          acc += static_cast<double>(e4m3_to_float(a8[static_cast<size_t>(i * groups * k + gi * k + t)])) *
                 e4m3_to_float(w8[static_cast<size_t>((gi * n + j) * k + t)]);
        ref[static_cast<size_t>(i * groups * n + gi * n + j)] = static_cast<float>(
            acc * as[static_cast<size_t>(i)] * wrs[static_cast<size_t>(gi * n + j)]);
      }
    }
  }
  const auto scaled = download<float>(*dy);
  // unscaled: the same GEMM without the scaling pass; scaled = unscaled * (a_scale * b_scale),
  // bit for bit.
  g.unscaled = true;
  g.a_scale = nullptr;
  g.b_scale = nullptr;
  auto du = poisoned_floats(m * groups * n);
  g.c = du->view().data_as<float>();
  lt.run(g);
  const auto unscaled = download<float>(*du);
  size_t unscaled_diff = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < groups * n; ++j)
      unscaled_diff += unscaled[static_cast<size_t>(i * groups * n + j)] *
                           (as[static_cast<size_t>(i)] * wrs[static_cast<size_t>(j)]) !=
                       scaled[static_cast<size_t>(i * groups * n + j)];
  EXPECT_EQ(unscaled_diff, 0u);
  // c_bf16: the unscaled sums stored as bf16 (the padded experts' form), within a bf16 rounding
  // of the fp32 ones (2^-9 of the largest, 1.95e-3) plus the two launches' FP8 sums, which
  // cuBLASLt may order differently (each ~3e-4 from the double product here): 4e-3. (The first
  // bound, 2e-3, left no room for the second term; measured 2.57e-3 on the H200, r19 call 3.)
  if (g.ldc % 8 == 0) {
    auto db = upload(std::vector<uint16_t>(static_cast<size_t>(m * groups * n), 0x7FC0));
    g.c = db->view().data();
    g.c_bf16 = true;
    lt.run(g);
    const auto bits = download<uint16_t>(*db);
    std::vector<float> widened(bits.size());
    bf16_to_float(bits, widened);
    EXPECT_LE(rel_err(widened, unscaled), 4e-3);
    g.c_bf16 = false;
  }
  const double err = rel_err(scaled, ref);
  std::printf("  fp8 row-scaled batched %ldx%ldx%ld x%ld: %.3g\n", static_cast<long>(m),
              static_cast<long>(n), static_cast<long>(k), static_cast<long>(groups), err);
  EXPECT_LE(err, 2e-3);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaFp8RowScaled,
                         ::testing::Values(RowScaledCase{1, 512, 5120}, RowScaledCase{7, 1280, 5120},
                                           RowScaledCase{64, 2304, 5120},
                                           RowScaledCase{384, 512, 4096},
                                           RowScaledCase{130, 160, 96}),
                         [](const auto& info) {
                           return std::to_string(info.param.m) + "x" +
                                  std::to_string(info.param.n) + "x" + std::to_string(info.param.k);
                         });

// Bad shapes abort as bad arguments (cols % 32, ldo < cols, a bf16 row pitch off 16 bytes,
// kperm_fp8 with cols % 64, the weight's k % 32), and the cuBLASLt row-scaled GEMM refuses an FP8
// pitch off 16 bytes and bf16 sums on a scaled GEMM (c_bf16).
TEST_F(CudaOps, Fp8RowScaledRejectsBadShapes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto buf = upload(std::vector<float>(4096, 1.0f));
  cuda::ActQuantFp8RowsParams p;
  p.x = buf->view().data();
  p.ldx = 64;
  p.rows = 2;
  p.cols = 48;
  p.out = buf->view().data_as<uint8_t>();
  p.ldo = 64;
  p.row_scale = buf->view().data_as<float>() + 1024;
  EXPECT_DEATH(cuda::launch_act_quant_fp8_rows(p, stream_), "bad arguments");
  p.cols = 64;
  p.ldo = 32;
  EXPECT_DEATH(cuda::launch_act_quant_fp8_rows(p, stream_), "bad arguments");
  p.ldo = 64;
  p.x_type = cuda::ActivationType::kBF16;
  p.ldx = 68;
  EXPECT_DEATH(cuda::launch_act_quant_fp8_rows(p, stream_), "bad arguments");
  p.x_type = cuda::ActivationType::kF32;
  p.ldx = 96;
  p.cols = 96;
  p.ldo = 96;
  p.kperm_fp8 = true;  // cols % 64
  EXPECT_DEATH(cuda::launch_act_quant_fp8_rows(p, stream_), "bad arguments");
  EXPECT_DEATH(cuda::launch_fold_fp8_block_rows(buf->view().data_as<uint8_t>(),
                                                buf->view().data_as<uint8_t>(), 32, 48,
                                                buf->view().data_as<uint8_t>(),
                                                buf->view().data_as<float>(), stream_),
               "bad arguments");
  cuda::CublasLtGemm lt(stream_);
  cuda::LtGemmParams g;
  g.precision = cuda::GemmPrecision::kFp8RowScaled;
  g.a = buf->view().data();
  g.lda = 40;
  g.b = buf->view().data();
  g.ldb = 48;
  g.c = buf->view().data_as<float>();
  g.ldc = 4;
  g.m = 2;
  g.n = 4;
  g.k = 32;
  g.a_scale = buf->view().data_as<float>();
  g.b_scale = buf->view().data_as<float>();
  EXPECT_DEATH(lt.run(g), "kFp8RowScaled");
  g.lda = 48;
  g.c_bf16 = true;  // bf16 sums only unscaled
  EXPECT_DEATH(lt.run(g), "c_bf16");
}

// CublasLtGemm::set_autotune on a bf16 GEMM with fp32 output (kBf16F32, B stored [n, k]) against
// the double product of the same bf16 operands (fp32 accumulation: 1e-5 of max|ref|):
// - untuned (the heuristic's first) and tuned (the fastest of 8 candidates, timed) both within it;
// - a second tuning instance takes the process's choice for the shape (tunes nothing itself)
//   and gives the first's bits;
// - a run captured into a CUDA graph does not tune (no timing under capture): the replay gives
//   the untuned instance's bits on a shape not seen before;
// - candidates outside 0..16 are refused.
TEST_F(CudaOps, LtAutotuneKeepsResultsAndOneChoicePerShape) {
  std::mt19937 rng(61);
  const auto case_of = [&](int64_t m, int64_t n, int64_t k) {
    std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(n * k));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& v : a) v = u(rng);
    for (float& v : b) v = u(rng);
    std::vector<uint16_t> ab(a.size()), bb(b.size());
    float_to_bf16(a, ab);
    float_to_bf16(b, bb);
    bf16_to_float(ab, a);
    bf16_to_float(bb, b);
    std::vector<float> ref(static_cast<size_t>(m * n));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0.0;
        for (int64_t t = 0; t < k; ++t)
          acc += static_cast<double>(a[static_cast<size_t>(i * k + t)]) *
                 b[static_cast<size_t>(j * k + t)];
        ref[static_cast<size_t>(i * n + j)] = static_cast<float>(acc);
      }
    return std::tuple{upload(ab), upload(bb), ref};
  };
  const auto params = [](const DeviceBuffer& a, const DeviceBuffer& b, DeviceBuffer& c, int64_t m,
                         int64_t n, int64_t k) {
    cuda::LtGemmParams g;
    g.precision = cuda::GemmPrecision::kBf16F32;
    g.a = a.view().data();
    g.lda = k;
    g.b = b.view().data();
    g.ldb = k;
    g.b_transposed = true;
    g.c = c.view().data_as<float>();
    g.ldc = n;
    g.m = m;
    g.n = n;
    g.k = k;
    return g;
  };
  {
    const int64_t m = 384, n = 1536, k = 2048;
    const auto [da, db, ref] = case_of(m, n, k);
    std::vector<std::vector<float>> got;
    int64_t tuned_first = -1, tuned_second = -1;
    for (int tune : {0, 8, 8}) {
      cuda::CublasLtGemm lt(stream_);
      lt.set_autotune(tune);
      auto dc = poisoned_floats(m * n);
      lt.run(params(*da, *db, *dc, m, n, k));
      got.push_back(download<float>(*dc));
      EXPECT_LE(rel_err(got.back(), ref), 1e-5) << "autotune " << tune;
      if (tune > 0) (tuned_first < 0 ? tuned_first : tuned_second) = lt.tuned_shapes();
    }
    EXPECT_LE(tuned_first, 1);  // 0 only where this process tuned the shape before (a repeat)
    EXPECT_EQ(tuned_second, 0) << "the second instance takes the process's choice";
    EXPECT_EQ(std::memcmp(got[1].data(), got[2].data(), got[1].size() * sizeof(float)), 0);
  }
  {
    // Under capture: no tuning, the heuristic's first (the untuned instance's bits).
    const int64_t m = 200, n = 1024, k = 1536;
    const auto [da, db, ref] = case_of(m, n, k);
    cuda::CublasLtGemm plain(stream_);
    auto dplain = poisoned_floats(m * n);
    plain.run(params(*da, *db, *dplain, m, n, k));
    cuda::CublasLtGemm lt(stream_);
    lt.set_autotune(8);
    auto dc = poisoned_floats(m * n);
    cuda::graph_capture_begin(stream_);
    lt.run(params(*da, *db, *dc, m, n, k));
    void* exec = cuda::graph_capture_end(stream_);
    cuda::graph_launch(exec, stream_);
    const auto got = download<float>(*dc);
    cuda::graph_destroy(exec);
    EXPECT_EQ(lt.tuned_shapes(), 0);
    EXPECT_LE(rel_err(got, ref), 1e-5);
    const auto want = download<float>(*dplain);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  }
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  cuda::CublasLtGemm lt(stream_);
  EXPECT_DEATH(lt.set_autotune(17), "autotune");
  EXPECT_DEATH(lt.set_autotune(-1), "autotune");
}

struct RouterCase {
  int64_t tokens, hidden, experts;
  int top_k;
  float temperature;
};

class CudaRouter : public CudaOps, public ::testing::WithParamInterface<RouterCase> {};

// Ids must match except where the two selection scores are within 1e-5 (a near tie that fp32
// and double order differently); weights within 1e-5 relative where the ids match.
TEST_P(CudaRouter, MatchesCpu) {
  const RouterCase c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.hidden + c.experts));
  auto x = random_floats(c.tokens * c.hidden, rng, -1, 1);
  auto w = random_floats(c.experts * c.hidden, rng, -0.1f, 0.1f);
  auto bias = random_floats(c.experts, rng, -0.1f, 0.1f);
  std::vector<int32_t> ref_ids(static_cast<size_t>(c.tokens * c.top_k));
  std::vector<float> ref_w(ref_ids.size());
  const cpu::MoeRouterConfig cfg{c.top_k, c.temperature, 1.5f};
  cpu::moe_router(host_view(x, DType::kF32, {c.tokens, c.hidden}),
                  host_view(w, DType::kF32, {c.experts, c.hidden}),
                  host_view(bias, DType::kF32, {c.experts}), cfg,
                  host_view(ref_ids, DType::kI32, {c.tokens, c.top_k}),
                  host_view(ref_w, DType::kF32, {c.tokens, c.top_k}));
  // Both ways: dots in the kernel, and precomputed logits (the model's batched fp32 GEMM; here
  // the host's double dots rounded to fp32).
  std::vector<float> logits(static_cast<size_t>(c.tokens * c.experts));
  for (int64_t t = 0; t < c.tokens; ++t)
    for (int64_t e = 0; e < c.experts; ++e) {
      double dot = 0;
      for (int64_t i = 0; i < c.hidden; ++i)
        dot += static_cast<double>(x[t * c.hidden + i]) * w[e * c.hidden + i];
      logits[static_cast<size_t>(t * c.experts + e)] = static_cast<float>(dot);
    }
  for (bool precomputed : {false, true}) {
  SCOPED_TRACE(precomputed ? "precomputed logits" : "dots in the kernel");
  auto dx = upload(x);
  auto dw = upload(w);
  auto db = upload(bias);
  auto dl = upload(logits);
  auto dids = upload(std::vector<int32_t>(ref_ids.size(), -1));
  auto dwts = poisoned_floats(static_cast<int64_t>(ref_w.size()));
  cuda::MoeRouterParams rp{dx->view().data_as<float>(), c.hidden, dw->view().data_as<float>(),
                           db->view().data_as<float>(), c.tokens, c.hidden, c.experts, c.top_k,
                           c.temperature, 1.5f, dids->view().data_as<int32_t>(),
                           dwts->view().data_as<float>()};
  if (precomputed) {
    rp.logits = dl->view().data_as<float>();
    rp.x = nullptr;
    rp.gate_weight = nullptr;
  }
  cuda::launch_moe_router(rp, stream_);
  const auto ids = download<int32_t>(*dids);
  const auto wts = download<float>(*dwts);
  // Selection scores on the CPU in double, to judge near ties.
  auto select = [&](int64_t t, int32_t e) {
    double dot = 0;
    for (int64_t i = 0; i < c.hidden; ++i)
      dot += static_cast<double>(x[t * c.hidden + i]) * w[e * c.hidden + i];
    const double z = dot / c.temperature;
    return std::sqrt(z > 20 ? z : std::log1p(std::exp(z))) + bias[static_cast<size_t>(e)];
  };
  int mismatches = 0;
  for (int64_t t = 0; t < c.tokens; ++t) {
    for (int j = 0; j < c.top_k; ++j) {
      const size_t i = static_cast<size_t>(t * c.top_k + j);
      ASSERT_GE(ids[i], 0) << "unwritten id";
      ASSERT_LT(ids[i], c.experts);
      if (ids[i] != ref_ids[i]) {
        ++mismatches;
        EXPECT_LE(std::abs(select(t, ids[i]) - select(t, ref_ids[i])), 1e-5)
            << "token " << t << " rank " << j;
      } else {
        EXPECT_NEAR(wts[i], ref_w[i], 1e-5 * std::abs(ref_w[i])) << "token " << t << " rank " << j;
      }
    }
  }
  EXPECT_LE(mismatches, c.tokens / 16 + 1);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaRouter,
    ::testing::Values(RouterCase{1, 64, 16, 6, 1.0f}, RouterCase{33, 5120, 384, 6, 1.0f},
                      RouterCase{70, 1000, 384, 8, 0.7f}, RouterCase{5, 5120, 1024, 16, 1.3f}),
    [](const auto& info) {
      return "t" + std::to_string(info.param.tokens) + "_h" + std::to_string(info.param.hidden) +
             "_e" + std::to_string(info.param.experts) + "_k" + std::to_string(info.param.top_k);
    });

// MoeRouterParams::logit_slices (the forward's split-K router GEMM): three random partial-logit
// slices at a padded stride are summed in slice order, so the ids and weights equal, bit for bit,
// those from the logits the host sums in that order ((l0 + l1) + l2 in fp32). Bad slice
// arguments are refused.
TEST_F(CudaOps, RouterSumsLogitSlicesInOrder) {
  const int64_t t = 37, e = 384, stride = t * e + 16;
  const int k = 6, slices = 3;
  std::mt19937 rng(17);
  auto parts = random_floats(slices * stride, rng, -2, 2);
  auto bias = random_floats(e, rng, -0.1f, 0.1f);
  std::vector<float> sum(static_cast<size_t>(t * e));
  for (size_t i = 0; i < sum.size(); ++i) {
    float v = parts[i];
    for (int s = 1; s < slices; ++s) v += parts[static_cast<size_t>(s * stride) + i];
    sum[i] = v;
  }
  const auto run = [&](const std::vector<float>& logits, int n_slices) {
    auto dl = upload(logits);
    auto db = upload(bias);
    auto dids = upload(std::vector<int32_t>(static_cast<size_t>(t * k), -1));
    auto dwts = poisoned_floats(t * k);
    cuda::MoeRouterParams rp;
    rp.bias = db->view().data_as<float>();
    rp.num_tokens = t;
    rp.hidden = 5120;
    rp.num_experts = e;
    rp.top_k = k;
    rp.topk_ids = dids->view().data_as<int32_t>();
    rp.topk_weights = dwts->view().data_as<float>();
    rp.logits = dl->view().data_as<float>();
    rp.logit_slices = n_slices;
    rp.slice_stride = n_slices > 1 ? stride : 0;
    cuda::launch_moe_router(rp, stream_);
    return std::pair{download<int32_t>(*dids), download<float>(*dwts)};
  };
  const auto [ids1, w1] = run(sum, 1);
  const auto [ids3, w3] = run(parts, slices);
  EXPECT_EQ(ids1, ids3);
  ASSERT_EQ(w1.size(), w3.size());
  EXPECT_EQ(0, std::memcmp(w1.data(), w3.data(), w1.size() * sizeof(float)));
  for (const int32_t id : ids3) ASSERT_TRUE(id >= 0 && id < e);
  // The slices matter: slice 0 alone routes differently.
  EXPECT_NE(run(parts, 1).first, ids3);
  cuda::MoeRouterParams bad;
  bad.num_tokens = t;
  bad.num_experts = e;
  bad.top_k = k;
  bad.logit_slices = 2;  // no logits
  EXPECT_DEATH(cuda::launch_moe_router(bad, stream_), "bad logit slices");
  bad.logits = reinterpret_cast<const float*>(16);
  bad.slice_stride = t * e - 1;  // slices overlap
  EXPECT_DEATH(cuda::launch_moe_router(bad, stream_), "bad logit slices");
  bad.logit_slices = 0;
  EXPECT_DEATH(cuda::launch_moe_router(bad, stream_), "bad logit slices");
}

// launch_router_logits_f32 (the router logits' split-K fp32 GEMM) against a double-precision
// product on the host, at the decode's 384 x 384 x 5120 with 11 slices and with the automatic
// slices (router_logits_auto_slices), and at ragged shapes (rows and experts past a tile, the
// 64-row tiles at <= 64 rows, experts not a multiple of 4, one slice, 80 slices, a pitched x).
// Each slice is checked
// on its own k range (chunks [s C / S, (s + 1) C / S) of 16), and their fp32 sum against the
// whole product: |err| <= 2e-6 of the row's largest |z| plus 1e-6 absolute (fp32 sums of 5120
// products of U(-1, 1) values: ~1e-7 relative each). Bad arguments are refused.
TEST_F(CudaOps, RouterLogitsF32MatchesDoubleProduct) {
  struct Case {
    int64_t rows, experts, hidden, ldx;
    int slices;
  };
  const int auto_decode = cuda::router_logits_auto_slices(384, 384, 5120);
  const int auto_narrow = cuda::router_logits_auto_slices(64, 250, 2048);
  for (const int a : {auto_decode, auto_narrow}) {
    EXPECT_GE(a, 2);
    EXPECT_LE(a, 32);
  }
  EXPECT_LE(auto_narrow, 2048 / 16 / 4);
  EXPECT_EQ(cuda::router_logits_auto_slices(8, 8, 16), 0);       // fewer than 8 chunks
  EXPECT_EQ(cuda::router_logits_auto_slices(8192, 384, 5120), 0);  // the tiles fill the SMs
  for (const Case c : {Case{384, 384, 5120, 5120, 11}, Case{384, 384, 5120, 5120, auto_decode},
                       Case{70, 100, 1024, 1028, 1}, Case{130, 384, 1280, 1280, 80},
                       Case{1, 16, 64, 64, 3}, Case{64, 250, 2048, 2052, auto_narrow},
                       Case{33, 130, 512, 512, 7}}) {
    SCOPED_TRACE("rows " + std::to_string(c.rows) + " experts " + std::to_string(c.experts) +
                 " hidden " + std::to_string(c.hidden) + " slices " + std::to_string(c.slices));
    std::mt19937 rng(static_cast<uint32_t>(c.rows + c.slices));
    const auto x = random_floats(c.rows * c.ldx, rng, -1, 1);
    const auto w = random_floats(c.experts * c.hidden, rng, -1, 1);
    auto dx = upload(x);
    auto dw = upload(w);
    auto dout = poisoned_floats(c.slices * c.rows * c.experts);
    cuda::RouterLogitsParams p;
    p.x = dx->view().data_as<float>();
    p.ldx = c.ldx;
    p.w = dw->view().data_as<float>();
    p.rows = c.rows;
    p.experts = c.experts;
    p.hidden = c.hidden;
    p.slices = c.slices;
    p.out = dout->view().data_as<float>();
    cuda::launch_router_logits_f32(p, stream_);
    const auto out = download<float>(*dout);
    const int64_t chunks = c.hidden / 16;
    double worst = 0.0;
    for (int64_t t = 0; t < c.rows; ++t) {
      std::vector<double> z(static_cast<size_t>(c.experts));
      double zmax = 0.0;
      std::vector<std::vector<double>> part(static_cast<size_t>(c.slices),
                                            std::vector<double>(static_cast<size_t>(c.experts)));
      for (int64_t e = 0; e < c.experts; ++e) {
        for (int s = 0; s < c.slices; ++s) {
          double acc = 0.0;
          for (int64_t k = 16 * (s * chunks / c.slices); k < 16 * ((s + 1) * chunks / c.slices);
               ++k)
            acc += static_cast<double>(x[static_cast<size_t>(t * c.ldx + k)]) *
                   static_cast<double>(w[static_cast<size_t>(e * c.hidden + k)]);
          part[static_cast<size_t>(s)][static_cast<size_t>(e)] = acc;
          z[static_cast<size_t>(e)] += acc;
        }
        zmax = std::max(zmax, std::abs(z[static_cast<size_t>(e)]));
      }
      for (int64_t e = 0; e < c.experts; ++e) {
        float sum = 0.0f;
        for (int s = 0; s < c.slices; ++s) {
          const float got = out[static_cast<size_t>((s * c.rows + t) * c.experts + e)];
          ASSERT_TRUE(std::isfinite(got)) << "slice " << s << " row " << t << " expert " << e;
          const double ref = part[static_cast<size_t>(s)][static_cast<size_t>(e)];
          ASSERT_NEAR(got, ref, 2e-6 * zmax + 1e-6)
              << "slice " << s << " row " << t << " expert " << e;
          sum += got;
        }
        const double err = std::abs(sum - z[static_cast<size_t>(e)]);
        worst = std::max(worst, err / (zmax + 1e-30));
        ASSERT_NEAR(sum, z[static_cast<size_t>(e)], 2e-6 * zmax + 1e-6)
            << "row " << t << " expert " << e;
      }
    }
    std::printf("  router logits f32: worst |err| / max|z| %.2e\n", worst);
  }
  cuda::RouterLogitsParams bad;
  bad.rows = 4;
  bad.experts = 4;
  bad.hidden = 40;  // not a multiple of 16
  bad.ldx = 40;
  bad.x = bad.w = reinterpret_cast<const float*>(256);
  EXPECT_DEATH(cuda::launch_router_logits_f32(bad, stream_), "bad arguments");
  bad.hidden = bad.ldx = 64;
  bad.slices = 5;  // more slices than chunks
  EXPECT_DEATH(cuda::launch_router_logits_f32(bad, stream_), "bad arguments");
}

TEST_F(CudaOps, RouterTiesGoToTheLowestExpert) {
  const int64_t h = 256, e = 64;
  std::mt19937 rng(9);
  auto x = random_floats(h, rng, -1, 1);
  auto w = random_floats(e * h, rng, -0.1f, 0.1f);
  // Experts 40 and 7 get identical rows and the largest bias: an exact tie for first place.
  std::copy(w.begin() + 40 * h, w.begin() + 41 * h, w.begin() + 7 * h);
  std::vector<float> bias(static_cast<size_t>(e), 0.0f);
  bias[7] = bias[40] = 10.0f;
  auto dx = upload(x);
  auto dw = upload(w);
  auto db = upload(bias);
  auto dids = upload(std::vector<int32_t>(2, -1));
  auto dwts = poisoned_floats(2);
  cuda::launch_moe_router(
      {dx->view().data_as<float>(), h, dw->view().data_as<float>(), db->view().data_as<float>(), 1,
       h, e, 2, 1.0f, 1.5f, dids->view().data_as<int32_t>(), dwts->view().data_as<float>()},
      stream_);
  EXPECT_EQ(download<int32_t>(*dids), (std::vector<int32_t>{7, 40}));
  const auto wts = download<float>(*dwts);
  EXPECT_FLOAT_EQ(wts[0], 0.75f);
  EXPECT_FLOAT_EQ(wts[1], 0.75f);
}

struct ArgmaxCase {
  int64_t rows, cols, ld;
};

class CudaArgmax : public CudaOps, public ::testing::WithParamInterface<ArgmaxCase> {};

// Exact: the winning index per row, with planted ties (the lowest must win).
TEST_P(CudaArgmax, MatchesCpuWithTies) {
  const ArgmaxCase c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.cols));
  auto logits = random_floats(c.rows * c.ld, rng, -10, 10);
  std::uniform_int_distribution<int64_t> col(0, c.cols - 1);
  for (int64_t r = 0; r < c.rows; ++r) {
    if (r % 2 == 0) {  // a tie for the maximum at two random columns
      const int64_t a = col(rng), b = col(rng);
      logits[static_cast<size_t>(r * c.ld + a)] = 11.0f;
      logits[static_cast<size_t>(r * c.ld + b)] = 11.0f;
    }
  }
  std::vector<int32_t> ref(static_cast<size_t>(c.rows));
  auto lv = logits;
  cpu::argmax_rows(
      TensorView(lv.data(), DType::kF32, Shape{c.rows, c.cols}, std::vector<int64_t>{c.ld, 1}),
      host_view(ref, DType::kI32, {c.rows}));
  auto dl = upload(logits);
  auto dout = upload(std::vector<int32_t>(static_cast<size_t>(c.rows), -1));
  auto scratch = backend_->allocate(DType::kI64, {c.rows});
  cuda::launch_argmax_rows(
      {dl->view().data_as<float>(), c.rows, c.cols, c.ld, dout->view().data_as<int32_t>(),
       static_cast<uint64_t*>(scratch->view().data())},
      stream_);
  EXPECT_EQ(download<int32_t>(*dout), ref);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaArgmax,
                         ::testing::Values(ArgmaxCase{1, 129280, 129280},
                                           ArgmaxCase{64, 129280, 129280},
                                           ArgmaxCase{3, 1001, 1003}, ArgmaxCase{300, 5000, 5000},
                                           ArgmaxCase{2, 7, 7}),
                         [](const auto& info) {
                           return "r" + std::to_string(info.param.rows) + "_c" +
                                  std::to_string(info.param.cols) + "_ld" +
                                  std::to_string(info.param.ld);
                         });

#endif  // MOESERVE_HAVE_CUDA

}  // namespace
}  // namespace moeserve
