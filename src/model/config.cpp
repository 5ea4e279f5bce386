#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/check.h"

namespace moeserve {

using nlohmann::json;

std::string_view layer_mode_name(LayerMode mode) {
  switch (mode) {
    case LayerMode::kSwaOnly:
      return "swa";
    case LayerMode::kFull:
      return "full";
    case LayerMode::kReuse:
      return "reuse";
    case LayerMode::kReindex:
      return "reindex";
  }
  return "?";
}

namespace {

// Reads typed fields from one JSON object and collects every problem (not just the first).
// NOTE: nlohmann::json stays in this file: the rest of the engine sees ModelConfig only.
class FieldReader {
 public:
  FieldReader(const json& obj, std::string prefix, bool flat, std::vector<std::string>* errors)
      : obj_(obj), prefix_(std::move(prefix)), flat_(flat), errors_(errors) {}

  // The JSON value of a field: the flat name when reading the flat layout (falling back to the HF
  // name), else the HF name. nullptr when absent (or JSON null).
  const json* find(std::string_view hf, std::string_view flat_name, std::string* used) const {
    if (flat_ && !flat_name.empty()) {
      auto it = obj_.find(std::string(flat_name));
      if (it != obj_.end() && !it->is_null()) {
        *used = std::string(flat_name);
        return &*it;
      }
    }
    auto it = obj_.find(std::string(hf));
    if (it != obj_.end() && !it->is_null()) {
      *used = std::string(hf);
      return &*it;
    }
    *used = std::string(flat_ && !flat_name.empty() ? flat_name : hf);
    return nullptr;
  }

  bool has(std::string_view hf, std::string_view flat_name = {}) const {
    std::string used;
    return find(hf, flat_name, &used) != nullptr;
  }

  void fail(const std::string& field, const std::string& what) {
    errors_->push_back(prefix_ + field + ": " + what);
  }

  // Integer field >= min_value. `required`: absent is an error; else *out keeps its default.
  template <typename Int>
  void integer(Int* out, std::string_view hf, std::string_view flat_name, bool required,
               int64_t min_value) {
    std::string used;
    const json* v = find(hf, flat_name, &used);
    if (v == nullptr) {
      if (required) fail(used, "missing (required)");
      return;
    }
    const char* expect = min_value > 0    ? "expected a positive integer"
                         : min_value == 0 ? "expected a non-negative integer"
                                          : "expected an integer";
    int64_t value = 0;
    if (v->is_number_integer()) {
      value = v->get<int64_t>();
    } else if (v->is_number_float() && std::isfinite(v->get<double>()) &&
               v->get<double>() == static_cast<double>(static_cast<int64_t>(v->get<double>()))) {
      value = static_cast<int64_t>(v->get<double>());  // 16.0 is accepted as 16
    } else {
      fail(used, fmt::format("{}, got {}", expect, v->dump()));
      return;
    }
    if (value < min_value || value > static_cast<int64_t>(std::numeric_limits<Int>::max())) {
      fail(used, fmt::format("{}, got {}", expect, v->dump()));
      return;
    }
    *out = static_cast<Int>(value);
  }

  void number(double* out, std::string_view hf, std::string_view flat_name, bool required,
              bool positive) {
    std::string used;
    const json* v = find(hf, flat_name, &used);
    if (v == nullptr) {
      if (required) fail(used, "missing (required)");
      return;
    }
    const char* expect = positive ? "expected a positive number" : "expected a non-negative number";
    if (!v->is_number() || !std::isfinite(v->get<double>())) {
      fail(used, fmt::format("{}, got {}", expect, v->dump()));
      return;
    }
    const double value = v->get<double>();
    if (positive ? !(value > 0) : !(value >= 0)) {
      fail(used, fmt::format("{}, got {}", expect, v->dump()));
      return;
    }
    *out = value;
  }

  void boolean(bool* out, std::string_view hf, std::string_view flat_name = {}) {
    std::string used;
    const json* v = find(hf, flat_name, &used);
    if (v == nullptr) return;
    if (!v->is_boolean()) {
      fail(used, fmt::format("expected true or false, got {}", v->dump()));
      return;
    }
    *out = v->get<bool>();
  }

  void string(std::string* out, std::string_view hf, std::string_view flat_name,
              std::initializer_list<std::string_view> allowed) {
    std::string used;
    const json* v = find(hf, flat_name, &used);
    if (v == nullptr) return;
    std::string allowed_text;
    for (std::string_view a : allowed) {
      allowed_text += allowed_text.empty() ? "" : " or ";
      allowed_text += fmt::format("\"{}\"", a);
    }
    if (!v->is_string()) {
      fail(used, fmt::format("expected {}, got {}", allowed.size() ? allowed_text : "a string",
                             v->dump()));
      return;
    }
    const std::string value = v->get<std::string>();
    if (allowed.size() != 0 &&
        std::find(allowed.begin(), allowed.end(), std::string_view(value)) == allowed.end()) {
      fail(used, fmt::format("expected {}, got {}", allowed_text, v->dump()));
      return;
    }
    *out = value;
  }

