// Kernels of the Backend-interface ops: RMSNorm, softmax (one block per row), unary and binary
// elementwise ops (grid-stride), and the random fill used by tests and benchmarks.
#include <cuda_bf16.h>

#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/device_runtime.h"
#include "backend/cuda/kernels.h"

namespace moeserve::cuda {
namespace {

constexpr int kRowThreads = 256;
constexpr int kElemThreads = 256;

__global__ void __launch_bounds__(kRowThreads) rms_norm_kernel(RmsNormParams p) {
  pdl_wait();
  __shared__ float scratch[32];
  const float* x = p.x + static_cast<int64_t>(blockIdx.x) * p.x_stride;
  float* out = p.out + static_cast<int64_t>(blockIdx.x) * p.out_stride;
  float ss = 0.0f;
  for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x) ss += x[c] * x[c];
  ss = block_sum(ss, scratch);
  // NOTE: 1/sqrt rather than rsqrtf: rsqrtf's 2-ulp error shows at the 1e-6 test tolerance.
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(p.cols) + p.eps);
  for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x) {
    out[c] = x[c] * inv * (p.weight ? p.weight[c] : 1.0f);
  }
}

__global__ void __launch_bounds__(kRowThreads) softmax_kernel(SoftmaxParams p) {
  pdl_wait();
  __shared__ float scratch[32];
  const float* x = p.x + static_cast<int64_t>(blockIdx.x) * p.x_stride;
  float* out = p.out + static_cast<int64_t>(blockIdx.x) * p.out_stride;
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x) m = fmaxf(m, x[c]);
  m = block_max(m, scratch);
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x) s += expf(x[c] - m);
  s = block_sum(s, scratch);
  const float inv = 1.0f / s;
  for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x) out[c] = expf(x[c] - m) * inv;
}

__global__ void unary_kernel(UnaryParams p) {
  pdl_wait();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < p.n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = p.x[i];
    float r;
    switch (p.op) {
      case UnaryFn::kSilu:
        r = v / (1.0f + expf(-v));
        break;
      case UnaryFn::kSigmoid:
        r = 1.0f / (1.0f + expf(-v));
        break;
      default:
        r = expf(v);
        break;
    }
    p.out[i] = r;
  }
}

__global__ void binary_kernel(BinaryParams p) {
  pdl_wait();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < p.n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float bv = p.b[p.b_n == p.n ? i : i % p.b_n];
    p.out[i] = p.op == BinaryFn::kAdd ? p.a[i] + bv : p.a[i] * bv;
  }
}

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fill_kernel(FillParams p, int64_t count) {
  pdl_wait();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t r = mix64(p.seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(i));
    const float u = static_cast<float>(r >> 40) * 0x1p-24f;  // [0, 1)
    switch (p.dtype) {
      case DType::kF32: {
        float v = p.lo + (p.hi - p.lo) * u;
        static_cast<float*>(p.data)[i] = v == 0.0f ? p.hi * 0.5f : v;
        break;
      }
      case DType::kBF16: {
        float v = p.lo + (p.hi - p.lo) * u;
        static_cast<__nv_bfloat16*>(p.data)[i] = __float2bfloat16_rn(v == 0.0f ? p.hi * 0.5f : v);
        break;
      }
      case DType::kF8E4M3: {
        uint8_t b = static_cast<uint8_t>(r >> 56);
        if ((b & 0x7F) == 0x7F) b ^= 0x01;  // 0x7F / 0xFF are NaN
        static_cast<uint8_t*>(p.data)[i] = b;
        break;
      }
      case DType::kFp4E2m1:
        static_cast<uint8_t*>(p.data)[i] = static_cast<uint8_t>(r >> 56);
        break;
      default: {
        const int lo = static_cast<int>(p.lo);
        const int span = static_cast<int>(p.hi) - lo + 1;
        static_cast<uint8_t*>(p.data)[i] =
            static_cast<uint8_t>(lo + static_cast<int>((r >> 32) % span));
        break;
      }
    }
  }
}

int elementwise_blocks(int64_t n) {
  const int64_t blocks = ceil_div(n, kElemThreads);
  return static_cast<int>(blocks < 132 * 16 ? (blocks > 0 ? blocks : 1) : 132 * 16);
}

