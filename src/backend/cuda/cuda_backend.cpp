#include "backend/cuda/cuda_backend.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

#include "backend/cuda/cublaslt_gemm.h"
#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/kernels.h"
#include "common/check.h"

namespace moeserve {
namespace cuda::detail {

void cuda_call_failed(const char* file, int line, const char* expr, const char* error_name,
                      const char* error_string) {
  ::moeserve::detail::check_failed(file, line, expr,
                                   fmt::format("CUDA error {}: {}", error_name, error_string));
}

}  // namespace cuda::detail

namespace {

class CudaDeviceBuffer final : public DeviceBuffer {
 public:
  CudaDeviceBuffer(DType dtype, Shape shape, int device)
      : dtype_(dtype), shape_(shape), device_(device) {
    const size_t bytes = dtype_bytes(dtype, shape.numel());
    if (bytes > 0) MS_CUDA_CHECK(cudaMalloc(&data_, bytes));
  }
  ~CudaDeviceBuffer() override {
    if (data_ != nullptr) cudaFree(data_);
  }
  CudaDeviceBuffer(const CudaDeviceBuffer&) = delete;
  CudaDeviceBuffer& operator=(const CudaDeviceBuffer&) = delete;

  [[nodiscard]] TensorView view() const override {
    return TensorView(data_, dtype_, shape_, Device{DeviceKind::kCuda, device_});
  }

 private:
  void* data_ = nullptr;
  DType dtype_;
  Shape shape_;
  int device_;
};

// Rows of a tensor viewed as [rows, cols] (cols = last dim; leading dims collapse to one stride).
struct RowView {
  int64_t rows;
  int64_t cols;
  int64_t stride;
};

RowView as_rows(const TensorView& t) {
  MS_CHECK(t.dtype() == DType::kF32 && t.rank() >= 1 && t.stride(-1) == 1);
  const int64_t cols = t.dim(-1);
  const int64_t rows = cols == 0 ? 0 : t.numel() / cols;
  for (int i = 0; i + 2 < t.rank(); ++i) MS_CHECK(t.stride(i) == t.stride(i + 1) * t.dim(i + 1));
  return {rows, cols, t.rank() >= 2 ? t.stride(-2) : cols};
}

cuda::UnaryFn to_unary_fn(UnaryOp op) {
  switch (op) {
    case UnaryOp::kSilu:
      return cuda::UnaryFn::kSilu;
    case UnaryOp::kSigmoid:
      return cuda::UnaryFn::kSigmoid;
    case UnaryOp::kExp:
      return cuda::UnaryFn::kExp;
  }
  return cuda::UnaryFn::kExp;
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    MS_CUDA_CHECK(cudaSetDevice(device_));
    MS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    gemm_ = std::make_unique<cuda::CublasLtGemm>(stream_);
  }
  ~CudaBackend() override {
    gemm_.reset();
    cudaStreamDestroy(stream_);
  }
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  [[nodiscard]] std::string_view name() const override { return "cuda"; }
  [[nodiscard]] Device device() const override { return {DeviceKind::kCuda, device_}; }
  [[nodiscard]] cudaStream_t stream() const { return stream_; }

  std::unique_ptr<DeviceBuffer> allocate(DType dtype, Shape shape) override {
    MS_CUDA_CHECK(cudaSetDevice(device_));
    return std::make_unique<CudaDeviceBuffer>(dtype, shape, device_);
  }

