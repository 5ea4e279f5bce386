#include "model/arch/checkpoint_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/fake_quant.h"
#include "common/numeric.h"

namespace moeserve::arch {

struct CheckpointReader::Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr != nullptr && addr != MAP_FAILED) munmap(addr, size);
  }
};

namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

size_t dtype_size(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64") return 8;
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "BF16" || dtype == "F16" || dtype == "I16") return 2;
  if (dtype == "F8_E4M3" || dtype == "F8_E8M0" || dtype == "F8_E5M2" || dtype == "I8" ||
      dtype == "U8" || dtype == "BOOL")
    return 1;
  return 0;
}

}  // namespace

Result<CheckpointReader> CheckpointReader::open(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) {
    std::ifstream in(index);
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.contains("weight_map"))
      return make_error(ErrorCode::kInvalidArgument, "{}: not a safetensors index", index.string());
    std::set<std::string> names;
    for (const auto& [k, v] : j["weight_map"].items()) names.insert(v.get<std::string>());
    for (const auto& n : names) files.push_back(dir / n);
  } else if (fs::exists(dir / "model.safetensors")) {
    files.push_back(dir / "model.safetensors");
  } else {
    return make_error(ErrorCode::kNotFound, "{}: no model.safetensors(.index.json)", dir.string());
  }
  CheckpointReader reader;
  for (const auto& path : files) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) return make_error(ErrorCode::kIo, "cannot open {}", path.string());
    struct stat st {};
    fstat(fd, &st);
    auto mapping = std::make_shared<Mapping>();
    mapping->size = static_cast<size_t>(st.st_size);
    mapping->addr = mmap(nullptr, mapping->size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (mapping->addr == MAP_FAILED || mapping->size < 8)
      return make_error(ErrorCode::kIo, "cannot mmap {}", path.string());
    const auto* base = static_cast<const uint8_t*>(mapping->addr);
    uint64_t header_len = 0;
    std::memcpy(&header_len, base, 8);
    if (header_len + 8 > mapping->size)
      return make_error(ErrorCode::kInvalidArgument, "{}: bad header length", path.string());
    nlohmann::json header = nlohmann::json::parse(
        std::string_view(reinterpret_cast<const char*>(base + 8), header_len), nullptr, false);
    if (header.is_discarded() || !header.is_object())
      return make_error(ErrorCode::kInvalidArgument, "{}: bad header JSON", path.string());
    const uint8_t* data = base + 8 + header_len;
    const size_t data_size = mapping->size - 8 - header_len;
    for (const auto& [name, info] : header.items()) {
      if (name == "__metadata__") continue;
      TensorRecord rec;
      rec.dtype = info.at("dtype").get<std::string>();
      rec.shape = info.at("shape").get<std::vector<int64_t>>();
      const auto offs = info.at("data_offsets").get<std::vector<uint64_t>>();
      if (offs.size() != 2 || offs[0] > offs[1] || offs[1] > data_size)
        return make_error(ErrorCode::kInvalidArgument, "{}: tensor '{}' has bad offsets",
                          path.string(), name);
      rec.bytes = {data + offs[0], offs[1] - offs[0]};
      int64_t numel = 1;
      for (int64_t d : rec.shape) numel *= d;
      const size_t es = dtype_size(rec.dtype);
      if (es != 0 && static_cast<size_t>(numel) * es != rec.bytes.size())
        return make_error(ErrorCode::kInvalidArgument, "{}: tensor '{}' size mismatch",
                          path.string(), name);
      reader.tensors_[name] = std::move(rec);
    }
    reader.mappings_.push_back(std::move(mapping));
  }
  return reader;
}

std::shared_ptr<const void> CheckpointReader::keep_alive() const {
  return std::make_shared<std::vector<std::shared_ptr<Mapping>>>(mappings_);
}

const TensorRecord* CheckpointReader::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Result<const TensorRecord*> CheckpointReader::get(const std::string& name) const {
  const TensorRecord* rec = find(name);
  if (rec == nullptr)
    return make_error(ErrorCode::kNotFound, "checkpoint tensor '{}' is missing", name);
  return rec;
}

