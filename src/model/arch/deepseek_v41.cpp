#include "model/arch/deepseek_v41.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/check.h"
#include "common/fake_quant.h"
#include "common/logging.h"
#include "model/checkpoint_validator.h"

namespace moeserve::arch {

// One sequence's forward call in flight. Rows are chunk rows 0..T-1 (position start + row); the
// rows still being computed ("current") are the contiguous suffix [row0, T).
struct DeepseekV41Model::Chunk {
  SequenceState* state = nullptr;
  int32_t start = 0;  // position of chunk row 0
  int32_t num_rows = 0;
  int32_t row0 = 0;  // first current row
  int32_t replay_start = 0;
  bool narrow = false;  // production mode: decoder layers skip rows before replay_start
  std::span<const uint8_t> is_image;
  std::vector<float> x;     // [current rows, HC, D] residual streams
  std::vector<double> pre;  // [current rows, HC] pre-mix of the previous site
  // Per Engram layer hash row ids [T, hashes].
  std::vector<std::vector<int64_t>> engram_ids;
  // Per index-source layer: selected global entries per chunk row.
  std::map<int32_t, std::vector<std::vector<int32_t>>> selected;
  // Candidate mask per chunk row (from the candidate-source layer), over its entries.
  std::vector<std::vector<uint8_t>> candidates;
  std::vector<float> taps;  // [T, taps * D]
  ForwardTrace* trace = nullptr;

  [[nodiscard]] int64_t rows() const { return num_rows - row0; }
  [[nodiscard]] int32_t pos(int64_t current_row) const {
    return start + row0 + static_cast<int32_t>(current_row);
  }
};

Result<std::unique_ptr<DeepseekV41Model>> DeepseekV41Model::load(
    const std::filesystem::path& dir, Backend& backend, std::optional<EngramTokenMap> token_map) {
  MS_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(dir));
  if (config.model_type != "deepseek_v41")
    return make_error(ErrorCode::kInvalidArgument, "{}: model_type '{}' is not deepseek_v41",
                      dir.string(), config.model_type);
  MS_ASSIGN_OR_RETURN(WeightLoader reader, WeightLoader::open(dir));
  // Every missing / mis-typed / mis-shaped tensor at once (docs/checkpoint_format.md), before
  // the per-tensor loads below (which still check what they read).
  const CheckpointValidation validation = validate_checkpoint(config, reader.checkpoint());
  for (const std::string& w : validation.warnings) MS_LOG_WARN("{}: {}", dir.string(), w);
  MS_RETURN_IF_ERROR(validation.to_status(dir.string()));
  MS_ASSIGN_OR_RETURN(ModelWeights weights, load_model_weights(config, reader));
  EngramTokenMap map;
  if (token_map) {
    map = std::move(*token_map);
  } else if (!config.engram_layer_ids.empty()) {
    auto identity = EngramTokenMap::identity(config);
    if (identity) {
      map = std::move(*identity);
    } else {
      // NOTE: a real checkpoint needs the tokenizer-derived map (set_token_map); until then the
      // pad-only map keeps the model loadable and Engram lookups well-defined.
      std::vector<int32_t> pad_only(static_cast<size_t>(config.vocab_size), 0);
      MS_ASSIGN_OR_RETURN(map, EngramTokenMap::from_table(config, std::move(pad_only)));
      MS_LOG_WARN("{}: no Engram token map; Engram hashes use a pad-only map", dir.string());
    }
  }
  return std::make_unique<DeepseekV41Model>(std::move(config), std::move(weights), std::move(map),
                                            backend);
}

DeepseekV41Model::DeepseekV41Model(ModelConfig config, ModelWeights weights,
                                   EngramTokenMap token_map, Backend& backend)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      token_map_(std::move(token_map)),
      backend_(backend),
      ops_{backend, true},
      rope_main_(config_, RopeKind::kMain),
      rope_compress_(config_, RopeKind::kCompress) {
  stats_.engram_calls.assign(config_.engram_layers.size(), 0);
}

std::unique_ptr<SequenceState> DeepseekV41Model::new_state() const {
  return std::make_unique<ContiguousSequenceState>(config_);
}

Result<std::vector<SequenceOutput>> DeepseekV41Model::forward(std::span<const SequenceInput> inputs,
                                                              ForwardMode mode) {
  std::vector<SequenceOutput> outputs;
  outputs.reserve(inputs.size());
  for (const SequenceInput& in : inputs) {
    MS_ASSIGN_OR_RETURN(SequenceOutput out, forward_one(in, mode));
    outputs.push_back(std::move(out));
  }
  return outputs;
}

