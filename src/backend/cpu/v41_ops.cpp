#include "backend/cpu/v41_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <numeric>
#include <span>

#include "common/check.h"
#include "common/fake_quant.h"
#include "common/numeric.h"

namespace moeserve::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

}  // namespace

// ---- RoPE ---------------------------------------------------------------------------------------

std::vector<double> rope_frequencies(double base, int rd, const YarnParams* yarn) {
  MS_CHECK(rd > 0 && rd % 2 == 0);
  const int half = rd / 2;
  std::vector<double> f(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) f[static_cast<size_t>(i)] = std::pow(base, -2.0 * i / rd);
  if (yarn != nullptr) {
    const auto correction_dim = [&](double rotations) {
      return rd *
             std::log(static_cast<double>(yarn->original_max_position) /
                      (rotations * 2.0 * std::numbers::pi)) /
             (2.0 * std::log(base));
    };
    const double low = std::max(std::floor(correction_dim(yarn->beta_fast)), 0.0);
    double high = std::min(std::ceil(correction_dim(yarn->beta_slow)), static_cast<double>(rd - 1));
    if (low == high) high += 0.001;
    for (int i = 0; i < half; ++i) {
      const double smooth = 1.0 - std::clamp((i - low) / (high - low), 0.0, 1.0);
      double& v = f[static_cast<size_t>(i)];
      v = v / yarn->factor * (1.0 - smooth) + v * smooth;
    }
  }
  return f;
}

void rope(float* x, int64_t rows, int64_t row_stride, int heads, int64_t head_stride, int head_dim,
          int rd, const int32_t* pos, const double* freqs, bool inverse) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int h = 0; h < heads; ++h) {
      float* t = x + r * row_stride + h * head_stride + (head_dim - rd);
      for (int i = 0; i < rd / 2; ++i) {
        const double angle = static_cast<double>(pos[r]) * freqs[i];
        const double c = std::cos(angle), s = inverse ? -std::sin(angle) : std::sin(angle);
        const double a = t[2 * i], b = t[2 * i + 1];
        t[2 * i] = static_cast<float>(a * c - b * s);
        t[2 * i + 1] = static_cast<float>(a * s + b * c);
      }
    }
  }
}

// ---- SwiGLU -------------------------------------------------------------------------------------

void swiglu_clamped(const float* gate, int64_t ld_gate, const float* up, int64_t ld_up, float* out,
                    int64_t ld_out, int64_t rows, int64_t cols, float limit,
                    const float* row_weight) {
  for (int64_t r = 0; r < rows; ++r) {
    const double w = row_weight ? row_weight[r] : 1.0;
    for (int64_t c = 0; c < cols; ++c) {
      const double g = std::min(gate[r * ld_gate + c], limit);
      const double u = std::clamp(up[r * ld_up + c], -limit, limit);
      out[r * ld_out + c] = static_cast<float>(g * sigmoid(g) * u * w);
    }
  }
}

// ---- mHC ----------------------------------------------------------------------------------------

void hc_mixes(const float* x, int64_t ldx, int64_t rows, int hc, int64_t dim, const float* fn,
              const float* base, const float* scale, float rms_eps, float hc_eps, int iters,
              float* pre, float* post, float* comb) {
  const int64_t width = hc * dim;
  const int m = (2 + hc) * hc;
  std::vector<double> mix(static_cast<size_t>(m)), c(static_cast<size_t>(hc * hc));
  for (int64_t r = 0; r < rows; ++r) {
    const float* f = x + r * ldx;
    double ss = 0.0;
    for (int64_t i = 0; i < width; ++i) ss += static_cast<double>(f[i]) * f[i];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(width) + rms_eps);
    for (int k = 0; k < m; ++k) {
      const float* row = fn + k * width;
      double acc = 0.0;
      for (int64_t i = 0; i < width; ++i) acc += static_cast<double>(f[i]) * row[i];
      mix[static_cast<size_t>(k)] = acc * inv;
    }
    for (int k = 0; k < hc; ++k) {
      pre[r * hc + k] = static_cast<float>(sigmoid(mix[k] * scale[0] + base[k]) + hc_eps);
      post[r * hc + k] = static_cast<float>(2.0 * sigmoid(mix[hc + k] * scale[1] + base[hc + k]));
    }
    for (int i = 0; i < hc * hc; ++i) c[i] = mix[2 * hc + i] * scale[2] + base[2 * hc + i];
    for (int j = 0; j < hc; ++j) {
      double* row = c.data() + j * hc;
      const double mx = *std::max_element(row, row + hc);
      double sum = 0.0;
      for (int k = 0; k < hc; ++k) sum += (row[k] = std::exp(row[k] - mx));
      for (int k = 0; k < hc; ++k) row[k] = row[k] / sum + hc_eps;
    }
    const auto cols = [&] {
      for (int k = 0; k < hc; ++k) {
        double sum = 0.0;
        for (int j = 0; j < hc; ++j) sum += c[j * hc + k];
        for (int j = 0; j < hc; ++j) c[j * hc + k] /= sum + hc_eps;
      }
    };
    const auto rows_norm = [&] {
      for (int j = 0; j < hc; ++j) {
        double sum = 0.0;
        for (int k = 0; k < hc; ++k) sum += c[j * hc + k];
        for (int k = 0; k < hc; ++k) c[j * hc + k] /= sum + hc_eps;
      }
    };
    cols();
    for (int it = 1; it < iters; ++it) {
      rows_norm();
      cols();
    }
    for (int i = 0; i < hc * hc; ++i) comb[r * hc * hc + i] = static_cast<float>(c[i]);
  }
}

