#include "backend/cuda/cublaslt_gemm.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/kernels.h"
#include "common/check.h"

#define MS_CUBLAS_CHECK(expr)                                                      \
  do {                                                                             \
    const cublasStatus_t ms_st_ = (expr);                                          \
    if (ms_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                              \
      ::moeserve::cuda::detail::cuda_call_failed(__FILE__, __LINE__, #expr,        \
                                                 cublasLtGetStatusName(ms_st_),    \
                                                 cublasLtGetStatusString(ms_st_)); \
  } while (0)

namespace moeserve::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

using ShapeKey = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool,
                            int64_t, int64_t, int64_t, int64_t, bool>;

// A cached algorithm; outer_scales: kFp8RowScaled with the OUTER_VEC_32F modes (else unscaled).
struct Algo {
  cublasLtMatmulAlgo_t algo;
  bool outer_scales = false;
};

// Descriptors of one call (destroyed with it).
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  ~Descs() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// The algorithms autotuning chose (CublasLtGemm::set_autotune), by shape and scale mode, for the
// whole process: every instance that tunes a shape after the first takes the first's choice, so
// two models (or a model and its side stream) in one process run one shape with one algorithm.
struct TunedAlgos {
  std::mutex mu;
  std::map<std::pair<ShapeKey, bool>, cublasLtMatmulAlgo_t> chosen;
};
TunedAlgos& tuned_algos() {
  static TunedAlgos t;
  return t;
}

}  // namespace

struct CublasLtGemm::Impl {
  cudaStream_t stream = nullptr;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<ShapeKey, Algo> algos;
  bool last_outer = false;
  int tune_candidates = 0;
  int64_t tuned = 0;
};

CublasLtGemm::CublasLtGemm(void* stream) : impl_(std::make_unique<Impl>()) {
  impl_->stream = as_cuda_stream(stream);
  MS_CUBLAS_CHECK(cublasLtCreate(&impl_->handle));
  MS_CUDA_CHECK(cudaMalloc(&impl_->workspace, kWorkspaceBytes));
}

CublasLtGemm::~CublasLtGemm() {
  if (impl_->workspace) cudaFree(impl_->workspace);
  if (impl_->handle) cublasLtDestroy(impl_->handle);
}