#if CUDART_VERSION >= 13000
// graph_if_begin's condition: the IF node's body runs in this replay where *count > 0.
__global__ void graph_if_kernel(cudaGraphConditionalHandle handle, const int32_t* count) {
  pdl_wait();
  cudaGraphSetConditional(handle, *count > 0 ? 1u : 0u);
}
#endif

}  // namespace

void launch_rms_norm(const RmsNormParams& p, Stream stream) {
  if (p.rows == 0) return;
  MS_CUDA_CHECK(launch_kernel(rms_norm_kernel, static_cast<unsigned>(p.rows), kRowThreads, 0,
                              as_cuda_stream(stream), p));
}

void launch_softmax(const SoftmaxParams& p, Stream stream) {
  if (p.rows == 0) return;
  MS_CUDA_CHECK(launch_kernel(softmax_kernel, static_cast<unsigned>(p.rows), kRowThreads, 0,
                              as_cuda_stream(stream), p));
}

void launch_unary(const UnaryParams& p, Stream stream) {
  if (p.n == 0) return;
  MS_CUDA_CHECK(launch_kernel(unary_kernel, elementwise_blocks(p.n), kElemThreads, 0,
                              as_cuda_stream(stream), p));
}

void launch_binary(const BinaryParams& p, Stream stream) {
  if (p.n == 0) return;
  MS_CUDA_CHECK(launch_kernel(binary_kernel, elementwise_blocks(p.n), kElemThreads, 0,
                              as_cuda_stream(stream), p));
}

void launch_fill_random(const FillParams& p, Stream stream) {
  const int64_t count = p.dtype == DType::kFp4E2m1 ? (p.numel + 1) / 2 : p.numel;
  if (count == 0) return;
  MS_CUDA_CHECK(launch_kernel(fill_kernel, elementwise_blocks(count), kElemThreads, 0,
                              as_cuda_stream(stream), p, count));
}

namespace {
bool g_if_saved_pdl = false;  // the launch switch graph_if_begin turned off, restored by end
}  // namespace

bool graph_if_begin(void* stream, const int32_t* count, void* body_stream) {
#if CUDART_VERSION >= 13000
  const cudaStream_t s = as_cuda_stream(stream);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaGraph_t graph = nullptr;
  const cudaGraphNode_t* deps = nullptr;
  const cudaGraphEdgeData* edges = nullptr;
  size_t n_deps = 0;
  MS_CUDA_CHECK(cudaStreamGetCaptureInfo(s, &status, nullptr, &graph, &deps, &edges, &n_deps));
  if (status != cudaStreamCaptureStatusActive) return false;
  cudaGraphConditionalHandle handle = 0;
  MS_CUDA_CHECK(cudaGraphConditionalHandleCreate(&handle, graph, 0, cudaGraphCondAssignDefault));
  MS_CUDA_CHECK(launch_kernel(graph_if_kernel, 1, 1, 0, s, handle, count));
  MS_CUDA_CHECK(cudaStreamGetCaptureInfo(s, &status, nullptr, &graph, &deps, &edges, &n_deps));
  cudaGraphNodeParams params = {};
  params.type = cudaGraphNodeTypeConditional;
  params.conditional.handle = handle;
  params.conditional.type = cudaGraphCondTypeIf;
  params.conditional.size = 1;
  cudaGraphNode_t node = nullptr;
  // Plain (full) dependencies on the setter: a programmatic edge only joins two kernels.
  MS_CUDA_CHECK(cudaGraphAddNode(&node, graph, deps, nullptr, n_deps, &params));
  MS_CUDA_CHECK(
      cudaStreamUpdateCaptureDependencies(s, &node, nullptr, 1, cudaStreamSetCaptureDependencies));
  MS_CUDA_CHECK(cudaStreamBeginCaptureToGraph(as_cuda_stream(body_stream),
                                              params.conditional.phGraph_out[0], nullptr, nullptr,
                                              0, cudaStreamCaptureModeRelaxed));
  g_if_saved_pdl = programmatic_launch();
  set_programmatic_launch(false);
  return true;
#else
  (void)stream;
  (void)count;
  (void)body_stream;
  return false;
#endif
}

void graph_if_end(void* body_stream) {
  cudaGraph_t body = nullptr;
  MS_CUDA_CHECK(cudaStreamEndCapture(as_cuda_stream(body_stream), &body));
  set_programmatic_launch(g_if_saved_pdl);
}

}  // namespace moeserve::cuda
