// The CUDA runtime calls the model and benchmarks need, behind a plain header: device memory,
// copies, streams, events and CUDA-graph capture/replay. Streams, events and graphs are opaque
// handles (cudaStream_t, cudaEvent_t, cudaGraphExec_t). Every call aborts on a CUDA error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace moeserve::cuda {

// Number of visible CUDA devices (0 when the driver or the device is missing; never aborts).
[[nodiscard]] int device_count();
// Why no device is usable ("" when device_count() > 0).
[[nodiscard]] std::string no_device_reason();

[[nodiscard]] void* device_malloc(size_t bytes);
void device_free(void* p);
// Free and total device memory in bytes.
void device_memory_info(size_t* free_bytes, size_t* total_bytes);

[[nodiscard]] void* stream_create();
void stream_destroy(void* stream);
void stream_synchronize(void* stream);
void device_synchronize();

void copy_h2d(void* dst, const void* src, size_t bytes, void* stream);
void copy_d2h(void* dst, const void* src, size_t bytes, void* stream);
void copy_d2d(void* dst, const void* src, size_t bytes, void* stream);
void memset_async(void* dst, int value, size_t bytes, void* stream);

[[nodiscard]] void* event_create();
// An event for ordering streams only (no timestamps: cheaper to record and wait on).
[[nodiscard]] void* event_create_ordering();
void event_destroy(void* event);
void event_record(void* event, void* stream);
// Work enqueued on `stream` after this call waits for the event's last record (a fork / join
// between streams; inside a graph capture it becomes a dependency edge of the graph).
void stream_wait_event(void* stream, void* event);
void event_synchronize(void* event);
// Milliseconds between two recorded (and completed) events.
[[nodiscard]] float event_elapsed_ms(void* start, void* end);

// Graph capture of the work enqueued on `stream` between begin and end (relaxed capture mode:
// other CUDA calls, e.g. kernel attributes, stay allowed; an allocation during a capture is not
// captured, so callers must not allocate then); end returns an instantiated executable graph.
void graph_capture_begin(void* stream);
[[nodiscard]] void* graph_capture_end(void* stream);
void graph_launch(void* graph_exec, void* stream);
void graph_destroy(void* graph_exec);

// A conditional section of a capture (CUDA graph IF node, CUDA >= 13): while `stream` is being
// captured, graph_if_begin adds a one-thread kernel that reads the int32 at `count` (device
// memory) and an IF node after it, and starts capturing `body_stream` into the node's body; the
// caller enqueues the section's work on body_stream and ends it with graph_if_end(body_stream).
// In each replay the body then runs only where *count > 0 (after the work enqueued on `stream`
// before the call), and the work enqueued on `stream` after the call follows the node. Returns
// false, and adds nothing, when `stream` is not capturing (or the toolkit lacks the API): the
// caller then enqueues the section on `stream` as usual, where it must be correct for any count.
// Kernels enqueued into the body take no programmatic (PDL) edges: the launch switch is off
// between begin and end (process-wide, as set_programmatic_launch) and restored by end.
[[nodiscard]] bool graph_if_begin(void* stream, const int32_t* count, void* body_stream);
void graph_if_end(void* body_stream);

// Owning device allocation (bytes); moves, never copies.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  explicit DeviceMemory(size_t bytes)
      : ptr_(bytes > 0 ? device_malloc(bytes) : nullptr), bytes_(bytes) {}
  ~DeviceMemory() { reset(); }
  DeviceMemory(DeviceMemory&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceMemory& operator=(DeviceMemory&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      o.ptr_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  void reset() {
    if (ptr_ != nullptr) device_free(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  [[nodiscard]] size_t bytes() const { return bytes_; }
  template <typename T = void>
  [[nodiscard]] T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace moeserve::cuda
