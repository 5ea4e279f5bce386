#include "tensor/tensor.h"

#include <gtest/gtest.h>

namespace moeserve {
namespace {

TEST(DType, NamesRoundTrip) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kF8E5M2, DType::kF8E8M0,
                  DType::kFp4E2m1, DType::kI8, DType::kU8, DType::kI32, DType::kI64}) {
    auto back = dtype_from_name(dtype_name(d));
    ASSERT_TRUE(back.has_value()) << dtype_name(d);
    EXPECT_EQ(*back, d);
  }
  EXPECT_FALSE(dtype_from_name("F128").has_value());
}

TEST(DType, PackedFp4Bytes) {
  EXPECT_EQ(dtype_bytes(DType::kFp4E2m1, 512), 256u);
  EXPECT_EQ(dtype_bytes(DType::kFp4E2m1, 3), 2u);
  EXPECT_EQ(dtype_bytes(DType::kBF16, 3), 6u);
}

TEST(TensorView, ContiguousStridesAndSlice) {
  HostTensor t(DType::kF32, {4, 3});
  auto s = t.span<float>();
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<float>(i);
  TensorView v = t.view();
  EXPECT_EQ(v.stride(0), 3);
  EXPECT_EQ(v.stride(1), 1);
  EXPECT_TRUE(v.is_contiguous());
  TensorView rows = v.slice_rows(1, 3);
  EXPECT_EQ(rows.dim(0), 2);
  EXPECT_EQ(rows.data_as<float>()[0], 3.0f);
  EXPECT_EQ(rows.reshape({6}).dim(0), 6);
}

TEST(TensorView, NonContiguousDetected) {
  HostTensor t(DType::kF32, {4, 4});
  const int64_t strides[] = {8, 1};
  TensorView v(t.view().data(), DType::kF32, {2, 4}, strides);
  EXPECT_FALSE(v.is_contiguous());
}

TEST(TensorView, Fp4SliceOnByteBoundary) {
  HostTensor t(DType::kFp4E2m1, {4, 32});
  TensorView rows = t.view().slice_rows(2, 4);
  EXPECT_EQ(static_cast<std::byte*>(rows.data()) - static_cast<std::byte*>(t.view().data()), 32);
  EXPECT_EQ(rows.nbytes(), 32u);
}

TEST(WorkspaceArena, AlignsAndResets) {
  WorkspaceArena arena(1024);
  TensorView a = arena.allocate(DType::kF32, {3});
  TensorView b = arena.allocate(DType::kF32, {5});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
  EXPECT_NE(a.data(), b.data());
  EXPECT_EQ(arena.used(), 64u + 20u);
  arena.reset();
  EXPECT_EQ(arena.used(), 0u);
  EXPECT_EQ(arena.allocate(DType::kF32, {1}).data(), a.data());
  EXPECT_EQ(arena.high_water(), 84u);
}

TEST(WorkspaceArenaDeathTest, ExhaustionIsACheckFailure) {
  WorkspaceArena arena(128);
  EXPECT_DEATH((void)arena.allocate(DType::kF32, {100}), "workspace arena exhausted");
}

}  // namespace
}  // namespace moeserve