  // NOTE: pageable host memory: the copy from host returns once the source is staged (the caller
  // may free it); the copy to host returns once the data has landed.
  void copy_from_host(TensorView dst, TensorView src) override {
    MS_CHECK(dst.is_contiguous() && src.is_contiguous() && dst.nbytes() == src.nbytes());
    if (dst.nbytes() > 0) {
      MS_CUDA_CHECK(
          cudaMemcpyAsync(dst.data(), src.data(), dst.nbytes(), cudaMemcpyHostToDevice, stream_));
    }
  }
  void copy_to_host(TensorView dst, TensorView src) override {
    MS_CHECK(dst.is_contiguous() && src.is_contiguous() && dst.nbytes() == src.nbytes());
    if (dst.nbytes() > 0) {
      MS_CUDA_CHECK(
          cudaMemcpyAsync(dst.data(), src.data(), dst.nbytes(), cudaMemcpyDeviceToHost, stream_));
    }
  }
  void synchronize() override { MS_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  void gemm(const GemmParams& p) override {
    MS_CHECK(p.a.dtype() == DType::kF32 && p.b.dtype() == DType::kF32 &&
             p.c.dtype() == DType::kF32);
    MS_CHECK(p.a.rank() == 2 && p.b.rank() == 2 && p.c.rank() == 2);
    MS_CHECK(p.a.stride(1) == 1 && p.b.stride(1) == 1 && p.c.stride(1) == 1);
    const int64_t m = p.a.dim(0);
    const int64_t k = p.a.dim(1);
    const int64_t n = p.b_transposed ? p.b.dim(0) : p.b.dim(1);
    const int64_t kb = p.b_transposed ? p.b.dim(1) : p.b.dim(0);
    MS_CHECK_MSG(kb == k && p.c.dim(0) == m && p.c.dim(1) == n, "gemm shapes A{} B{} C{}",
                 p.a.shape().to_string(), p.b.shape().to_string(), p.c.shape().to_string());
    gemm_->run({cuda::GemmPrecision::kF32, p.a.data(), p.a.stride(0), p.b.data(), p.b.stride(0),
                p.b_transposed, p.c.data(), p.c.stride(0), m, n, k, p.alpha, p.beta});
  }

  void rms_norm(TensorView x, TensorView weight, float eps, TensorView out) override {
    const RowView xr = as_rows(x);
    const RowView orow = as_rows(out);
    MS_CHECK(xr.rows == orow.rows && xr.cols == orow.cols);
    MS_CHECK(weight.empty() || weight.numel() == xr.cols);
    cuda::launch_rms_norm({x.data_as<float>(), weight.empty() ? nullptr : weight.data_as<float>(),
                           out.data_as<float>(), xr.rows, xr.cols, xr.stride, orow.stride, eps},
                          stream_);
  }

  void softmax(TensorView x, TensorView out) override {
    const RowView xr = as_rows(x);
    const RowView orow = as_rows(out);
    MS_CHECK(xr.rows == orow.rows && xr.cols == orow.cols);
    cuda::launch_softmax(
        {x.data_as<float>(), out.data_as<float>(), xr.rows, xr.cols, xr.stride, orow.stride},
        stream_);
  }

  void unary(UnaryOp op, TensorView x, TensorView out) override {
    MS_CHECK(x.is_contiguous() && out.is_contiguous() && x.numel() == out.numel());
    cuda::launch_unary({to_unary_fn(op), x.data_as<float>(), out.data_as<float>(), x.numel()},
                       stream_);
  }

  void binary(BinaryOp op, TensorView a, TensorView b, TensorView out) override {
    MS_CHECK(a.is_contiguous() && b.is_contiguous() && out.is_contiguous());
    MS_CHECK(a.numel() == out.numel());
    const int64_t n = a.numel();
    const int64_t bn = b.numel();
    MS_CHECK_MSG(bn == n || (a.rank() >= 1 && bn == a.dim(-1)),
                 "binary: b{} does not broadcast to a{}", b.shape().to_string(),
                 a.shape().to_string());
    cuda::launch_binary({op == BinaryOp::kAdd ? cuda::BinaryFn::kAdd : cuda::BinaryFn::kMul,
                         a.data_as<float>(), b.data_as<float>(), out.data_as<float>(), n, bn},
                        stream_);
  }

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::CublasLtGemm> gemm_;
};

}  // namespace

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

std::unique_ptr<Backend> make_cuda_backend(int device) {
  return std::make_unique<CudaBackend>(device);
}

void* cuda_backend_stream(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  MS_CHECK_MSG(cuda != nullptr, "cuda_backend_stream: backend '{}' is not a CUDA backend",
               backend.name());
  return cuda->stream();
}

}  // namespace moeserve
