// Backend: the device-neutral op interface every model path calls. The CPU backend is the
// reference implementation; other backends are tested op by op against it
// (tests/backend_ops/). Backends are created through one explicit registry table (registry.cpp).
// All tensors passed to a backend live on that backend's device; ops are fp32 unless noted.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "tensor/tensor.h"

namespace moeserve {

// C[M,N] = alpha * A[M,K] · op(B) + beta * C, op(B) = B^T when b_transposed (B is [N,K], the
// checkpoint's [out,in] weight layout) else B ([K,N]). Row-major; leading dimensions from strides.
struct GemmParams {
  TensorView a;
  TensorView b;
  TensorView c;
  bool b_transposed = true;
  float alpha = 1.0f;
  float beta = 0.0f;
};

enum class BinaryOp { kAdd, kMul };
enum class UnaryOp { kSilu, kSigmoid, kExp };

// A device allocation owned by its backend; freed on destruction.
class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  [[nodiscard]] virtual TensorView view() const = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  [[nodiscard]] virtual std::string_view name() const = 0;
  [[nodiscard]] virtual Device device() const = 0;

  // Memory.
  [[nodiscard]] virtual std::unique_ptr<DeviceBuffer> allocate(DType dtype, Shape shape) = 0;
  virtual void copy_from_host(TensorView dst, TensorView src_host) = 0;
  virtual void copy_to_host(TensorView dst_host, TensorView src) = 0;
  virtual void synchronize() = 0;

  // Ops (fp32).
  virtual void gemm(const GemmParams& p) = 0;
  // out[r,:] = x[r,:] * rsqrt(mean(x[r,:]^2) + eps) * weight (weight may be empty = ones).
  virtual void rms_norm(TensorView x, TensorView weight, float eps, TensorView out) = 0;
  // Softmax over the last dimension.
  virtual void softmax(TensorView x, TensorView out) = 0;
  virtual void unary(UnaryOp op, TensorView x, TensorView out) = 0;
  // out = a op b; b is either the same shape as a or broadcast along rows (shape [last dim]).
  virtual void binary(BinaryOp op, TensorView a, TensorView b, TensorView out) = 0;
};

enum class BackendKind { kCpu, kCuda };

[[nodiscard]] std::string_view backend_kind_name(BackendKind kind);
// Backends usable in this process (CPU always; CUDA when built with it and a device is present).
[[nodiscard]] std::vector<BackendKind> available_backends();
[[nodiscard]] Result<std::unique_ptr<Backend>> create_backend(std::string_view name);
[[nodiscard]] Result<std::unique_ptr<Backend>> create_backend(BackendKind kind);

}  // namespace moeserve
