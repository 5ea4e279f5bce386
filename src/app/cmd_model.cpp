// `moeserve model inspect PATH` and `moeserve model gen-tiny DIR`: config summary, parameter and
// cache accounting, checkpoint validation, and the deterministic tiny checkpoint generator.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "app/commands.h"
#include "common/logging.h"
#include "model/checkpoint_layout.h"
#include "model/checkpoint_validator.h"
#include "model/config.h"
#include "model/model_stats.h"
#include "model/safetensors.h"
#include "model/tiny_model.h"

namespace moeserve::app {
namespace {

namespace fs = std::filesystem;

// "0-1, 3-7, 9" from a sorted id list.
std::string ranges(const std::vector<int32_t>& ids, std::string_view prefix = "") {
  std::string out;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    out += out.empty() ? "" : ", ";
    out += j == i ? fmt::format("{}{}", prefix, ids[i])
                  : fmt::format("{}{}-{}", prefix, ids[i], ids[j]);
    i = j + 1;
  }
  return out.empty() ? "-" : out;
}

std::string billions(int64_t n) {
  if (n >= 1'000'000'000) return fmt::format("{:.2f} B", static_cast<double>(n) / 1e9);
  if (n >= 1'000'000) return fmt::format("{:.2f} M", static_cast<double>(n) / 1e6);
  return fmt::format("{}", n);
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000 && u < 4) {
    b /= 1000;
    ++u;
  }
  return fmt::format("{:.2f} {}", b, units[u]);
}

std::string layout_name(ConfigLayout l) {
  switch (l) {
    case ConfigLayout::kHfComposite:
      return "HF composite layout";
    case ConfigLayout::kHfText:
      return "HF text-config layout";
    case ConfigLayout::kFlat:
      return "flat inference/config.json layout";
  }
  return "?";
}

void print_config_summary(const ModelConfig& c) {
  const int32_t L = c.num_hidden_layers;
  fmt::print("  dims: vocab {}, hidden {} x {} hc streams, {} layers + {} draft stages\n",
             c.vocab_size, c.hidden_size, c.hc_mult, L, c.num_nextn_predict_layers);
  fmt::print(
      "  attention: {} heads x {} (rope {}), 1 shared K=V latent, q_lora {}, o {} groups x "
      "{}, window {}\n",
      c.num_attention_heads, c.head_dim, c.qk_rope_head_dim, c.q_lora_rank, c.o_groups,
      c.o_lora_rank, c.sliding_window);
  std::vector<int32_t> by_mode[4];
  for (int32_t l = 0; l < L; ++l) by_mode[static_cast<int>(c.layer(l).mode)].push_back(l);
  fmt::print("  layers by mode:\n");
  for (LayerMode m :
       {LayerMode::kSwaOnly, LayerMode::kFull, LayerMode::kReuse, LayerMode::kReindex}) {
    const auto& ids = by_mode[static_cast<int>(m)];
    fmt::print("    {:<8} {:>2}  {}\n", layer_mode_name(m), ids.size(), ranges(ids));
  }
  std::vector<int32_t> stages;
  for (int32_t s = 0; s < c.num_nextn_predict_layers; ++s) stages.push_back(s);
  fmt::print("    {:<8} {:>2}  {} (swa only)\n", "draft", stages.size(), ranges(stages, "mtp."));
  std::vector<int32_t> r1, r2;
  for (int32_t l = 0; l < L; ++l) {
    if (c.compress_ratios[static_cast<size_t>(l)] == 1) r1.push_back(l);
    if (c.compress_ratios[static_cast<size_t>(l)] == 2) r2.push_back(l);
  }
  fmt::print("  compress ratios: 2 on {}, 1 on {}; KV sources {}; index sources {}\n", ranges(r2),
             ranges(r1), ranges(c.kv_source_layer_ids), ranges(c.index_source_layer_ids));
  fmt::print(
      "  CED: encoder layers 0-{}, decoder {}-{} (candidate source {}: top-{} blocks x {} "
      "= {} positions)\n",
      c.decoder_start_layer() - 1, c.decoder_start_layer(), L - 1, c.candidate_source_layer_id,
      c.candidate_topk_blocks, c.candidate_block_size,
      static_cast<int64_t>(c.candidate_topk_blocks) * c.candidate_block_size);
  fmt::print("  indexer: {} heads x {}, top-{}\n", c.index_n_heads, c.index_head_dim, c.index_topk);
  fmt::print("  MoE: {} routed (top-{}) + {} shared, inter {}, {}, scale {}, swiglu limit {}\n",
             c.n_routed_experts, c.num_experts_per_tok, c.n_shared_experts, c.moe_intermediate_size,
             c.scoring_func, c.routed_scaling_factor, c.swiglu_limit);
  fmt::print("  mHC: {} streams, {} Sinkhorn iters, hc_eps {}; rms_norm_eps {}\n", c.hc_mult,
             c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps);
  if (c.rope_scaling.enabled) {
    fmt::print(
        "  RoPE: main theta {}; compress theta {} + YaRN x{} (orig {}, beta {}/{}); max "
        "positions {}\n",
        c.rope_theta, c.compress_rope_theta, c.rope_scaling.factor,
        c.rope_scaling.original_max_position_embeddings, c.rope_scaling.beta_fast,
        c.rope_scaling.beta_slow, c.max_position_embeddings);
  } else {
    fmt::print("  RoPE: main theta {}; compress theta {} (no YaRN); max positions {}\n",
               c.rope_theta, c.compress_rope_theta, c.max_position_embeddings);
  }
  if (c.engram_layers.empty()) {
    fmt::print("  Engram: off\n");
  } else {
    fmt::print(
        "  Engram: layers {}; orders 2..{} x {} heads x {} dims; compressed vocab {}, pad "
        "id {}\n",
        ranges(c.engram_layer_ids), c.engram_max_ngram_size, c.engram_n_heads, c.engram_head_dim,
        c.engram_compressed_vocab_size, c.engram_pad_id);
    for (const EngramLayer& e : c.engram_layers) {
      fmt::print("    layer {}: {} rows (sum of {} primes, first {}), multipliers [{}]\n",
                 e.layer_id, e.num_embeddings, e.offsets.size(), e.primes[0][0],
                 fmt::join(e.multipliers, ", "));
    }
  }
  if (c.num_nextn_predict_layers > 0) {
    fmt::print(
        "  DSpark: {} stages, block {}, {} experts (top-{}), Markov rank {}, targets {}, "
        "noise token {}\n",
        c.num_nextn_predict_layers, c.dspark_block_size, c.dspark_n_routed_experts,
        c.dspark_num_experts_per_tok, c.dspark_markov_rank, ranges(c.dspark_target_layer_ids),
        c.dspark_noise_token_id);
  }
}

void print_stats(const ModelConfig& c, const ModelStats& st) {
  fmt::print("parameters (logical: FP4 counts 2 per byte, scales excluded):\n");
  for (int g = 0; g < kNumParamGroups; ++g) {
    fmt::print("  {:<58} {:>10}\n", param_group_name(static_cast<ParamGroup>(g)),
               billions(st.params[static_cast<size_t>(g)]));
  }
  fmt::print("  {:<58} {:>10}\n", "backbone (embed/head + dense + routed + Engram proj)",
             billions(st.backbone_params()));
  fmt::print("  {:<58} {:>10}\n", "total checkpoint (backbone + Engram tables + draft)",
             billions(st.total_params()));
  fmt::print(
      "  active per token: decode {}, prefill with bounded replay {} (layers 0-{}), one "
      "draft pass {}\n",
      billions(st.active_decode), billions(st.active_prefill), c.decoder_start_layer() - 1,
      billions(st.active_draft));
}

void print_bytes(std::string_view title, const ModelStats& st) {
  fmt::print("{}: {} in {} tensors ({} of it scales)\n", title,
             human_bytes(static_cast<double>(st.total_bytes)), st.num_tensors,
             human_bytes(static_cast<double>(st.scale_bytes)));
  for (const auto& [dtype, bytes] : st.bytes_by_dtype) {
    fmt::print("  {:<8} {:>12} {:>8} tensors\n", dtype, human_bytes(static_cast<double>(bytes)),
               st.tensors_by_dtype.at(dtype));
  }
}

void print_cache(const ModelConfig& c) {
  fmt::print("KV cache:\n");
  fmt::print("  global: {} entries/token x ({} B main + {} B index key) = {} bytes/token\n",
             c.global_entries_per_token(), c.main_entry_bytes(), c.index_entry_bytes(),
             c.global_kv_bytes_per_token());
  fmt::print("  SWA rings per request: {} layers (incl. draft) x {} rows x {} B = {} bytes ({})\n",
             c.num_total_layers(), c.sliding_window, c.swa_row_bytes(),
             c.swa_ring_bytes_per_request(),
             human_bytes(static_cast<double>(c.swa_ring_bytes_per_request())));
}

int run_inspect(const std::string& path_text, bool prefetch, int32_t threads) {
  const fs::path path(path_text);
  std::error_code ec;
  const bool is_dir = fs::is_directory(path, ec);
  const fs::path config_path = is_dir ? path / "config.json" : path;
  std::ifstream in(config_path, std::ios::binary);
  if (!in) {
    MS_LOG_ERROR("{}: cannot open the model config", config_path.string());
    return 1;
  }
  std::stringstream text;
  text << in.rdbuf();
  ConfigLayout layout{};
  auto config = parse_model_config(text.str(), config_path.string(), &layout);
  if (!config) {
    MS_LOG_ERROR("{}", config.error().message);
    return 1;
  }
  const ModelConfig& c = *config;
  fmt::print("{}: DeepSeek-V4.1 ({})\n", config_path.string(), layout_name(layout));
  print_config_summary(c);
  const ModelStats st = compute_model_stats(c);
  print_stats(c, st);
  print_bytes("checkpoint bytes expected from the config", st);
  print_cache(c);

  if (!is_dir) return 0;
  bool has_weights = fs::exists(path / "model.safetensors.index.json", ec) ||
                     fs::exists(path / "model.safetensors", ec);
  for (const auto& e : fs::directory_iterator(path, ec))
    has_weights = has_weights || e.path().extension() == ".safetensors";
  if (!has_weights) {
    fmt::print("checkpoint: no safetensors in {}\n", path.string());
    return 0;
  }
  CheckpointLoadOptions opts;
  opts.prefetch = prefetch;
  opts.num_threads = threads;
  opts.progress = make_console_progress();
  auto ckpt = CheckpointLoader(opts).load(path);
  if (!ckpt) {
    MS_LOG_ERROR("{}", ckpt.error().message);
    return 1;
  }
  print_bytes(fmt::format("checkpoint bytes found ({} shards)", ckpt->shard_paths().size()),
              checkpoint_byte_stats(*ckpt));
  const CheckpointValidation v = validate_checkpoint(c, *ckpt);
  for (const std::string& w : v.warnings) MS_LOG_WARN("{}", w);
  if (!v.ok()) {
    MS_LOG_ERROR("{}", v.to_status(path.string()).error().message);
    return 1;
  }
  fmt::print(
      "checkpoint: OK, all {} expected tensors present with the right dtype and shape ({} "
      "unexpected)\n",
      v.num_expected, v.warnings.size());
  return 0;
}

int run_gen_tiny(const std::string& dir, uint64_t seed, const std::string& config_path) {
  std::string text(tiny_config_json());
  if (!config_path.empty()) {
    std::ifstream in(config_path, std::ios::binary);
    if (!in) {
      MS_LOG_ERROR("{}: cannot open", config_path);
      return 1;
    }
    std::stringstream s;
    s << in.rdbuf();
    text = s.str();
  }
  if (Status s = write_generated_model(dir, text, seed); !s) {
    MS_LOG_ERROR("{}", s.error().message);
    return 1;
  }
  CheckpointLoadOptions opts;
  opts.prefetch = false;
  auto ckpt = CheckpointLoader(opts).load(dir);
  auto config = load_model_config(dir);
  if (!ckpt || !config) {
    MS_LOG_ERROR("{}", !ckpt ? ckpt.error().message : config.error().message);
    return 1;
  }
  if (Status s = validate_checkpoint(*config, *ckpt).to_status(dir); !s) {
    MS_LOG_ERROR("{}", s.error().message);
    return 1;
  }
  fmt::print(
      "wrote {}/config.json and {}/model.safetensors: {} tensors, {} parameters, {} "
      "(seed {})\n",
      dir, dir, ckpt->tensors().size(), compute_model_stats(*config).total_params(),
      human_bytes(static_cast<double>(ckpt->total_bytes())), seed);
  return 0;
}

}  // namespace

