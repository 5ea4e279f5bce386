#include "backend/cpu/quant_ops.h"

#include <cmath>
#include <vector>

#include "common/check.h"
#include "common/numeric.h"

namespace moeserve::cpu {
namespace {

constexpr int64_t kBlock = 32;

// Row r of x as doubles (F32 or BF16 bits).
void load_row(const TensorView& x, int64_t r, std::vector<double>& out) {
  const int64_t k = x.dim(1);
  out.resize(static_cast<size_t>(k));
  if (x.dtype() == DType::kF32) {
    const float* row = x.data_as<const float>() + r * x.stride(0);
    for (int64_t i = 0; i < k; ++i) out[static_cast<size_t>(i)] = row[i];
  } else {
    const uint16_t* row = x.data_as<const uint16_t>() + r * x.stride(0);
    for (int64_t i = 0; i < k; ++i) out[static_cast<size_t>(i)] = bf16_to_float(row[i]);
  }
}

void check_gemm(const TensorView& x, const TensorView& w, const TensorView& y, DType w_dtype) {
  MS_CHECK(x.dtype() == DType::kF32 || x.dtype() == DType::kBF16);
  MS_CHECK(w.dtype() == w_dtype && y.dtype() == DType::kF32);
  MS_CHECK(x.rank() == 2 && w.rank() == 2 && y.rank() == 2);
  MS_CHECK(x.stride(1) == 1 && y.stride(1) == 1 && w.is_contiguous());
  MS_CHECK_MSG(w.dim(1) == x.dim(1) && y.dim(0) == x.dim(0) && y.dim(1) == w.dim(0) &&
                   x.dim(1) % kBlock == 0,
               "gemm shapes x{} w{} y{}", x.shape().to_string(), w.shape().to_string(),
               y.shape().to_string());
}

// y = x · W^T given W decoded to doubles [N,K].
void gemm_decoded(const TensorView& x, const std::vector<double>& w, int64_t n,
                  const TensorView& y) {
  const int64_t m = x.dim(0);
  const int64_t k = x.dim(1);
#pragma omp parallel for schedule(static) if (m * n * k > (1 << 20))
  for (int64_t i = 0; i < m; ++i) {
    std::vector<double> xr;
    load_row(x, i, xr);
    float* yr = y.data_as<float>() + i * y.stride(0);
    for (int64_t j = 0; j < n; ++j) {
      const double* wr = w.data() + j * k;
      double acc = 0.0;
      for (int64_t kk = 0; kk < k; ++kk) acc += xr[static_cast<size_t>(kk)] * wr[kk];
      yr[j] = static_cast<float>(acc);
    }
  }
}

}  // namespace

void fp8_block_gemm(TensorView x, TensorView w, TensorView w_scale, TensorView y) {
  check_gemm(x, w, y, DType::kF8E4M3);
  const int64_t n = w.dim(0);
  const int64_t k = w.dim(1);
  const int64_t kb = k / kBlock;
  MS_CHECK(w_scale.dtype() == DType::kF8E8M0 && w_scale.is_contiguous() &&
           w_scale.numel() == (n + kBlock - 1) / kBlock * kb);
  const uint8_t* codes = w.data_as<const uint8_t>();
  const uint8_t* scales = w_scale.data_as<const uint8_t>();
  std::vector<double> decoded(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      decoded[static_cast<size_t>(r * k + c)] =
          static_cast<double>(e4m3_to_float(codes[r * k + c])) *
          ue8m0_to_float(scales[(r / kBlock) * kb + c / kBlock]);
    }
  }
  gemm_decoded(x, decoded, n, y);
}

void mxfp4_gemm(TensorView x, TensorView w, TensorView w_scale, TensorView y) {
  check_gemm(x, w, y, DType::kFp4E2m1);
  const int64_t n = w.dim(0);
  const int64_t k = w.dim(1);
  const int64_t kb = k / kBlock;
  MS_CHECK(w_scale.dtype() == DType::kF8E8M0 && w_scale.is_contiguous() &&
           w_scale.numel() == n * kb);
  const uint8_t* packed = w.data_as<const uint8_t>();
  const uint8_t* scales = w_scale.data_as<const uint8_t>();
  std::vector<double> decoded(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const uint8_t byte = packed[(r * k + c) / 2];
      const uint8_t nibble = c % 2 == 0 ? e2m1_low(byte) : e2m1_high(byte);
      decoded[static_cast<size_t>(r * k + c)] =
          static_cast<double>(e2m1_to_float(nibble)) * ue8m0_to_float(scales[r * kb + c / kBlock]);
    }
  }
  gemm_decoded(x, decoded, n, y);
}

