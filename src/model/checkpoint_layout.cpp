#include "model/checkpoint_layout.h"

#include <cmath>

#include <fmt/format.h>

namespace moeserve {

std::string_view param_group_name(ParamGroup group) {
  switch (group) {
    case ParamGroup::kEmbedHead:
      return "embed/head/norm";
    case ParamGroup::kBackbone:
      return "backbone dense (attn, norms, mHC, router, shared expert)";
    case ParamGroup::kRoutedExperts:
      return "backbone routed experts";
    case ParamGroup::kEngramTables:
      return "Engram tables";
    case ParamGroup::kEngramProj:
      return "Engram projections (wkv, q/k weights)";
    case ParamGroup::kDraft:
      return "draft dense (mtp.*)";
    case ParamGroup::kDraftExperts:
      return "draft routed experts";
  }
  return "?";
}

int64_t WeightSpec::num_params() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

int64_t ceil32(int64_t x) { return (x + 31) / 32; }

float inv_sqrt(int64_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); }

class SpecBuilder {
 public:
  explicit SpecBuilder(std::vector<WeightSpec>* out) : out_(out) {}

  void set_context(ParamGroup group, int32_t layer_id) {
    group_ = group;
    layer_id_ = layer_id;
  }

  void add(std::string name, WeightFormat format, std::vector<int64_t> shape, float mean, float std,
           ParamGroup group, bool routed = false, WeightInit init = WeightInit::kNormal) {
    WeightSpec s;
    s.name = std::move(name);
    s.format = format;
    s.shape = std::move(shape);
    s.group = group;
    s.layer_id = layer_id_;
    s.routed_expert = routed;
    s.init = init;
    s.init_mean = mean;
    s.init_std = std;
    out_->push_back(std::move(s));
  }
  void bf16(std::string name, std::vector<int64_t> shape, float mean, float std) {
    add(std::move(name), WeightFormat::kBf16, std::move(shape), mean, std, group_);
  }
  void f32(std::string name, std::vector<int64_t> shape, float mean, float std) {
    add(std::move(name), WeightFormat::kF32, std::move(shape), mean, std, group_);
  }
  void norm(std::string name, int64_t dim) { bf16(std::move(name), {dim}, 1.0f, 0.1f); }
  // Linear weights ~ N(0, 1/fan_in) before quantisation.
  void fp8(std::string name, int64_t out, int64_t in) {
    add(std::move(name), WeightFormat::kFp8Linear, {out, in}, 0.0f, inv_sqrt(in), group_);
  }
  void bf16_linear(std::string name, int64_t out, int64_t in) {
    bf16(std::move(name), {out, in}, 0.0f, inv_sqrt(in));
  }

 private:
  std::vector<WeightSpec>* out_;
  ParamGroup group_ = ParamGroup::kBackbone;
  int32_t layer_id_ = -1;
};

// One block (backbone layer or draft stage), docs/checkpoint_format.md "Every block".
void add_block(const ModelConfig& c, const LayerInfo& info, const std::string& p, SpecBuilder& b) {
  const int64_t D = c.hidden_size, HC = c.hc_mult, H = c.num_attention_heads, hd = c.head_dim;
  const int64_t Q = c.q_lora_rank, G = c.o_groups, O = c.o_lora_rank, I = c.moe_intermediate_size;
  const int64_t M = c.hc_mix_count();
  const ParamGroup dense = info.is_draft ? ParamGroup::kDraft : ParamGroup::kBackbone;
  const ParamGroup experts = info.is_draft ? ParamGroup::kDraftExperts : ParamGroup::kRoutedExperts;
  b.set_context(dense, info.layer_id);
  for (const char* site : {"hc_attn", "hc_ffn"}) {
    b.f32(fmt::format("{}{}_fn", p, site), {M, HC * D}, 0.0f, 0.05f);
    b.add(fmt::format("{}{}_base", p, site), WeightFormat::kF32, {M}, 0.0f, 0.3f, dense, false,
          WeightInit::kHcBase);
    b.f32(fmt::format("{}{}_scale", p, site), {3}, 1.0f, 0.1f);
  }
  b.norm(p + "attn_norm.weight", D);
  b.norm(p + "ffn_norm.weight", D);
  const std::string a = p + "attn.";
  b.fp8(a + "wq_a", Q, D);
  b.norm(a + "q_norm.weight", Q);
  b.fp8(a + "wq_b", H * hd, Q);
  b.fp8(a + "wkv", hd, D);
  b.norm(a + "kv_norm.weight", hd);
  b.fp8(a + "wo_a", G * O, H * hd / G);
  b.fp8(a + "wo_b", D, G * O);
  b.f32(a + "attn_sink", {H}, 0.0f, 0.1f);
  if (info.is_kv_source) {
    b.bf16_linear(a + "compressor.wkv.weight", hd, D);
    if (info.ratio > 1) b.bf16_linear(a + "compressor.wgate.weight", hd, D);
    b.norm(a + "compressor.norm.weight", hd);
    b.bf16_linear(a + "indexer.wk.weight", c.index_head_dim, hd);
    b.norm(a + "indexer.k_norm.weight", c.index_head_dim);
  }
  if (info.is_index_source) {
    b.fp8(a + "indexer.wq_b", static_cast<int64_t>(c.index_n_heads) * c.index_head_dim, Q);
    b.bf16_linear(a + "indexer.weights_proj.weight", c.index_n_heads, D);
  }
  const std::string f = p + "ffn.";
  const int64_t E = c.routed_experts_of(info.layer_id);
  b.bf16_linear(f + "gate.weight", E, D);
  b.f32(f + "gate.bias", {E}, 0.0f, 0.05f);
  if (!info.is_draft) b.f32(f + "gate.bias_vl", {E}, 0.0f, 0.05f);
  for (int64_t e = 0; e < E; ++e) {
    const std::string x = fmt::format("{}experts.{}.", f, e);
    b.add(x + "w1", WeightFormat::kMxfp4Linear, {I, D}, 0.0f, inv_sqrt(D), experts, true);
    b.add(x + "w2", WeightFormat::kMxfp4Linear, {D, I}, 0.0f, inv_sqrt(I), experts, true);
    b.add(x + "w3", WeightFormat::kMxfp4Linear, {I, D}, 0.0f, inv_sqrt(D), experts, true);
  }
  b.fp8(f + "shared_experts.w1", I, D);
  b.fp8(f + "shared_experts.w2", D, I);
  b.fp8(f + "shared_experts.w3", I, D);
}

}  // namespace