void hc_collapse(const float* x, int64_t rows, int hc, int64_t dim, const float* pre, float* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < dim; ++d) {
      double acc = 0.0;
      for (int k = 0; k < hc; ++k)
        acc += static_cast<double>(pre[r * hc + k]) * x[(r * hc + k) * dim + d];
      out[r * dim + d] = static_cast<float>(acc);
    }
}

void hc_expand(float* x, const float* y, int64_t rows, int hc, int64_t dim, const float* post,
               const float* comb) {
  std::vector<double> in(static_cast<size_t>(hc));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < dim; ++d) {
      for (int j = 0; j < hc; ++j) in[j] = x[(r * hc + j) * dim + d];
      for (int k = 0; k < hc; ++k) {
        double acc = static_cast<double>(post[r * hc + k]) * y[r * dim + d];
        for (int j = 0; j < hc; ++j) acc += comb[(r * hc + j) * hc + k] * in[j];
        x[(r * hc + k) * dim + d] = static_cast<float>(acc);
      }
    }
}

// ---- cache writers ------------------------------------------------------------------------------

void swa_write_fp8(const float* kv, int64_t ld_kv, int64_t rows, int dim, const int32_t* pos,
                   uint8_t* ring, int ring_size) {
  MS_CHECK(dim % 32 == 0);
  const int64_t bytes = swa_row_bytes(dim);
  for (int64_t r = 0; r < rows; ++r) {
    if (static_cast<int64_t>(pos[rows - 1]) - pos[r] >= ring_size) continue;
    uint8_t* rec = ring + (pos[r] % ring_size) * bytes;
    quantize_fp8_block32_pow2(std::span<const float>(kv + r * ld_kv, static_cast<size_t>(dim)),
                              std::span<uint8_t>(rec, static_cast<size_t>(dim)),
                              std::span<uint8_t>(rec + dim, static_cast<size_t>(dim / 32)));
  }
}

void fp4_cache_write(const float* x, int64_t ldx, int64_t rows, int dim, Fp4Record format,
                     uint8_t* cache, int64_t first_entry) {
  const int64_t bytes = fp4_record_bytes(format, dim);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* rec = cache + (first_entry + r) * bytes;
    const std::span<const float> in(x + r * ldx, static_cast<size_t>(dim));
    const std::span<uint8_t> packed(rec, static_cast<size_t>(dim / 2));
    if (format == Fp4Record::kMainBlock16E4m3)
      quantize_fp4_block16_e4m3scale(
          in, packed, std::span<uint8_t>(rec + dim / 2, static_cast<size_t>(dim / 16)));
    else
      quantize_fp4_block32_ue8m0(in, packed,
                                 std::span<uint8_t>(rec + dim / 2, static_cast<size_t>(dim / 32)));
  }
}

void swa_record_to_float(const uint8_t* record, int dim, float* out) {
  dequantize_fp8_block32_pow2(std::span<const uint8_t>(record, static_cast<size_t>(dim)),
                              std::span<const uint8_t>(record + dim, static_cast<size_t>(dim / 32)),
                              std::span<float>(out, static_cast<size_t>(dim)));
}