void moe_router(TensorView x, TensorView gate_weight, TensorView bias,
                const MoeRouterConfig& config, TensorView topk_ids, TensorView topk_weights) {
  MS_CHECK(x.dtype() == DType::kF32 && gate_weight.dtype() == DType::kF32 && x.rank() == 2 &&
           x.stride(1) == 1);
  MS_CHECK(gate_weight.is_contiguous() && gate_weight.dim(1) == x.dim(1));
  const int64_t t_count = x.dim(0);
  const int64_t hidden = x.dim(1);
  const int64_t experts = gate_weight.dim(0);
  const int k = config.top_k;
  MS_CHECK(k >= 1 && k <= experts);
  MS_CHECK(bias.empty() || (bias.dtype() == DType::kF32 && bias.numel() == experts));
  MS_CHECK(topk_ids.dtype() == DType::kI32 && topk_ids.is_contiguous() &&
           topk_ids.numel() == t_count * k);
  MS_CHECK(topk_weights.dtype() == DType::kF32 && topk_weights.is_contiguous() &&
           topk_weights.numel() == t_count * k);
  const float* w = gate_weight.data_as<const float>();
  const float* b = bias.empty() ? nullptr : bias.data_as<const float>();
#pragma omp parallel for schedule(static) if (t_count > 4)
  for (int64_t t = 0; t < t_count; ++t) {
    const float* xr = x.data_as<const float>() + t * x.stride(0);
    std::vector<double> score(static_cast<size_t>(experts));
    std::vector<double> select(static_cast<size_t>(experts));
    for (int64_t e = 0; e < experts; ++e) {
      double dot = 0.0;
      for (int64_t i = 0; i < hidden; ++i) dot += static_cast<double>(xr[i]) * w[e * hidden + i];
      const double z = dot / config.temperature;
      const double softplus = z > 20.0 ? z : std::log1p(std::exp(z));
      score[static_cast<size_t>(e)] = std::sqrt(softplus);
      select[static_cast<size_t>(e)] = score[static_cast<size_t>(e)] + (b ? b[e] : 0.0f);
    }
    std::vector<int32_t> ids;
    double sum = 0.0;
    for (int j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < experts; ++e) {
        if (std::isinf(select[static_cast<size_t>(e)])) continue;
        if (best < 0 || select[static_cast<size_t>(e)] > select[static_cast<size_t>(best)])
          best = e;
      }
      ids.push_back(static_cast<int32_t>(best));
      sum += score[static_cast<size_t>(best)];
      select[static_cast<size_t>(best)] = -INFINITY;
    }
    for (int j = 0; j < k; ++j) {
      topk_ids.data_as<int32_t>()[t * k + j] = ids[static_cast<size_t>(j)];
      topk_weights.data_as<float>()[t * k + j] =
          static_cast<float>(score[static_cast<size_t>(ids[static_cast<size_t>(j)])] /
                             (sum + 1e-20) * config.route_scale);
    }
  }
}

void argmax_rows(TensorView logits, TensorView out) {
  MS_CHECK(logits.dtype() == DType::kF32 && logits.rank() == 2 && logits.stride(1) == 1);
  MS_CHECK(out.dtype() == DType::kI32 && out.is_contiguous() && out.numel() == logits.dim(0));
  const int64_t cols = logits.dim(1);
  for (int64_t r = 0; r < logits.dim(0); ++r) {
    const float* row = logits.data_as<const float>() + r * logits.stride(0);
    int64_t best = 0;
    for (int64_t c = 1; c < cols; ++c) {
      if (row[c] > row[best]) best = c;
    }
    out.data_as<int32_t>()[r] = static_cast<int32_t>(best);
  }
}

}  // namespace moeserve::cpu
