// Host-callable launchers of the CUDA kernels (definitions in *.cu). Plain header: pointers are
// device pointers, `stream` is an opaque cudaStream_t (nullptr = the legacy default stream).
// Every launcher checks its launch and aborts on a CUDA error; none synchronises.
// Layouts are row-major with leading dimensions in elements; counts are int64_t.
// NOTE: only tensor/dtype.h is included: nvcc compiles the .cu files that include this header,
// and fmt (reached through backend.h / check.h) does not compile under nvcc.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace moeserve::cuda {

using Stream = void*;

// ---- Backend-interface ops (fp32) ------------------------------------------------------------

// out[r,:] = x[r,:] * 1/sqrt(mean(x[r,:]^2) + eps) * weight (weight nullptr = ones).
struct RmsNormParams {
  const float* x = nullptr;
  const float* weight = nullptr;
  float* out = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t x_stride = 0;
  int64_t out_stride = 0;
  float eps = 1e-6f;
};
void launch_rms_norm(const RmsNormParams& p, Stream stream);

// Softmax over each row.
struct SoftmaxParams {
  const float* x = nullptr;
  float* out = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t x_stride = 0;
  int64_t out_stride = 0;
};
void launch_softmax(const SoftmaxParams& p, Stream stream);

enum class UnaryFn : uint8_t { kSilu, kSigmoid, kExp };
enum class BinaryFn : uint8_t { kAdd, kMul };

// Elementwise over n contiguous values.
struct UnaryParams {
  UnaryFn op = UnaryFn::kSilu;
  const float* x = nullptr;
  float* out = nullptr;
  int64_t n = 0;
};
void launch_unary(const UnaryParams& p, Stream stream);

// out[i] = a[i] op b[i % b_n]; b_n == n (same shape) or the row length (broadcast along rows).
struct BinaryParams {
  BinaryFn op = BinaryFn::kAdd;
  const float* a = nullptr;
  const float* b = nullptr;
  float* out = nullptr;
  int64_t n = 0;
  int64_t b_n = 0;
};
void launch_binary(const BinaryParams& p, Stream stream);

// ---- V4.1 ops ---------------------------------------------------------------------------------

enum class ActivationType : uint8_t { kF32, kBF16 };

// y[M,N] (fp32, ldy) = x[M,K] (fp32 or bf16 bits, ldx) · dequant(W)^T with W e4m3 [N,K] (row
// pitch K bytes) and ue8m0 scales [ceil(N/32), K/32] (one per 32x32 block; w = e4m3 * 2^(s-127)).
// K % 32 == 0. bf16 tensor-core products with fp32 accumulation: fp32 activations are rounded to
// bf16 on load (the weights are exact in bf16).
struct Fp8BlockGemmParams {
  const void* x = nullptr;
  ActivationType x_type = ActivationType::kF32;
  int64_t ldx = 0;
  const uint8_t* w = nullptr;
  const uint8_t* w_scale = nullptr;
  float* y = nullptr;
  int64_t ldy = 0;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
};
void launch_fp8_block_gemm(const Fp8BlockGemmParams& p, Stream stream);

// As above with MXFP4 weights: e2m1 packed [N, K/2] (element 2i in the low nibble) and ue8m0
// scales [N, K/32] (one per row per 32 along K). Dequantised to bf16 in the kernel (exact).
struct Mxfp4GemmParams {
  const void* x = nullptr;
  ActivationType x_type = ActivationType::kF32;
  int64_t ldx = 0;
  const uint8_t* w = nullptr;
  const uint8_t* w_scale = nullptr;
  float* y = nullptr;
  int64_t ldy = 0;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
};
void launch_mxfp4_gemm(const Mxfp4GemmParams& p, Stream stream);

// The MoE router of model.md §5, one block per token (fp32 throughout):
//   z = x · Wg^T / temperature, s = sqrt(softplus(z)) (softplus(z) = z above 20),
//   ids = top_k of s + bias (descending; ties -> lowest expert id),
//   weights = s[ids] / (sum s[ids] + 1e-20) * route_scale.
// num_experts <= 1024, top_k <= 16.
struct MoeRouterParams {
  const float* x = nullptr;  // [num_tokens, hidden], ldx
  int64_t ldx = 0;
  const float* gate_weight = nullptr;  // [num_experts, hidden], contiguous
  const float* bias = nullptr;         // [num_experts] (nullptr = zeros)
  int64_t num_tokens = 0;
  int64_t hidden = 0;
  int64_t num_experts = 0;
  int top_k = 6;
  float temperature = 1.0f;
  float route_scale = 1.5f;
  int32_t* topk_ids = nullptr;    // [num_tokens, top_k]
  float* topk_weights = nullptr;  // [num_tokens, top_k]
};
void launch_moe_router(const MoeRouterParams& p, Stream stream);

// Greedy sampling: out[r] = argmax_c logits[r, c] (ties -> lowest c; logits finite).
// `scratch` holds `rows` uint64 (device) that the launcher overwrites.
struct ArgmaxParams {
  const float* logits = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;
  int32_t* out = nullptr;
  uint64_t* scratch = nullptr;
};
void launch_argmax_rows(const ArgmaxParams& p, Stream stream);

// ---- test and benchmark data ----------------------------------------------------------------

// Fills device memory with deterministic pseudo-random values from `seed` (never all zeros):
// kF32/kBF16 uniform in [lo, hi); kF8E4M3 random e4m3 codes (no NaN); kU8/kF8E8M0 bytes in
// [lo, hi] (integers); kFp4E2m1 random bytes (two nibbles each).
struct FillParams {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t numel = 0;  // elements (kFp4E2m1: bytes = numel / 2)
  uint64_t seed = 1;
  float lo = -1.0f;
  float hi = 1.0f;
};
void launch_fill_random(const FillParams& p, Stream stream);

}  // namespace moeserve::cuda
