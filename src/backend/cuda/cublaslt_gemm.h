// Row-major GEMM through cuBLASLt on one stream: C[M,N] = alpha * A[M,K] · op(B) + beta * C with
// op(B) = B^T when b_transposed (B is [N,K]). Owns the handle and a 32 MiB workspace; caches the
// heuristic's algorithm per shape. Plain header (the stream is an opaque cudaStream_t).
#pragma once

#include <cstdint>
#include <memory>

namespace moeserve::cuda {

enum class GemmPrecision : uint8_t {
  kF32,   // fp32 operands and output, fp32 arithmetic (no TF32)
  kTf32,  // fp32 operands and output, TF32 tensor cores
  kBf16,  // bf16 operands and output, fp32 accumulation
  kBf16F32,  // bf16 operands, fp32 output, fp32 accumulation
  // e4m3 operands (row-scaled FP8, kernels.h), fp32 output: C = alpha * diag(a_scale) A B^T
  // diag(b_scale). b_transposed only, beta 0; lda, ldb % 16 == 0, a and b 16-byte aligned. The
  // outer scales go to cuBLASLt's OUTER_VEC_32F scale modes where it has an algorithm for them,
  // else the GEMM runs unscaled and launch_scale_rows_cols applies them. Scaled strided
  // batches only with the batches' outputs side by side (stride_c == n) and the one a_scale [m]
  // for all: unscaled, then one scaling pass over [m, batch * n] with b_scale [batch * n] (batch
  // i's scales at i * n); with `unscaled`, any strides (the caller applies the scales).
  kFp8RowScaled,
};

struct LtGemmParams {
  GemmPrecision precision = GemmPrecision::kF32;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  bool b_transposed = true;
  void* c = nullptr;
  int64_t ldc = 0;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
  // Strided batch: C_i = A_i · op(B_i) for i < batch, X_i = X + i * stride_x (elements).
  int64_t batch = 1;
  int64_t stride_a = 0;
  int64_t stride_b = 0;
  int64_t stride_c = 0;
  // kFp8RowScaled: a_scale[m] (our A's rows), b_scale[n] (our B's rows), fp32, device.
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
  // kFp8RowScaled: leave C unscaled (A B^T of the codes times alpha); the caller applies
  // a_scale and b_scale itself (e.g. ActQuantFp8RowsParams::in_row_scale / in_col_scale).
  bool unscaled = false;
  // kFp8RowScaled with unscaled: C in bf16 (the fp32 sums rounded once; half the bytes for the
  // consumer that applies the scales).
  bool c_bf16 = false;
  // kFp8RowScaled: skip the OUTER_VEC_32F modes (the unscaled GEMM + launch_scale_rows_cols),
  // for the test of that path.
  bool force_post_scale = false;
};

class CublasLtGemm {
 public:
  explicit CublasLtGemm(void* stream);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  void run(const LtGemmParams& p);
  // kFp8RowScaled: whether the last such run applied the scales in cuBLASLt (false: the separate
  // scaling kernel).
  [[nodiscard]] bool last_fp8_outer_scales() const;
  // >= 2: on the first run of a shape (per instance), time the first `candidates` (up to 16)
  // algorithms of cuBLASLt's heuristic on that call's operands and keep the fastest, instead of
  // the heuristic's first (0 or 1: no tuning). Only where the timing cannot change anything but
  // C (beta 0, C neither A nor B) and the stream is not capturing a graph; elsewhere the
  // heuristic's first. The choice is kept for the whole process (later instances take it), so
  // one shape runs one algorithm in a process; two processes may choose differently (timing),
  // which changes results by the summation order of the algorithms' tilings and splits.
  void set_autotune(int candidates);
  // Shapes this instance tuned by timing (not counting choices taken from the process's).
  [[nodiscard]] int64_t tuned_shapes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve::cuda