void DeepseekV41Model::restore_history(SequenceState& state,
                                       std::span<const int32_t> prefix) const {
  // The n-gram history only needs the last max_ngram-1 ids; the position count is the prefix's.
  EngramHistory& h = state.engram_history();
  const size_t keep = std::min(prefix.size(), h.last_ids.size());
  std::fill(h.last_ids.begin(), h.last_ids.end(), -1);
  h.num_tokens = static_cast<int64_t>(prefix.size() - keep);
  advance_engram_history(config_, token_map_, prefix.last(keep), {}, h);
}

Result<SequenceOutput> DeepseekV41Model::forward_one(const SequenceInput& in, ForwardMode mode) {
  const ModelConfig& c = config_;
  if (in.state == nullptr) return make_error(ErrorCode::kInvalidArgument, "forward: no state");
  if (in.tokens.empty()) return make_error(ErrorCode::kInvalidArgument, "forward: no tokens");
  if (!in.is_image.empty() && in.is_image.size() != in.tokens.size())
    return make_error(ErrorCode::kInvalidArgument, "forward: image mask has {} flags for {} tokens",
                      in.is_image.size(), in.tokens.size());
  for (int32_t t : in.tokens)
    if (t < 0 || t >= c.vocab_size)
      return make_error(ErrorCode::kOutOfRange, "forward: token id {} outside vocab {}", t,
                        c.vocab_size);
  SequenceState& state = *in.state;
  const int64_t d = c.hidden_size;
  const int32_t hc = c.hc_mult;
  Chunk ch;
  ch.state = &state;
  ch.start = state.num_tokens();
  ch.num_rows = static_cast<int32_t>(in.tokens.size());
  if (static_cast<int64_t>(ch.start) + ch.num_rows > c.max_position_embeddings)
    return make_error(ErrorCode::kOutOfRange, "forward: position {} beyond max positions {}",
                      ch.start + ch.num_rows, c.max_position_embeddings);
  ch.is_image = in.is_image;
  ch.trace = in.trace;
  if (ch.start == 0) {
    const int32_t prompt = in.prompt_len >= 0 ? in.prompt_len : ch.num_rows;
    state.set_replay_start(mode == ForwardMode::kProduction ? std::max(0, prompt - c.sliding_window)
                                                            : 0);
  }
  ch.replay_start = state.replay_start();
  ch.narrow = mode == ForwardMode::kProduction && ch.replay_start > ch.start;

  // Engram hash ids for the whole chunk, ahead of the layers (§4: a pure function of token ids).
  for (const EngramLayer& el : c.engram_layers) {
    std::vector<int64_t> ids(static_cast<size_t>(ch.num_rows * c.engram_num_hashes()));
    compute_engram_ids(c, el, token_map_, state.engram_history(), in.tokens, in.is_image, ids);
    if (ch.trace != nullptr) ch.trace->engram_ids[el.layer_id] = ids;
    ch.engram_ids.push_back(std::move(ids));
  }

  // Embedding copied into every stream; identity pre-mix.  X: [T, HC, D]
  ch.x.resize(static_cast<size_t>(ch.num_rows * hc * d));
  for (int32_t t = 0; t < ch.num_rows; ++t)
    for (int32_t k = 0; k < hc; ++k)
      std::copy_n(weights_.embed.data<float>() + static_cast<int64_t>(in.tokens[t]) * d, d,
                  ch.x.data() + (static_cast<int64_t>(t) * hc + k) * d);
  ch.pre = identity_pre(ch.num_rows, hc);
  ch.taps.assign(static_cast<size_t>(ch.num_rows) * c.dspark_target_layer_ids.size() * d, 0.0f);

  for (int32_t l = 0; l < c.num_hidden_layers; ++l) run_layer(ch, l);

  SequenceOutput out;
  // Final collapse, norm, head for the requested rows.  h: [n, D] -> logits [n, V]
  int64_t first = 0;
  const int64_t rows = ch.rows();
  if (in.logits == LogitsRows::kLast) first = rows - 1;
  if (in.logits != LogitsRows::kNone && rows > 0) {
    const int64_t n = rows - first;
    std::vector<float> h = hc_collapse(
        std::span<const float>(ch.x).subspan(static_cast<size_t>(first * hc * d)), n, hc, d,
        std::span<const double>(ch.pre).subspan(static_cast<size_t>(first * hc)));
    rms_norm_rows(h, n, d, weights_.norm.data<float>(), c.rms_norm_eps);
    out.logits = linear(ops_, h, n, weights_.head);
    for (int64_t r = first; r < rows; ++r) out.logit_positions.push_back(ch.pos(r));
  }
  if (in.want_main_hidden && !c.dspark_target_layer_ids.empty()) {
    const size_t width = c.dspark_target_layer_ids.size() * static_cast<size_t>(d);
    out.main_hidden.assign(ch.taps.begin() + static_cast<std::ptrdiff_t>(ch.row0 * width),
                           ch.taps.end());
    for (int64_t r = 0; r < rows; ++r) out.main_hidden_positions.push_back(ch.pos(r));
  }
  advance_engram_history(c, token_map_, in.tokens, in.is_image, state.engram_history());
  state.set_num_tokens(ch.start + ch.num_rows);
  for (int32_t l : c.kv_source_layer_ids)
    if (state.compressor_partial(l).rows > 0) ++stats_.compressor_partial_carries;
  if (ch.narrow) ++stats_.narrowed_calls;
  return out;
}

