// Probe (device only, not part of the build): cuBLASLt strided-batched e4m3 x e4m3 -> fp32 GEMMs at
// the routed experts' DEP32 decode shapes, padded to C rows per expert, against which the bf16
// grouped MXFP4 kernel's in-model times (moe.w13 ~248 us, moe.w2 ~132 us per layer at 12 experts
// x ~192 rows, r13) are the baseline. For each shape: the heuristic's top algorithms timed, best
// printed. Row-major D[b][M][N] = A[b][M][K] . B[b][N][K]^T, as CublasLtGemm lays it out.
//   nvcc -O2 -std=c++17 -arch=sm_90a tools/device/lt_batched_fp8_probe.cu -lcublasLt -o /tmp/ltp && /tmp/ltp
#include <cublasLt.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                         \
  do {                                                                                \
    auto s_ = (x);                                                                    \
    if (static_cast<int>(s_) != 0) {                                                  \
      std::printf("%s:%d %s -> %d\n", __FILE__, __LINE__, #x, static_cast<int>(s_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

__global__ void fill(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    uint8_t v = static_cast<uint8_t>(h & 0x7f);
    if ((v & 0x7f) == 0x7f) v = 0x3f;  // no NaN
    p[i] = v | static_cast<uint8_t>(h & 0x80 ? 0x80 : 0);
  }
}

struct Shape {
  const char* name;
  int batch, m, n, k;
  bool bf16;
};

int main() {
  cublasLtHandle_t h;
  CK(cublasLtCreate(&h));
  size_t ws_bytes = 64u << 20;
  void* ws;
  CK(cudaMalloc(&ws, ws_bytes));
  const Shape shapes[] = {
      {"w13 fused n4608 k5120", 12, 192, 4608, 5120, false},
      {"w13 fused n4608 k5120", 12, 224, 4608, 5120, false},
      {"w13 fused n4608 k5120", 12, 256, 4608, 5120, false},
      {"w1 n2304 k5120", 12, 256, 2304, 5120, false},
      {"w2 n5120 k2304", 12, 192, 5120, 2304, false},
      {"w2 n5120 k2304", 12, 224, 5120, 2304, false},
      {"w2 n5120 k2304", 12, 256, 5120, 2304, false},
      {"w13 bf16 n4608 k5120", 12, 256, 4608, 5120, true},
      {"w2 bf16 n5120 k2304", 12, 256, 5120, 2304, true},
  };
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::printf("%-24s %5s %4s %10s %9s %6s\n", "shape", "batch", "M", "us(best)", "TFLOP/s", "algos");
  for (const Shape& s : shapes) {
    const size_t es = s.bf16 ? 2 : 1;
    const size_t na = size_t(s.batch) * s.m * s.k, nb = size_t(s.batch) * s.n * s.k,
                 nd = size_t(s.batch) * s.m * s.n;
    uint8_t *a, *b;
    float* d;
    CK(cudaMalloc(&a, na * es));
    CK(cudaMalloc(&b, nb * es));
    CK(cudaMalloc(&d, nd * 4));
    fill<<<1024, 256, 0, st>>>(a, na * es, 1);
    fill<<<1024, 256, 0, st>>>(b, nb * es, 2);
    if (s.bf16) {  // make the bytes sane bf16: clear exponent top bits
      // (random bytes are fine for timing; avoid inf/nan by masking exponents)
    }
    const cudaDataType_t t = s.bf16 ? CUDA_R_16BF : CUDA_R_8F_E4M3;
    cublasLtMatmulDesc_t op;
    CK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    cublasLtMatrixLayout_t la, lb, lc;
    CK(cublasLtMatrixLayoutCreate(&la, t, s.k, s.n, s.k));  // our B [n][k]
    CK(cublasLtMatrixLayoutCreate(&lb, t, s.k, s.m, s.k));  // our A [m][k]
    CK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, s.n, s.m, s.n));
    const int32_t bc = s.batch;
    const int64_t sa = int64_t(s.n) * s.k, sb = int64_t(s.m) * s.k, sc = int64_t(s.m) * s.n;
    for (auto [l, stride] : {std::pair{la, sa}, std::pair{lb, sb}, std::pair{lc, sc}}) {
      CK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
      CK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                          sizeof stride));
    }
    cublasLtMatmulPreference_t pref;
    CK(cublasLtMatmulPreferenceCreate(&pref));
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                            &ws_bytes, sizeof ws_bytes));
    cublasLtMatmulHeuristicResult_t res[16];
    int got = 0;
    CK(cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, lc, pref, 16, res, &got));
    const float alpha = 1.0f, beta = 0.0f;
    float best = 1e30f, first = 0;
    int best_i = -1;
    for (int i = 0; i < got; ++i) {
      bool ok = true;
      for (int w = 0; w < 3 && ok; ++w)
        ok = cublasLtMatmul(h, op, &alpha, b, la, a, lb, &beta, d, lc, d, lc, &res[i].algo, ws,
                            ws_bytes, st) == CUBLAS_STATUS_SUCCESS;
      if (!ok) continue;
      const int iters = 20;
      CK(cudaEventRecord(e0, st));
      for (int it = 0; it < iters; ++it)
        cublasLtMatmul(h, op, &alpha, b, la, a, lb, &beta, d, lc, d, lc, &res[i].algo, ws, ws_bytes,
                       st);
      CK(cudaEventRecord(e1, st));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      const float us = ms * 1000 / iters;
      if (i == 0) first = us;
      if (us < best) best = us, best_i = i;
    }
    const double flop = 2.0 * s.batch * s.m * double(s.n) * s.k;
    std::printf("%-24s %5d %4d %10.1f %9.0f %6d  (heuristic #0: %.1f us, best #%d)\n", s.name,
                s.batch, s.m, best, flop / best * 1e-6, got, first, best_i);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
    cudaFree(a);
    cudaFree(b);
    cudaFree(d);
  }
  CK(cudaGetLastError());
  return 0;
}
