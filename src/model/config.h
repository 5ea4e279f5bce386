// ModelConfig: the typed, validated DeepSeek-V4.1 configuration (config.json, both the HF composite
// layout and the flat inference/config.json names) plus everything the forward derives from it:
// per-layer CSA2 roles (spec model.md §2.1), KV/index owners, Engram primes/offsets/multipliers
// (§4), DSpark targets (§6). Invariant: a ModelConfig returned by parse_model_config() passed
// validate(); layers has num_hidden_layers + num_nextn_predict_layers entries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace moeserve {

// CSA2 attention mode of one layer (model.md §2.1).
enum class LayerMode : uint8_t {
  kSwaOnly,  // ratio 0: sliding window only (layers 0,1 and every draft stage)
  kFull,     // KV source: own compressor + index keys + own indexer (and maybe candidate source)
  kReuse,    // reads the owner's global cache with the latest index source's selection
  kReindex,  // own indexer queries against the owner's index keys, masked to the candidate pool
};
[[nodiscard]] std::string_view layer_mode_name(LayerMode mode);

// Which RoPE table a layer's projections use: ratio 0 -> main (rope_theta, no YaRN),
// ratio > 0 -> compress (compress_rope_theta + YaRN when rope_scaling is set).
enum class RopeKind : uint8_t { kMain, kCompress };

struct LayerInfo {
  int32_t layer_id = 0;      // 0..L-1 backbone, L..L+nextn-1 draft stages
  bool is_draft = false;     // mtp.{layer_id - L}
  int32_t draft_stage = -1;  // s for mtp.s, -1 for backbone layers
  int32_t ratio = 0;         // compress_ratios[layer_id]
  LayerMode mode = LayerMode::kSwaOnly;
  RopeKind rope = RopeKind::kMain;
  bool is_kv_source = false;
  bool is_index_source = false;
  bool is_candidate_source = false;
  // Latest KV-source layer <= layer_id whose global cache this layer reads (-1 for ratio 0).
  int32_t kv_owner = -1;
  // Latest index-source layer <= layer_id whose top-k selection this layer uses (-1: ratio 0).
  int32_t index_owner = -1;
  // Index into ModelConfig::engram_layers, -1 when the layer has no Engram.
  int32_t engram_index = -1;
  bool is_dspark_target = false;  // residual entering this layer feeds DSpark main_hidden

  bool operator==(const LayerInfo&) const = default;
};

struct RopeScaling {
  bool enabled = false;  // false: no YaRN on the compress rope
  std::string type;      // "yarn"
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;

  bool operator==(const RopeScaling&) const = default;
};

struct QuantizationConfig {
  std::string quant_method = "fp8";
  int32_t weight_block_rows = 32;
  int32_t weight_block_cols = 32;
  std::string scale_fmt = "ue8m0";
  std::string expert_dtype = "fp4";

  bool operator==(const QuantizationConfig&) const = default;
};

// Hashing parameters of one Engram layer (model.md §4 steps 3–5).
struct EngramLayer {
  int32_t layer_id = 0;
  int64_t num_embeddings = 0;  // rows of this layer's table = sum of its primes
  // primes[n-2][k]: prime of n-gram order n (2..max_ngram), hash head k.
  std::vector<std::vector<int64_t>> primes;
  // offsets[(n-2)*n_heads + k]: exclusive prefix sum of the flattened primes (row base per head).
  std::vector<int64_t> offsets;
  // multipliers[s], s = 0..max_ngram-1 (odd, from numpy default_rng(10007*layer_id)).
  std::vector<int64_t> multipliers;

  bool operator==(const EngramLayer&) const = default;
};

// Which JSON layout a config came from (both parse to the same ModelConfig).
enum class ConfigLayout : uint8_t { kHfComposite, kHfText, kFlat };

struct ModelConfig {
  // ---- top level -------------------------------------------------------------------------------
  std::string model_type = "deepseek_v41";
  int32_t bos_token_id = 0;
  int32_t eos_token_id = 1;
  int32_t pad_token_id = 2;
  int32_t image_token_id = -1;  // -1: none
  QuantizationConfig quantization;