void DeepseekV41Model::run_layer(Chunk& ch, int32_t l) {
  const ModelConfig& c = config_;
  const LayerInfo& info = c.layer(l);
  const BlockWeights& w = weights_.layers[static_cast<size_t>(l)];
  const int64_t d = c.hidden_size;
  const int32_t hc = c.hc_mult;
  const bool boundary = l == c.decoder_start_layer();
  if (boundary && ch.trace != nullptr) {
    ch.trace->encoder_out = ch.x;
    for (int64_t r = 0; r < ch.rows(); ++r) ch.trace->encoder_positions.push_back(ch.pos(r));
  }
  if (info.engram_index >= 0) apply_engram(ch, l);
  if (info.is_dspark_target) {
    // Tap: mean over the streams entering the layer (after Engram, before mHC).  [T, D]
    const auto it =
        std::find(c.dspark_target_layer_ids.begin(), c.dspark_target_layer_ids.end(), l);
    const int64_t slot = it - c.dspark_target_layer_ids.begin();
    const int64_t width = static_cast<int64_t>(c.dspark_target_layer_ids.size()) * d;
    for (int64_t r = 0; r < ch.rows(); ++r)
      for (int64_t i = 0; i < d; ++i) {
        double acc = 0.0;
        for (int32_t k = 0; k < hc; ++k) acc += ch.x[static_cast<size_t>((r * hc + k) * d + i)];
        ch.taps[static_cast<size_t>((ch.row0 + r) * width + slot * d + i)] =
            static_cast<float>(acc / hc);
      }
  }
  ++stats_.layer_mode_calls[static_cast<size_t>(info.mode)];

  // ---- attention site
  // a = attn_norm(collapse(X, pre_prev))  [n, D]
  std::vector<float> a = hc_collapse(ch.x, ch.rows(), hc, d, ch.pre);
  rms_norm_rows(a, ch.rows(), d, w.attn_norm.data<float>(), c.rms_norm_eps);
  if (info.is_kv_source) compress(ch, l, a);
  if (boundary && ch.narrow) {
    // Bounded replay (§2.6): the compressor above saw every row; from here on only rows at or
    // after replay_start are computed.
    const int32_t new_row0 = std::max(ch.row0, std::min(ch.replay_start - ch.start, ch.num_rows));
    const int64_t drop = new_row0 - ch.row0;
    ch.x.erase(ch.x.begin(), ch.x.begin() + drop * hc * d);
    ch.pre.erase(ch.pre.begin(), ch.pre.begin() + drop * hc);
    a.erase(a.begin(), a.begin() + drop * d);
    ch.row0 = new_row0;
  }
  const int64_t n = ch.rows();
  if (ch.trace != nullptr) {
    ch.trace->attn_in[l] = a;
    auto& p = ch.trace->layer_positions[l];
    p.clear();
    for (int64_t r = 0; r < n; ++r) p.push_back(ch.pos(r));
  }
  if (n == 0) return;
  const HcCoeffs mix_a = hc_mixes(c, w.hc_attn, ch.x, n);
  const std::vector<float> y_attn = attention(ch, l, a);  // [n, D]
  hc_expand(ch.x, n, hc, d, y_attn, mix_a);

  // ---- FFN site: f = ffn_norm(collapse(X, pre_a)); X = expand(moe(f), X, post_f, C_f)
  const HcCoeffs mix_f = hc_mixes(c, w.hc_ffn, ch.x, n);
  std::vector<float> f = hc_collapse(ch.x, n, hc, d, mix_a.pre);
  rms_norm_rows(f, n, d, w.ffn_norm.data<float>(), c.rms_norm_eps);
  MoeTrace moe_trace;
  const std::vector<float> y_ffn = moe_forward(
      ops_, c, w.moe, c.experts_per_tok_of(l), f, n,
      ch.is_image.empty() ? ch.is_image : ch.is_image.subspan(static_cast<size_t>(ch.row0)),
      ch.trace != nullptr ? &moe_trace : nullptr);
  hc_expand(ch.x, n, hc, d, y_ffn, mix_f);
  ch.pre = mix_f.pre;
  if (ch.trace != nullptr) {
    ch.trace->experts[l] = std::move(moe_trace.experts);
    ch.trace->layer_out[l] = ch.x;
    ch.trace->attn_out[l] = y_attn;
    ch.trace->ffn_in[l] = f;
    ch.trace->ffn_out[l] = y_ffn;
  }
}

