#include "backend/cpu/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/check.h"

namespace moeserve {
namespace cpu {
namespace {

void check_gemm_shapes(const GemmParams& p, int64_t& m, int64_t& n, int64_t& k) {
  MS_CHECK(p.a.dtype() == DType::kF32 && p.b.dtype() == DType::kF32 && p.c.dtype() == DType::kF32);
  MS_CHECK(p.a.rank() == 2 && p.b.rank() == 2 && p.c.rank() == 2);
  MS_CHECK(p.a.stride(1) == 1 && p.b.stride(1) == 1 && p.c.stride(1) == 1);
  m = p.a.dim(0);
  k = p.a.dim(1);
  n = p.b_transposed ? p.b.dim(0) : p.b.dim(1);
  const int64_t kb = p.b_transposed ? p.b.dim(1) : p.b.dim(0);
  MS_CHECK_MSG(kb == k && p.c.dim(0) == m && p.c.dim(1) == n, "gemm shapes A{} B{} C{} (b_transposed={})",
               p.a.shape().to_string(), p.b.shape().to_string(), p.c.shape().to_string(), p.b_transposed);
}

}  // namespace

void gemm_reference(const GemmParams& p) {
  int64_t m, n, k;
  check_gemm_shapes(p, m, n, k);
  const float* a = p.a.data_as<float>();
  const float* b = p.b.data_as<float>();
  float* c = p.c.data_as<float>();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const float bv = p.b_transposed ? b[j * p.b.stride(0) + kk] : b[kk * p.b.stride(0) + j];
        acc += static_cast<double>(a[i * p.a.stride(0) + kk]) * bv;
      }
      float& out = c[i * p.c.stride(0) + j];
      out = static_cast<float>(p.alpha * acc + (p.beta == 0.0f ? 0.0 : static_cast<double>(p.beta) * out));
    }
  }
}

void gemm_blas(const GemmParams& p) {
  int64_t m, n, k;
  check_gemm_shapes(p, m, n, k);
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, p.b_transposed ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), p.alpha, p.a.data_as<float>(), static_cast<int>(p.a.stride(0)),
              p.b.data_as<float>(), static_cast<int>(p.b.stride(0)), p.beta, p.c.data_as<float>(),
              static_cast<int>(p.c.stride(0)));
}

}  // namespace cpu

namespace {

class HostDeviceBuffer final : public DeviceBuffer {
 public:
  HostDeviceBuffer(DType dtype, Shape shape) : tensor_(dtype, shape) {}
  [[nodiscard]] TensorView view() const override { return tensor_.view(); }

 private:
  HostTensor tensor_;
};

// Rows of a tensor viewed as [rows, cols] with cols = last dim (rows may be strided).
struct RowView {
  int64_t rows;
  int64_t cols;
  int64_t stride;
};

RowView as_rows(const TensorView& t) {
  MS_CHECK(t.rank() >= 1 && t.stride(-1) == 1);
  const int64_t cols = t.dim(-1);
  const int64_t rows = cols == 0 ? 0 : t.numel() / cols;
  // Leading dims must collapse into one stride.
  if (t.rank() >= 2) {
    for (int i = 0; i + 2 < t.rank(); ++i) MS_CHECK(t.stride(i) == t.stride(i + 1) * t.dim(i + 1));
  }
  return {rows, cols, t.rank() >= 2 ? t.stride(-2) : cols};
}

class CpuBackend final : public Backend {
 public:
  [[nodiscard]] std::string_view name() const override { return "cpu"; }
  [[nodiscard]] Device device() const override { return {}; }

  std::unique_ptr<DeviceBuffer> allocate(DType dtype, Shape shape) override {
    return std::make_unique<HostDeviceBuffer>(dtype, shape);
  }
  void copy_from_host(TensorView dst, TensorView src) override { copy(dst, src); }
  void copy_to_host(TensorView dst, TensorView src) override { copy(dst, src); }
  void synchronize() override {}

  void gemm(const GemmParams& p) override { cpu::gemm_blas(p); }

