#include "model/model_stats.h"

namespace moeserve {

int64_t ModelStats::total_params() const {
  int64_t n = 0;
  for (int64_t p : params) n += p;
  return n;
}

int64_t ModelStats::backbone_params() const {
  return param(ParamGroup::kEmbedHead) + param(ParamGroup::kBackbone) +
         param(ParamGroup::kRoutedExperts) + param(ParamGroup::kEngramProj);
}

ModelStats compute_model_stats(const ModelConfig& c) {
  ModelStats st;
  const int64_t D = c.hidden_size;
  for (const WeightSpec& s : weight_specs(c)) {
    const int64_t n = s.num_params();
    st.params[static_cast<size_t>(s.group)] += n;
    for (const ExpectedTensor& t : expand_weight_spec(s)) {
      const std::string name(dtype_name(t.dtype));
      st.bytes_by_dtype[name] += t.nbytes();
      st.tensors_by_dtype[name] += 1;
      st.total_bytes += t.nbytes();
      if (t.is_scale) st.scale_bytes += t.nbytes();
      ++st.num_tensors;
    }
    // Active parameters: a routed expert counts k/E of the time; an Engram table contributes the
    // rows gathered per token; the embedding contributes one row.
    int64_t active = n;
    if (s.routed_expert) {
      active = n * c.experts_per_tok_of(s.layer_id) / c.routed_experts_of(s.layer_id);
    } else if (s.group == ParamGroup::kEngramTables) {
      active = static_cast<int64_t>(c.engram_num_hashes()) * c.engram_head_dim;
    } else if (s.name == "embed.weight") {
      active = D;
    }
    const bool draft = s.group == ParamGroup::kDraft || s.group == ParamGroup::kDraftExperts;
    if (draft) {
      st.active_draft += active;
      continue;
    }
    st.active_decode += active;
    const bool encoder_layer = s.layer_id >= 0 && s.layer_id < c.decoder_start_layer();
    if (encoder_layer || s.name == "embed.weight") st.active_prefill += active;
  }
  return st;
}

ModelStats checkpoint_byte_stats(const Checkpoint& checkpoint) {
  ModelStats st;
  for (const Checkpoint::Tensor& t : checkpoint.tensors()) {
    const std::string name(dtype_name(t.dtype));
    st.bytes_by_dtype[name] += t.nbytes;
    st.tensors_by_dtype[name] += 1;
    st.total_bytes += t.nbytes;
    if (t.name.size() > 6 && t.name.compare(t.name.size() - 6, 6, ".scale") == 0)
      st.scale_bytes += t.nbytes;
    ++st.num_tensors;
  }
  return st;
}

}  // namespace moeserve