void fp4_record_to_float(const uint8_t* record, int dim, Fp4Record format, float* out) {
  const std::span<const uint8_t> packed(record, static_cast<size_t>(dim / 2));
  const std::span<float> o(out, static_cast<size_t>(dim));
  if (format == Fp4Record::kMainBlock16E4m3)
    dequantize_fp4_block16_e4m3scale(
        packed, std::span<const uint8_t>(record + dim / 2, static_cast<size_t>(dim / 16)), o);
  else
    dequantize_fp4_block32_ue8m0(
        packed, std::span<const uint8_t>(record + dim / 2, static_cast<size_t>(dim / 32)), o);
}

// ---- compressor ---------------------------------------------------------------------------------

void compressor(const float* kv, const float* gate, int64_t ld, int64_t rows, int dim, int ratio,
                int64_t start_pos, float* state_kv, float* state_gate, const float* norm_weight,
                float eps, float* out) {
  MS_CHECK(ratio >= 1);
  const int64_t j0 = start_pos / ratio;
  const int64_t groups = compressor_groups(start_pos, rows, ratio);
  std::vector<double> lat(static_cast<size_t>(dim));
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t first = (j0 + g) * ratio;
    for (int c = 0; c < dim; ++c) {
      double mx = -std::numeric_limits<double>::infinity();
      const auto kv_at = [&](int64_t p) {
        return p < start_pos ? state_kv[(p % ratio) * dim + c] : kv[(p - start_pos) * ld + c];
      };
      const auto g_at = [&](int64_t p) {
        return p < start_pos ? state_gate[(p % ratio) * dim + c] : gate[(p - start_pos) * ld + c];
      };
      if (ratio == 1) {
        lat[c] = kv_at(first);
        continue;
      }
      for (int t = 0; t < ratio; ++t) mx = std::max<double>(mx, g_at(first + t));
      double den = 0.0, num = 0.0;
      for (int t = 0; t < ratio; ++t) {
        const double e = std::exp(g_at(first + t) - mx);
        den += e;
        num += e * kv_at(first + t);
      }
      lat[c] = num / den;
    }
    double ss = 0.0;
    for (int c = 0; c < dim; ++c) {
      lat[c] = bf16_to_float(float_to_bf16(static_cast<float>(lat[c])));
      ss += lat[c] * lat[c];
    }
    const double inv = 1.0 / std::sqrt(ss / dim + eps);
    for (int c = 0; c < dim; ++c)
      out[g * dim + c] = static_cast<float>(lat[c] * inv * (norm_weight ? norm_weight[c] : 1.0f));
  }
  // Trailing partial group into the state.
  const int64_t end = start_pos + rows;
  for (int64_t p = std::max(start_pos, end / ratio * ratio); p < end; ++p) {
    for (int c = 0; c < dim; ++c) {
      state_kv[(p % ratio) * dim + c] = kv[(p - start_pos) * ld + c];
      if (gate != nullptr) state_gate[(p % ratio) * dim + c] = gate[(p - start_pos) * ld + c];
    }
  }
}

// ---- indexer ------------------------------------------------------------------------------------

void indexer_scores(const float* q, const float* w, int64_t rows, int heads, int head_dim,
                    const uint8_t* keys, int64_t n_keys, const int32_t* pos, int ratio,
                    const int32_t* candidates, int64_t n_cand, float scale, float* scores,
                    int64_t ld) {
  const int64_t rec = index_key_bytes(head_dim);
  const int64_t cols = candidates ? n_cand : n_keys;
  std::vector<float> key(static_cast<size_t>(head_dim));
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t visible = std::min<int64_t>(n_keys, (static_cast<int64_t>(pos[t]) + 1) / ratio);
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t j = candidates ? candidates[t * n_cand + c] : c;
      if (j < 0 || j >= visible) {
        scores[t * ld + c] = kNegInf;
        continue;
      }
      fp4_record_to_float(keys + j * rec, head_dim, Fp4Record::kIndexBlock32Ue8m0, key.data());
      double s = 0.0;
      for (int h = 0; h < heads; ++h) {
        const float* qh = q + (t * heads + h) * head_dim;
        double dot = 0.0;
        for (int d = 0; d < head_dim; ++d) dot += static_cast<double>(qh[d]) * key[d];
        s += static_cast<double>(w[t * heads + h]) * std::max(dot, 0.0);
      }
      scores[t * ld + c] = static_cast<float>(s * scale);
    }
  }
}

