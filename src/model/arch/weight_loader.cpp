#include "model/arch/weight_loader.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/fake_quant.h"
#include "common/numeric.h"

namespace moeserve::arch {

namespace {

std::string shape_str(std::span<const int64_t> shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

bool same_shape(const Shape& got, std::span<const int64_t> want) {
  const auto dims = got.dims();
  return std::equal(dims.begin(), dims.end(), want.begin(), want.end());
}

}  // namespace

Result<WeightLoader> WeightLoader::open(const std::filesystem::path& path) {
  // The forward dequantises every weight right after this, which reads every page anyway.
  CheckpointLoadOptions options;
  options.prefetch = false;
  MS_ASSIGN_OR_RETURN(Checkpoint checkpoint, CheckpointLoader(options).load(path));
  return WeightLoader(std::make_shared<const Checkpoint>(std::move(checkpoint)));
}

Result<const Checkpoint::Tensor*> WeightLoader::get(const std::string& name) const {
  const Checkpoint::Tensor* t = find(name);
  if (t == nullptr)
    return make_error(ErrorCode::kNotFound, "checkpoint tensor '{}' is missing", name);
  return t;
}

Result<HostTensor> WeightLoader::load_dense(const std::string& name,
                                            const std::vector<int64_t>& shape) const {
  MS_ASSIGN_OR_RETURN(const Checkpoint::Tensor* t, get(name));
  if (!same_shape(t->shape, shape))
    return make_error(ErrorCode::kInvalidArgument,
                      "checkpoint tensor '{}' has shape {}, expected {}", name,
                      t->shape.to_string(), shape_str(shape));
  HostTensor out(DType::kF32, Shape(std::span<const int64_t>(shape)));
  const auto dst = out.span<float>();
  const std::span<const uint8_t> src = bytes(*t);
  if (t->dtype == DType::kF32) {
    std::memcpy(dst.data(), src.data(), dst.size() * 4);
  } else if (t->dtype == DType::kBF16) {
    for (size_t i = 0; i < dst.size(); ++i) {
      uint16_t v = 0;
      std::memcpy(&v, src.data() + 2 * i, 2);
      dst[i] = bf16_to_float(v);
    }
  } else {
    return make_error(ErrorCode::kInvalidArgument, "checkpoint tensor '{}' has dtype {}", name,
                      dtype_name(t->dtype));
  }
  return out;
}

Result<HostTensor> WeightLoader::load_linear(const std::string& name, int64_t out,
                                             int64_t in) const {
  MS_ASSIGN_OR_RETURN(const Checkpoint::Tensor* t, get(name));
  if (t->dtype == DType::kBF16 || t->dtype == DType::kF32) return load_dense(name, {out, in});
  const std::string scale_name = name.substr(0, name.rfind(".weight")) + ".scale";
  MS_ASSIGN_OR_RETURN(const Checkpoint::Tensor* scale, get(scale_name));
  const int64_t blocks_in = (in + 31) / 32;
  const bool fp8 = t->dtype == DType::kF8E4M3;
  const bool fp4 = t->dtype == DType::kI8 || t->dtype == DType::kU8;
  if (!fp8 && !fp4)
    return make_error(ErrorCode::kInvalidArgument, "checkpoint tensor '{}' has dtype {}", name,
                      dtype_name(t->dtype));
  const std::vector<int64_t> want_w =
      fp8 ? std::vector<int64_t>{out, in} : std::vector<int64_t>{out, in / 2};
  if (!same_shape(t->shape, want_w) || (fp4 && in % 2 != 0))
    return make_error(ErrorCode::kInvalidArgument,
                      "checkpoint tensor '{}' has shape {}, expected {}{}", name,
                      t->shape.to_string(), shape_str(want_w), fp4 ? " (packed FP4)" : "");
  const std::vector<int64_t> want_s =
      fp8 ? std::vector<int64_t>{(out + 31) / 32, blocks_in} : std::vector<int64_t>{out, blocks_in};
  if (scale->dtype != DType::kF8E8M0 || !same_shape(scale->shape, want_s))
    return make_error(ErrorCode::kInvalidArgument,
                      "checkpoint tensor '{}' is {} {}, expected F8_E8M0 {}", scale_name,
                      dtype_name(scale->dtype), scale->shape.to_string(), shape_str(want_s));
  HostTensor result(DType::kF32, Shape{out, in});
  if (fp8)
    dequantize_fp8_block_weight_rows(bytes(*t), bytes(*scale), WeightShape{out, in}, 0, out,
                                     result.span<float>());
  else
    dequantize_mxfp4_weight_rows(bytes(*t), bytes(*scale), WeightShape{out, in}, 0, out,
                                 result.span<float>());
  return result;
}

Result<LinearWeight> WeightLoader::load_linear_weight(const std::string& name, int64_t out,
                                                      int64_t in) const {
  MS_ASSIGN_OR_RETURN(const Checkpoint::Tensor* t, get(name));
  LinearWeight w;
  w.block_scaled = t->dtype != DType::kBF16 && t->dtype != DType::kF32;
  MS_ASSIGN_OR_RETURN(w.weight, load_linear(name, out, in));
  return w;
}

}  // namespace moeserve::arch