// Row-major C[M,N] = A[M,K] op(B) is column-major C^T[N,M] = op(B)^T[N,K] A^T[K,M]: cuBLASLt's A is
// our B (transposed when b_transposed: stored [K,N] column-major), its B is our A ([K,M]).
void CublasLtGemm::run(const LtGemmParams& p) {
  if (p.m == 0 || p.n == 0) return;
  MS_CHECK(p.k > 0);
  const bool fp8 = p.precision == GemmPrecision::kFp8RowScaled;
  if (fp8) {
    MS_CHECK_MSG(p.b_transposed && p.beta == 0.0f && (p.batch == 1 || p.stride_c == p.n || p.unscaled) &&
                     p.lda % 16 == 0 &&
                     p.ldb % 16 == 0 && reinterpret_cast<uintptr_t>(p.a) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(p.b) % 16 == 0 && (p.unscaled || (p.a_scale != nullptr && p.b_scale != nullptr)),
                 "cuBLASLt kFp8RowScaled: b_transposed, beta 0, batches side by side, lda and ldb % 16, "
                 "16-byte aligned operands, both scale vectors (M={} N={} K={})",
                 p.m, p.n, p.k);
  }
  MS_CHECK_MSG(!p.c_bf16 || (fp8 && p.unscaled), "cuBLASLt c_bf16: kFp8RowScaled unscaled only");
  const bool bf16_in = p.precision == GemmPrecision::kBf16 || p.precision == GemmPrecision::kBf16F32;
  const cudaDataType_t data_type = fp8 ? CUDA_R_8F_E4M3 : bf16_in ? CUDA_R_16BF : CUDA_R_32F;
  const cudaDataType_t out_type =
      p.precision == GemmPrecision::kBf16 || p.c_bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasComputeType_t compute =
      p.precision == GemmPrecision::kTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;

  const ShapeKey key{static_cast<int>(p.precision) + (p.c_bf16 ? 256 : 0),
                     p.m,
                     p.n,
                     p.k,
                     p.lda,
                     p.ldb,
                     p.ldc,
                     p.b_transposed,
                     p.beta != 0.0f,
                     p.batch,
                     p.stride_a,
                     p.stride_b,
                     p.stride_c,
                     p.force_post_scale || p.unscaled};

  // The descriptors; outer: kFp8RowScaled with cuBLASLt's outer-vector scale modes (cuBLASLt's
  // A is our B, so its A scale is b_scale [N] and its B scale a_scale [M]).
  const auto make = [&](Descs& d, bool outer) {
    MS_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, compute, CUDA_R_32F));
    const cublasOperation_t trans_a = p.b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t trans_b = CUBLAS_OP_N;
    MS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                                                   sizeof(trans_a)));
    MS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b,
                                                   sizeof(trans_b)));
    if (outer) {
      const cublasLtMatmulMatrixScale_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
      MS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                                                     &mode, sizeof(mode)));
      MS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                                                     &mode, sizeof(mode)));
      MS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                     &p.b_scale, sizeof(p.b_scale)));
      MS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                     &p.a_scale, sizeof(p.a_scale)));
    }
    const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
    if (p.b_transposed) {
      MS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, data_type, u(p.k), u(p.n), p.ldb));
    } else {
      MS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, data_type, u(p.n), u(p.k), p.ldb));
    }
    MS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, data_type, u(p.k), u(p.m), p.lda));
    MS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, out_type, u(p.n), u(p.m), p.ldc));
    if (p.batch > 1) {
      const auto batched = [&](cublasLtMatrixLayout_t l, int64_t stride) {
        const auto count = static_cast<int32_t>(p.batch);
        MS_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                         &count, sizeof(count)));
        MS_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
            l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
      };
      batched(d.a, p.stride_b);  // cuBLASLt's A is our B (see above)
      batched(d.b, p.stride_a);
      batched(d.c, p.stride_c);
    }
  };
  // Autotuning (set_autotune) applies where timing the candidates cannot change the result or
  // another buffer: beta 0 (C is written, not read), C neither A nor B, and the stream is not
  // being captured into a graph (the timing synchronises).
  const auto can_tune = [&] {
    if (impl_->tune_candidates < 2 || p.beta != 0.0f || p.c == p.a || p.c == p.b) return false;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    MS_CUDA_CHECK(cudaStreamIsCapturing(impl_->stream, &cap));
    return cap == cudaStreamCaptureStatusNone;
  };
  // The algorithm for d, or false: the heuristic's first; with autotuning, the fastest of the
  // heuristic's first tune_candidates by CUDA events (one warm-up and kTuneRuns timed runs
  // each, on this call's operands; a later candidate must beat the best so far by 3%, so near
  // ties keep the heuristic's order), or the choice already made in this process for the shape.
  const auto pick = [&](Descs& d, bool outer, cublasLtMatmulAlgo_t* algo) {
    const bool tune = can_tune();
    TunedAlgos& tuned = tuned_algos();
    if (tune) {
      const std::lock_guard<std::mutex> lock(tuned.mu);
      if (const auto hit = tuned.chosen.find({key, outer}); hit != tuned.chosen.end()) {
        *algo = hit->second;
        return true;
      }
    }
    cublasLtMatmulPreference_t pref = nullptr;
    MS_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = kWorkspaceBytes;
    MS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    constexpr int kMaxCandidates = 16;
    cublasLtMatmulHeuristicResult_t results[kMaxCandidates] = {};
    const int want = tune ? std::min(impl_->tune_candidates, kMaxCandidates) : 1;
    int returned = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
        impl_->handle, d.op, d.a, d.b, d.c, d.c, pref, want, results, &returned);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && returned == 0))
      return false;
    MS_CUBLAS_CHECK(st);
    int best = 0;
    if (tune && returned > 1) {
      constexpr int kTuneRuns = 5;
      cudaEvent_t ev[2] = {nullptr, nullptr};
      MS_CUDA_CHECK(cudaEventCreate(&ev[0]));
      MS_CUDA_CHECK(cudaEventCreate(&ev[1]));
      float best_ms = std::numeric_limits<float>::infinity();
      const auto matmul = [&](const cublasLtMatmulAlgo_t& al) {
        return cublasLtMatmul(impl_->handle, d.op, &p.alpha, p.b, d.a, p.a, d.b, &p.beta, p.c,
                              d.c, p.c, d.c, &al, impl_->workspace, kWorkspaceBytes,
                              impl_->stream);
      };
      for (int i = 0; i < returned; ++i) {
        if (results[i].state != CUBLAS_STATUS_SUCCESS ||
            matmul(results[i].algo) != CUBLAS_STATUS_SUCCESS)
          continue;
        MS_CUDA_CHECK(cudaEventRecord(ev[0], impl_->stream));
        for (int r = 0; r < kTuneRuns; ++r) MS_CUBLAS_CHECK(matmul(results[i].algo));
        MS_CUDA_CHECK(cudaEventRecord(ev[1], impl_->stream));
        MS_CUDA_CHECK(cudaEventSynchronize(ev[1]));
        float ms = 0.0f;
        MS_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
        if (ms < 0.97f * best_ms) {
          best_ms = ms;
          best = i;
        }
      }
      cudaEventDestroy(ev[0]);
      cudaEventDestroy(ev[1]);
      ++impl_->tuned;
    }
    *algo = results[best].algo;
    if (tune) {
      const std::lock_guard<std::mutex> lock(tuned.mu);
      *algo = tuned.chosen.emplace(std::pair{key, outer}, *algo).first->second;
    }
    return true;
  };

  auto it = impl_->algos.find(key);
  if (it == impl_->algos.end()) {
    Algo a{};
    bool found = false;
    if (fp8 && !p.force_post_scale && !p.unscaled && p.batch == 1) {
      Descs d;
      make(d, true);
      found = a.outer_scales = pick(d, true, &a.algo);
    }
    if (!found) {
      Descs d;
      make(d, false);
      MS_CHECK_MSG(pick(d, false, &a.algo), "cuBLASLt has no algorithm for M={} N={} K={}", p.m,
                   p.n, p.k);
    }
    it = impl_->algos.emplace(key, a).first;
  }
  const Algo& a = it->second;
  Descs d;
  make(d, a.outer_scales);
  MS_CUBLAS_CHECK(cublasLtMatmul(impl_->handle, d.op, &p.alpha, p.b, d.a, p.a, d.b, &p.beta, p.c,
                                 d.c, p.c, d.c, &a.algo, impl_->workspace, kWorkspaceBytes,
                                 impl_->stream));
  if (fp8) {
    impl_->last_outer = a.outer_scales;
    if (!a.outer_scales && !p.unscaled)
      launch_scale_rows_cols(static_cast<float*>(p.c), p.ldc, p.m, p.n * p.batch, p.a_scale,
                             p.b_scale, impl_->stream);
  }
}

bool CublasLtGemm::last_fp8_outer_scales() const { return impl_->last_outer; }

void CublasLtGemm::set_autotune(int candidates) {
  MS_CHECK_MSG(candidates >= 0 && candidates <= 16, "cuBLASLt autotune candidates 0..16, got {}",
               candidates);
  impl_->tune_candidates = candidates;
}

int64_t CublasLtGemm::tuned_shapes() const { return impl_->tuned; }

}  // namespace moeserve::cuda