void topk_rows(const float* scores, int64_t rows, int64_t n, int64_t ld, int k, int32_t* out_idx,
               float* out_val, int32_t* out_count) {
  std::vector<int32_t> ids;
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = scores + r * ld;
    ids.clear();
    for (int64_t j = 0; j < n; ++j)
      if (s[j] != kNegInf) ids.push_back(static_cast<int32_t>(j));
    const auto better = [&](int32_t a, int32_t b) {
      return s[a] > s[b] || (s[a] == s[b] && a < b);
    };
    const size_t take = std::min(ids.size(), static_cast<size_t>(k));
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(take), ids.end(),
                      better);
    for (int i = 0; i < k; ++i) {
      const bool have = static_cast<size_t>(i) < take;
      out_idx[r * k + i] = have ? ids[i] : -1;
      if (out_val) out_val[r * k + i] = have ? s[ids[i]] : kNegInf;
    }
    if (out_count) out_count[r] = static_cast<int32_t>(take);
  }
}

void block_max_scores(const float* scores, int64_t rows, int64_t n, int64_t ld, int block,
                      const int32_t* pos, int ratio, float* out) {
  const int64_t nb = (n + block - 1) / block;
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t visible = std::min<int64_t>(n, (static_cast<int64_t>(pos[t]) + 1) / ratio);
    for (int64_t b = 0; b < nb; ++b) {
      float m = kNegInf;
      for (int64_t j = b * block; j < std::min(n, (b + 1) * block); ++j)
        m = std::max(m, scores[t * ld + j]);
      out[t * nb + b] = m;
    }
    if (visible > 0) out[t * nb + (visible - 1) / block] = std::numeric_limits<float>::infinity();
  }
}

void blocks_to_candidates(const int32_t* block_ids, int64_t rows, int kb, int block, int64_t n_keys,
                          int32_t* cand) {
  for (int64_t t = 0; t < rows; ++t)
    for (int i = 0; i < kb; ++i)
      for (int e = 0; e < block; ++e) {
        const int32_t b = block_ids[t * kb + i];
        const int64_t j = static_cast<int64_t>(b) * block + e;
        cand[(t * kb + i) * block + e] = b >= 0 && j < n_keys ? static_cast<int32_t>(j) : -1;
      }
}

// ---- sparse attention ---------------------------------------------------------------------------

void sparse_attention(const float* q, int64_t rows, int heads, int head_dim, const uint8_t* swa,
                      const int32_t* swa_idx, int swa_k, const uint8_t* glob,
                      const int32_t* glob_idx, int glob_k, const float* sink, float scale,
                      const int32_t* pos, const double* freqs, int rd, float* out) {
  const int64_t swa_rec = swa_row_bytes(head_dim);
  const int64_t glob_rec = main_entry_bytes(head_dim);
  std::vector<float> keys;
  std::vector<double> logit, acc(static_cast<size_t>(head_dim));
  for (int64_t t = 0; t < rows; ++t) {
    keys.clear();
    std::vector<float> k(static_cast<size_t>(head_dim));
    for (int i = 0; i < swa_k; ++i) {
      const int32_t id = swa_idx[t * swa_k + i];
      if (id < 0) continue;
      swa_record_to_float(swa + id * swa_rec, head_dim, k.data());
      keys.insert(keys.end(), k.begin(), k.end());
    }
    for (int i = 0; i < glob_k; ++i) {
      const int32_t id = glob_idx[t * glob_k + i];
      if (id < 0) continue;
      fp4_record_to_float(glob + id * glob_rec, head_dim, Fp4Record::kMainBlock16E4m3, k.data());
      keys.insert(keys.end(), k.begin(), k.end());
    }
    const int64_t nk = static_cast<int64_t>(keys.size()) / head_dim;
    logit.resize(static_cast<size_t>(nk));
    for (int h = 0; h < heads; ++h) {
      const float* qh = q + (t * heads + h) * head_dim;
      double m = sink[h];
      for (int64_t j = 0; j < nk; ++j) {
        double dot = 0.0;
        for (int d = 0; d < head_dim; ++d)
          dot += static_cast<double>(qh[d]) * keys[j * head_dim + d];
        logit[j] = dot * scale;
        m = std::max(m, logit[j]);
      }
      double den = std::exp(sink[h] - m);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < nk; ++j) {
        const double p = std::exp(logit[j] - m);
        den += p;
        for (int d = 0; d < head_dim; ++d) acc[d] += p * keys[j * head_dim + d];
      }
      float* o = out + (t * heads + h) * head_dim;
      for (int d = 0; d < head_dim; ++d) o[d] = static_cast<float>(acc[d] / den);
    }
    if (freqs != nullptr)
      rope(out + t * heads * head_dim, 1, 0, heads, head_dim, head_dim, rd, pos + t, freqs, true);
  }
}