void DeepseekV41Model::apply_engram(Chunk& ch, int32_t l) {
  const ModelConfig& c = config_;
  const LayerInfo& info = c.layer(l);
  const EngramWeights& w = *weights_.layers[static_cast<size_t>(l)].engram;
  const int64_t d = c.hidden_size;
  const int32_t hc = c.hc_mult;
  const int64_t n = ch.rows();
  const int32_t hashes = c.engram_num_hashes();
  ++stats_.engram_calls[static_cast<size_t>(info.engram_index)];
  const std::vector<int64_t>& all_ids = ch.engram_ids[static_cast<size_t>(info.engram_index)];
  // e = table[ids] (FP8 rows dequantised)  [n, NE]
  std::vector<float> e(static_cast<size_t>(n * c.engram_embed_dim()));
  w.table.gather(std::span<const int64_t>(all_ids).subspan(static_cast<size_t>(ch.row0 * hashes),
                                                           static_cast<size_t>(n * hashes)),
                 e);
  // kv = e @ wkv^T  [n, (HC+1) D]: HC keys then the shared value.
  const std::vector<float> kv = linear(ops_, e, n, w.wkv);
  const double eps = c.rms_norm_eps;
  const float* qk = w.qk_weight.data<float>();
  for (int64_t r = 0; r < n; ++r) {
    const bool image = !ch.is_image.empty() && ch.is_image[static_cast<size_t>(ch.row0 + r)] != 0;
    const float* val = kv.data() + (r * (hc + 1) + hc) * d;
    for (int32_t k = 0; k < hc; ++k) {
      float* xs = ch.x.data() + (r * hc + k) * d;
      const float* key = kv.data() + (r * (hc + 1) + k) * d;
      double ss_x = 0.0, ss_k = 0.0, dot = 0.0;
      for (int64_t i = 0; i < d; ++i) {
        ss_x += static_cast<double>(xs[i]) * xs[i];
        ss_k += static_cast<double>(key[i]) * key[i];
        dot += static_cast<double>(xs[i]) * qk[k * d + i] * key[i];
      }
      dot *= 1.0 / std::sqrt(ss_x / d + eps) / std::sqrt(ss_k / d + eps) /
             std::sqrt(static_cast<double>(d));
      // NOTE: copysign, not sign(): dot = ±0 gives ±1e-3 (§4). Image tokens get gate 0.
      const double gate = image ? 0.0
                                : 1.0 / (1.0 + std::exp(-std::copysign(
                                                   std::sqrt(std::max(std::abs(dot), 1e-6)), dot)));
      for (int64_t i = 0; i < d; ++i) xs[i] = static_cast<float>(xs[i] + gate * val[i]);
    }
  }
}