Result<HostTensor> CheckpointReader::load_dense(const std::string& name,
                                                std::vector<int64_t> shape) const {
  MS_ASSIGN_OR_RETURN(const TensorRecord* rec, get(name));
  if (rec->shape != shape)
    return make_error(ErrorCode::kInvalidArgument,
                      "checkpoint tensor '{}' has shape {}, expected {}", name,
                      shape_str(rec->shape), shape_str(shape));
  HostTensor out(DType::kF32, Shape(std::span<const int64_t>(shape)));
  auto dst = out.span<float>();
  if (rec->dtype == "F32") {
    std::memcpy(dst.data(), rec->bytes.data(), dst.size() * 4);
  } else if (rec->dtype == "BF16") {
    for (size_t i = 0; i < dst.size(); ++i) {
      uint16_t v = 0;
      std::memcpy(&v, rec->bytes.data() + 2 * i, 2);
      dst[i] = bf16_to_float(v);
    }
  } else if (rec->dtype == "F64") {
    for (size_t i = 0; i < dst.size(); ++i) {
      double v = 0;
      std::memcpy(&v, rec->bytes.data() + 8 * i, 8);
      dst[i] = static_cast<float>(v);
    }
  } else {
    return make_error(ErrorCode::kInvalidArgument, "checkpoint tensor '{}' has dtype {}", name,
                      rec->dtype);
  }
  return out;
}

Result<HostTensor> CheckpointReader::load_linear(const std::string& name, int64_t out,
                                                 int64_t in) const {
  MS_ASSIGN_OR_RETURN(const TensorRecord* rec, get(name));
  if (rec->dtype == "BF16" || rec->dtype == "F32") return load_dense(name, {out, in});
  const std::string scale_name = name.substr(0, name.rfind(".weight")) + ".scale";
  const std::string scale_name_alt = name + ".scale";
  const TensorRecord* scale = find(scale_name);
  if (scale == nullptr) scale = find(scale_name_alt);
  if (scale == nullptr)
    return make_error(ErrorCode::kNotFound, "checkpoint tensor '{}' is missing", scale_name);
  const int64_t blocks_in = (in + 31) / 32;
  HostTensor result(DType::kF32, Shape{out, in});
  if (rec->dtype == "F8_E4M3") {
    if (rec->shape != std::vector<int64_t>{out, in})
      return make_error(ErrorCode::kInvalidArgument,
                        "checkpoint tensor '{}' has shape {}, expected [{}, {}]", name,
                        shape_str(rec->shape), out, in);
    const std::vector<int64_t> want{(out + 31) / 32, blocks_in};
    if (scale->dtype != "F8_E8M0" || scale->shape != want)
      return make_error(ErrorCode::kInvalidArgument,
                        "checkpoint tensor '{}' is {} {}, expected F8_E8M0 {}", scale_name,
                        scale->dtype, shape_str(scale->shape), shape_str(want));
    dequantize_fp8_block_weight_rows(rec->bytes, scale->bytes, WeightShape{out, in}, 0, out,
                                     result.span<float>());
  } else if (rec->dtype == "I8" || rec->dtype == "U8") {
    if (rec->shape != std::vector<int64_t>{out, in / 2} || in % 2 != 0)
      return make_error(ErrorCode::kInvalidArgument,
                        "checkpoint tensor '{}' has shape {}, expected [{}, {}] (packed FP4)", name,
                        shape_str(rec->shape), out, in / 2);
    const std::vector<int64_t> want{out, blocks_in};
    if (scale->dtype != "F8_E8M0" || scale->shape != want)
      return make_error(ErrorCode::kInvalidArgument,
                        "checkpoint tensor '{}' is {} {}, expected F8_E8M0 {}", scale_name,
                        scale->dtype, shape_str(scale->shape), shape_str(want));
    dequantize_mxfp4_weight_rows(rec->bytes, scale->bytes, WeightShape{out, in}, 0, out,
                                 result.span<float>());
  } else {
    return make_error(ErrorCode::kInvalidArgument, "checkpoint tensor '{}' has dtype {}", name,
                      rec->dtype);
  }
  return result;
}

}  // namespace moeserve::arch
