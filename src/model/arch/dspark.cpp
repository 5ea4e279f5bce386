#include "model/arch/dspark.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"
#include "common/fake_quant.h"

namespace moeserve::arch {

namespace {

// kv = fq_fp8(rope(kv_norm(wkv(x))))  [n, hd] as FP8 rows + their dequantised values.
void window_kv(const LinearOps& ops, const ModelConfig& c, const AttentionWeights& w,
               const Rope& rope, std::span<const float> x, std::span<const int32_t> positions,
               std::vector<float>& kv, std::vector<uint8_t>& bytes) {
  const int64_t n = static_cast<int64_t>(positions.size());
  const int64_t hd = c.head_dim, rd = c.qk_rope_head_dim;
  const size_t row_bytes = static_cast<size_t>(hd + hd / 32);
  kv = linear(ops, x, n, w.wkv);
  rms_norm_rows(kv, n, hd, w.kv_norm.data<float>(), c.rms_norm_eps);
  bytes.assign(static_cast<size_t>(n) * row_bytes, 0);
  for (int64_t r = 0; r < n; ++r) {
    float* row = kv.data() + r * hd;
    rope.apply(row + hd - rd, positions[static_cast<size_t>(r)]);
    // NOTE: V4.1 rule for the draft window (§6.1 chosen behaviour): fq_fp8 block 32 over all
    // channels incl. the RoPE tail.
    const std::span<uint8_t> b =
        std::span<uint8_t>(bytes).subspan(static_cast<size_t>(r) * row_bytes, row_bytes);
    quantize_fp8_block32_pow2(std::span<const float>(row, static_cast<size_t>(hd)),
                              b.first(static_cast<size_t>(hd)), b.subspan(static_cast<size_t>(hd)));
    dequantize_fp8_block32_pow2(b.first(static_cast<size_t>(hd)),
                                b.subspan(static_cast<size_t>(hd)),
                                std::span<float>(row, static_cast<size_t>(hd)));
  }
}

}  // namespace

DSparkDraft::DSparkDraft(const DeepseekV41Model& model)
    : model_(model),
      config_(model.config()),
      weights_(*model.weights().dspark),
      rope_main_(model.config(), RopeKind::kMain) {
  stats_.stage_calls.assign(weights_.stages.size(), 0);
}

Status DSparkDraft::commit(SequenceState& state, std::span<const int32_t> positions,
                           std::span<const float> main_hidden) {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size;
  const int64_t n = static_cast<int64_t>(positions.size());
  const int64_t width = static_cast<int64_t>(c.dspark_target_layer_ids.size()) * d;
  if (main_hidden.size() != static_cast<size_t>(n * width))
    return make_error(ErrorCode::kInvalidArgument, "dspark commit: {} values for {} rows of {}",
                      main_hidden.size(), n, width);
  if (n == 0) return ok_status();
  for (int64_t i = 1; i < n; ++i)
    if (positions[static_cast<size_t>(i)] != positions[0] + i)
      return make_error(ErrorCode::kInvalidArgument, "dspark commit: positions not consecutive");
  int32_t begin = state.dspark_begin(), end = state.dspark_end();
  if (begin == end) {
    begin = positions[0];
  } else if (positions[0] != end) {
    return make_error(ErrorCode::kInvalidArgument,
                      "dspark commit: position {} does not continue the ring (end {})",
                      positions[0], end);
  }
  // main_x = main_norm(main_proj(main_hidden))  [n, D]
  std::vector<float> main_x = linear(model_.linear_ops(), main_hidden, n, weights_.main_proj);
  rms_norm_rows(main_x, n, d, weights_.main_norm.data<float>(), c.rms_norm_eps);
  std::vector<float> kv;
  std::vector<uint8_t> bytes;
  const size_t row_bytes = static_cast<size_t>(c.head_dim + c.head_dim / 32);
  for (size_t s = 0; s < weights_.stages.size(); ++s) {
    window_kv(model_.linear_ops(), c, weights_.stages[s].attn, rope_main_, main_x, positions, kv,
              bytes);
    for (int64_t r = 0; r < n; ++r)
      std::copy_n(
          bytes.data() + static_cast<size_t>(r) * row_bytes, row_bytes,
          state.dspark_row(static_cast<int32_t>(s), positions[static_cast<size_t>(r)]).data());
  }
  state.set_dspark_range(begin, positions[0] + static_cast<int32_t>(n));
  stats_.committed_rows += n;
  return ok_status();
}

Result<DraftOutput> DSparkDraft::draft(SequenceState& state, int32_t anchor) {
  const ModelConfig& c = config_;
  const ModelWeights& mw = model_.weights();
  const LinearOps& ops = model_.linear_ops();
  const int64_t d = c.hidden_size, hd = c.head_dim, rd = c.qk_rope_head_dim, v = c.vocab_size;
  const int32_t hc = c.hc_mult, heads = c.num_attention_heads;
  const int64_t b = c.dspark_block_size;
  if (anchor < 0 || anchor >= c.vocab_size)
    return make_error(ErrorCode::kOutOfRange, "dspark: anchor {} outside vocab", anchor);
  if (state.dspark_end() == state.dspark_begin())
    return make_error(ErrorCode::kInvalidArgument, "dspark: no committed context");
  DraftOutput out;
  out.anchor = anchor;
  const int32_t first = state.dspark_end();  // the anchor's position
  for (int64_t i = 0; i < b; ++i) out.positions.push_back(first + static_cast<int32_t>(i));
  for (int32_t p = std::max(state.dspark_begin(), state.dspark_end() - c.sliding_window);
       p < state.dspark_end(); ++p)
    out.ctx_positions.push_back(p);
  const int64_t nctx = static_cast<int64_t>(out.ctx_positions.size());

  // X = embed([anchor, noise x (B-1)]) copied to every stream  [B, HC, D]; pre = e0
  std::vector<float> x(static_cast<size_t>(b * hc * d));
  for (int64_t i = 0; i < b; ++i) {
    const int32_t tok = i == 0 ? anchor : c.dspark_noise_token_id;
    for (int32_t k = 0; k < hc; ++k)
      std::copy_n(mw.embed.data<float>() + static_cast<int64_t>(tok) * d, d,
                  x.data() + (i * hc + k) * d);
  }
  std::vector<double> pre = identity_pre(b, hc);
  std::vector<float> keys, kv;
  std::vector<uint8_t> kv_bytes;
  for (size_t s = 0; s < weights_.stages.size(); ++s) {
    const BlockWeights& w = weights_.stages[s];
    const int32_t layer_id = c.num_hidden_layers + static_cast<int32_t>(s);
    ++stats_.stage_calls[s];
    // ---- attention site (window only: ring context + the whole block, no causal mask)
    std::vector<float> a = hc_collapse(x, b, hc, d, pre);
    rms_norm_rows(a, b, d, w.attn_norm.data<float>(), c.rms_norm_eps);
    const HcCoeffs mix_a = hc_mixes(c, w.hc_attn, x, b);
    std::vector<float> qr = linear(ops, a, b, w.attn.wq_a);
    rms_norm_rows(qr, b, c.q_lora_rank, w.attn.q_norm.data<float>(), c.rms_norm_eps);
    std::vector<float> q = linear(ops, qr, b, w.attn.wq_b);  // [B, H, hd]
    for (int64_t i = 0; i < b; ++i)
      for (int32_t h = 0; h < heads; ++h)
        rope_main_.apply(q.data() + (i * heads + h) * hd + hd - rd,
                         out.positions[static_cast<size_t>(i)]);
    window_kv(ops, c, w.attn, rope_main_, a, out.positions, kv, kv_bytes);
    // keys = [ring rows (nctx) ; block rows (B)]  [nctx + B, hd]
    // NOTE: every block query sees the whole ring and all B block rows (oracle choice 8).
    keys.assign(static_cast<size_t>((nctx + b) * hd), 0.0f);
    for (int64_t j = 0; j < nctx; ++j) {
      const auto row =
          state.dspark_row(static_cast<int32_t>(s), out.ctx_positions[static_cast<size_t>(j)]);
      dequantize_fp8_block32_pow2(
          row.first(static_cast<size_t>(hd)), row.subspan(static_cast<size_t>(hd)),
          std::span<float>(keys).subspan(static_cast<size_t>(j * hd), static_cast<size_t>(hd)));
    }
    std::copy(kv.begin(), kv.end(), keys.begin() + nctx * hd);
    std::vector<float> o(static_cast<size_t>(b * heads * hd));
    for (int64_t i = 0; i < b; ++i) {
      const std::span<float> orow = std::span<float>(o).subspan(static_cast<size_t>(i * heads * hd),
                                                                static_cast<size_t>(heads * hd));
      attention_row(std::span<const float>(q).subspan(static_cast<size_t>(i * heads * hd),
                                                      static_cast<size_t>(heads * hd)),
                    heads, static_cast<int32_t>(hd), keys, nctx + b, w.attn.attn_sink.span<float>(),
                    orow);
      for (int32_t h = 0; h < heads; ++h)
        rope_main_.apply(orow.data() + h * hd + hd - rd, out.positions[static_cast<size_t>(i)],
                         true);
    }
    const std::vector<float> y_attn = output_projection(ops, c, w.attn, o, b);
    hc_expand(x, b, hc, d, y_attn, mix_a);
    // ---- FFN site
    const HcCoeffs mix_f = hc_mixes(c, w.hc_ffn, x, b);
    std::vector<float> f = hc_collapse(x, b, hc, d, mix_a.pre);
    rms_norm_rows(f, b, d, w.ffn_norm.data<float>(), c.rms_norm_eps);
    const std::vector<float> y_ffn =
        moe_forward(ops, c, w.moe, c.experts_per_tok_of(layer_id), f, b, {}, nullptr);
    hc_expand(x, b, hc, d, y_ffn, mix_f);
    pre = mix_f.pre;
  }
  // hb = collapse(X, pre)  [B, D];  U = head(norm(hb))  [B, V]
  const std::vector<float> hb = hc_collapse(x, b, hc, d, pre);
  std::vector<float> h = hb;
  rms_norm_rows(h, b, d, weights_.norm.data<float>(), c.rms_norm_eps);
  out.base_logits = linear(ops, h, b, mw.head);
  out.logits = out.base_logits;
  // Markov head (sequential): l_i = U_i + head_w · embed[prev]; confidence on [hb_i; m_i].
  const int64_t rank = c.dspark_markov_rank;
  const float* conf = weights_.confidence.data<float>();
  int32_t prev = anchor;
  for (int64_t i = 0; i < b; ++i) {
    const float* m = weights_.markov_embed.data<float>() + static_cast<int64_t>(prev) * rank;
    float* li = out.logits.data() + i * v;
    for (int64_t t = 0; t < v; ++t) {
      const float* hw = weights_.markov_head.data<float>() + t * rank;
      double acc = 0.0;
      for (int64_t k = 0; k < rank; ++k) acc += static_cast<double>(hw[k]) * m[k];
      li[t] = static_cast<float>(li[t] + acc);
    }
    const int32_t token = static_cast<int32_t>(std::max_element(li, li + v) - li);
    // NOTE: the confidence head reads the un-normalised hb_i (oracle choice 8).
    double z = 0.0;
    for (int64_t k = 0; k < d; ++k)
      z += static_cast<double>(conf[k]) * hb[static_cast<size_t>(i * d + k)];
    for (int64_t k = 0; k < rank; ++k) z += static_cast<double>(conf[d + k]) * m[k];
    out.tokens.push_back(token);
    out.confidences.push_back(static_cast<float>(1.0 / (1.0 + std::exp(-z))));
    ++stats_.markov_steps;
    prev = token;
  }
  return out;
}

}  // namespace moeserve::arch