  template <typename Int>
  void int_list(std::vector<Int>* out, std::string_view hf, std::string_view flat_name,
                bool required, int64_t min_value) {
    std::string used;
    const json* v = find(hf, flat_name, &used);
    if (v == nullptr) {
      if (required) fail(used, "missing (required)");
      return;
    }
    if (!v->is_array()) {
      fail(used, fmt::format("expected a list of integers, got {}", v->dump()));
      return;
    }
    std::vector<Int> values;
    for (size_t i = 0; i < v->size(); ++i) {
      const json& e = (*v)[i];
      if (!e.is_number_integer() || e.get<int64_t>() < min_value ||
          e.get<int64_t>() > static_cast<int64_t>(std::numeric_limits<Int>::max())) {
        fail(fmt::format("{}[{}]", used, i),
             fmt::format("expected {} integer, got {}",
                         min_value > 0 ? "a positive" : "a non-negative", e.dump()));
        return;
      }
      values.push_back(static_cast<Int>(e.get<int64_t>()));
    }
    *out = std::move(values);
  }

  const json& obj() const { return obj_; }
  const std::string& prefix() const { return prefix_; }

 private:
  const json& obj_;
  std::string prefix_;
  bool flat_;
  std::vector<std::string>* errors_;
};

Status join_errors(std::string_view source, const std::vector<std::string>& errors) {
  if (errors.empty()) return ok_status();
  std::string msg = fmt::format("{}: {} problem{} in the model config:", source, errors.size(),
                                errors.size() == 1 ? "" : "s");
  for (const std::string& e : errors) msg += "\n  " + e;
  return make_error(ErrorCode::kInvalidArgument, std::move(msg));
}

std::string list_text(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

bool contains(const std::vector<int32_t>& v, int32_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

bool strictly_increasing(const std::vector<int32_t>& v) {
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] <= v[i - 1]) return false;
  return true;
}

uint64_t mul_mod(uint64_t a, uint64_t b, uint64_t m) {
  return static_cast<uint64_t>(static_cast<unsigned __int128>(a) * b % m);
}

uint64_t pow_mod(uint64_t a, uint64_t d, uint64_t m) {
  uint64_t r = 1;
  a %= m;
  while (d) {
    if (d & 1) r = mul_mod(r, a, m);
    a = mul_mod(a, a, m);
    d >>= 1;
  }
  return r;
}

struct KnownMultipliers {
  int32_t layer_id;
  int32_t compressed_vocab;
  int64_t values[4];
};

// Computed once with numpy by tools/gen_engram_multipliers.py (model.md §4 step 3):
// default_rng(10007*layer_id).integers(0, (INT64_MAX // compressed_vocab)//2, size=4)*2 + 1.
constexpr KnownMultipliers kKnownMultipliers[] = {
    // DeepSeek-V4.1-Flash (engram_compressed_vocab_size 99092), quoted in model.md §4.
    {1, 99092, {76632096046245, 4839876093313, 35959672319349, 73987337458391}},
    {14, 99092, {67716810739261, 51510806800915, 30921347202721, 82619226485591}},
    // §9 tiny config (engram_compressed_vocab_size 256).
    {1, 256, {29662608052400909, 1873410163432121, 13919202536988139, 28638879857136817}},
    {4, 256, {31841131192811251, 1950019090429101, 28509641033320619, 7337012813361983}},
};

}  // namespace

bool is_prime_u64(uint64_t n) {
  if (n < 2) return false;
  static constexpr uint64_t kSmall[] = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37};
  for (uint64_t p : kSmall) {
    if (n % p == 0) return n == p;
  }
  uint64_t d = n - 1;
  int s = 0;
  while ((d & 1) == 0) {
    d >>= 1;
    ++s;
  }
  for (uint64_t a : kSmall) {  // deterministic for every 64-bit n
    uint64_t x = pow_mod(a, d, n);
    if (x == 1 || x == n - 1) continue;
    bool composite = true;
    for (int r = 1; r < s; ++r) {
      x = mul_mod(x, x, n);
      if (x == n - 1) {
        composite = false;
        break;
      }
    }
    if (composite) return false;
  }
  return true;
}

std::vector<std::vector<std::vector<int64_t>>> compute_engram_primes(int32_t num_layers,
                                                                     int32_t max_ngram,
                                                                     int32_t n_heads,
                                                                     int64_t vocab_size) {
  std::set<int64_t> seen;
  std::vector<std::vector<std::vector<int64_t>>> out(static_cast<size_t>(num_layers));
  for (auto& layer : out) {
    for (int32_t n = 2; n <= max_ngram; ++n) {
      int64_t start = vocab_size - 1;
      std::vector<int64_t> heads;
      for (int32_t k = 0; k < n_heads; ++k) {
        int64_t c = start + 1;
        while (seen.count(c) != 0 || !is_prime_u64(static_cast<uint64_t>(c))) ++c;
        seen.insert(c);
        heads.push_back(c);
        start = c;
      }
      layer.push_back(std::move(heads));
    }
  }
  return out;
}

std::optional<std::vector<int64_t>> builtin_engram_multipliers(int32_t layer_id,
                                                               int32_t compressed_vocab,
                                                               int32_t max_ngram) {
  if (max_ngram != 4) return std::nullopt;
  for (const KnownMultipliers& k : kKnownMultipliers) {
    if (k.layer_id == layer_id && k.compressed_vocab == compressed_vocab) {
      return std::vector<int64_t>(std::begin(k.values), std::end(k.values));
    }
  }
  return std::nullopt;
}

