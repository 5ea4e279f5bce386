// TensorView: a non-owning view (dtype, shape, strides in elements, device, pointer).
// Buffer: owning, 64-byte aligned host memory (device buffers are owned by their backend).
// Invariant: a view's strides are in elements; a packed FP4 view must be contiguous.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/check.h"
#include "tensor/dtype.h"

namespace moeserve {

enum class DeviceKind : uint8_t { kCpu, kCuda };

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;
  bool operator==(const Device&) const = default;
};

inline constexpr int kMaxDims = 6;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::span<const int64_t> dims);

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int64_t operator[](int i) const { return dims_[static_cast<size_t>(i < 0 ? rank_ + i : i)]; }
  [[nodiscard]] int64_t numel() const;
  [[nodiscard]] std::span<const int64_t> dims() const { return {dims_.data(), static_cast<size_t>(rank_)}; }
  [[nodiscard]] std::string to_string() const;
  bool operator==(const Shape& other) const;

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int rank_ = 0;
};

class TensorView {
 public:
  TensorView() = default;
  // Contiguous (row-major) view.
  TensorView(void* data, DType dtype, Shape shape, Device device = {});
  TensorView(void* data, DType dtype, Shape shape, std::span<const int64_t> strides, Device device = {});

  [[nodiscard]] void* data() const { return data_; }
  template <typename T>
  [[nodiscard]] T* data_as() const { return static_cast<T*>(data_); }
  [[nodiscard]] DType dtype() const { return dtype_; }
  [[nodiscard]] const Shape& shape() const { return shape_; }
  [[nodiscard]] int rank() const { return shape_.rank(); }
  [[nodiscard]] int64_t dim(int i) const { return shape_[i]; }
  [[nodiscard]] int64_t stride(int i) const { return strides_[static_cast<size_t>(i < 0 ? rank() + i : i)]; }
  [[nodiscard]] int64_t numel() const { return shape_.numel(); }
  [[nodiscard]] size_t nbytes() const { return dtype_bytes(dtype_, numel()); }
  [[nodiscard]] Device device() const { return device_; }
  [[nodiscard]] bool is_contiguous() const;
  [[nodiscard]] bool empty() const { return data_ == nullptr; }

  // Rows [begin, end) along dim 0 (a view into the same memory).
  [[nodiscard]] TensorView slice_rows(int64_t begin, int64_t end) const;
  // Same memory, new shape; the view must be contiguous and numel must match.
  [[nodiscard]] TensorView reshape(Shape shape) const;

  // Typed span over a contiguous CPU view.
  template <typename T>
  [[nodiscard]] std::span<T> span() const {
    MS_CHECK(is_contiguous() && device_.kind == DeviceKind::kCpu);
    MS_CHECK_EQ(sizeof(T) * 8, static_cast<size_t>(dtype_bits(dtype_)));
    return {static_cast<T*>(data_), static_cast<size_t>(numel())};
  }

  [[nodiscard]] std::string to_string() const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Shape shape_;
  std::array<int64_t, kMaxDims> strides_{};
  Device device_;
};

// Owning host buffer, 64-byte aligned, zero-initialised.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t nbytes);
  Buffer(Buffer&&) noexcept = default;
  Buffer& operator=(Buffer&&) noexcept = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  [[nodiscard]] void* data() const { return data_.get(); }
  [[nodiscard]] size_t size() const { return size_; }

 private:
  struct FreeDeleter {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, FreeDeleter> data_;
  size_t size_ = 0;
};

// A tensor that owns its host memory (tests, weights dequantised at load, small states).
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, Shape shape);

  [[nodiscard]] TensorView view() const { return view_; }
  [[nodiscard]] const Shape& shape() const { return view_.shape(); }
  [[nodiscard]] DType dtype() const { return view_.dtype(); }
  [[nodiscard]] int64_t numel() const { return view_.numel(); }
  template <typename T>
  [[nodiscard]] std::span<T> span() const { return view_.span<T>(); }
  template <typename T>
  [[nodiscard]] T* data() const { return view_.data_as<T>(); }

 private:
  Buffer buffer_;
  TensorView view_;
};

// Bump allocator over one Buffer for per-step scratch: allocate() hands out aligned views,
// reset() releases all at once. Running out is a bug in the caller's sizing (CHECK).
class WorkspaceArena {
 public:
  explicit WorkspaceArena(size_t capacity_bytes);

  [[nodiscard]] TensorView allocate(DType dtype, Shape shape, size_t alignment = 64);
  void reset() { used_ = 0; }
  [[nodiscard]] size_t used() const { return used_; }
  [[nodiscard]] size_t capacity() const { return buffer_.size(); }
  [[nodiscard]] size_t high_water() const { return high_water_; }

 private:
  Buffer buffer_;
  size_t used_ = 0;
  size_t high_water_ = 0;
};

}  // namespace moeserve
