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
};

class CublasLtGemm {
 public:
  explicit CublasLtGemm(void* stream);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  void run(const LtGemmParams& p);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve::cuda