const LayerInfo& ModelConfig::layer(int32_t layer_id) const {
  MS_CHECK_MSG(layer_id >= 0 && static_cast<size_t>(layer_id) < layers.size(), "layer {} of {}",
               layer_id, layers.size());
  return layers[static_cast<size_t>(layer_id)];
}

const EngramLayer* ModelConfig::engram_for_layer(int32_t layer_id) const {
  for (const EngramLayer& e : engram_layers)
    if (e.layer_id == layer_id) return &e;
  return nullptr;
}

int32_t ModelConfig::decoder_start_layer() const {
  return candidate_source_layer_id >= 0 ? candidate_source_layer_id : num_hidden_layers;
}

int32_t ModelConfig::routed_experts_of(int32_t layer_id) const {
  return layer_id >= num_hidden_layers ? dspark_n_routed_experts : n_routed_experts;
}

int32_t ModelConfig::experts_per_tok_of(int32_t layer_id) const {
  return layer_id >= num_hidden_layers ? dspark_num_experts_per_tok : num_experts_per_tok;
}

size_t ModelConfig::main_entry_bytes() const {
  return static_cast<size_t>(head_dim / 2 + head_dim / 16);
}

size_t ModelConfig::index_entry_bytes() const {
  return static_cast<size_t>(index_head_dim / 2 + index_head_dim / 32);
}

size_t ModelConfig::swa_row_bytes() const { return static_cast<size_t>(head_dim + head_dim / 32); }

double ModelConfig::global_entries_per_token() const {
  double entries = 0;
  for (int32_t l : kv_source_layer_ids) entries += 1.0 / compress_ratios[static_cast<size_t>(l)];
  return entries;
}

double ModelConfig::global_kv_bytes_per_token() const {
  return static_cast<double>(main_entry_bytes() + index_entry_bytes()) * global_entries_per_token();
}

size_t ModelConfig::swa_ring_bytes_per_request() const {
  return static_cast<size_t>(num_total_layers()) * static_cast<size_t>(sliding_window) *
         swa_row_bytes();
}