std::vector<WeightSpec> weight_specs(const ModelConfig& c) {
  std::vector<WeightSpec> out;
  SpecBuilder b(&out);
  const int64_t D = c.hidden_size, V = c.vocab_size;
  b.set_context(ParamGroup::kEmbedHead, -1);
  b.bf16("embed.weight", {V, D}, 0.0f, 1.0f);
  b.bf16_linear("head.weight", V, D);
  b.norm("norm.weight", D);
  for (int32_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerInfo& info = c.layer(l);
    const std::string p = fmt::format("layers.{}.", l);
    add_block(c, info, p, b);
    if (const EngramLayer* e = c.engram_for_layer(l)) {
      const std::string g = p + "engram.";
      b.set_context(ParamGroup::kEngramTables, l);
      b.add(g + "table", WeightFormat::kFp8RowTable, {e->num_embeddings, c.engram_head_dim}, 0.0f,
            1.0f, ParamGroup::kEngramTables);
      b.set_context(ParamGroup::kEngramProj, l);
      const int64_t NE = c.engram_embed_dim();
      b.add(g + "wkv", WeightFormat::kFp8Linear, {D * (c.hc_mult + 1), NE}, 0.0f, inv_sqrt(NE),
            ParamGroup::kEngramProj);
      b.bf16(g + "q_weight", {c.hc_mult, D}, 1.0f, 0.3f);
      b.bf16(g + "k_weight", {c.hc_mult, D}, 1.0f, 0.3f);
    }
  }
  for (int32_t s = 0; s < c.num_nextn_predict_layers; ++s) {
    const LayerInfo& info = c.layer(c.num_hidden_layers + s);
    const std::string p = fmt::format("mtp.{}.", s);
    add_block(c, info, p, b);
    b.set_context(ParamGroup::kDraft, info.layer_id);
    if (s == 0) {
      const int64_t taps = static_cast<int64_t>(c.dspark_target_layer_ids.size());
      b.fp8(p + "main_proj", D, taps * D);
      b.norm(p + "main_norm.weight", D);
    }
    if (s == c.num_nextn_predict_layers - 1) {
      const int64_t R = c.dspark_markov_rank;
      b.norm(p + "norm.weight", D);
      b.bf16(p + "markov_head.embed.weight", {V, R}, 0.0f, 1.0f);
      b.bf16(p + "markov_head.head.weight", {V, R}, 0.0f, inv_sqrt(R));
      b.bf16(p + "confidence_head.proj.weight", {1, D + R}, 0.0f, 0.02f);
    }
  }
  return out;
}

std::vector<ExpectedTensor> expand_weight_spec(const WeightSpec& s) {
  auto shape = [](std::initializer_list<int64_t> d) { return Shape(d); };
  switch (s.format) {
    case WeightFormat::kBf16:
      return {{s.name, DType::kBF16, Shape(std::span<const int64_t>(s.shape)), false}};
    case WeightFormat::kF32:
      return {{s.name, DType::kF32, Shape(std::span<const int64_t>(s.shape)), false}};
    case WeightFormat::kFp8Linear:
      return {{s.name + ".weight", DType::kF8E4M3, shape({s.shape[0], s.shape[1]}), false},
              {s.name + ".scale", DType::kF8E8M0, shape({ceil32(s.shape[0]), ceil32(s.shape[1])}),
               true}};
    case WeightFormat::kMxfp4Linear:
      return {{s.name + ".weight", DType::kI8, shape({s.shape[0], s.shape[1] / 2}), false},
              {s.name + ".scale", DType::kF8E8M0, shape({s.shape[0], ceil32(s.shape[1])}), true}};
    case WeightFormat::kFp8RowTable:
      return {{s.name + ".weight", DType::kF8E4M3, shape({s.shape[0], s.shape[1]}), false},
              {s.name + ".scale", DType::kF8E8M0, shape({s.shape[0], ceil32(s.shape[1])}), true}};
  }
  return {};
}

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& config) {
  std::vector<ExpectedTensor> out;
  for (const WeightSpec& s : weight_specs(config))
    for (ExpectedTensor& t : expand_weight_spec(s)) out.push_back(std::move(t));
  return out;
}

}  // namespace moeserve