  void rms_norm(TensorView x, TensorView weight, float eps, TensorView out) override {
    const RowView xr = as_rows(x);
    const RowView orow = as_rows(out);
    MS_CHECK(xr.rows == orow.rows && xr.cols == orow.cols);
    MS_CHECK(weight.empty() || weight.numel() == xr.cols);
    const float* w = weight.empty() ? nullptr : weight.data_as<float>();
    const float* xs = x.data_as<float>();
    float* os = out.data_as<float>();
#pragma omp parallel for schedule(static) if (xr.rows > 8)
    for (int64_t r = 0; r < xr.rows; ++r) {
      const float* xi = xs + r * xr.stride;
      float* oi = os + r * orow.stride;
      double ss = 0.0;
      for (int64_t c = 0; c < xr.cols; ++c) ss += static_cast<double>(xi[c]) * xi[c];
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(xr.cols) + eps));
      for (int64_t c = 0; c < xr.cols; ++c) oi[c] = xi[c] * inv * (w ? w[c] : 1.0f);
    }
  }

  void softmax(TensorView x, TensorView out) override {
    const RowView xr = as_rows(x);
    const RowView orow = as_rows(out);
    MS_CHECK(xr.rows == orow.rows && xr.cols == orow.cols);
    const float* xs = x.data_as<float>();
    float* os = out.data_as<float>();
#pragma omp parallel for schedule(static) if (xr.rows > 8)
    for (int64_t r = 0; r < xr.rows; ++r) {
      const float* xi = xs + r * xr.stride;
      float* oi = os + r * orow.stride;
      float m = -INFINITY;
      for (int64_t c = 0; c < xr.cols; ++c) m = std::max(m, xi[c]);
      double sum = 0.0;
      for (int64_t c = 0; c < xr.cols; ++c) {
        oi[c] = std::exp(xi[c] - m);
        sum += oi[c];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t c = 0; c < xr.cols; ++c) oi[c] *= inv;
    }
  }

  void unary(UnaryOp op, TensorView x, TensorView out) override {
    MS_CHECK(x.is_contiguous() && out.is_contiguous() && x.numel() == out.numel());
    const float* xs = x.data_as<float>();
    float* os = out.data_as<float>();
    const int64_t n = x.numel();
    switch (op) {
      case UnaryOp::kSilu:
        for (int64_t i = 0; i < n; ++i) os[i] = xs[i] / (1.0f + std::exp(-xs[i]));
        break;
      case UnaryOp::kSigmoid:
        for (int64_t i = 0; i < n; ++i) os[i] = 1.0f / (1.0f + std::exp(-xs[i]));
        break;
      case UnaryOp::kExp:
        for (int64_t i = 0; i < n; ++i) os[i] = std::exp(xs[i]);
        break;
    }
  }

  void binary(BinaryOp op, TensorView a, TensorView b, TensorView out) override {
    MS_CHECK(a.is_contiguous() && b.is_contiguous() && out.is_contiguous());
    MS_CHECK(a.numel() == out.numel());
    const int64_t n = a.numel();
    const int64_t bn = b.numel();
    MS_CHECK_MSG(bn == n || (a.rank() >= 1 && bn == a.dim(-1)), "binary: b{} does not broadcast to a{}",
                 b.shape().to_string(), a.shape().to_string());
    const float* as = a.data_as<float>();
    const float* bs = b.data_as<float>();
    float* os = out.data_as<float>();
    for (int64_t i = 0; i < n; ++i) {
      const float bv = bs[bn == n ? i : i % bn];
      os[i] = op == BinaryOp::kAdd ? as[i] + bv : as[i] * bv;
    }
  }

 private:
  static void copy(TensorView dst, TensorView src) {
    MS_CHECK(dst.is_contiguous() && src.is_contiguous() && dst.nbytes() == src.nbytes());
    if (dst.nbytes() > 0) std::memcpy(dst.data(), src.data(), dst.nbytes());
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace moeserve
