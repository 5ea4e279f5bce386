// Element types moeserve stores: the checkpoint's dtypes (safetensors names) plus packed FP4.
// kFp4E2m1 is two elements per byte; every other type is byte-addressable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace moeserve {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF8E4M3,
  kF8E5M2,
  kF8E8M0,
  kFp4E2m1,  // packed 2 per byte; element 2i in the low nibble
  kI8,
  kU8,
  kI32,
  kI64,
};

// Bits per element (4 for kFp4E2m1).
[[nodiscard]] int dtype_bits(DType dtype);
// Bytes for `numel` elements (rounded up for packed types).
[[nodiscard]] size_t dtype_bytes(DType dtype, int64_t numel);
// Name as in safetensors headers ("F32", "BF16", "F8_E4M3", ...); kFp4E2m1 is "FP4_E2M1" (not a
// safetensors dtype: the checkpoint stores packed FP4 as I8).
[[nodiscard]] std::string_view dtype_name(DType dtype);
[[nodiscard]] std::optional<DType> dtype_from_name(std::string_view name);

}  // namespace moeserve