Status ModelConfig::finalize(std::string_view prefix_view) {
  const std::string prefix(prefix_view);
  std::vector<std::string> errors;
  auto fail = [&](std::string_view field, const std::string& what) {
    errors.push_back(prefix + std::string(field) + ": " + what);
  };
  const int32_t L = num_hidden_layers;
  const int32_t total = num_total_layers();

  // ---- dims the formats need (32×32 FP8 blocks, MXFP4 K blocks, FP4 cache blocks) -----------
  auto div = [&](std::string_view field, int64_t value, int64_t by, std::string_view why) {
    if (value % by != 0)
      fail(field, fmt::format("{} is not a multiple of {} ({})", value, by, why));
  };
  div("hidden_size", hidden_size, 32, "FP8 32x32 weight blocks");
  div("head_dim", head_dim, 32, "FP8 window KV blocks of 32");
  div("q_lora_rank", q_lora_rank, 32, "FP8 32x32 weight blocks");
  div("moe_intermediate_size", moe_intermediate_size, 32, "MXFP4 scale per 32 along K");
  if (qk_rope_head_dim % 2 != 0 || qk_rope_head_dim > head_dim)
    fail("qk_rope_head_dim",
         fmt::format("{} must be even and <= head_dim {}", qk_rope_head_dim, head_dim));
  if (o_groups > 0 && num_attention_heads % o_groups != 0) {
    fail("o_groups", fmt::format("num_attention_heads {} is not a multiple of o_groups {}",
                                 num_attention_heads, o_groups));
  } else if (o_groups > 0) {
    div("o_groups", static_cast<int64_t>(num_attention_heads) * head_dim / o_groups, 32,
        "wo_a input width H*hd/G must be a multiple of 32");
  }
  if (num_key_value_heads != 1)
    fail("num_key_value_heads",
         fmt::format("expected 1 (one shared K=V latent), got {}", num_key_value_heads));
  if (num_experts_per_tok > n_routed_experts)
    fail("num_experts_per_tok",
         fmt::format("{} > n_routed_experts {}", num_experts_per_tok, n_routed_experts));
  if (n_shared_experts != 1)
    fail("n_shared_experts", fmt::format("expected 1, got {}", n_shared_experts));
  if (hc_mult < 1) fail("hc_mult", "expected a positive integer");
  if (quantization.weight_block_rows != 32 || quantization.weight_block_cols != 32)
    errors.push_back(
        fmt::format("quantization_config.weight_block_size: expected [32, 32], got "
                    "[{}, {}]",
                    quantization.weight_block_rows, quantization.weight_block_cols));

  // ---- compress ratios and CSA2 roles ----------------------------------------------------------
  if (static_cast<int32_t>(compress_ratios.size()) != total) {
    fail("compress_ratios",
         fmt::format("has {} entries, expected num_hidden_layers + num_nextn_predict_layers = "
                     "{} + {} = {}",
                     compress_ratios.size(), L, num_nextn_predict_layers, total));
    return join_errors("config", errors);  // everything below indexes compress_ratios
  }
  for (int32_t s = 0; s < num_nextn_predict_layers; ++s) {
    if (compress_ratios[static_cast<size_t>(L + s)] != 0)
      fail(fmt::format("compress_ratios[{}]", L + s),
           fmt::format("draft stage mtp.{} must have ratio 0, got {}", s,
                       compress_ratios[static_cast<size_t>(L + s)]));
  }
  auto check_ids = [&](std::string_view field, const std::vector<int32_t>& ids) {
    if (!strictly_increasing(ids))
      fail(field, fmt::format("{} must be strictly increasing", list_text(ids)));
    for (int32_t id : ids) {
      if (id < 0 || id >= L) {
        fail(field, fmt::format("layer {} is outside 0..{}", id, L - 1));
      } else if (compress_ratios[static_cast<size_t>(id)] == 0) {
        fail(field, fmt::format("layer {} has compress ratio 0 (SWA only)", id));
      }
    }
  };
  check_ids("kv_source_layer_ids", kv_source_layer_ids);
  check_ids("index_source_layer_ids", index_source_layer_ids);
  for (int32_t id : kv_source_layer_ids) {
    if (!contains(index_source_layer_ids, id))
      fail("index_source_layer_ids",
           fmt::format("KV-source layer {} must also be an index source", id));
  }
  const bool any_compressed = std::any_of(compress_ratios.begin(), compress_ratios.begin() + L,
                                          [](int32_t r) { return r != 0; });
  if (any_compressed) {
    if (kv_source_layer_ids.empty()) fail("kv_source_layer_ids", "empty, but some ratios are > 0");
    if (index_n_heads <= 0) fail("index_n_heads", "must be positive when ratios > 0");
    if (index_head_dim <= 0 || index_head_dim % 32 != 0)
      fail("index_head_dim",
           fmt::format("{} must be a positive multiple of 32 (FP4 index keys)", index_head_dim));
    else if (index_head_dim < qk_rope_head_dim)
      fail("index_head_dim",
           fmt::format("{} < qk_rope_head_dim {}", index_head_dim, qk_rope_head_dim));
    if (index_topk <= 0) fail("index_topk", "must be positive when ratios > 0");
  }
  if (candidate_source_layer_id < 0 && !kv_source_layer_ids.empty())
    candidate_source_layer_id = kv_source_layer_ids.back();
  if (candidate_source_layer_id >= 0 && !contains(kv_source_layer_ids, candidate_source_layer_id))
    fail("candidate_source_layer_id",
         fmt::format("{} is not a KV-source layer {}", candidate_source_layer_id,
                     list_text(kv_source_layer_ids)));
  const bool any_reindex =
      std::any_of(index_source_layer_ids.begin(), index_source_layer_ids.end(),
                  [&](int32_t id) { return !contains(kv_source_layer_ids, id); });
  if (any_reindex && (candidate_topk_blocks <= 0 || candidate_block_size <= 0))
    fail("candidate_topk_blocks",
         "candidate_topk_blocks and candidate_block_size must be positive with Reindex layers");

  layers.assign(static_cast<size_t>(total), LayerInfo{});
  int32_t kv_owner = -1;
  int32_t index_owner = -1;
  for (int32_t l = 0; l < total; ++l) {
    LayerInfo& info = layers[static_cast<size_t>(l)];
    info.layer_id = l;
    info.is_draft = l >= L;
    info.draft_stage = info.is_draft ? l - L : -1;
    info.ratio = compress_ratios[static_cast<size_t>(l)];
    info.rope = info.ratio == 0 ? RopeKind::kMain : RopeKind::kCompress;
    if (info.is_draft || info.ratio == 0) continue;
    info.is_kv_source = contains(kv_source_layer_ids, l);
    info.is_index_source = contains(index_source_layer_ids, l);
    info.is_candidate_source = l == candidate_source_layer_id;
    if (info.is_kv_source) kv_owner = l;
    if (info.is_index_source) index_owner = l;
    info.kv_owner = kv_owner;
    info.index_owner = index_owner;
    info.mode = info.is_kv_source      ? LayerMode::kFull
                : info.is_index_source ? LayerMode::kReindex
                                       : LayerMode::kReuse;
    if (kv_owner < 0) {
      fail("kv_source_layer_ids",
           fmt::format("layer {} has ratio {} but no KV-source layer at or before it", l,
                       info.ratio));
      continue;
    }
    if (info.ratio != compress_ratios[static_cast<size_t>(kv_owner)])
      fail(fmt::format("compress_ratios[{}]", l),
           fmt::format("ratio {} differs from its KV-source layer {} (ratio {})", info.ratio,
                       kv_owner, compress_ratios[static_cast<size_t>(kv_owner)]));
    if (info.mode == LayerMode::kReindex && kv_owner != candidate_source_layer_id)
      fail("index_source_layer_ids",
           fmt::format("Reindex layer {} reads KV source {}, which is not the candidate source "
                       "{}",
                       l, kv_owner, candidate_source_layer_id));
  }

  // ---- DSpark ----------------------------------------------------------------------------------
  if (num_nextn_predict_layers > 0) {
    if (dspark_target_layer_ids.empty()) {
      for (int32_t l = L - 1; l >= 0 && dspark_target_layer_ids.size() < 3; --l)
        if (!contains(kv_source_layer_ids, l))
          dspark_target_layer_ids.insert(dspark_target_layer_ids.begin(), l);
    }
    if (!strictly_increasing(dspark_target_layer_ids))
      fail("dspark_target_layer_ids",
           fmt::format("{} must be strictly increasing", list_text(dspark_target_layer_ids)));
    for (int32_t id : dspark_target_layer_ids) {
      if (id < 0 || id >= L)
        fail("dspark_target_layer_ids", fmt::format("layer {} is outside 0..{}", id, L - 1));
      else
        layers[static_cast<size_t>(id)].is_dspark_target = true;
    }
    if (dspark_n_routed_experts == 0) dspark_n_routed_experts = n_routed_experts;
    if (dspark_num_experts_per_tok == 0) dspark_num_experts_per_tok = num_experts_per_tok;
    if (dspark_num_experts_per_tok > dspark_n_routed_experts)
      fail("dspark_num_experts_per_tok",
           fmt::format("{} > dspark_n_routed_experts {}", dspark_num_experts_per_tok,
                       dspark_n_routed_experts));
    if (dspark_markov_rank <= 0) fail("dspark_markov_rank", "must be positive with draft stages");
    if (dspark_block_size <= 0) fail("dspark_block_size", "must be positive with draft stages");
    if (dspark_noise_token_id < 0 || dspark_noise_token_id >= vocab_size)
      fail("dspark_noise_token_id", fmt::format("{} is outside the vocabulary 0..{}",
                                                dspark_noise_token_id, vocab_size - 1));
  }

  // ---- Engram ----------------------------------------------------------------------------------
  engram_layers.clear();
  if (!engram_layer_ids.empty()) {
    if (!strictly_increasing(engram_layer_ids))
      fail("engram_layer_ids",
           fmt::format("{} must be strictly increasing", list_text(engram_layer_ids)));
    for (int32_t id : engram_layer_ids)
      if (id < 0 || id >= L)
        fail("engram_layer_ids", fmt::format("layer {} is outside 0..{}", id, L - 1));
    if (engram_num_embeddings.size() != engram_layer_ids.size())
      fail("engram_num_embeddings",
           fmt::format("has {} entries, expected one per engram layer ({})",
                       engram_num_embeddings.size(), engram_layer_ids.size()));
    if (engram_max_ngram_size < 2) fail("engram_max_ngram_size", "must be >= 2");
    if (engram_n_heads <= 0) fail("engram_n_heads", "must be positive");
    if (engram_head_dim <= 0 || engram_head_dim % 32 != 0)
      fail("engram_head_dim",
           fmt::format("{} must be a positive multiple of 32 (ue8m0 per 32)", engram_head_dim));
    if (engram_vocab_size < 2) fail("engram_vocab_size", "must be >= 2 (prime search start)");
    if (engram_compressed_vocab_size <= 0) fail("engram_compressed_vocab_size", "must be positive");
    if (engram_pad_id < 0 || engram_pad_id >= vocab_size)
      fail("engram_pad_id", fmt::format("{} is outside the vocabulary", engram_pad_id));
  }
  if (errors.empty() && !engram_layer_ids.empty()) {
    const auto primes =
        compute_engram_primes(static_cast<int32_t>(engram_layer_ids.size()), engram_max_ngram_size,
                              engram_n_heads, engram_vocab_size);
    for (size_t i = 0; i < engram_layer_ids.size(); ++i) {
      EngramLayer e;
      e.layer_id = engram_layer_ids[i];
      e.primes = primes[i];
      int64_t sum = 0;
      for (const auto& order : e.primes)
        for (int64_t p : order) {
          e.offsets.push_back(sum);
          sum += p;
        }
      e.num_embeddings = sum;
      if (sum != engram_num_embeddings[i])
        fail(fmt::format("engram_num_embeddings[{}]", i),
             fmt::format("{} does not match the sum of layer {}'s {} hash primes ({})",
                         engram_num_embeddings[i], e.layer_id, e.offsets.size(), sum));
      layers[static_cast<size_t>(e.layer_id)].engram_index = static_cast<int32_t>(i);
      engram_layers.push_back(std::move(e));
    }
  }
  return join_errors("config", errors);
}