void DeepseekV41Model::compress(Chunk& ch, int32_t l, std::span<const float> a) {
  const ModelConfig& c = config_;
  const LayerInfo& info = c.layer(l);
  const AttentionWeights& w = weights_.layers[static_cast<size_t>(l)].attn;
  const int64_t hd = c.head_dim, id = c.index_head_dim, rd = c.qk_rope_head_dim;
  const int64_t n = ch.rows();
  const int32_t ratio = info.ratio;
  SequenceState& state = *ch.state;
  // kvc = a @ wkv_c^T  [n, hd] (fp32)
  const std::vector<float> kvc = linear(ops_, a, n, w.compressor_wkv);
  std::vector<float> latents;  // [groups, hd]
  std::vector<int64_t> group_ids;
  if (ratio == 1) {
    latents = kvc;
    for (int64_t r = 0; r < n; ++r) group_ids.push_back(ch.pos(r));
    stats_.compressor_groups_ratio1 += n;
  } else {
    // g = a @ wgate^T  [n, hd]; groups of `ratio` consecutive absolute positions, partial groups
    // carried in the state.
    const std::vector<float> g = linear(ops_, a, n, w.compressor_wgate);
    CompressorPartial& part = state.compressor_partial(l);
    for (int64_t r = 0; r < n; ++r) {
      const int32_t p = ch.pos(r);
      MS_CHECK_EQ(p % ratio, part.rows);
      part.kv.insert(part.kv.end(), kvc.begin() + r * hd, kvc.begin() + (r + 1) * hd);
      part.gate.insert(part.gate.end(), g.begin() + r * hd, g.begin() + (r + 1) * hd);
      if (++part.rows < ratio) continue;
      // latent[c] = Σ_t softmax_t(g[t, c]) kv[t, c]  (per-channel softmax over the group)
      for (int64_t ci = 0; ci < hd; ++ci) {
        double mx = -std::numeric_limits<double>::infinity();
        for (int32_t t = 0; t < ratio; ++t) mx = std::max<double>(mx, part.gate[t * hd + ci]);
        double den = 0.0, num = 0.0;
        for (int32_t t = 0; t < ratio; ++t) {
          const double e = std::exp(part.gate[t * hd + ci] - mx);
          den += e;
          num += e * part.kv[t * hd + ci];
        }
        latents.push_back(static_cast<float>(num / den));
      }
      group_ids.push_back(p / ratio);
      part.rows = 0;
      part.kv.clear();
      part.gate.clear();
      ++stats_.compressor_groups_ratio2;
    }
  }
  const int64_t groups = static_cast<int64_t>(group_ids.size());
  if (groups == 0) return;
  // NOTE: the pooled fp32 sum is cast to bf16 before compressor.norm (§2.3); done for ratio 1
  // too (oracle choice 5).
  round_to_bf16(latents);
  rms_norm_rows(latents, groups, hd, w.compressor_norm.data<float>(), c.rms_norm_eps);
  // Index keys: k_norm(wk(latent))  [groups, ID]
  std::vector<float> keys = linear(ops_, latents, groups, w.indexer_wk);
  rms_norm_rows(keys, groups, id, w.indexer_k_norm.data<float>(), c.rms_norm_eps);
  const CacheGeometry geo = CacheGeometry::from_config(c);
  std::vector<uint8_t> main_bytes(geo.main_entry_bytes), index_bytes(geo.index_key_bytes);
  for (int64_t gi = 0; gi < groups; ++gi) {
    const int64_t j = group_ids[static_cast<size_t>(gi)];
    // Encoder replay after a prefix hit: the cached entry of this group is kept (read-only).
    if (j < state.num_global_entries(l)) continue;
    MS_CHECK_EQ(j, state.num_global_entries(l));
    const int64_t rope_pos = j * ratio;  // group j's RoPE position = its first token
    float* lat = latents.data() + gi * hd;
    rope_compress_.apply(lat + hd - rd, rope_pos);
    quantize_fp4_block16_e4m3scale(
        std::span<const float>(lat, static_cast<size_t>(hd)),
        std::span<uint8_t>(main_bytes).first(static_cast<size_t>(hd / 2)),
        std::span<uint8_t>(main_bytes).subspan(static_cast<size_t>(hd / 2)));
    float* key = keys.data() + gi * id;
    rope_compress_.apply(key + id - rd, rope_pos);
    quantize_fp4_block32_ue8m0(
        std::span<const float>(key, static_cast<size_t>(id)),
        std::span<uint8_t>(index_bytes).first(static_cast<size_t>(id / 2)),
        std::span<uint8_t>(index_bytes).subspan(static_cast<size_t>(id / 2)));
    state.append_global_entry(l, main_bytes, index_bytes);
  }
}