  // ---- backbone dims ---------------------------------------------------------------------------
  int32_t vocab_size = 0;
  int32_t hidden_size = 0;        // D, per hyper-connection stream
  int32_t num_hidden_layers = 0;  // L (draft stages are appended after)
  int32_t num_attention_heads = 0;
  int32_t num_key_value_heads = 1;
  int32_t head_dim = 0;          // hd: also the K=V latent width
  int32_t qk_rope_head_dim = 0;  // rd: trailing rd channels get RoPE
  int32_t q_lora_rank = 0;
  int32_t o_groups = 0;
  int32_t o_lora_rank = 0;
  int32_t sliding_window = 0;
  int64_t max_position_embeddings = 0;

  // ---- CSA2 ------------------------------------------------------------------------------------
  std::vector<int32_t> compress_ratios;  // L + nextn entries
  std::vector<int32_t> kv_source_layer_ids;
  std::vector<int32_t> index_source_layer_ids;
  int32_t candidate_source_layer_id = -1;  // default: last KV source
  int32_t candidate_topk_blocks = 0;
  int32_t candidate_block_size = 0;
  int32_t index_n_heads = 0;
  int32_t index_head_dim = 0;
  int32_t index_topk = 0;

  // ---- RoPE ------------------------------------------------------------------------------------
  double rope_theta = 10000.0;
  double compress_rope_theta = 160000.0;
  RopeScaling rope_scaling;

  // ---- MoE -------------------------------------------------------------------------------------
  int32_t n_routed_experts = 0;
  int32_t n_shared_experts = 1;
  int32_t num_experts_per_tok = 0;
  int32_t moe_intermediate_size = 0;
  std::string scoring_func = "sqrtsoftplus";
  std::string topk_method = "noaux_tc";
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  double gate_temp = 1.0;
  double swiglu_limit = 0.0;  // 0: no clamp
  std::string hidden_act = "silu";

  // ---- mHC / norms -----------------------------------------------------------------------------
  int32_t hc_mult = 4;
  int32_t hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  double rms_norm_eps = 1e-6;

  // ---- Engram ----------------------------------------------------------------------------------
  std::vector<int32_t> engram_layer_ids;  // empty: Engram off
  std::vector<int64_t> engram_num_embeddings;
  int32_t engram_max_ngram_size = 4;
  int32_t engram_n_heads = 8;
  int32_t engram_head_dim = 256;
  int64_t engram_vocab_size = 0;
  int32_t engram_pad_id = 2;
  int32_t engram_compressed_vocab_size = 0;

  // ---- DSpark draft ----------------------------------------------------------------------------
  int32_t num_nextn_predict_layers = 0;  // draft stages mtp.0..nextn-1
  int32_t dspark_block_size = 0;
  int32_t dspark_noise_token_id = -1;
  std::vector<int32_t> dspark_target_layer_ids;  // default: last 3 non-KV-source layers
  int32_t dspark_markov_rank = 0;
  int32_t dspark_n_routed_experts = 0;     // default: n_routed_experts
  int32_t dspark_num_experts_per_tok = 0;  // default: num_experts_per_tok

  bool tie_word_embeddings = false;

  // ---- derived (filled by parse_model_config / finalize) ---------------------------------------
  std::vector<LayerInfo> layers;           // backbone then draft stages
  std::vector<EngramLayer> engram_layers;  // parallel to engram_layer_ids

  bool operator==(const ModelConfig&) const = default;

  // Fills the derived fields and defaults (candidate source, DSpark targets, Engram tables) and
  // checks every cross-field rule. `prefix` names the fields in errors ("text_config." or "").
  [[nodiscard]] Status finalize(std::string_view prefix = "text_config.");

