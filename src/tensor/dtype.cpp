#include "tensor/dtype.h"

#include <array>

namespace moeserve {
namespace {
struct DTypeInfo {
  DType dtype;
  std::string_view name;
  int bits;
};
constexpr std::array<DTypeInfo, 11> kDTypes = {{
    {DType::kF32, "F32", 32},
    {DType::kF16, "F16", 16},
    {DType::kBF16, "BF16", 16},
    {DType::kF8E4M3, "F8_E4M3", 8},
    {DType::kF8E5M2, "F8_E5M2", 8},
    {DType::kF8E8M0, "F8_E8M0", 8},
    {DType::kFp4E2m1, "FP4_E2M1", 4},
    {DType::kI8, "I8", 8},
    {DType::kU8, "U8", 8},
    {DType::kI32, "I32", 32},
    {DType::kI64, "I64", 64},
}};
}  // namespace

int dtype_bits(DType dtype) { return kDTypes[static_cast<size_t>(dtype)].bits; }

size_t dtype_bytes(DType dtype, int64_t numel) {
  return (static_cast<size_t>(numel) * static_cast<size_t>(dtype_bits(dtype)) + 7) / 8;
}

std::string_view dtype_name(DType dtype) { return kDTypes[static_cast<size_t>(dtype)].name; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

}  // namespace moeserve