void register_model_commands(CLI::App& app) {
  CLI::App* model =
      app.add_subcommand("model", "Inspect configs/checkpoints, generate tiny models");
  model->require_subcommand(1);

  struct InspectArgs {
    std::string path;
    bool prefetch = false;
    int32_t threads = 8;
  };
  auto inspect_args = std::make_shared<InspectArgs>();
  CLI::App* inspect =
      model->add_subcommand("inspect",
                            "Config summary, parameter/byte counts, KV bytes/token; "
                            "validates the checkpoint when DIR holds one");
  inspect->add_option("path", inspect_args->path, "model DIR or config.json")->required();
  inspect->add_flag("--prefetch", inspect_args->prefetch,
                    "read every shard into the page cache (progress shown)");
  inspect->add_option("--threads", inspect_args->threads, "shards opened in parallel")
      ->capture_default_str();
  inspect->callback([inspect_args] {
    exit_code() = run_inspect(inspect_args->path, inspect_args->prefetch, inspect_args->threads);
  });

  struct GenArgs {
    std::string dir;
    uint64_t seed = 0;
    std::string config;
  };
  auto gen_args = std::make_shared<GenArgs>();
  CLI::App* gen = model->add_subcommand(
      "gen-tiny", "Write a deterministic tiny V4.1 checkpoint (config.json + model.safetensors)");
  gen->add_option("dir", gen_args->dir, "output directory")->required();
  gen->add_option("--seed", gen_args->seed, "PRNG seed")->capture_default_str();
  gen->add_option("--config", gen_args->config,
                  "config.json to use (default: the built-in §9 tiny config)");
  gen->callback(
      [gen_args] { exit_code() = run_gen_tiny(gen_args->dir, gen_args->seed, gen_args->config); });
}

}  // namespace moeserve::app