void swa_window_indices(const int32_t* pos, int64_t rows, int window, int ring_size, int64_t floor,
                        int32_t* idx) {
  for (int64_t t = 0; t < rows; ++t)
    for (int i = 0; i < window; ++i) {
      const int64_t p = static_cast<int64_t>(pos[t]) - i;
      idx[t * window + i] =
          p >= std::max<int64_t>(0, floor) ? static_cast<int32_t>(p % ring_size) : -1;
    }
}

// ---- Engram -------------------------------------------------------------------------------------

void engram_gather(const uint8_t* codes, const uint8_t* scales, int dim, const int64_t* ids,
                   int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* c = codes + ids[i] * dim;
    const uint8_t* s = scales + ids[i] * (dim / 32);
    for (int d = 0; d < dim; ++d)
      out[i * dim + d] = e4m3_to_float(c[d]) * ue8m0_to_float(s[d / 32]);
  }
}

void engram_gate(float* x, const float* key, int64_t ld_key, const float* val, int64_t ld_val,
                 const float* wprod, const uint8_t* is_image, int64_t rows, int hc, int64_t dim,
                 float eps, float* gate_out) {
  for (int64_t t = 0; t < rows; ++t)
    for (int k = 0; k < hc; ++k) {
      float* xk = x + (t * hc + k) * dim;
      const float* kk = key + t * ld_key + k * dim;
      const float* wk = wprod + k * dim;
      double dot = 0.0, sx = 0.0, sk = 0.0;
      for (int64_t d = 0; d < dim; ++d) {
        dot += static_cast<double>(xk[d]) * wk[d] * kk[d];
        sx += static_cast<double>(xk[d]) * xk[d];
        sk += static_cast<double>(kk[d]) * kk[d];
      }
      dot *= 1.0 / std::sqrt(sx / dim + eps) / std::sqrt(sk / dim + eps) /
             std::sqrt(static_cast<double>(dim));
      double g = sigmoid(std::copysign(std::sqrt(std::max(std::abs(dot), 1e-6)), dot));
      if (is_image != nullptr && is_image[t]) g = 0.0;
      if (gate_out) gate_out[t * hc + k] = static_cast<float>(g);
      for (int64_t d = 0; d < dim; ++d)
        xk[d] = static_cast<float>(xk[d] + g * static_cast<double>(val[t * ld_val + d]));
    }
}

// ---- sampling -----------------------------------------------------------------------------------

float sample_uniform(uint64_t seed) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * 0x1p-24f;
}

void sample_rows(const float* logits, int64_t rows, int64_t vocab, int64_t ld, float temperature,
                 int top_k, float top_p, const uint64_t* seeds, int32_t* out) {
  MS_CHECK(top_k >= 1 && top_k <= 2048);
  std::vector<int32_t> idx(static_cast<size_t>(top_k));
  std::vector<float> val(static_cast<size_t>(top_k));
  std::vector<double> cum(static_cast<size_t>(top_k));
  for (int64_t r = 0; r < rows; ++r) {
    int32_t count = 0;
    topk_rows(logits + r * ld, 1, vocab, ld, top_k, idx.data(), val.data(), &count);
    if (temperature <= 0.0f || count <= 1) {
      out[r] = idx[0];
      continue;
    }
    double total = 0.0;
    for (int i = 0; i < count; ++i) {
      total += std::exp((static_cast<double>(val[i]) - val[0]) / temperature);
      cum[i] = total;
    }
    int keep = count;
    for (int i = 0; i < count; ++i)
      if (cum[i] >= top_p * total) {
        keep = i + 1;
        break;
      }
    const double target = static_cast<double>(sample_uniform(seeds[r])) * cum[keep - 1];
    int pick = keep - 1;
    for (int i = 0; i < keep; ++i)
      if (cum[i] > target) {
        pick = i;
        break;
      }
    out[r] = idx[pick];
  }
}

}  // namespace moeserve::cpu
