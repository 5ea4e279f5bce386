#include "model/arch/deepseek_v41_layers.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <numeric>

#include "backend/cpu/cpu_backend.h"
#include "common/check.h"
#include "common/fake_quant.h"
#include "common/numeric.h"

namespace moeserve::arch {

std::vector<float> quantize_activations_mxfp8(std::span<const float> x, int64_t rows, int64_t in) {
  MS_CHECK_EQ(x.size(), static_cast<size_t>(rows * in));
  MS_CHECK_EQ(in % static_cast<int64_t>(kFp8Block), 0);
  // Rows are whole blocks, so one pass over the flat buffer quantises each row on its own.
  std::vector<float> q(x.size());
  fq_fp8_block32_pow2(x, q);
  return q;
}

std::vector<float> linear(const LinearOps& ops, std::span<const float> x, int64_t rows,
                          TensorView w, bool mxfp8_input) {
  const int64_t out = w.dim(0), in = w.dim(1);
  MS_CHECK_EQ(x.size(), static_cast<size_t>(rows * in));
  std::vector<float> y(static_cast<size_t>(rows * out));
  if (rows == 0) return y;
  std::vector<float> xq;
  if (mxfp8_input) {
    xq = quantize_activations_mxfp8(x, rows, in);
    x = xq;
  }
  GemmParams p;
  p.a = TensorView(const_cast<float*>(x.data()), DType::kF32, Shape{rows, in});
  p.b = w;
  p.c = TensorView(y.data(), DType::kF32, Shape{rows, out});
  p.b_transposed = true;
  if (ops.batch_invariant && ops.backend.device().kind == DeviceKind::kCpu) {
    cpu::gemm_reference(p);
  } else {
    ops.backend.gemm(p);
  }
  return y;
}

void rms_norm_rows(std::span<float> x, int64_t rows, int64_t dim, const float* weight, double eps) {
  MS_CHECK_EQ(x.size(), static_cast<size_t>(rows * dim));
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x.data() + r * dim;
    double ss = 0.0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(row[i]) * row[i];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i)
      row[i] = static_cast<float>(row[i] * inv * (weight != nullptr ? weight[i] : 1.0f));
  }
}

void round_to_bf16(std::span<float> x) {
  for (float& v : x) v = bf16_to_float(float_to_bf16(v));
}

Rope::Rope(const ModelConfig& config, RopeKind kind) : rd_(config.qk_rope_head_dim) {
  const bool compress = kind == RopeKind::kCompress;
  const double base = compress ? config.compress_rope_theta : config.rope_theta;
  const int32_t half = rd_ / 2;
  freqs_.resize(static_cast<size_t>(half));
  for (int32_t i = 0; i < half; ++i)
    freqs_[static_cast<size_t>(i)] = std::pow(base, -2.0 * i / rd_);
  const RopeScaling& ys = config.rope_scaling;
  if (compress && ys.enabled) {
    // YaRN (§2.2): correction range from beta_fast/beta_slow, linear ramp over the rd/2 pairs.
    const auto correction_dim = [&](double rotations) {
      return rd_ *
             std::log(static_cast<double>(ys.original_max_position_embeddings) /
                      (rotations * 2.0 * std::numbers::pi)) /
             (2.0 * std::log(base));
    };
    double low = std::max(std::floor(correction_dim(ys.beta_fast)), 0.0);
    double high = std::min(std::ceil(correction_dim(ys.beta_slow)), static_cast<double>(rd_ - 1));
    if (low == high) high += 0.001;
    for (int32_t i = 0; i < half; ++i) {
      const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
      const double smooth = 1.0 - ramp;
      double& f = freqs_[static_cast<size_t>(i)];
      f = f / ys.factor * (1.0 - smooth) + f * smooth;
    }
  }
}

void Rope::apply(float* x, int64_t pos, bool inverse) const {
  for (size_t i = 0; i < freqs_.size(); ++i) {
    const double angle = static_cast<double>(pos) * freqs_[i];
    const double c = std::cos(angle), s = inverse ? -std::sin(angle) : std::sin(angle);
    const double a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = static_cast<float>(a * c - b * s);
    x[2 * i + 1] = static_cast<float>(a * s + b * c);
  }
}