  // ---- helpers ---------------------------------------------------------------------------------
  [[nodiscard]] int32_t num_total_layers() const {
    return num_hidden_layers + num_nextn_predict_layers;
  }
  [[nodiscard]] const LayerInfo& layer(int32_t layer_id) const;
  // mHC mix count M = (2 + HC) * HC.
  [[nodiscard]] int32_t hc_mix_count() const { return (2 + hc_mult) * hc_mult; }
  // Engram orders (2..max_ngram) × heads.
  [[nodiscard]] int32_t engram_num_hashes() const {
    return (engram_max_ngram_size - 1) * engram_n_heads;
  }
  // NE = hashes × head_dim: width of the gathered Engram embedding.
  [[nodiscard]] int32_t engram_embed_dim() const { return engram_num_hashes() * engram_head_dim; }
  [[nodiscard]] const EngramLayer* engram_for_layer(int32_t layer_id) const;
  // First decoder layer (CED boundary) = candidate source; num_hidden_layers when none.
  [[nodiscard]] int32_t decoder_start_layer() const;
  // Routed experts / top-k of a backbone layer or a draft stage.
  [[nodiscard]] int32_t routed_experts_of(int32_t layer_id) const;
  [[nodiscard]] int32_t experts_per_tok_of(int32_t layer_id) const;

  // ---- cache geometry (model.md §2.2, §2.3, §2.7) ----------------------------------------------
  // Main global entry: hd e2m1 (hd/2 B) + hd/16 e4m3 scales = 288 B for hd 512.
  [[nodiscard]] size_t main_entry_bytes() const;
  // Index key: ID e2m1 (ID/2 B) + ID/32 ue8m0 scales = 68 B for ID 128.
  [[nodiscard]] size_t index_entry_bytes() const;
  // SWA ring row: hd e4m3 + hd/32 ue8m0 = 528 B for hd 512.
  [[nodiscard]] size_t swa_row_bytes() const;
  // Global entries per token = Σ over KV-source layers of 1/ratio (2.5 for V4.1-Flash).
  [[nodiscard]] double global_entries_per_token() const;
  // (main + index) bytes × entries per token (890 for V4.1-Flash).
  [[nodiscard]] double global_kv_bytes_per_token() const;
  // SWA ring bytes per request: every layer incl. draft stages × window × row bytes.
  [[nodiscard]] size_t swa_ring_bytes_per_request() const;
};

// Parses config.json text. `source` names the file in errors. Accepts the HF composite layout
// (text fields under text_config), a bare HF text config, and the flat inference/config.json
// names (detected by the absence of text_config/hidden_size). Every bad field is named.
[[nodiscard]] Result<ModelConfig> parse_model_config(std::string_view json_text,
                                                     std::string_view source = "config.json",
                                                     ConfigLayout* layout_out = nullptr);
// Reads `path` (a config.json or a directory holding one) and parses it.
[[nodiscard]] Result<ModelConfig> load_model_config(const std::filesystem::path& path);

// Engram primes (model.md §4 step 5): per layer, per order n = 2..max_ngram, start the search at
// vocab_size - 1 and take the next n_heads primes above the running start not yet used (one
// global seen set across orders and layers). Result: [layer][order][head].
[[nodiscard]] std::vector<std::vector<std::vector<int64_t>>> compute_engram_primes(
    int32_t num_layers, int32_t max_ngram, int32_t n_heads, int64_t vocab_size);
[[nodiscard]] bool is_prime_u64(uint64_t n);

// Built-in Engram multipliers for known (layer_id, compressed vocab, max_ngram) combinations:
// the full-size V4.1-Flash constants of model.md §4 and the §9 tiny config's, both computed with
// numpy (tools/gen_engram_multipliers.py). nullopt when unknown (the config must then carry
// engram_multipliers).
[[nodiscard]] std::optional<std::vector<int64_t>> builtin_engram_multipliers(
    int32_t layer_id, int32_t compressed_vocab, int32_t max_ngram);

// The §9 tiny config (HF composite layout) as JSON text; configs/tiny/config.json holds the same.
[[nodiscard]] std::string_view tiny_config_json();

}  // namespace moeserve