namespace {

Result<ModelConfig> parse_json_object(const json& root, std::string_view source,
                                      ConfigLayout* layout_out) {
  std::vector<std::string> errors;
  ModelConfig c;
  if (!root.is_object())
    return make_error(ErrorCode::kInvalidArgument, "{}: expected a JSON object at the top level",
                      source);

  ConfigLayout layout;
  const json* text = &root;
  std::string prefix;
  if (root.contains("text_config")) {
    layout = ConfigLayout::kHfComposite;
    text = &root["text_config"];
    prefix = "text_config.";
    if (!text->is_object())
      return make_error(ErrorCode::kInvalidArgument, "{}: text_config: expected an object, got {}",
                        source, text->dump());
  } else if (root.contains("hidden_size")) {
    layout = ConfigLayout::kHfText;
  } else {
    layout = ConfigLayout::kFlat;
  }
  if (layout_out != nullptr) *layout_out = layout;
  const bool flat = layout == ConfigLayout::kFlat;

  FieldReader top(root, "", false, &errors);
  FieldReader r(*text, prefix, flat, &errors);

  // model_type: required "deepseek_v41" on the composite root; the text config may say
  // "deepseek_v41_text"; the flat layout has none.
  if (layout == ConfigLayout::kHfComposite) {
    std::string mt;
    top.string(&mt, "model_type", {}, {"deepseek_v41"});
    if (!top.has("model_type")) top.fail("model_type", "missing (required)");
    if (r.has("model_type")) r.string(&mt, "model_type", {}, {"deepseek_v41_text"});
  } else if (layout == ConfigLayout::kHfText) {
    std::string mt;
    if (r.has("model_type")) r.string(&mt, "model_type", {}, {"deepseek_v41", "deepseek_v41_text"});
  }

  // Token ids: text_config first, then the composite root.
  auto token = [&](int32_t* out, std::string_view name) {
    if (r.has(name)) {
      r.integer(out, name, {}, false, 0);
    } else if (layout == ConfigLayout::kHfComposite && top.has(name)) {
      top.integer(out, name, {}, false, 0);
    }
  };
  token(&c.bos_token_id, "bos_token_id");
  token(&c.eos_token_id, "eos_token_id");
  token(&c.pad_token_id, "pad_token_id");
  token(&c.image_token_id, "image_token_id");

  // Quantization: composite/text: quantization_config {quant_method, weight_block_size,
  // scale_fmt, expert_dtype}; flat: dtype, scale_fmt, expert_dtype.
  if (flat) {
    r.string(&c.quantization.quant_method, "dtype", {}, {"fp8"});
    r.string(&c.quantization.scale_fmt, "scale_fmt", {}, {"ue8m0"});
    r.string(&c.quantization.expert_dtype, "expert_dtype", {}, {"fp4"});
  } else {
    const json& qroot = root.contains("quantization_config") ? root : *text;
    if (qroot.contains("quantization_config")) {
      const json& q = qroot["quantization_config"];
      std::string qprefix = (&qroot == &root ? std::string() : prefix) + "quantization_config.";
      if (!q.is_object()) {
        errors.push_back(qprefix + ": expected an object, got " + q.dump());
      } else {
        FieldReader qr(q, qprefix, false, &errors);
        qr.string(&c.quantization.quant_method, "quant_method", {}, {"fp8"});
        qr.string(&c.quantization.scale_fmt, "scale_fmt", {}, {"ue8m0"});
        qr.string(&c.quantization.expert_dtype, "expert_dtype", {}, {"fp4"});
        std::vector<int32_t> block;
        qr.int_list(&block, "weight_block_size", {}, false, 1);
        if (!block.empty()) {
          if (block.size() != 2) {
            qr.fail("weight_block_size",
                    fmt::format("expected [rows, cols], got {}", list_text(block)));
          } else {
            c.quantization.weight_block_rows = block[0];
            c.quantization.weight_block_cols = block[1];
          }
        }
      }
    }
  }

  constexpr bool kRequired = true;
  constexpr bool kOptional = false;
  r.integer(&c.vocab_size, "vocab_size", "vocab_size", kRequired, 1);
  r.integer(&c.hidden_size, "hidden_size", "dim", kRequired, 1);
  r.integer(&c.num_hidden_layers, "num_hidden_layers", "n_layers", kRequired, 1);
  r.integer(&c.num_attention_heads, "num_attention_heads", "n_heads", kRequired, 1);
  r.integer(&c.num_key_value_heads, "num_key_value_heads", {}, kOptional, 1);
  r.integer(&c.head_dim, "head_dim", "head_dim", kRequired, 1);
  r.integer(&c.qk_rope_head_dim, "qk_rope_head_dim", "rope_head_dim", kRequired, 1);
  r.integer(&c.q_lora_rank, "q_lora_rank", "q_lora_rank", kRequired, 1);
  r.integer(&c.o_groups, "o_groups", "o_groups", kRequired, 1);
  r.integer(&c.o_lora_rank, "o_lora_rank", "o_lora_rank", kRequired, 1);
  r.integer(&c.sliding_window, "sliding_window", "window_size", kRequired, 1);

  r.int_list(&c.compress_ratios, "compress_ratios", "compress_ratios", kRequired, 0);
  r.int_list(&c.kv_source_layer_ids, "kv_source_layer_ids", "kv_source_layers", kOptional, 0);
  r.int_list(&c.index_source_layer_ids, "index_source_layer_ids", "index_source_layers", kOptional,
             0);
  r.integer(&c.candidate_source_layer_id, "candidate_source_layer_id", "candidate_source_layer",
            kOptional, 0);
  r.integer(&c.candidate_topk_blocks, "candidate_topk_blocks", {}, kOptional, 0);
  r.integer(&c.candidate_block_size, "candidate_block_size", {}, kOptional, 0);
  r.integer(&c.index_n_heads, "index_n_heads", {}, kOptional, 0);
  r.integer(&c.index_head_dim, "index_head_dim", {}, kOptional, 0);
  r.integer(&c.index_topk, "index_topk", {}, kOptional, 0);

  r.number(&c.rope_theta, "rope_theta", {}, kOptional, true);
  r.number(&c.compress_rope_theta, "compress_rope_theta", {}, kOptional, true);
  if (flat) {
    // Flat: rope_factor/original_seq_len/beta_fast/beta_slow at the top; YaRN when factor > 1.
    double factor = 1.0;
    r.number(&factor, "rope_factor", {}, kOptional, true);
    if (factor != 1.0) {
      c.rope_scaling.enabled = true;
      c.rope_scaling.type = "yarn";
      c.rope_scaling.factor = factor;
      r.integer(&c.rope_scaling.original_max_position_embeddings, "original_seq_len", {}, kRequired,
                1);
      r.number(&c.rope_scaling.beta_fast, "beta_fast", {}, kOptional, true);
      r.number(&c.rope_scaling.beta_slow, "beta_slow", {}, kOptional, true);
    }
  } else if (r.has("rope_scaling")) {
    const json& rs = r.obj()["rope_scaling"];
    if (!rs.is_object()) {
      r.fail("rope_scaling", "expected an object, got " + rs.dump());
    } else {
      FieldReader sr(rs, prefix + "rope_scaling.", false, &errors);
      std::string type;
      if (sr.has("rope_type")) {
        sr.string(&type, "rope_type", {}, {"yarn"});
      } else {
        sr.string(&type, "type", {}, {"yarn"});
        if (!sr.has("type")) sr.fail("rope_type", "missing (required)");
      }
      c.rope_scaling.enabled = true;
      c.rope_scaling.type = "yarn";
      sr.number(&c.rope_scaling.factor, "factor", {}, kRequired, true);
      sr.integer(&c.rope_scaling.original_max_position_embeddings,
                 "original_max_position_embeddings", {}, kRequired, 1);
      sr.number(&c.rope_scaling.beta_fast, "beta_fast", {}, kOptional, true);
      sr.number(&c.rope_scaling.beta_slow, "beta_slow", {}, kOptional, true);
    }
  }
  if (r.has("max_position_embeddings") || !flat) {
    r.integer(&c.max_position_embeddings, "max_position_embeddings", {}, kRequired, 1);
  } else {
    c.max_position_embeddings =
        c.rope_scaling.enabled
            ? static_cast<int64_t>(
                  c.rope_scaling.factor *
                  static_cast<double>(c.rope_scaling.original_max_position_embeddings))
            : 0;
    if (c.max_position_embeddings <= 0) r.fail("max_position_embeddings", "missing (required)");
  }

  r.integer(&c.n_routed_experts, "n_routed_experts", "n_routed_experts", kRequired, 1);
  r.integer(&c.n_shared_experts, "n_shared_experts", "n_shared_experts", kOptional, 0);
  r.integer(&c.num_experts_per_tok, "num_experts_per_tok", "n_activated_experts", kRequired, 1);
  r.integer(&c.moe_intermediate_size, "moe_intermediate_size", "moe_inter_dim", kRequired, 1);
  r.string(&c.scoring_func, "scoring_func", "score_func", {"sqrtsoftplus"});
  r.string(&c.topk_method, "topk_method", {}, {"noaux_tc"});
  r.boolean(&c.norm_topk_prob, "norm_topk_prob");
  r.number(&c.routed_scaling_factor, "routed_scaling_factor", "route_scale", kOptional, true);
  r.number(&c.gate_temp, "gate_temp", {}, kOptional, true);
  r.number(&c.swiglu_limit, "swiglu_limit", {}, kOptional, false);
  r.string(&c.hidden_act, "hidden_act", {}, {"silu"});
  r.boolean(&c.tie_word_embeddings, "tie_word_embeddings");
  if (c.tie_word_embeddings)
    r.fail("tie_word_embeddings", "expected false (V4.1 has a separate head)");
  // Features V4.1 does not have: refuse them rather than silently ignore.
  int32_t unsupported = 0;
  r.integer(&unsupported, "num_hash_layers", "n_hash_layers", kOptional, 0);
  if (unsupported != 0) r.fail("num_hash_layers", "hash-MoE layers are not supported (V4.1: 0)");
  unsupported = 0;
  r.integer(&unsupported, "first_k_dense_replace", "n_dense_layers", kOptional, 0);
  if (unsupported != 0) r.fail("first_k_dense_replace", "dense layers are not supported (V4.1: 0)");
  unsupported = 1;
  r.integer(&unsupported, "n_group", "n_expert_groups", kOptional, 0);
  if (unsupported > 1) r.fail("n_group", "group-limited routing is not supported");

  r.integer(&c.hc_mult, "hc_mult", {}, kOptional, 1);
  r.integer(&c.hc_sinkhorn_iters, "hc_sinkhorn_iters", {}, kOptional, 1);
  r.number(&c.hc_eps, "hc_eps", {}, kOptional, false);
  r.number(&c.rms_norm_eps, "rms_norm_eps", "norm_eps", kOptional, true);

  r.int_list(&c.engram_layer_ids, "engram_layer_ids", {}, kOptional, 0);
  r.int_list(&c.engram_num_embeddings, "engram_num_embeddings", {}, !c.engram_layer_ids.empty(), 1);
  r.integer(&c.engram_max_ngram_size, "engram_max_ngram_size", {}, kOptional, 2);
  r.integer(&c.engram_n_heads, "engram_n_heads", {}, kOptional, 1);
  r.integer(&c.engram_head_dim, "engram_head_dim", {}, kOptional, 1);
  const bool engram = !c.engram_layer_ids.empty();
  r.integer(&c.engram_vocab_size, "engram_vocab_size", {}, engram, 2);
  // NOTE: the released field is engram_pad_id; some copies say engram_pad_token_id (alias).
  if (r.has("engram_pad_id")) {
    r.integer(&c.engram_pad_id, "engram_pad_id", {}, kOptional, 0);
  } else {
    r.integer(&c.engram_pad_id, "engram_pad_token_id", {}, kOptional, 0);
  }
  c.engram_compressed_vocab_size = c.vocab_size;
  r.integer(&c.engram_compressed_vocab_size, "engram_compressed_vocab_size", {}, engram, 1);

  r.integer(&c.num_nextn_predict_layers, "num_nextn_predict_layers", "n_mtp_layers", kOptional, 0);
  const bool draft = c.num_nextn_predict_layers > 0;
  r.integer(&c.dspark_block_size, "dspark_block_size", {}, draft, 1);
  r.integer(&c.dspark_noise_token_id, "dspark_noise_token_id", {}, draft, 0);
  r.int_list(&c.dspark_target_layer_ids, "dspark_target_layer_ids", {}, kOptional, 0);
  r.integer(&c.dspark_markov_rank, "dspark_markov_rank", {}, draft, 1);
  r.integer(&c.dspark_n_routed_experts, "dspark_n_routed_experts", {}, kOptional, 1);
  r.integer(&c.dspark_num_experts_per_tok, "dspark_num_experts_per_tok", {}, kOptional, 1);

  // engram_multipliers (our extension): [[m_0..m_{max_ngram-1}] per engram layer].
  std::vector<std::vector<int64_t>> multipliers;
  if (r.has("engram_multipliers")) {
    const json& m = r.obj()["engram_multipliers"];
    bool ok = m.is_array() && m.size() == c.engram_layer_ids.size();
    for (size_t i = 0; ok && i < m.size(); ++i) {
      ok = m[i].is_array() && static_cast<int32_t>(m[i].size()) == c.engram_max_ngram_size;
      std::vector<int64_t> row;
      for (size_t j = 0; ok && j < m[i].size(); ++j) {
        ok = m[i][j].is_number_integer() && m[i][j].get<int64_t>() > 0 &&
             (m[i][j].get<int64_t>() & 1) == 1;
        if (ok) row.push_back(m[i][j].get<int64_t>());
      }
      multipliers.push_back(std::move(row));
    }
    if (!ok)
      r.fail("engram_multipliers",
             fmt::format("expected {} lists (one per engram layer) of {} positive odd integers, "
                         "got {}",
                         c.engram_layer_ids.size(), c.engram_max_ngram_size, m.dump()));
  }

  MS_RETURN_IF_ERROR(join_errors(source, errors));
  if (Status s = c.finalize(prefix); !s) {
    // finalize() names the fields under "config"; name the file instead.
    Error e = s.error();
    if (e.message.rfind("config:", 0) == 0) e.message = std::string(source) + e.message.substr(6);
    return tl::unexpected(e);
  }

  // Multipliers: explicit ones win (and must match the built-ins when both exist); otherwise the
  // built-in table; otherwise an error naming the field.
  for (size_t i = 0; i < c.engram_layers.size(); ++i) {
    EngramLayer& e = c.engram_layers[i];
    auto builtin = builtin_engram_multipliers(e.layer_id, c.engram_compressed_vocab_size,
                                              c.engram_max_ngram_size);
    if (!multipliers.empty()) {
      e.multipliers = multipliers[i];
      if (builtin && *builtin != e.multipliers)
        r.fail(fmt::format("engram_multipliers[{}]", i),
               fmt::format("differ from the known numpy values for layer {} (compressed vocab {})",
                           e.layer_id, c.engram_compressed_vocab_size));
    } else if (builtin) {
      e.multipliers = *builtin;
    } else {
      r.fail("engram_multipliers",
             fmt::format("required for engram layer {} (compressed vocab {}, max n-gram {}): no "
                         "built-in constants; compute them with tools/gen_engram_multipliers.py",
                         e.layer_id, c.engram_compressed_vocab_size, c.engram_max_ngram_size));
    }
  }
  MS_RETURN_IF_ERROR(join_errors(source, errors));
  return c;
}

}  // namespace

Result<ModelConfig> parse_model_config(std::string_view json_text, std::string_view source,
                                       ConfigLayout* layout_out) {
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded())
    return make_error(ErrorCode::kInvalidArgument, "{}: not valid JSON", source);
  return parse_json_object(root, source, layout_out);
}

Result<ModelConfig> load_model_config(const std::filesystem::path& path) {
  std::filesystem::path file = path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) file = path / "config.json";
  std::ifstream in(file, std::ios::binary);
  if (!in)
    return make_error(ErrorCode::kNotFound, "{}: cannot open the model config", file.string());
  std::ostringstream text;
  text << in.rdbuf();
  return parse_model_config(text.str(), file.string());
}

}  // namespace moeserve