HcCoeffs hc_mixes(const ModelConfig& config, const HcWeights& w, std::span<const float> x,
                  int64_t rows) {
  const int32_t hc = config.hc_mult;
  const int64_t width = static_cast<int64_t>(hc) * config.hidden_size;
  const int32_t m = config.hc_mix_count();
  const double eps = config.hc_eps;
  const float* fn = w.fn.data<float>();
  const float* base = w.base.data<float>();
  const float* scale = w.scale.data<float>();
  HcCoeffs out;
  out.pre.resize(static_cast<size_t>(rows * hc));
  out.post.resize(static_cast<size_t>(rows * hc));
  out.comb.resize(static_cast<size_t>(rows * hc * hc));
  std::vector<double> mix(static_cast<size_t>(m));
  const auto sigmoid = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  for (int64_t r = 0; r < rows; ++r) {
    const float* f = x.data() + r * width;
    double ss = 0.0;
    for (int64_t i = 0; i < width; ++i) ss += static_cast<double>(f[i]) * f[i];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(width) + config.rms_norm_eps);
    for (int32_t k = 0; k < m; ++k) {
      const float* row = fn + static_cast<int64_t>(k) * width;
      double acc = 0.0;
      for (int64_t i = 0; i < width; ++i) acc += static_cast<double>(f[i]) * row[i];
      mix[static_cast<size_t>(k)] = acc * inv;
    }
    double* pre = out.pre.data() + r * hc;
    double* post = out.post.data() + r * hc;
    double* comb = out.comb.data() + r * hc * hc;
    for (int32_t k = 0; k < hc; ++k) {
      pre[k] = sigmoid(mix[static_cast<size_t>(k)] * scale[0] + base[k]) + eps;
      post[k] = 2.0 * sigmoid(mix[static_cast<size_t>(hc + k)] * scale[1] + base[hc + k]);
    }
    for (int32_t i = 0; i < hc * hc; ++i)
      comb[i] = mix[static_cast<size_t>(2 * hc + i)] * scale[2] + base[2 * hc + i];
    // softmax over k (each row j), + eps, then column normalisation: the first Sinkhorn iteration.
    for (int32_t j = 0; j < hc; ++j) {
      double* row = comb + j * hc;
      const double mx = *std::max_element(row, row + hc);
      double sum = 0.0;
      for (int32_t k = 0; k < hc; ++k) sum += (row[k] = std::exp(row[k] - mx));
      for (int32_t k = 0; k < hc; ++k) row[k] = row[k] / sum + eps;
    }
    const auto normalize_cols = [&] {
      for (int32_t k = 0; k < hc; ++k) {
        double sum = 0.0;
        for (int32_t j = 0; j < hc; ++j) sum += comb[j * hc + k];
        for (int32_t j = 0; j < hc; ++j) comb[j * hc + k] /= sum + eps;
      }
    };
    const auto normalize_rows = [&] {
      for (int32_t j = 0; j < hc; ++j) {
        double sum = 0.0;
        for (int32_t k = 0; k < hc; ++k) sum += comb[j * hc + k];
        for (int32_t k = 0; k < hc; ++k) comb[j * hc + k] /= sum + eps;
      }
    };
    normalize_cols();
    for (int32_t it = 1; it < config.hc_sinkhorn_iters; ++it) {
      normalize_rows();
      normalize_cols();
    }
  }
  return out;
}

std::vector<float> hc_collapse(std::span<const float> x, int64_t rows, int32_t hc, int64_t dim,
                               std::span<const double> pre) {
  std::vector<float> out(static_cast<size_t>(rows * dim));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < dim; ++i) {
      double acc = 0.0;
      for (int32_t k = 0; k < hc; ++k)
        acc +=
            pre[static_cast<size_t>(r * hc + k)] * x[static_cast<size_t>((r * hc + k) * dim + i)];
      out[static_cast<size_t>(r * dim + i)] = static_cast<float>(acc);
    }
  }
  return out;
}

void hc_expand(std::span<float> x, int64_t rows, int32_t hc, int64_t dim, std::span<const float> y,
               const HcCoeffs& coeffs) {
  std::vector<double> next(static_cast<size_t>(hc));
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x.data() + r * hc * dim;
    const double* post = coeffs.post.data() + r * hc;
    const double* comb = coeffs.comb.data() + r * hc * hc;
    for (int64_t i = 0; i < dim; ++i) {
      const double yi = y[static_cast<size_t>(r * dim + i)];
      for (int32_t k = 0; k < hc; ++k) {
        double acc = post[k] * yi;
        for (int32_t j = 0; j < hc; ++j) acc += comb[j * hc + k] * xr[j * dim + i];
        next[static_cast<size_t>(k)] = acc;
      }
      for (int32_t k = 0; k < hc; ++k)
        xr[k * dim + i] = static_cast<float>(next[static_cast<size_t>(k)]);
    }
  }
}

