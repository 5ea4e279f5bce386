#include "model/tiny_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include "common/fake_quant.h"
#include "common/numeric.h"

namespace moeserve {

namespace {

// splitmix64 (Steele, Lea, Flood 2014): tiny, integer-only, identical everywhere.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Approximately N(0, 1): Irwin–Hall sum of 12 uniforms on a 2^-24 grid, minus 6. The sum is
  // exact in double, so the value does not depend on libm (no log/cos as in Box–Muller).
  float normal() {
    double sum = 0;
    for (int i = 0; i < 12; ++i) sum += static_cast<double>(next() >> 40) * 0x1p-24;
    return static_cast<float>(sum - 6.0);
  }

 private:
  uint64_t state_;
};

// Per-tensor stream: seed mixed with FNV-1a of the name (order independent).
uint64_t tensor_seed(uint64_t seed, std::string_view name) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (char ch : name) h = (h ^ static_cast<uint8_t>(ch)) * 0x100000001B3ull;
  SplitMix64 mix(seed ^ h);
  return mix.next();
}

std::vector<float> sample(const WeightSpec& s, uint64_t seed) {
  SplitMix64 rng(tensor_seed(seed, s.name));
  std::vector<float> v(static_cast<size_t>(s.num_params()));
  for (float& x : v) x = s.init_mean + s.init_std * rng.normal();
  if (s.init == WeightInit::kHcBase) {
    // [pre HC | post HC | comb HC×HC]: comb = 2·I + noise keeps Sinkhorn well-conditioned.
    const size_t m = v.size();
    size_t hc = 1;
    while ((2 + hc) * hc < m) ++hc;
    for (size_t i = 0; i < hc; ++i) v[2 * hc + i * hc + i] += 2.0f;
  }
  return v;
}

std::vector<uint8_t> to_bytes_f32(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

std::vector<uint8_t> to_bytes_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  float_to_bf16(v, h);
  std::vector<uint8_t> out(v.size() * 2);
  std::memcpy(out.data(), h.data(), out.size());
  return out;
}

// FP8 e4m3 with one ue8m0 scale per (block_rows × 32) block: s = 2^ceil(log2(amax/448)).
void quantize_fp8_blocks(const std::vector<float>& w, int64_t rows, int64_t cols,
                         int64_t block_rows, std::vector<uint8_t>* codes,
                         std::vector<uint8_t>* scales) {
  const int64_t br = (rows + block_rows - 1) / block_rows, bc = (cols + 31) / 32;
  codes->assign(static_cast<size_t>(rows * cols), 0);
  scales->assign(static_cast<size_t>(br * bc), 0);
  for (int64_t bi = 0; bi < br; ++bi) {
    for (int64_t bj = 0; bj < bc; ++bj) {
      const int64_t r0 = bi * block_rows, r1 = std::min(rows, r0 + block_rows);
      const int64_t c0 = bj * 32, c1 = std::min(cols, c0 + 32);
      float amax = 0;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c)
          amax = std::max(amax, std::fabs(w[static_cast<size_t>(r * cols + c)]));
      const uint8_t code = float_to_ue8m0_ceil(std::max(amax, 1e-30f) / kE4m3Max);
      (*scales)[static_cast<size_t>(bi * bc + bj)] = code;
      const float s = ue8m0_to_float(code);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c)
          (*codes)[static_cast<size_t>(r * cols + c)] =
              float_to_e4m3(w[static_cast<size_t>(r * cols + c)] / s);
    }
  }
}

// MXFP4: per row, per 32 along K: s = 2^ceil(log2(amax/6)), nibble = e2m1(w/s), packed pairs.
void quantize_mxfp4(const std::vector<float>& w, int64_t rows, int64_t cols,
                    std::vector<uint8_t>* packed, std::vector<uint8_t>* scales) {
  const int64_t bc = (cols + 31) / 32;
  packed->assign(static_cast<size_t>(rows * cols / 2), 0);
  scales->assign(static_cast<size_t>(rows * bc), 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t bj = 0; bj < bc; ++bj) {
      const int64_t c0 = bj * 32, c1 = std::min(cols, c0 + 32);
      float amax = 0;
      for (int64_t c = c0; c < c1; ++c)
        amax = std::max(amax, std::fabs(w[static_cast<size_t>(r * cols + c)]));
      const uint8_t code = float_to_ue8m0_ceil(std::max(amax, kE2m1Max * 0x1p-126f) / kE2m1Max);
      (*scales)[static_cast<size_t>(r * bc + bj)] = code;
      const float s = ue8m0_to_float(code);
      for (int64_t c = c0; c < c1; c += 2) {
        const uint8_t lo = float_to_e2m1(w[static_cast<size_t>(r * cols + c)] / s);
        const uint8_t hi = float_to_e2m1(w[static_cast<size_t>(r * cols + c + 1)] / s);
        (*packed)[static_cast<size_t>((r * cols + c) / 2)] = pack_e2m1_pair(lo, hi);
      }
    }
  }
}

}  // namespace