void DeepseekV41Model::select_entries(Chunk& ch, int32_t l, std::span<const float> qr,
                                      std::span<const float> a) {
  const ModelConfig& c = config_;
  const LayerInfo& info = c.layer(l);
  const AttentionWeights& w = weights_.layers[static_cast<size_t>(l)].attn;
  const int64_t n = ch.rows();
  const int32_t ih = c.index_n_heads;
  const int64_t id = c.index_head_dim, rd = c.qk_rope_head_dim;
  const int32_t owner = info.kv_owner;
  const int32_t ratio = info.ratio;
  SequenceState& state = *ch.state;
  // qi = fq_fp4(rope(wq_b_idx(qr)))  [n, IH, ID];  weights = weights_proj(a) * IH^-0.5  [n, IH]
  std::vector<float> qi = linear(ops_, qr, n, w.indexer_wq_b);
  for (int64_t r = 0; r < n; ++r)
    for (int32_t h = 0; h < ih; ++h)
      rope_compress_.apply(qi.data() + (r * ih + h) * id + id - rd, ch.pos(r));
  fq_fp4_block32_ue8m0(qi, qi);
  const std::vector<float> head_w = linear(ops_, a, n, w.indexer_weights_proj);
  // Owner's index keys, dequantised once.  [entries, ID]
  const int64_t entries = state.num_global_entries(owner);
  std::vector<float> keys(static_cast<size_t>(entries * id));
  for (int64_t j = 0; j < entries; ++j) {
    const auto bytes = state.index_key(owner, j);
    dequantize_fp4_block32_ue8m0(
        bytes.first(static_cast<size_t>(id / 2)), bytes.subspan(static_cast<size_t>(id / 2)),
        std::span<float>(keys).subspan(static_cast<size_t>(j * id), static_cast<size_t>(id)));
  }
  const bool candidate = info.is_candidate_source;
  const bool reindex = info.mode == LayerMode::kReindex;
  if (candidate) {
    ++stats_.candidate_source_calls;
    ch.candidates.assign(static_cast<size_t>(ch.num_rows), {});
  }
  auto& selected = ch.selected[l];
  selected.assign(static_cast<size_t>(ch.num_rows), {});
  const double inv_sqrt_ih = 1.0 / std::sqrt(static_cast<double>(ih));
  const double inv_sqrt_id = 1.0 / std::sqrt(static_cast<double>(id));
  // NOTE: scores stay in double: rounding them to fp32 creates ties the float64 oracle does not
  // have, and the tie rule then picks a different entry.
  std::vector<double> scores;
  for (int64_t r = 0; r < n; ++r) {
    const int32_t p = ch.pos(r);
    const int64_t visible = (static_cast<int64_t>(p) + 1) / ratio;  // groups complete incl. p
    MS_CHECK_LE(visible, entries);
    // S[j] = Σ_h w[h] relu(qi[h] · k_j) / sqrt(ID)
    scores.assign(static_cast<size_t>(visible), 0.0);
    for (int64_t j = 0; j < visible; ++j) {
      double s = 0.0;
      for (int32_t h = 0; h < ih; ++h) {
        const float* qh = qi.data() + (r * ih + h) * id;
        const float* kj = keys.data() + j * id;
        double dot = 0.0;
        for (int64_t i = 0; i < id; ++i) dot += static_cast<double>(qh[i]) * kj[i];
        s += head_w[static_cast<size_t>(r * ih + h)] * inv_sqrt_ih * std::max(dot, 0.0) *
             inv_sqrt_id;
      }
      scores[static_cast<size_t>(j)] = s;
    }
    const size_t row = static_cast<size_t>(ch.row0 + r);
    if (candidate) {
      // Candidate blocks (§2.4): block score = max over its visible entries; the block holding
      // the newest visible entry is pinned; keep the top candidate_topk_blocks blocks.
      // NOTE: block max over visible entries only and the +inf pin follow the oracle's choice 2.
      const int64_t bs = c.candidate_block_size;
      const int64_t blocks = (visible + bs - 1) / bs;
      std::vector<double> block_score(static_cast<size_t>(blocks),
                                      -std::numeric_limits<double>::infinity());
      for (int64_t j = 0; j < visible; ++j)
        block_score[static_cast<size_t>(j / bs)] =
            std::max(block_score[static_cast<size_t>(j / bs)], scores[static_cast<size_t>(j)]);
      if (blocks > 0)
        block_score[static_cast<size_t>((visible - 1) / bs)] =
            std::numeric_limits<double>::infinity();
      std::vector<uint8_t>& mask = ch.candidates[row];
      mask.assign(static_cast<size_t>(visible), 0);
      for (int32_t b : topk_indices(block_score, {}, c.candidate_topk_blocks))
        for (int64_t j = b * bs; j < std::min<int64_t>((b + 1) * bs, visible); ++j)
          mask[static_cast<size_t>(j)] = 1;
    }
    std::span<const uint8_t> allow;
    if (reindex) {
      MS_CHECK_MSG(ch.candidates.size() == static_cast<size_t>(ch.num_rows) &&
                       ch.candidates[row].size() == static_cast<size_t>(visible),
                   "layer {}: Reindex without a candidate pool", l);
      allow = ch.candidates[row];
    }
    selected[row] = topk_indices(scores, allow, c.index_topk);
  }
  if (ch.trace != nullptr) ch.trace->selected[l] = selected;
}