std::vector<double> identity_pre(int64_t rows, int32_t hc) {
  std::vector<double> pre(static_cast<size_t>(rows * hc), 0.0);
  for (int64_t r = 0; r < rows; ++r) pre[static_cast<size_t>(r * hc)] = 1.0;
  return pre;
}

std::vector<int32_t> topk_indices(std::span<const double> scores, std::span<const uint8_t> allowed,
                                  int32_t k) {
  std::vector<int32_t> idx;
  idx.reserve(scores.size());
  for (size_t i = 0; i < scores.size(); ++i)
    if (allowed.empty() || allowed[i] != 0) idx.push_back(static_cast<int32_t>(i));
  const size_t kk = std::min(idx.size(), static_cast<size_t>(std::max(k, 0)));
  std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(kk), idx.end(),
                    [&](int32_t a, int32_t b) {
                      const double sa = scores[static_cast<size_t>(a)];
                      const double sb = scores[static_cast<size_t>(b)];
                      if (sa != sb) return sa > sb;
                      return a < b;
                    });
  idx.resize(kk);
  return idx;
}

namespace {

// One SwiGLU expert on `rows` rows; `row_weight` (may be empty) scales h before w2.
std::vector<float> expert_ffn(const LinearOps& ops, const FfnWeights& w, std::span<const float> x,
                              int64_t rows, double limit, std::span<const float> row_weight) {
  std::vector<float> g = linear(ops, x, rows, w.w1);
  const std::vector<float> u = linear(ops, x, rows, w.w3);
  const int64_t inter = w.w1.weight.shape()[0];
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < inter; ++i) {
      const size_t at = static_cast<size_t>(r * inter + i);
      double gv = g[at], uv = u[at];
      if (limit > 0.0) {
        uv = std::clamp(uv, -limit, limit);
        gv = std::min(gv, limit);
      }
      double h = gv / (1.0 + std::exp(-gv)) * uv;
      if (!row_weight.empty()) h *= row_weight[static_cast<size_t>(r)];
      g[at] = static_cast<float>(h);
    }
  }
  return linear(ops, g, rows, w.w2);
}

}  // namespace

std::vector<float> moe_forward(const LinearOps& ops, const ModelConfig& config, const MoeWeights& w,
                               int32_t top_k, std::span<const float> x, int64_t rows,
                               std::span<const uint8_t> is_image, MoeTrace* trace) {
  const int64_t d = config.hidden_size;
  const int32_t e = static_cast<int32_t>(w.experts.size());
  // [rows, E] router logits.
  const std::vector<float> z = linear(ops, x, rows, w.gate);
  std::vector<std::vector<int32_t>> rows_of(static_cast<size_t>(e));
  std::vector<std::vector<float>> weights_of(static_cast<size_t>(e));
  if (trace != nullptr) trace->experts.assign(static_cast<size_t>(rows * top_k), -1);
  std::vector<double> sel(static_cast<size_t>(e));
  std::vector<double> s(static_cast<size_t>(e));
  for (int64_t r = 0; r < rows; ++r) {
    const bool image = !is_image.empty() && is_image[static_cast<size_t>(r)] != 0;
    // NOTE: bias_vl replaces bias for image tokens (§5); draft stages have no bias_vl.
    const float* bias =
        (image && w.bias_vl.numel() > 0) ? w.bias_vl.data<float>() : w.bias.data<float>();
    for (int32_t i = 0; i < e; ++i) {
      const double zi = z[static_cast<size_t>(r * e + i)] / config.gate_temp;
      const double softplus = zi > 0 ? zi + std::log1p(std::exp(-zi)) : std::log1p(std::exp(zi));
      s[static_cast<size_t>(i)] = std::sqrt(softplus);
      sel[static_cast<size_t>(i)] = s[static_cast<size_t>(i)] + bias[i];
    }
    const std::vector<int32_t> chosen = topk_indices(sel, {}, top_k);
    double sum = 0.0;
    for (int32_t c : chosen) sum += s[static_cast<size_t>(c)];
    for (size_t i = 0; i < chosen.size(); ++i) {
      const int32_t c = chosen[i];
      // NOTE: normalised (sum + 1e-20) also for top-1, as the §5 pseudocode (oracle choice 3).
      const double wt =
          config.norm_topk_prob
              ? s[static_cast<size_t>(c)] / (sum + 1e-20) * config.routed_scaling_factor
              : s[static_cast<size_t>(c)] * config.routed_scaling_factor;
      rows_of[static_cast<size_t>(c)].push_back(static_cast<int32_t>(r));
      weights_of[static_cast<size_t>(c)].push_back(static_cast<float>(wt));
      if (trace != nullptr) trace->experts[static_cast<size_t>(r * top_k) + i] = c;
    }
  }
  // NOTE: the swiglu clamp applies to the shared expert too (oracle choice 6).
  std::vector<float> y =
      expert_ffn(ops, w.shared, x, rows, config.swiglu_limit, std::span<const float>{});
  std::vector<float> gathered;
  for (int32_t i = 0; i < e; ++i) {
    const auto& idx = rows_of[static_cast<size_t>(i)];
    if (idx.empty()) continue;
    const int64_t n = static_cast<int64_t>(idx.size());
    gathered.resize(static_cast<size_t>(n * d));
    for (int64_t j = 0; j < n; ++j)
      std::copy_n(x.data() + idx[static_cast<size_t>(j)] * d, d, gathered.data() + j * d);
    const std::vector<float> out =
        expert_ffn(ops, w.experts[static_cast<size_t>(i)], gathered, n, config.swiglu_limit,
                   weights_of[static_cast<size_t>(i)]);
    for (int64_t j = 0; j < n; ++j) {
      float* dst = y.data() + idx[static_cast<size_t>(j)] * d;
      for (int64_t c = 0; c < d; ++c) dst[c] += out[static_cast<size_t>(j * d + c)];
    }
  }
  return y;
}

