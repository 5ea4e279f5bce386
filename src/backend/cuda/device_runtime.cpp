#include "backend/cuda/device_runtime.h"

#include <cuda_runtime.h>

#include <atomic>

#include "backend/cuda/cuda_util.cuh"

namespace moeserve::cuda {

// kernels.h's programmatic-launch switch (read by launch_kernel at every launch).
namespace {
std::atomic<bool> g_programmatic_launch{false};
}  // namespace
void set_programmatic_launch(bool on) {
  g_programmatic_launch.store(on, std::memory_order_relaxed);
}
bool programmatic_launch() { return g_programmatic_launch.load(std::memory_order_relaxed); }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

std::string no_device_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
  }
  return n > 0 ? std::string() : std::string("no CUDA device visible");
}

void* device_malloc(size_t bytes) {
  void* p = nullptr;
  MS_CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}

void device_free(void* p) { MS_CUDA_CHECK(cudaFree(p)); }

void device_memory_info(size_t* free_bytes, size_t* total_bytes) {
  MS_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}

void* stream_create() {
  cudaStream_t s = nullptr;
  MS_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

void stream_destroy(void* stream) { MS_CUDA_CHECK(cudaStreamDestroy(as_cuda_stream(stream))); }
void stream_synchronize(void* stream) {
  MS_CUDA_CHECK(cudaStreamSynchronize(as_cuda_stream(stream)));
}
void device_synchronize() { MS_CUDA_CHECK(cudaDeviceSynchronize()); }

void copy_h2d(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return;
  MS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, as_cuda_stream(stream)));
}
void copy_d2h(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return;
  MS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, as_cuda_stream(stream)));
}
void copy_d2d(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return;
  MS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, as_cuda_stream(stream)));
}
void memset_async(void* dst, int value, size_t bytes, void* stream) {
  if (bytes == 0) return;
  MS_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, as_cuda_stream(stream)));
}

void* event_create() {
  cudaEvent_t e = nullptr;
  MS_CUDA_CHECK(cudaEventCreate(&e));
  return e;
}
void* event_create_ordering() {
  cudaEvent_t e = nullptr;
  MS_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}
void stream_wait_event(void* stream, void* event) {
  MS_CUDA_CHECK(cudaStreamWaitEvent(as_cuda_stream(stream), static_cast<cudaEvent_t>(event), 0));
}
void event_destroy(void* event) {
  MS_CUDA_CHECK(cudaEventDestroy(static_cast<cudaEvent_t>(event)));
}
void event_record(void* event, void* stream) {
  MS_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), as_cuda_stream(stream)));
}
void event_synchronize(void* event) {
  MS_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
}
float event_elapsed_ms(void* start, void* end) {
  float ms = 0.0f;
  MS_CUDA_CHECK(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
  return ms;
}

void graph_capture_begin(void* stream) {
  MS_CUDA_CHECK(cudaStreamBeginCapture(as_cuda_stream(stream), cudaStreamCaptureModeRelaxed));
}
void* graph_capture_end(void* stream) {
  cudaGraph_t graph = nullptr;
  MS_CUDA_CHECK(cudaStreamEndCapture(as_cuda_stream(stream), &graph));
  cudaGraphExec_t exec = nullptr;
  MS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  MS_CUDA_CHECK(cudaGraphDestroy(graph));
  return exec;
}
void graph_launch(void* graph_exec, void* stream) {
  MS_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph_exec), as_cuda_stream(stream)));
}
void graph_destroy(void* graph_exec) {
  MS_CUDA_CHECK(cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph_exec)));
}

}  // namespace moeserve::cuda