std::vector<float> DeepseekV41Model::attention(Chunk& ch, int32_t l, std::span<const float> a) {
  const ModelConfig& c = config_;
  const LayerInfo& info = c.layer(l);
  const AttentionWeights& w = weights_.layers[static_cast<size_t>(l)].attn;
  const Rope& rope = info.rope == RopeKind::kMain ? rope_main_ : rope_compress_;
  const int64_t n = ch.rows();
  const int32_t heads = c.num_attention_heads;
  const int64_t hd = c.head_dim, rd = c.qk_rope_head_dim, window = c.sliding_window;
  SequenceState& state = *ch.state;
  // qr = q_norm(wq_a(a))  [n, Q];  q = wq_b(qr)  [n, H, hd], RoPE on the trailing rd channels.
  std::vector<float> qr = linear(ops_, a, n, w.wq_a);
  rms_norm_rows(qr, n, c.q_lora_rank, w.q_norm.data<float>(), c.rms_norm_eps);
  std::vector<float> q = linear(ops_, qr, n, w.wq_b);
  for (int64_t r = 0; r < n; ++r)
    for (int32_t h = 0; h < heads; ++h)
      rope.apply(q.data() + (r * heads + h) * hd + hd - rd, ch.pos(r));
  // kv = fq_fp8(rope(kv_norm(wkv(a))))  [n, hd]: the window K=V rows, kept as FP8 bytes.
  std::vector<float> kv = linear(ops_, a, n, w.wkv);
  rms_norm_rows(kv, n, hd, w.kv_norm.data<float>(), c.rms_norm_eps);
  const CacheGeometry geo = CacheGeometry::from_config(c);
  std::vector<uint8_t> kv_bytes(static_cast<size_t>(n) * geo.swa_row_bytes);
  for (int64_t r = 0; r < n; ++r) {
    float* row = kv.data() + r * hd;
    rope.apply(row + hd - rd, ch.pos(r));
    const std::span<uint8_t> bytes = std::span<uint8_t>(kv_bytes).subspan(
        static_cast<size_t>(r) * geo.swa_row_bytes, geo.swa_row_bytes);
    quantize_fp8_block32_pow2(std::span<const float>(row, static_cast<size_t>(hd)),
                              bytes.first(static_cast<size_t>(hd)),
                              bytes.subspan(static_cast<size_t>(hd)));
    dequantize_fp8_block32_pow2(bytes.first(static_cast<size_t>(hd)),
                                bytes.subspan(static_cast<size_t>(hd)),
                                std::span<float>(row, static_cast<size_t>(hd)));
  }
  if (info.is_index_source) select_entries(ch, l, qr, a);

  // Attention per query row over [SWA window ∪ selected global entries].
  const bool decoder = l >= c.decoder_start_layer();
  const int32_t floor = decoder ? std::max(ch.replay_start, state.swa_floor()) : state.swa_floor();
  const int32_t first_current_pos = ch.pos(0);
  std::vector<float> o(static_cast<size_t>(n * heads * hd));
  std::vector<float> keys;
  const std::vector<std::vector<int32_t>>* sel = nullptr;
  if (info.ratio > 0) sel = &ch.selected.at(info.index_owner);
  for (int64_t r = 0; r < n; ++r) {
    const int32_t p = ch.pos(r);
    keys.clear();
    // NOTE: production decoder layers never computed rows before replay_start, and after a prefix
    // hit no layer has rows before swa_floor: SWA reads are floored there (§2.6).
    for (int32_t kp = std::max({0, p - static_cast<int32_t>(window) + 1, floor}); kp <= p; ++kp) {
      const size_t at = keys.size();
      keys.resize(at + static_cast<size_t>(hd));
      if (kp >= first_current_pos) {
        std::copy_n(kv.data() + (kp - first_current_pos) * hd, hd, keys.data() + at);
      } else {
        const auto bytes = state.swa_row(l, kp);
        dequantize_fp8_block32_pow2(bytes.first(static_cast<size_t>(hd)),
                                    bytes.subspan(static_cast<size_t>(hd)),
                                    std::span<float>(keys).subspan(at, static_cast<size_t>(hd)));
      }
    }
    if (sel != nullptr) {
      for (int32_t j : (*sel)[static_cast<size_t>(ch.row0 + r)]) {
        const size_t at = keys.size();
        keys.resize(at + static_cast<size_t>(hd));
        const auto bytes = state.main_entry(info.kv_owner, j);
        dequantize_fp4_block16_e4m3scale(
            bytes.first(static_cast<size_t>(hd / 2)), bytes.subspan(static_cast<size_t>(hd / 2)),
            std::span<float>(keys).subspan(at, static_cast<size_t>(hd)));
      }
    }
    const std::span<float> orow = std::span<float>(o).subspan(static_cast<size_t>(r * heads * hd),
                                                              static_cast<size_t>(heads * hd));
    attention_row(std::span<const float>(q).subspan(static_cast<size_t>(r * heads * hd),
                                                    static_cast<size_t>(heads * hd)),
                  heads, static_cast<int32_t>(hd), keys, static_cast<int64_t>(keys.size()) / hd,
                  w.attn_sink.span<float>(), orow);
    for (int32_t h = 0; h < heads; ++h)
      rope.apply(orow.data() + h * hd + hd - rd, p, /*inverse=*/true);
  }
  // The chunk's rows enter the ring after every query has read it (a chunk may be longer than
  // the window).
  for (int64_t r = 0; r < n; ++r)
    std::copy_n(kv_bytes.data() + static_cast<size_t>(r) * geo.swa_row_bytes, geo.swa_row_bytes,
                state.swa_row(l, ch.pos(r)).data());

  // Grouped low-rank output: [n, H*hd] -> [n, G*O] -> [n, D]
  return output_projection(ops_, c, w, o, n);
}