void attention_row(std::span<const float> q, int32_t heads, int32_t head_dim,
                   std::span<const float> keys, int64_t num_keys, std::span<const float> sink,
                   std::span<float> out) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  std::vector<double> logit(static_cast<size_t>(num_keys));
  std::vector<double> acc(static_cast<size_t>(head_dim));
  for (int32_t h = 0; h < heads; ++h) {
    const float* qh = q.data() + static_cast<int64_t>(h) * head_dim;
    double mx = sink[static_cast<size_t>(h)];
    for (int64_t k = 0; k < num_keys; ++k) {
      const float* kr = keys.data() + k * head_dim;
      double dot = 0.0;
      for (int32_t i = 0; i < head_dim; ++i) dot += static_cast<double>(qh[i]) * kr[i];
      logit[static_cast<size_t>(k)] = dot * scale;
      mx = std::max(mx, logit[static_cast<size_t>(k)]);
    }
    // The sink only enlarges the denominator.
    double denom = std::exp(sink[static_cast<size_t>(h)] - mx);
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t k = 0; k < num_keys; ++k) {
      const double p = std::exp(logit[static_cast<size_t>(k)] - mx);
      denom += p;
      const float* kr = keys.data() + k * head_dim;
      for (int32_t i = 0; i < head_dim; ++i) acc[static_cast<size_t>(i)] += p * kr[i];
    }
    float* oh = out.data() + static_cast<int64_t>(h) * head_dim;
    for (int32_t i = 0; i < head_dim; ++i)
      oh[i] = static_cast<float>(acc[static_cast<size_t>(i)] / denom);
  }
}

std::vector<float> output_projection(const LinearOps& ops, const ModelConfig& config,
                                     const AttentionWeights& w, std::span<const float> o,
                                     int64_t rows) {
  const int32_t groups = config.o_groups;
  const int64_t width = static_cast<int64_t>(config.num_attention_heads) * config.head_dim;
  const int64_t group_in = width / groups, group_out = config.o_lora_rank;
  std::vector<float> og(static_cast<size_t>(rows * group_in));
  std::vector<float> mid(static_cast<size_t>(rows * groups * group_out));
  for (int32_t g = 0; g < groups; ++g) {
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(o.data() + r * width + g * group_in, group_in, og.data() + r * group_in);
    const std::vector<float> part =
        linear(ops, og, rows, w.wo_a.weight.view().slice_rows(g * group_out, (g + 1) * group_out),
               w.wo_a.block_scaled);
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(part.data() + r * group_out, group_out,
                  mid.data() + r * groups * group_out + g * group_out);
  }
  return linear(ops, mid, rows, w.wo_b);
}

}  // namespace moeserve::arch