std::vector<GeneratedTensor> generate_model_tensors(const ModelConfig& config, uint64_t seed) {
  std::vector<GeneratedTensor> out;
  for (const WeightSpec& s : weight_specs(config)) {
    const std::vector<ExpectedTensor> tensors = expand_weight_spec(s);
    const std::vector<float> w = sample(s, seed);
    auto add = [&](const ExpectedTensor& t, std::vector<uint8_t> bytes) {
      out.push_back({t.name, t.dtype, t.shape, std::move(bytes)});
    };
    switch (s.format) {
      case WeightFormat::kF32:
        add(tensors[0], to_bytes_f32(w));
        break;
      case WeightFormat::kBf16:
        add(tensors[0], to_bytes_bf16(w));
        break;
      case WeightFormat::kFp8Linear:
      case WeightFormat::kFp8RowTable: {
        std::vector<uint8_t> codes, scales;
        quantize_fp8_blocks(w, s.shape[0], s.shape[1],
                            s.format == WeightFormat::kFp8Linear ? 32 : 1, &codes, &scales);
        add(tensors[0], std::move(codes));
        add(tensors[1], std::move(scales));
        break;
      }
      case WeightFormat::kMxfp4Linear: {
        std::vector<uint8_t> packed, scales;
        quantize_mxfp4(w, s.shape[0], s.shape[1], &packed, &scales);
        add(tensors[0], std::move(packed));
        add(tensors[1], std::move(scales));
        break;
      }
    }
  }
  return out;
}

Status write_generated_model(const std::filesystem::path& dir, std::string_view config_json,
                             uint64_t seed) {
  MS_ASSIGN_OR_RETURN(ModelConfig config, parse_model_config(config_json, "config.json"));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return make_error(ErrorCode::kIo, "{}: cannot create: {}", dir.string(), ec.message());
  {
    std::ofstream out(dir / "config.json", std::ios::binary | std::ios::trunc);
    out.write(config_json.data(), static_cast<std::streamsize>(config_json.size()));
    if (!out) return make_error(ErrorCode::kIo, "{}: cannot write", (dir / "config.json").string());
  }
  const std::vector<GeneratedTensor> tensors = generate_model_tensors(config, seed);
  std::vector<TensorToWrite> views;
  views.reserve(tensors.size());
  for (const GeneratedTensor& t : tensors) views.push_back({t.name, t.dtype, t.shape, t.bytes});
  return write_safetensors(
      dir / "model.safetensors", views,
      {{"format", "pt"}, {"generator", "moeserve model gen-tiny"}, {"seed", std::to_string(seed)}});
}

Result<std::vector<float>> dequantize_weight(const WeightSpec& spec, const Checkpoint& checkpoint) {
  const std::vector<ExpectedTensor> tensors = expand_weight_spec(spec);
  std::vector<const Checkpoint::Tensor*> found;
  for (const ExpectedTensor& e : tensors) {
    const Checkpoint::Tensor* t = checkpoint.find(e.name);
    if (t == nullptr) return make_error(ErrorCode::kNotFound, "tensor '{}' is missing", e.name);
    if (t->dtype != e.dtype || !(t->shape == e.shape))
      return make_error(ErrorCode::kInvalidArgument, "tensor '{}' is {} {}, expected {} {}", e.name,
                        dtype_name(t->dtype), t->shape.to_string(), dtype_name(e.dtype),
                        e.shape.to_string());
    found.push_back(t);
  }
  auto bytes = [](const Checkpoint::Tensor* t) {
    return std::span<const uint8_t>(static_cast<const uint8_t*>(t->view.data()), t->nbytes);
  };
  std::vector<float> out(static_cast<size_t>(spec.num_params()));
  switch (spec.format) {
    case WeightFormat::kF32:
      std::memcpy(out.data(), found[0]->view.data(), out.size() * 4);
      break;
    case WeightFormat::kBf16: {
      std::vector<uint16_t> h(out.size());
      std::memcpy(h.data(), found[0]->view.data(), h.size() * 2);
      bf16_to_float(h, out);
      break;
    }
    case WeightFormat::kFp8Linear:
      dequantize_fp8_block_weight_rows(bytes(found[0]), bytes(found[1]),
                                       {spec.shape[0], spec.shape[1]}, 0, spec.shape[0], out);
      break;
    case WeightFormat::kMxfp4Linear:
      dequantize_mxfp4_weight_rows(bytes(found[0]), bytes(found[1]), {spec.shape[0], spec.shape[1]},
                                   0, spec.shape[0], out);
      break;
    case WeightFormat::kFp8RowTable: {
      const int64_t rows = spec.shape[0], cols = spec.shape[1], bc = (cols + 31) / 32;
      auto codes = bytes(found[0]);
      auto scales = bytes(found[1]);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          out[static_cast<size_t>(r * cols + c)] =
              e4m3_to_float(codes[static_cast<size_t>(r * cols + c)]) *
              ue8m0_to_float(scales[static_cast<size_t>(r * bc + c / 32)]);
      break;
    }
  }
  return out;
}

}  // namespace moeserve