double DeepseekV41Model::weight_bytes_per_decode_token() const {
  // fp32 weights as this backend holds them: every dense tensor of every layer, top-k routed
  // experts + the shared expert, embed row, head.
  const ModelConfig& c = config_;
  double bytes = 0.0;
  const auto tensor_bytes = [](const HostTensor& t) {
    return static_cast<double>(t.numel()) * 4.0;
  };
  for (int32_t l = 0; l < c.num_hidden_layers; ++l) {
    const BlockWeights& w = weights_.layers[static_cast<size_t>(l)];
    const AttentionWeights& a = w.attn;
    for (const LinearWeight* t :
         {&a.wq_a, &a.wq_b, &a.wkv, &a.wo_a, &a.wo_b, &a.compressor_wkv, &a.compressor_wgate,
          &a.indexer_wk, &a.indexer_wq_b, &a.indexer_weights_proj, &w.moe.gate, &w.moe.shared.w1,
          &w.moe.shared.w2, &w.moe.shared.w3})
      bytes += tensor_bytes(t->weight);
    bytes += tensor_bytes(w.hc_attn.fn) + tensor_bytes(w.hc_ffn.fn);
    if (!w.moe.experts.empty()) {
      const FfnWeights& e = w.moe.experts.front();
      bytes += c.experts_per_tok_of(l) *
               (tensor_bytes(e.w1.weight) + tensor_bytes(e.w2.weight) + tensor_bytes(e.w3.weight));
    }
    if (w.engram)
      bytes += tensor_bytes(w.engram->wkv.weight) +
               c.engram_num_hashes() * (c.engram_head_dim + c.engram_head_dim / 32.0);
  }
  bytes += tensor_bytes(weights_.head.weight) + c.hidden_size * 4.0;
  return bytes;
}

}  // namespace moeserve::arch
