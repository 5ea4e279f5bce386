#include "model/arch/deepseek_v41_weights.h"

#include <fmt/format.h>

namespace moeserve::arch {

namespace {

Result<FfnWeights> load_ffn(const WeightLoader& r, const std::string& p, int64_t d, int64_t inter) {
  FfnWeights f;
  MS_ASSIGN_OR_RETURN(f.w1, r.load_linear_weight(p + "w1.weight", inter, d));
  MS_ASSIGN_OR_RETURN(f.w3, r.load_linear_weight(p + "w3.weight", inter, d));
  MS_ASSIGN_OR_RETURN(f.w2, r.load_linear_weight(p + "w2.weight", d, inter));
  return f;
}

Result<BlockWeights> load_block(const ModelConfig& c, const WeightLoader& r, const LayerInfo& info,
                                const std::string& p) {
  const int64_t d = c.hidden_size, hd = c.head_dim, h = c.num_attention_heads;
  const int64_t q = c.q_lora_rank, g = c.o_groups, o = c.o_lora_rank;
  const int64_t m = c.hc_mix_count(), hc = c.hc_mult;
  BlockWeights b;
  for (auto [site, w] : {std::pair{"attn", &b.hc_attn}, std::pair{"ffn", &b.hc_ffn}}) {
    MS_ASSIGN_OR_RETURN(w->fn, r.load_dense(fmt::format("{}hc_{}_fn", p, site), {m, hc * d}));
    MS_ASSIGN_OR_RETURN(w->base, r.load_dense(fmt::format("{}hc_{}_base", p, site), {m}));
    MS_ASSIGN_OR_RETURN(w->scale, r.load_dense(fmt::format("{}hc_{}_scale", p, site), {3}));
  }
  MS_ASSIGN_OR_RETURN(b.attn_norm, r.load_dense(p + "attn_norm.weight", {d}));
  MS_ASSIGN_OR_RETURN(b.ffn_norm, r.load_dense(p + "ffn_norm.weight", {d}));
  AttentionWeights& a = b.attn;
  const std::string ap = p + "attn.";
  MS_ASSIGN_OR_RETURN(a.wq_a, r.load_linear_weight(ap + "wq_a.weight", q, d));
  MS_ASSIGN_OR_RETURN(a.q_norm, r.load_dense(ap + "q_norm.weight", {q}));
  MS_ASSIGN_OR_RETURN(a.wq_b, r.load_linear_weight(ap + "wq_b.weight", h * hd, q));
  MS_ASSIGN_OR_RETURN(a.wkv, r.load_linear_weight(ap + "wkv.weight", hd, d));
  MS_ASSIGN_OR_RETURN(a.kv_norm, r.load_dense(ap + "kv_norm.weight", {hd}));
  MS_ASSIGN_OR_RETURN(a.wo_a, r.load_linear_weight(ap + "wo_a.weight", g * o, h * hd / g));
  MS_ASSIGN_OR_RETURN(a.wo_b, r.load_linear_weight(ap + "wo_b.weight", d, g * o));
  MS_ASSIGN_OR_RETURN(a.attn_sink, r.load_dense(ap + "attn_sink", {h}));
  if (info.is_kv_source) {
    MS_ASSIGN_OR_RETURN(a.compressor_wkv,
                        r.load_linear_weight(ap + "compressor.wkv.weight", hd, d));
    if (info.ratio > 1) {
      MS_ASSIGN_OR_RETURN(a.compressor_wgate,
                          r.load_linear_weight(ap + "compressor.wgate.weight", hd, d));
    }
    MS_ASSIGN_OR_RETURN(a.compressor_norm, r.load_dense(ap + "compressor.norm.weight", {hd}));
    MS_ASSIGN_OR_RETURN(a.indexer_wk,
                        r.load_linear_weight(ap + "indexer.wk.weight", c.index_head_dim, hd));
    MS_ASSIGN_OR_RETURN(a.indexer_k_norm,
                        r.load_dense(ap + "indexer.k_norm.weight", {c.index_head_dim}));
  }
  if (info.is_index_source) {
    MS_ASSIGN_OR_RETURN(
        a.indexer_wq_b,
        r.load_linear_weight(ap + "indexer.wq_b.weight",
                             static_cast<int64_t>(c.index_n_heads) * c.index_head_dim, q));
    MS_ASSIGN_OR_RETURN(
        a.indexer_weights_proj,
        r.load_linear_weight(ap + "indexer.weights_proj.weight", c.index_n_heads, d));
  }
  const int64_t e = c.routed_experts_of(info.layer_id);
  const int64_t inter = c.moe_intermediate_size;
  const std::string fp = p + "ffn.";
  MS_ASSIGN_OR_RETURN(b.moe.gate, r.load_linear_weight(fp + "gate.weight", e, d));
  MS_ASSIGN_OR_RETURN(b.moe.bias, r.load_dense(fp + "gate.bias", {e}));
  if (!info.is_draft) {
    MS_ASSIGN_OR_RETURN(b.moe.bias_vl, r.load_dense(fp + "gate.bias_vl", {e}));
  }
  for (int64_t i = 0; i < e; ++i) {
    MS_ASSIGN_OR_RETURN(FfnWeights f, load_ffn(r, fmt::format("{}experts.{}.", fp, i), d, inter));
    b.moe.experts.push_back(std::move(f));
  }
  MS_ASSIGN_OR_RETURN(b.moe.shared, load_ffn(r, fp + "shared_experts.", d, inter));
  if (info.engram_index >= 0) {
    const EngramLayer& el = c.engram_layers[static_cast<size_t>(info.engram_index)];
    const std::string ep = p + "engram.";
    EngramWeights ew;
    const int64_t rows = el.num_embeddings, dim = c.engram_head_dim;
    MS_ASSIGN_OR_RETURN(const Checkpoint::Tensor* tw, r.get(ep + "table.weight"));
    MS_ASSIGN_OR_RETURN(const Checkpoint::Tensor* ts, r.get(ep + "table.scale"));
    if (tw->dtype != DType::kF8E4M3 || !(tw->shape == Shape{rows, dim}))
      return make_error(ErrorCode::kInvalidArgument,
                        "checkpoint tensor '{}table.weight' must be F8_E4M3 [{}, {}]", ep, rows,
                        dim);
    if (ts->dtype != DType::kF8E8M0 || !(ts->shape == Shape{rows, (dim + 31) / 32}))
      return make_error(ErrorCode::kInvalidArgument,
                        "checkpoint tensor '{}table.scale' must be F8_E8M0 [{}, {}]", ep, rows,
                        (dim + 31) / 32);
    ew.table = EngramTable(WeightLoader::bytes(*tw), WeightLoader::bytes(*ts), rows,
                           static_cast<int32_t>(dim), r.keep_alive());
    MS_ASSIGN_OR_RETURN(
        ew.wkv, r.load_linear_weight(ep + "wkv.weight", d * (hc + 1), c.engram_embed_dim()));
    MS_ASSIGN_OR_RETURN(HostTensor qw, r.load_dense(ep + "q_weight", {hc, d}));
    MS_ASSIGN_OR_RETURN(HostTensor kw, r.load_dense(ep + "k_weight", {hc, d}));
    ew.qk_weight = HostTensor(DType::kF32, Shape{hc, d});
    for (int64_t i = 0; i < hc * d; ++i)
      ew.qk_weight.data<float>()[i] = qw.data<float>()[i] * kw.data<float>()[i];
    b.engram = std::move(ew);
  }
  return b;
}

}  // namespace

Result<ModelWeights> load_model_weights(const ModelConfig& c, const WeightLoader& r) {
  ModelWeights w;
  const int64_t v = c.vocab_size, d = c.hidden_size;
  MS_ASSIGN_OR_RETURN(w.embed, r.load_dense("embed.weight", {v, d}));
  MS_ASSIGN_OR_RETURN(w.head, r.load_linear_weight("head.weight", v, d));
  MS_ASSIGN_OR_RETURN(w.norm, r.load_dense("norm.weight", {d}));
  for (int32_t l = 0; l < c.num_hidden_layers; ++l) {
    MS_ASSIGN_OR_RETURN(BlockWeights b, load_block(c, r, c.layer(l), fmt::format("layers.{}.", l)));
    w.layers.push_back(std::move(b));
  }
  const int32_t stages = c.num_nextn_predict_layers;
  if (stages > 0) {
    DSparkWeights ds;
    for (int32_t s = 0; s < stages; ++s) {
      MS_ASSIGN_OR_RETURN(BlockWeights b, load_block(c, r, c.layer(c.num_hidden_layers + s),
                                                     fmt::format("mtp.{}.", s)));
      ds.stages.push_back(std::move(b));
    }
    const int64_t taps = static_cast<int64_t>(c.dspark_target_layer_ids.size());
    const std::string last = fmt::format("mtp.{}.", stages - 1);
    const int64_t rank = c.dspark_markov_rank;
    MS_ASSIGN_OR_RETURN(ds.main_proj, r.load_linear_weight("mtp.0.main_proj.weight", d, taps * d));
    MS_ASSIGN_OR_RETURN(ds.main_norm, r.load_dense("mtp.0.main_norm.weight", {d}));
    MS_ASSIGN_OR_RETURN(ds.norm, r.load_dense(last + "norm.weight", {d}));
    MS_ASSIGN_OR_RETURN(ds.markov_embed,
                        r.load_dense(last + "markov_head.embed.weight", {v, rank}));
    MS_ASSIGN_OR_RETURN(ds.markov_head, r.load_dense(last + "markov_head.head.weight", {v, rank}));
    MS_ASSIGN_OR_RETURN(ds.confidence,
                        r.load_dense(last + "confidence_head.proj.weight", {1, d + rank}));
    w.dspark = std::move(ds);
  }
  return w;
}

}  // namespace moeserve::arch
