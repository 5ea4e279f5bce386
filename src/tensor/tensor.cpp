#include "tensor/tensor.h"

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

namespace moeserve {

Shape::Shape(std::initializer_list<int64_t> dims) : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const int64_t> dims) {
  MS_CHECK_LE(dims.size(), static_cast<size_t>(kMaxDims));
  rank_ = static_cast<int>(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    MS_CHECK_GE(dims[i], 0);
    dims_[i] = dims[i];
  }
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[static_cast<size_t>(i)];
  return n;
}

std::string Shape::to_string() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string(dims_[static_cast<size_t>(i)]);
  return s + "]";
}

bool Shape::operator==(const Shape& other) const {
  if (rank_ != other.rank_) return false;
  for (int i = 0; i < rank_; ++i) {
    if (dims_[static_cast<size_t>(i)] != other.dims_[static_cast<size_t>(i)]) return false;
  }
  return true;
}

TensorView::TensorView(void* data, DType dtype, Shape shape, Device device)
    : data_(data), dtype_(dtype), shape_(shape), device_(device) {
  int64_t stride = 1;
  for (int i = shape_.rank() - 1; i >= 0; --i) {
    strides_[static_cast<size_t>(i)] = stride;
    stride *= shape_[i];
  }
}

TensorView::TensorView(void* data, DType dtype, Shape shape, std::span<const int64_t> strides, Device device)
    : data_(data), dtype_(dtype), shape_(shape), device_(device) {
  MS_CHECK_EQ(strides.size(), static_cast<size_t>(shape_.rank()));
  for (size_t i = 0; i < strides.size(); ++i) strides_[i] = strides[i];
  MS_CHECK_MSG(dtype != DType::kFp4E2m1 || is_contiguous(), "packed FP4 views must be contiguous");
}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (int i = rank() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[static_cast<size_t>(i)] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

TensorView TensorView::slice_rows(int64_t begin, int64_t end) const {
  MS_CHECK(rank() >= 1);
  MS_CHECK_MSG(0 <= begin && begin <= end && end <= dim(0), "slice [{}, {}) of {}", begin, end, shape_.to_string());
  std::array<int64_t, kMaxDims> dims{};
  for (int i = 0; i < rank(); ++i) dims[static_cast<size_t>(i)] = shape_[i];
  dims[0] = end - begin;
  const size_t offset_bits = static_cast<size_t>(begin * strides_[0]) * static_cast<size_t>(dtype_bits(dtype_));
  MS_CHECK_MSG(offset_bits % 8 == 0, "row slice must start on a byte");
  auto* base = static_cast<std::byte*>(data_) + offset_bits / 8;
  return TensorView(base, dtype_, Shape(std::span<const int64_t>(dims.data(), static_cast<size_t>(rank()))),
                    std::span<const int64_t>(strides_.data(), static_cast<size_t>(rank())), device_);
}

TensorView TensorView::reshape(Shape shape) const {
  MS_CHECK(is_contiguous());
  MS_CHECK_MSG(shape.numel() == numel(), "reshape {} -> {}", shape_.to_string(), shape.to_string());
  return TensorView(data_, dtype_, shape, device_);
}

std::string TensorView::to_string() const {
  return fmt::format("{}{}", dtype_name(dtype_), shape_.to_string());
}

void Buffer::FreeDeleter::operator()(void* p) const { std::free(p); }

Buffer::Buffer(size_t nbytes) : size_(nbytes) {
  const size_t rounded = (nbytes + 63) / 64 * 64;
  void* p = rounded == 0 ? nullptr : std::aligned_alloc(64, rounded);
  MS_CHECK_MSG(rounded == 0 || p != nullptr, "out of host memory allocating {} bytes", nbytes);
  if (p != nullptr) std::memset(p, 0, rounded);
  data_.reset(p);
}

HostTensor::HostTensor(DType dtype, Shape shape)
    : buffer_(dtype_bytes(dtype, shape.numel())), view_(buffer_.data(), dtype, shape) {}

WorkspaceArena::WorkspaceArena(size_t capacity_bytes) : buffer_(capacity_bytes) {}

TensorView WorkspaceArena::allocate(DType dtype, Shape shape, size_t alignment) {
  const size_t start = (used_ + alignment - 1) / alignment * alignment;
  const size_t bytes = dtype_bytes(dtype, shape.numel());
  MS_CHECK_MSG(start + bytes <= buffer_.size(), "workspace arena exhausted: need {} more bytes, capacity {}",
               start + bytes - used_, buffer_.size());
  used_ = start + bytes;
  high_water_ = std::max(high_water_, used_);
  return TensorView(static_cast<std::byte*>(buffer_.data()) + start, dtype, shape);
}

}  // namespace moeserve
