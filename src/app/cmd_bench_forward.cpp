// `moeserve bench forward --backend cpu --model DIR`: prefill and decode tokens/s of the forward
// (src/model/arch) on one request, a table on stdout and a BenchResult JSON. CPU roofline: the
// bytes of weights one decode token reads (as the CPU backend holds them: fp32) over the measured
// memcpy bandwidth, against the measured decode step time.
// `--backend cuda` (CUDA builds): the GPU forward (deepseek_v41_gpu.h) on exact batches — decode
// (--batch B --context L --tokens-per-seq S) or prefill (--new-tokens T --cached C) — with real
// or random weights (--random-weights --config F), a layer subset, one DEP rank's experts, a
// synthetic KV fill (timed separately), per-component CUDA-event times and the roofline.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "app/commands.h"
#include "backend/backend.h"
#include "bench/bench_result.h"
#include "common/logging.h"
#include "model/arch/registry.h"
#include "model/config.h"

#ifdef MOESERVE_HAVE_CUDA
#include "backend/cuda/cuda_bench.h"
#include "backend/cuda/device_runtime.h"
#include "model/arch/deepseek_v41_gpu.h"
#endif

namespace moeserve::app {
namespace {

struct BenchForwardOptions {
  std::string backend = "cpu";
  std::string model;
  int32_t prompt_len = 96;
  int32_t decode_steps = 32;
  int32_t chunk_size = 0;
  std::string mode = "production";
  std::string gemm = "blas";
  uint64_t seed = 1;
  std::string output = "bench_forward.json";
  // --backend cuda
  bool random_weights = false;
  std::string config;          // config.json for --random-weights
  int32_t layers = 0;          // 0: all
  int32_t local_experts = -1;  // -1: all
  int32_t ep_ranks = 1;        // > 1: local experts also compute the other DEP ranks' tokens
  int32_t batch = 0;           // decode: requests
  int32_t context = 0;         // decode: context length L
  int32_t tokens_per_seq = 1;  // decode: S
  int32_t new_tokens = 0;      // prefill: T
  int32_t cached = 0;          // prefill: C
  int32_t iterations = 5;
  bool tf32 = true;
  // Single fp16 q and P operands (2^-11 relative, finer than FlashMLA's bf16): the serving
  // precision; false: the hi + lo pairs the GPU-vs-CPU tests use.
  bool fast_attention = true;
  bool indexer_wgmma = true;
  bool indexer_fp8 = true;
  bool indexer_cand_wgmma = true;
  bool attention_wgmma = true;
  bool attention_swa_f16_scale = false;
  bool attention_ws = true;  // GpuModelOptions::attention_ws
  bool attention_ws_q_in_b = false;  // GpuModelOptions::attention_ws_q_in_b
  bool fp8_wgmma = false;
  bool fp8_row_scaled = true;  // GpuModelOptions::fp8_row_scaled
  bool moe_grouped_wgmma = true;
  bool moe_grouped_wgmma_rs = true;
  bool moe_kperm = true;
  bool moe_fp8 = false;
  bool rank_block_replicas = true;
  bool moe_padded_fp8 = true;
  bool moe_group_ordered = true;
  bool moe_group_staged = true;
  int64_t moe_padded_min_rows = 16;
  int64_t moe_padded_group_rows = 0;
  bool moe_padded_gather_quant = true;
  bool moe_padded_bf16 = true;
  bool moe_padded_warp_quant = false;
  int moe_padded_quant_cpt = 0;
  bool moe_overflow_exit_empty = true;
  bool moe_overflow_side_stream = false;
  bool moe_overflow_graph_if = false;
  bool moe_quant_once = true;
  int router_f32_slices = -1;
  int32_t rope_heads_per_thread = 8;
  bool moe_padded_skip_empty = true;
  int32_t moe_rs_max_pass = 192;
  bool moe_fuse_swiglu = false;
  bool moe_stream_k = false;
  bool fuse_shared_w13 = true;
  bool fuse_qkv_a = true;
  bool moe_shared_overlap = true;
  bool router_split_tf32 = false;
  int32_t router_split_k = 1;
  bool mhc_fuse_expand_mixes = true;
  bool attn_quant_epilogue = true;
  bool attn_fp8_rows_epilogue = true;
  int32_t mhc_fused_rows_per_thread = 0;
  int32_t mhc_fused_cluster_width = 0;
  int32_t mhc_split_blocks = -1;
  bool mhc_tensor_cores = false;
  bool mhc_fuse_attn_quant = true;
  int32_t gemm_autotune = 0;
  int64_t mhc_fuse_min_rows = 0;
  bool mhc_fuse_norm = true;
  bool pdl = true;          // programmatic dependent launch of our kernels
  bool cuda_graphs = true;  // decode: CUDA graphs (the step a server would run)
  bool dspark = false;      // decode: also time the DSpark draft cycle of every request
  bool host_logits = false;  // copy the logits rows to the host (a server samples on the device)
};

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Best-of-3 memcpy bandwidth over a 256 MiB buffer, bytes/s (read + write counted once each).
double measure_memcpy_bandwidth() {
  const size_t bytes = size_t{256} << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  double best = 0.0;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    best = std::max(best, 2.0 * static_cast<double>(bytes) / seconds_since(t0));
  }
  return best;
}

Result<bench::BenchResult> run(const BenchForwardOptions& opt) {
  MS_ASSIGN_OR_RETURN(arch::ForwardMode mode, arch::forward_mode_from_name(opt.mode));
  if (opt.gemm != "blas" && opt.gemm != "reference")
    return make_error(ErrorCode::kInvalidArgument, "--gemm must be blas|reference");
  if (opt.prompt_len <= 0 || opt.decode_steps < 0)
    return make_error(ErrorCode::kInvalidArgument, "--prompt-len must be > 0, --decode-steps >= 0");
  MS_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, create_backend(opt.backend));
  auto t_load = Clock::now();
  MS_ASSIGN_OR_RETURN(std::unique_ptr<arch::CausalLm> model,
                      arch::load_causal_lm(opt.model, *backend));
  const double load_s = seconds_since(t_load);
  model->set_batch_invariant(opt.gemm == "reference");
  const ModelConfig& c = model->config();
  std::mt19937 rng(static_cast<uint32_t>(opt.seed));
  std::uniform_int_distribution<int32_t> dist(3, c.vocab_size - 1);
  std::vector<int32_t> prompt(static_cast<size_t>(opt.prompt_len));
  for (auto& t : prompt) t = dist(rng);

  auto state = model->new_state();
  const int32_t chunk = opt.chunk_size > 0 ? opt.chunk_size : opt.prompt_len;
  std::vector<float> last;
  const auto t_prefill = Clock::now();
  for (int32_t s = 0; s < opt.prompt_len; s += chunk) {
    arch::SequenceInput in;
    in.state = state.get();
    in.tokens = std::span<const int32_t>(prompt).subspan(
        static_cast<size_t>(s), static_cast<size_t>(std::min(chunk, opt.prompt_len - s)));
    in.prompt_len = opt.prompt_len;
    MS_ASSIGN_OR_RETURN(auto out, model->forward({&in, 1}, mode));
    if (!out.front().logits.empty()) last = std::move(out.front().logits);
  }
  const double prefill_s = seconds_since(t_prefill);
  const auto t_decode = Clock::now();
  for (int32_t i = 0; i < opt.decode_steps; ++i) {
    const int32_t next =
        static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
    arch::SequenceInput in;
    in.state = state.get();
    in.tokens = {&next, 1};
    MS_ASSIGN_OR_RETURN(auto out, model->forward({&in, 1}, mode));
    last = std::move(out.front().logits);
  }
  const double decode_s = seconds_since(t_decode);
  const double bandwidth = measure_memcpy_bandwidth();
  const double bytes_per_token = model->weight_bytes_per_decode_token();
  const double step_s = opt.decode_steps > 0 ? decode_s / opt.decode_steps : 0.0;
  const double ideal_step_s = bytes_per_token / bandwidth;

  bench::BenchResult r;
  r.benchmark = "forward";

  r.config = {{"backend", opt.backend},
              {"model", opt.model},
              {"model_type", c.model_type},
              {"prompt_len", opt.prompt_len},
              {"decode_steps", opt.decode_steps},
              {"chunk_size", chunk},
              {"mode", opt.mode},
              {"gemm", opt.gemm},
              {"seed", opt.seed}};
  r.results = {{"load_s", load_s},
               {"prefill_s", prefill_s},
               {"prefill_tokens_per_s", opt.prompt_len / prefill_s},
               {"decode_s", decode_s},
               {"decode_tokens_per_s", opt.decode_steps > 0 ? opt.decode_steps / decode_s : 0.0},
               {"decode_step_ms", step_s * 1e3}};
  r.roofline = {{"weight_bytes_per_decode_token", bytes_per_token},
                {"memcpy_bandwidth_bytes_per_s", bandwidth},
                {"ideal_decode_step_ms", ideal_step_s * 1e3},
                {"achieved_fraction", step_s > 0 ? ideal_step_s / step_s : 0.0}};
  r.roofline_note =
      "CPU decode roofline = fp32 weight bytes read per token (dense + top-k experts + head, as "
      "the CPU backend holds them) / measured memcpy bandwidth; prefill is compute-bound and has "
      "no roofline here. Tiny models are dominated by per-op overhead, not bytes.";
  std::printf("%-26s %14s\n", "metric", "value");
  std::printf("%-26s %14.3f\n", "load s", load_s);
  std::printf("%-26s %14.1f\n", "prefill tokens/s", opt.prompt_len / prefill_s);
  std::printf("%-26s %14.1f\n", "decode tokens/s",
              opt.decode_steps > 0 ? opt.decode_steps / decode_s : 0.0);
  std::printf("%-26s %14.3f\n", "decode step ms", step_s * 1e3);
  std::printf("%-26s %14.0f\n", "weight bytes/decode token", bytes_per_token);
  std::printf("%-26s %14.2f\n", "memcpy GB/s", bandwidth / 1e9);
  std::printf("%-26s %14.4f\n", "roofline fraction", step_s > 0 ? ideal_step_s / step_s : 0.0);
  return r;
}

#ifdef MOESERVE_HAVE_CUDA
double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Result<bench::BenchResult> run_cuda(const BenchForwardOptions& opt) {
  MS_ASSIGN_OR_RETURN(arch::ForwardMode mode, arch::forward_mode_from_name(opt.mode));
  const bool decode = opt.batch > 0;
  if (decode == (opt.new_tokens > 0))
    return make_error(ErrorCode::kInvalidArgument,
                      "give either decode (--batch B --context L [--tokens-per-seq S]) or prefill "
                      "(--new-tokens T [--cached C])");
  if (decode && (opt.context < 0 || opt.tokens_per_seq <= 0))
    return make_error(ErrorCode::kInvalidArgument, "--context >= 0, --tokens-per-seq > 0");
  if (opt.iterations <= 0) return make_error(ErrorCode::kInvalidArgument, "--iterations > 0");
  std::string cfg_path = opt.random_weights ? opt.config : opt.model;
  if (cfg_path.empty())
    return make_error(ErrorCode::kInvalidArgument,
                      "--backend cuda needs --model DIR or --random-weights --config F");
  MS_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(cfg_path));
  arch::GpuModelOptions go;
  // With CUDA graphs a decode shape runs eagerly once, then is captured: two warm-up steps so
  // that every timed step is a replay.
  const int32_t warmup = decode && opt.cuda_graphs ? 2 : 1;
  if (decode) {
    go.max_seqs = opt.batch;
    go.max_context = opt.context + opt.tokens_per_seq * (warmup + 2 * opt.iterations + 1);
    go.max_rows = opt.batch * opt.tokens_per_seq;
  } else {
    go.max_seqs = 1;
    go.max_context = opt.cached + opt.new_tokens;
    go.max_rows = opt.new_tokens;
  }
  go.tf32_dense = opt.tf32;
  go.fast_attention = opt.fast_attention;
  go.indexer_wgmma = opt.indexer_wgmma;
  go.indexer_fp8 = opt.indexer_fp8;
  go.indexer_cand_wgmma = opt.indexer_cand_wgmma;
  go.attention_wgmma = opt.attention_wgmma;
  go.attention_swa_f16_scale = opt.attention_swa_f16_scale;
  go.attention_ws = opt.attention_ws;
  go.attention_ws_q_in_b = opt.attention_ws_q_in_b;
  go.fp8_wgmma = opt.fp8_wgmma;
  go.fp8_row_scaled = opt.fp8_row_scaled;
  go.moe_grouped_wgmma = opt.moe_grouped_wgmma;
  go.moe_grouped_wgmma_rs = opt.moe_grouped_wgmma_rs;
  go.moe_kperm = opt.moe_kperm;
  go.moe_fp8 = opt.moe_fp8;
  go.moe_padded_fp8 = opt.moe_padded_fp8;
  go.moe_group_ordered = opt.moe_group_ordered;
  go.moe_group_staged = opt.moe_group_staged;
  go.moe_padded_gather_quant = opt.moe_padded_gather_quant;
  go.moe_padded_bf16 = opt.moe_padded_bf16;
  go.moe_padded_warp_quant = opt.moe_padded_warp_quant;
  go.moe_padded_quant_cpt = opt.moe_padded_quant_cpt;
  go.moe_overflow_exit_empty = opt.moe_overflow_exit_empty;
  go.moe_overflow_side_stream = opt.moe_overflow_side_stream;
  go.moe_overflow_graph_if = opt.moe_overflow_graph_if;
  go.moe_quant_once = opt.moe_quant_once;
  go.router_f32_slices = opt.router_f32_slices;
  go.rope_heads_per_thread = opt.rope_heads_per_thread;
  go.moe_padded_skip_empty = opt.moe_padded_skip_empty;
  go.moe_padded_min_rows = opt.moe_padded_min_rows;
  go.moe_padded_group_rows = opt.moe_padded_group_rows;
  go.moe_rs_max_pass = opt.moe_rs_max_pass;
  go.moe_fuse_swiglu = opt.moe_fuse_swiglu;
  go.moe_stream_k = opt.moe_stream_k;
  go.fuse_shared_w13 = opt.fuse_shared_w13;
  go.fuse_qkv_a = opt.fuse_qkv_a;
  go.moe_shared_overlap = opt.moe_shared_overlap;
  go.router_split_tf32 = opt.router_split_tf32;
  go.router_split_k = opt.router_split_k;
  go.mhc_fuse_expand_mixes = opt.mhc_fuse_expand_mixes;
  go.attn_quant_epilogue = opt.attn_quant_epilogue;
  go.attn_fp8_rows_epilogue = opt.attn_fp8_rows_epilogue;
  go.mhc_fused_rows_per_thread = opt.mhc_fused_rows_per_thread;
  go.mhc_fused_cluster_width = opt.mhc_fused_cluster_width;
  go.mhc_split_blocks = opt.mhc_split_blocks;
  go.mhc_tensor_cores = opt.mhc_tensor_cores;
  go.mhc_fuse_attn_quant = opt.mhc_fuse_attn_quant;
  go.gemm_autotune = opt.gemm_autotune;
  go.mhc_fuse_min_rows = opt.mhc_fuse_min_rows;
  go.mhc_fuse_norm = opt.mhc_fuse_norm;
  go.programmatic_launch = opt.pdl;
  go.cuda_graphs = decode && opt.cuda_graphs;
  go.dspark = decode && opt.dspark;
  // The draft block after the steps, and the whole cycles' verification steps.
  if (go.dspark)
    go.max_context += config.dspark_block_size + opt.tokens_per_seq * (warmup + opt.iterations);
  if (opt.dspark && (!decode || config.num_nextn_predict_layers == 0))
    return make_error(ErrorCode::kInvalidArgument,
                      "--dspark needs a decode run (--batch, --context) and a config with draft "
                      "stages");
  if (opt.ep_ranks < 1 || opt.ep_ranks > 256 || (opt.ep_ranks > 1 && !decode))
    return make_error(ErrorCode::kInvalidArgument,
                      "--ep-ranks {}: 1..256, and > 1 only for decode runs (the grouped-row "
                      "scratch grows with rows x top-k x ranks)",
                      opt.ep_ranks);
  go.host_logits = opt.host_logits;
  go.local_experts = opt.local_experts;
  go.moe_ep_ranks = opt.ep_ranks;
  go.moe_rank_block_replicas = opt.rank_block_replicas;
  if (opt.layers > 0) go.layers = arch::subsample_layers(config, opt.layers);
  const auto t_load = Clock::now();
  std::unique_ptr<arch::DeepseekV41Gpu> model;
  if (opt.random_weights) {
    MS_ASSIGN_OR_RETURN(model, arch::DeepseekV41Gpu::random(config, go, opt.seed));
  } else {
    MS_ASSIGN_OR_RETURN(model, arch::DeepseekV41Gpu::load(opt.model, go));
  }
  const double load_s = seconds_since(t_load);
  const ModelConfig& c = model->config();
  std::mt19937 rng(static_cast<uint32_t>(opt.seed));
  std::uniform_int_distribution<int32_t> dist(3, c.vocab_size - 1);
  const int32_t nseq = decode ? opt.batch : 1;
  std::vector<int32_t> seqs;
  for (int32_t i = 0; i < nseq; ++i) {
    MS_ASSIGN_OR_RETURN(int32_t s, model->new_sequence());
    seqs.push_back(s);
  }
  const int32_t rows_per_seq = decode ? opt.tokens_per_seq : opt.new_tokens;
  std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(nseq),
                                           std::vector<int32_t>(static_cast<size_t>(rows_per_seq)));
  // Synthetic KV fill (not in the step time).
  const int32_t context = decode ? opt.context : opt.cached;
  const int32_t replay_start = (!decode && mode == arch::ForwardMode::kProduction)
                                   ? std::max(0, opt.cached + opt.new_tokens - c.sliding_window)
                                   : 0;
  std::vector<double> fill_s;
  const auto fill_all = [&](uint64_t salt) {
    const auto t0 = Clock::now();
    for (int32_t i = 0; i < nseq; ++i)
      model->synthetic_fill(seqs[static_cast<size_t>(i)], context, opt.seed * 7919 + salt + i,
                            replay_start);
    cuda::stream_synchronize(model->stream());
    fill_s.push_back(seconds_since(t0));
  };
  const auto step = [&]() -> Result<double> {
    std::vector<arch::GpuSequenceInput> in(static_cast<size_t>(nseq));
    for (int32_t i = 0; i < nseq; ++i) {
      for (auto& t : tokens[static_cast<size_t>(i)]) t = dist(rng);
      auto& g = in[static_cast<size_t>(i)];
      g.seq = seqs[static_cast<size_t>(i)];
      g.tokens = tokens[static_cast<size_t>(i)];
      g.prompt_len = decode ? -1 : opt.cached + opt.new_tokens;
    }
    const auto t0 = Clock::now();
    MS_ASSIGN_OR_RETURN(auto out, model->forward(in, mode));
    (void)out;
    return seconds_since(t0);
  };
  fill_all(0);
  std::vector<double> step_s;
  for (int32_t it = 0; it < warmup + opt.iterations; ++it) {
    if (!decode && it > 0) fill_all(static_cast<uint64_t>(it));
    MS_ASSIGN_OR_RETURN(double s, step());
    if (it >= warmup) step_s.push_back(s);
  }
  const arch::GpuForwardCost cost = model->last_cost();
  model->set_profile(true);
  model->reset_profile();
  for (int32_t it = 0; it < opt.iterations; ++it) {
    if (!decode) fill_all(100 + static_cast<uint64_t>(it));
    MS_ASSIGN_OR_RETURN(double s, step());
    (void)s;
  }
  model->set_profile(false);
  auto comp = model->component_ms();
  double gpu_ms = 0.0;
  for (double& v : comp) {
    v /= opt.iterations;
    gpu_ms += v;
  }
  auto parts = model->part_ms();  // "<component>.<part>" -> ms
  for (auto& [name, v] : parts) v /= opt.iterations;
  // The parts of component i, largest first.
  const auto parts_of = [&](size_t i) {
    const std::string prefix =
        std::string(arch::gpu_component_name(static_cast<arch::GpuComponent>(i))) + ".";
    std::vector<std::pair<std::string, double>> v;
    for (const auto& [name, ms] : parts)
      if (name.starts_with(prefix)) v.emplace_back(name, ms);
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    return v;
  };
  // DSpark: every request's rings get the last `window` positions committed from random taps
  // (commit time reported per request), then one draft cycle for the whole batch is timed.
  std::vector<double> draft_s, commit_s, cycle_s, verify_taps_s, device_commit_s;
  arch::GpuForwardCost dcost;
  std::array<double, arch::kNumGpuComponents> dcomp{};
  int64_t draft_timed_replays = 0;  // draft graph replays of the timed draft cycles
  if (opt.dspark) {
    const int64_t width = static_cast<int64_t>(c.dspark_target_layer_ids.size()) * c.hidden_size;
    const int32_t window = c.sliding_window;
    std::vector<float> mh(static_cast<size_t>(window * width));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (auto& x : mh) x = u(rng);
    std::vector<arch::GpuDraftInput> din;
    for (int32_t sq : seqs) {
      const int32_t end = model->num_tokens(sq);
      const int32_t first = std::max(0, end - window);
      const auto t0 = Clock::now();
      MS_RETURN_IF_ERROR(model->dspark_commit(
          sq, first, std::span<const float>(mh).first(static_cast<size_t>((end - first) * width))));
      commit_s.push_back(seconds_since(t0));
      din.push_back({sq, dist(rng)});
    }
    // With CUDA graphs the first cycle runs eagerly and the second captures the draft's graph
    // (`warmup` cycles untimed); the timed ones replay it.
    for (int32_t it = 0; it < warmup + opt.iterations; ++it) {
      const auto t0 = Clock::now();
      MS_ASSIGN_OR_RETURN(auto d, model->dspark_draft(din));
      (void)d;
      if (it >= warmup) draft_s.push_back(seconds_since(t0));
    }
    draft_timed_replays = model->draft_graph_replays();
    dcost = model->last_cost();
    model->set_profile(true);
    model->reset_profile();
    for (int32_t it = 0; it < opt.iterations; ++it) {
      MS_ASSIGN_OR_RETURN(auto d, model->dspark_draft(din));
      (void)d;
    }
    model->set_profile(false);
    dcomp = model->component_ms();
    for (double& v : dcomp) v /= opt.iterations;
    // Whole DSpark cycles on the device: the verification step with the taps on, every row's
    // taps committed from the device (all accepted: the commit's largest case), one draft cycle
    // anchored on the step's greedy tokens. The first `warmup` cycles capture the taps graph.
    for (int32_t it = 0; it < warmup + opt.iterations; ++it) {
      std::vector<arch::GpuSequenceInput> in(static_cast<size_t>(nseq));
      std::vector<arch::GpuTapCommit> commits;
      for (int32_t i = 0; i < nseq; ++i) {
        for (auto& t : tokens[static_cast<size_t>(i)]) t = dist(rng);
        auto& g = in[static_cast<size_t>(i)];
        g.seq = seqs[static_cast<size_t>(i)];
        g.tokens = tokens[static_cast<size_t>(i)];
        g.want_main_hidden = true;
        g.main_hidden_to_host = false;  // committed from the device
        commits.push_back({i, model->num_tokens(g.seq), rows_per_seq});
      }
      const auto t0 = Clock::now();
      MS_ASSIGN_OR_RETURN(auto out, model->forward(in, mode));
      const auto t1 = Clock::now();
      MS_RETURN_IF_ERROR(model->dspark_commit_taps(commits));
      const auto t2 = Clock::now();
      for (int32_t i = 0; i < nseq; ++i)
        din[static_cast<size_t>(i)].anchor = out.greedy[static_cast<size_t>(i)];
      MS_ASSIGN_OR_RETURN(auto d, model->dspark_draft(din));
      (void)d;
      if (it >= warmup) {
        cycle_s.push_back(seconds_since(t0));
        verify_taps_s.push_back(std::chrono::duration<double>(t1 - t0).count());
        device_commit_s.push_back(std::chrono::duration<double>(t2 - t1).count());
      }
    }
  }
  const double step_ms = median(step_s) * 1e3;
  const double hbm_gbs = cuda::measure_copy_bandwidth_gbs(size_t{2} << 30, model->stream());
  const double mma_tflops =
      cuda::measure_gemm_tflops(cuda::GemmPrecision::kBf16, 8192, model->stream());
  const double bytes = cost.weight_bytes + cost.kv_bytes;
  // FP8 operands run at twice the bf16 rate on Hopper (dense FP8 1979 vs bf16 989 TFLOP/s):
  // the FP8-representable FLOPs are counted at 2x the measured bf16 rate.
  const double fp8_tflops = 2.0 * mma_tflops;
  const auto bytes_ms = [&](const arch::GpuForwardCost& k) {
    return (k.weight_bytes + k.kv_bytes) / (hbm_gbs * 1e9) * 1e3;
  };
  const auto flops_ms = [&](const arch::GpuForwardCost& k) {
    return ((k.flops - k.fp8_flops) / (mma_tflops * 1e12) + k.fp8_flops / (fp8_tflops * 1e12)) *
           1e3;
  };
  const double t_bytes_ms = bytes_ms(cost);
  const double t_flops_ms = flops_ms(cost);
  const double roofline_ms = std::max(t_bytes_ms, t_flops_ms);
  // Every FLOP at the bf16 rate: Hopper's FP8 MMA has no block scales, so MXFP8 x MXFP4/FP8
  // GEMMs with 32-wide scale blocks on both operands run on bf16 MMA here (a rescale per 32-wide
  // K block would cost the CUDA cores what the FP8 rate saves; docs/perf r10).
  const double t_flops_bf16_ms = cost.flops / (mma_tflops * 1e12) * 1e3;
  const double roofline_bf16_ms = std::max(t_bytes_ms, t_flops_bf16_ms);
  const int64_t rows = static_cast<int64_t>(nseq) * rows_per_seq;
  const cuda::DeviceInfo dev = cuda::device_info(0);
  std::vector<double> step_ms_all;
  for (const double s : step_s) step_ms_all.push_back(s * 1e3);

  bench::BenchResult r;
  r.benchmark = "forward";
  r.device = fmt::format("cuda: {} (sm_{}{}, {} SMs, {:.0f} GiB; host {})", dev.name,
                         dev.compute_major, dev.compute_minor, dev.sm_count,
                         static_cast<double>(dev.memory_bytes) / (1 << 30),
                         bench::host_device_description());
  r.config = {{"backend", "cuda"},
              {"model", opt.random_weights ? "random:" + opt.config : opt.model},
              {"kind", decode ? "decode" : "prefill"},
              {"mode", opt.mode},
              {"layers", model->layers()},
              {"num_layers", model->layers().size()},
              {"local_experts", opt.local_experts},
              {"ep_ranks", opt.ep_ranks},
              {"batch", nseq},
              {"context", context},
              {"tokens_per_seq", rows_per_seq},
              {"cached", decode ? 0 : opt.cached},
              {"new_tokens", decode ? 0 : opt.new_tokens},
              {"iterations", opt.iterations},
              {"tf32_fp32_linears", opt.tf32},
              {"fast_attention", opt.fast_attention},
              {"indexer_wgmma", opt.indexer_wgmma},
              {"indexer_fp8", opt.indexer_fp8},
              {"indexer_cand_wgmma", opt.indexer_cand_wgmma},
              {"attention_wgmma", opt.attention_wgmma},
              {"attention_swa_f16_scale", opt.attention_swa_f16_scale},
              {"attention_ws", opt.attention_ws},
              {"attention_ws_q_in_b", opt.attention_ws_q_in_b},
              {"fp8_wgmma", opt.fp8_wgmma},
              {"fp8_row_scaled", opt.fp8_row_scaled},
              {"moe_grouped_wgmma", opt.moe_grouped_wgmma},
              {"moe_grouped_wgmma_rs", opt.moe_grouped_wgmma_rs},
              {"moe_kperm", opt.moe_kperm},
              {"moe_fp8", opt.moe_fp8},
              {"rank_block_replicas", opt.rank_block_replicas},
              {"moe_padded_fp8", opt.moe_padded_fp8},
              {"moe_group_ordered", opt.moe_group_ordered},
              {"moe_group_staged", opt.moe_group_staged},
              {"moe_padded_gather_quant", opt.moe_padded_gather_quant},
              {"moe_padded_bf16", opt.moe_padded_bf16},
              {"moe_padded_warp_quant", opt.moe_padded_warp_quant},
              {"moe_padded_quant_cpt", opt.moe_padded_quant_cpt},
              {"moe_overflow_exit_empty", opt.moe_overflow_exit_empty},
              {"moe_overflow_side_stream", opt.moe_overflow_side_stream},
              {"moe_overflow_graph_if", opt.moe_overflow_graph_if},
              {"moe_quant_once", opt.moe_quant_once},
              {"router_f32_slices", opt.router_f32_slices},
              {"rope_heads_per_thread", opt.rope_heads_per_thread},
              {"moe_padded_skip_empty", opt.moe_padded_skip_empty},
              {"moe_padded_min_rows", opt.moe_padded_min_rows},
              {"moe_padded_group_rows", opt.moe_padded_group_rows},
              {"moe_rs_max_pass", opt.moe_rs_max_pass},
              {"moe_fuse_swiglu", opt.moe_fuse_swiglu},
              {"moe_stream_k", opt.moe_stream_k},
              {"fuse_shared_w13", opt.fuse_shared_w13},
              {"fuse_qkv_a", opt.fuse_qkv_a},
              {"moe_shared_overlap", opt.moe_shared_overlap},
              {"router_split_tf32", opt.router_split_tf32},
              {"router_split_k", opt.router_split_k},
              {"mhc_fuse_expand_mixes", opt.mhc_fuse_expand_mixes},
              {"attn_quant_epilogue", opt.attn_quant_epilogue},
              {"attn_fp8_rows_epilogue", opt.attn_fp8_rows_epilogue},
              {"mhc_fused_rows_per_thread", opt.mhc_fused_rows_per_thread},
              {"mhc_fused_cluster_width", opt.mhc_fused_cluster_width},
              {"mhc_split_blocks", opt.mhc_split_blocks},
              {"mhc_tensor_cores", opt.mhc_tensor_cores},
              {"mhc_fuse_attn_quant", opt.mhc_fuse_attn_quant},
              {"gemm_autotune", opt.gemm_autotune},
              {"mhc_fuse_min_rows", opt.mhc_fuse_min_rows},
              {"mhc_fuse_norm", opt.mhc_fuse_norm},
              {"pdl", opt.pdl},
              {"cuda_graphs", decode && opt.cuda_graphs},
              {"dspark", opt.dspark},
              {"host_logits", opt.host_logits},
              {"seed", opt.seed},
              {"device_name", dev.name}};
  nlohmann::json comps = nlohmann::json::object();
  for (size_t i = 0; i < comp.size(); ++i)
    comps[arch::gpu_component_name(static_cast<arch::GpuComponent>(i))] = comp[i];
  nlohmann::json part_json = nlohmann::json::object();
  for (const auto& [name, ms] : parts) part_json[name] = ms;
  r.results = {{"load_s", load_s},
               {"weight_bytes_device", model->weight_bytes()},
               {"cache_bytes_device", model->cache_bytes()},
               {"synthetic_fill_s_median", median(fill_s)},
               {"step_ms_median", step_ms},
               {"step_ms_all", step_ms_all},
               {"graph_replays", model->graph_replays()},
               {"graph_captures", model->graph_captures()},
               {"gpu_ms_profiled_sum", gpu_ms},
               {"component_gpu_ms", comps},
               {"part_gpu_ms", part_json},
               {"rows", rows},
               {"tokens_per_s", rows / (step_ms * 1e-3)}};
  r.roofline = {{"weight_bytes", cost.weight_bytes},
                {"kv_bytes", cost.kv_bytes},
                {"flops", cost.flops},
                {"fp8_flops", cost.fp8_flops},
                {"moe_rows", cost.moe_rows},
                {"moe_overflow_rows", cost.moe_overflow_rows},
                {"moe_slot_rows", cost.moe_slot_rows},
                {"fp8_tflops_assumed", fp8_tflops},
                {"hbm_gbs_measured", hbm_gbs},
                {"bf16_tflops_measured", mma_tflops},
                {"bytes_time_ms", t_bytes_ms},
                {"flops_time_ms", t_flops_ms},
                {"roofline_ms", roofline_ms},
                {"achieved_fraction", roofline_ms / step_ms},
                {"model_flops_utilisation", t_flops_ms / step_ms},
                {"flops_time_bf16_ms", t_flops_bf16_ms},
                {"roofline_bf16_ms", roofline_bf16_ms},
                {"achieved_fraction_bf16", roofline_bf16_ms / step_ms}};
  r.roofline_note =
      "roofline_ms = max(bytes / measured D2D-copy HBM bandwidth, matrix FLOPs / rate) with "
      "the rate the measured cuBLASLt bf16 rate, twice that for fp8_flops (the FLOPs whose "
      "operands are both FP8-representable: MXFP8 activations times FP8/MXFP4 weights; Hopper's "
      "FP8 rate is twice its bf16 rate; roofline_bf16_ms counts every FLOP at the bf16 rate, the "
      "rate Hopper's MMA gives block-scaled MXFP8 products); bytes = weights as held on the device (FP8/MXFP4, fp32 for the "
      "BF16-checkpoint tensors) touched by the step + cache bytes read by attention and the "
      "indexers; FLOPs = linears + attention + indexer scores. step_ms is host wall time of "
      "forward(): host plan, one metadata upload, the launches (or the graph replay), the "
      "greedy token ids (and with host_logits the logits rows) copied to the host.";
  std::printf("%-28s %14s\n", "metric", "value");
  std::printf("%-28s %14s\n", "kind", decode ? "decode" : "prefill");
  std::printf("%-28s %14zu\n", "layers", model->layers().size());
  std::printf("%-28s %14lld\n", "rows", static_cast<long long>(rows));
  std::printf("%-28s %14.3f\n", "synthetic fill s (median)", median(fill_s));
  std::printf("%-28s %14.3f\n", "step ms (median wall)", step_ms);
  std::printf("%-28s %14.1f\n", "tokens/s", rows / (step_ms * 1e-3));
  for (size_t i = 0; i < comp.size(); ++i) {
    std::printf(
        "  %-26s %14.3f\n",
        fmt::format("{} ms", arch::gpu_component_name(static_cast<arch::GpuComponent>(i))).c_str(),
        comp[i]);
    for (const auto& [name, ms] : parts_of(i))
      std::printf("    %-24s %14.3f\n", fmt::format("{} ms", name).c_str(), ms);
  }
  std::printf("%-28s %14.3f\n", "GPU ms (profiled sum)", gpu_ms);
  std::printf("%-28s %14.3e\n", "bytes (weights + kv)", bytes);
  std::printf("%-28s %14.3e\n", "matrix FLOPs", cost.flops);
  std::printf("%-28s %14.3e\n", "  of which FP8-able", cost.fp8_flops);
  std::printf("%-28s %14.0f\n", "MoE grouped rows", cost.moe_rows);
  if (cost.moe_slot_rows > 0)
    std::printf("%-28s %14.0f of %.0f slot rows\n", "  past the slots (overflow)",
                cost.moe_overflow_rows, cost.moe_slot_rows);
  if (opt.gemm_autotune > 1)
    std::printf("%-28s %14lld\n", "GEMM shapes tuned",
                static_cast<long long>(model->gemm_tuned_shapes()));
  std::printf("%-28s %14.1f\n", "HBM GB/s (measured)", hbm_gbs);
  std::printf("%-28s %14.1f\n", "bf16 TFLOP/s (measured)", mma_tflops);
  std::printf("%-28s %14.3f\n", "roofline ms", roofline_ms);
  std::printf("%-28s %14.4f\n", "achieved fraction", roofline_ms / step_ms);
  std::printf("%-28s %14.3f\n", "roofline ms, all bf16", roofline_bf16_ms);
  std::printf("%-28s %14.4f\n", "achieved fraction, bf16", roofline_bf16_ms / step_ms);
  if (opt.dspark) {
    const double draft_ms = median(draft_s) * 1e3;
    const double d_roof = std::max(bytes_ms(dcost), flops_ms(dcost));
    nlohmann::json dc = nlohmann::json::object();
    for (size_t i = 0; i < dcomp.size(); ++i)
      dc[arch::gpu_component_name(static_cast<arch::GpuComponent>(i))] = dcomp[i];
    std::vector<double> draft_ms_all;
    for (const double x : draft_s) draft_ms_all.push_back(x * 1e3);
    r.results["dspark"] = {{"draft_ms_median", draft_ms},
                           {"draft_ms_all", draft_ms_all},
                           {"draft_rows", static_cast<int64_t>(nseq) * c.dspark_block_size},
                           {"commit_ms_per_request_median", median(commit_s) * 1e3},
                           {"cycle_ms_median", median(cycle_s) * 1e3},
                           {"cycle_verify_with_taps_ms_median", median(verify_taps_s) * 1e3},
                           {"cycle_device_commit_ms_median", median(device_commit_s) * 1e3},
                           {"cycle_note",
                            "verify step with taps + dspark_commit_taps of every row + one draft "
                            "cycle, host wall time"},
                           {"component_gpu_ms", dc},
                           {"step_plus_draft_ms", step_ms + draft_ms},
                           {"weight_bytes", dcost.weight_bytes},
                           {"kv_bytes", dcost.kv_bytes},
                           {"flops", dcost.flops},
                           {"roofline_ms", d_roof},
                           {"achieved_fraction", d_roof / draft_ms},
                           {"draft_graph_replays_timed", draft_timed_replays},
                           {"draft_graph_replays", model->draft_graph_replays()},
                           {"draft_graph_captures", model->draft_graph_captures()}};
    r.roofline["step_plus_draft_roofline_ms"] = roofline_ms + d_roof;
    r.roofline["step_plus_draft_achieved_fraction"] = (roofline_ms + d_roof) / (step_ms + draft_ms);
    std::printf("%-28s %14.3f\n", "dspark draft ms (median)", draft_ms);
    std::printf("%-28s %8lld / %lld\n", "draft graph replays/capt.",
                static_cast<long long>(model->draft_graph_replays()),
                static_cast<long long>(model->draft_graph_captures()));
    for (size_t i = 0; i < dcomp.size(); ++i)
      std::printf("  %-26s %14.3f\n",
                  fmt::format("draft {} ms", arch::gpu_component_name(static_cast<arch::GpuComponent>(i))).c_str(),
                  dcomp[i]);
    std::printf("%-28s %14.3f\n", "dspark commit ms / request", median(commit_s) * 1e3);
    std::printf("%-28s %14.3f\n", "draft roofline ms", d_roof);
    std::printf("%-28s %14.3f\n", "dspark cycle ms (median)", median(cycle_s) * 1e3);
    std::printf("%-28s %14.3f\n", "  verify step with taps ms", median(verify_taps_s) * 1e3);
    std::printf("%-28s %14.3f\n", "  device commit ms", median(device_commit_s) * 1e3);
    std::printf("%-28s %14.3f\n", "step + draft ms", step_ms + draft_ms);
    std::printf("%-28s %14.4f\n", "step + draft fraction", (roofline_ms + d_roof) / (step_ms + draft_ms));
  }
  return r;
}
#endif

}  // namespace

void register_bench_forward(CLI::App& bench) {
  auto opt = std::make_shared<BenchForwardOptions>();
  CLI::App* cmd =
      bench.add_subcommand("forward", "Prefill and decode tokens/s of the forward pass");
  cmd->add_option("--backend", opt->backend, "cpu | cuda (CUDA builds)")->capture_default_str();
  cmd->add_option("--model", opt->model, "checkpoint directory");
  cmd->add_flag("--random-weights", opt->random_weights,
                "cuda: real shapes from --config, random weights filled on the device");
  cmd->add_option("--config", opt->config, "cuda: config.json for --random-weights");
  cmd->add_option("--layers", opt->layers, "cuda: keep N layers (+ their owners); 0 = all")
      ->capture_default_str();
  cmd->add_option("--local-experts", opt->local_experts,
                  "cuda: routed experts held per layer (one DEP rank's share); -1 = all")
      ->capture_default_str();
  cmd->add_option("--ep-ranks", opt->ep_ranks,
                  "cuda decode: expert-parallel ranks whose tokens the local experts receive "
                  "(every local hit computed this many times; with --local-experts, one DEP "
                  "rank's MoE work; the all-to-all is not modelled)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("--batch", opt->batch, "cuda decode: requests")->capture_default_str();
  cmd->add_option("--context", opt->context, "cuda decode: context length per request")
      ->capture_default_str();
  cmd->add_option("--tokens-per-seq", opt->tokens_per_seq, "cuda decode: tokens per request")
      ->capture_default_str();
  cmd->add_option("--new-tokens", opt->new_tokens, "cuda prefill: new tokens")
      ->capture_default_str();
  cmd->add_option("--cached", opt->cached, "cuda prefill: cached prefix tokens")
      ->capture_default_str();
  cmd->add_option("--iterations", opt->iterations, "cuda: timed steps")->capture_default_str();
  cmd->add_option("--tf32", opt->tf32, "cuda: fp32 linears on TF32 tensor cores")
      ->capture_default_str();
  cmd->add_option("--fast-attention", opt->fast_attention,
                  "cuda: the sparse attention on single fp16 q and P operands (false: hi + lo "
                  "pairs, about fp32)")
      ->capture_default_str();
  cmd->add_option("--indexer-wgmma", opt->indexer_wgmma,
                  "cuda: the indexer scores on the sm_90a wgmma kernel (false: mma.sync)")
      ->capture_default_str();
  cmd->add_option("--indexer-fp8", opt->indexer_fp8,
                  "cuda: with --indexer-wgmma, that kernel on e4m3 operands (the FP4 block scales "
                  "folded in; false: bf16)")
      ->capture_default_str();
  cmd->add_option("--indexer-cand-wgmma", opt->indexer_cand_wgmma,
                  "cuda: with --indexer-wgmma and --indexer-fp8, the Reindex layers' candidate "
                  "scores on e4m3 wgmma too (false: the mma.sync kernel, bf16)")
      ->capture_default_str();
  cmd->add_option("--attention-wgmma", opt->attention_wgmma,
                  "cuda: the sparse attention on the sm_90a wgmma kernel (false: mma.sync)")
      ->capture_default_str();
  cmd->add_option("--attention-swa-f16-scale", opt->attention_swa_f16_scale,
                  "cuda: the wgmma attention (fp16) dequantises SWA keys by an fp16 multiply by "
                  "their scale where it is an fp16 value (false: through fp32)")
      ->capture_default_str();
  cmd->add_option("--attention-ws", opt->attention_ws,
                  "cuda: the wgmma attention (fp16) in its warp-specialised form: two producer "
                  "warpgroups dequantise 64-key tiles, two consumers run S, softmax and P . V")
      ->capture_default_str();
  cmd->add_option("--attention-ws-q-in-b", opt->attention_ws_q_in_b,
                  "cuda: with --attention-ws, consumer B converts q instead of the producers "
                  "(the same results)")
      ->capture_default_str();
  cmd->add_option("--fp8-wgmma", opt->fp8_wgmma,
                  "cuda: FP8-weight linears as FP8 x FP8 wgmma GEMMs on the MXFP8 codes (false: "
                  "bf16 cuBLASLt on the same values)")
      ->capture_default_str();
  cmd->add_option("--fp8-row-scaled", opt->fp8_row_scaled,
                  "cuda: FP8-weight linears as row-scaled FP8 cuBLASLt GEMMs (MXFP8 inputs and "
                  "weights refolded onto one scale per row; false: bf16 cuBLASLt on the MXFP8 "
                  "values)")
      ->capture_default_str();
  cmd->add_option("--moe-grouped-wgmma", opt->moe_grouped_wgmma,
                  "cuda: the MoE's grouped MXFP4 GEMMs (> 24 rows per expert) on the sm_90a "
                  "wgmma kernel (false: the WMMA table kernel)")
      ->capture_default_str();
  cmd->add_option("--moe-grouped-wgmma-rs", opt->moe_grouped_wgmma_rs,
                  "cuda: with --moe-grouped-wgmma, the swapped-operand kernel (weights "
                  "dequantised into wgmma's register operand, activations by TMA; w1 and w3 in one "
                  "launch; false: the v1 wgmma kernel)")
      ->capture_default_str();
  cmd->add_option("--moe-fp8", opt->moe_fp8,
                  "cuda: the routed experts' grouped GEMMs on the FP8 kernel (e2m1 weights "
                  "refolded per row to e4m3, row-scaled e4m3 activations; written without a "
                  "device run, off)")
      ->capture_default_str();
  cmd->add_option("--rank-block-replicas", opt->rank_block_replicas,
                  "cuda: with --ep-ranks > 1, the other ranks' tokens modelled by this rank's hits "
                  "on other expert blocks (independent-rank spread of rows per expert); false: "
                  "every local hit copied --ep-ranks times")
      ->capture_default_str();
  cmd->add_option("--moe-padded-fp8", opt->moe_padded_fp8,
                  "cuda: the routed experts as strided-batched cuBLASLt FP8 GEMMs over C slot rows "
                  "per expert (weights refolded to e4m3 once; hits past C on the grouped path)")
      ->capture_default_str();
  cmd->add_option("--moe-group-ordered", opt->moe_group_ordered,
                  "cuda: group each expert's hits in hit order (deterministic layout; false: "
                  "in the order of the grouping's atomics)")
      ->capture_default_str();
  cmd->add_option("--moe-group-staged", opt->moe_group_staged,
                  "cuda: with --moe-group-ordered, the staged grouping kernel (counts in shared "
                  "memory, batched loads; the same layout)")
      ->capture_default_str();
  cmd->add_option("--moe-padded-gather-quant", opt->moe_padded_gather_quant,
                  "cuda: with --moe-padded-fp8, quantise each token row once and gather the codes "
                  "into the slot rows (false: one quantiser pass per slot row)")
      ->capture_default_str();
  cmd->add_option("--moe-padded-bf16", opt->moe_padded_bf16,
                  "cuda: with --moe-padded-fp8, the GEMMs' unscaled sums in bf16 (false: fp32)")
      ->capture_default_str();
  cmd->add_option("--moe-padded-warp-quant", opt->moe_padded_warp_quant,
                  "cuda: with --moe-padded-fp8, the SwiGLU quantiser with a warp per slot row "
                  "(false: a CTA per row; measured slower)")
      ->capture_default_str();
  cmd->add_option("--moe-padded-quant-cpt", opt->moe_padded_quant_cpt,
                  "cuda: with --moe-padded-fp8, the row quantisers with at least this many "
                  "8-column chunks per thread (0 automatic, 2, 4, 8)")
      ->check(CLI::IsMember({0, 1, 2, 4, 8}))
      ->capture_default_str();
  cmd->add_option("--moe-overflow-exit-empty", opt->moe_overflow_exit_empty,
                  "cuda: with --moe-padded-fp8, the overflow's stream-K GEMM launches return at "
                  "once when no hit passed the slots")
      ->capture_default_str();
  cmd->add_option("--moe-overflow-side-stream", opt->moe_overflow_side_stream,
                  "cuda: with --moe-padded-fp8 and the shared expert's side stream, the "
                  "overflow's launches on the side stream, under the padded GEMMs")
      ->capture_default_str();
  cmd->add_option("--moe-overflow-graph-if", opt->moe_overflow_graph_if,
                  "cuda: with --moe-padded-fp8, in CUDA graphs the overflow's launches sit in a "
                  "graph IF node that runs them only when some hit passed the slots")
      ->capture_default_str();
  cmd->add_option("--moe-quant-once", opt->moe_quant_once,
                  "cuda: with --moe-padded-fp8, the FFN input quantised to FP8 rows once for the "
                  "shared expert and the padded experts")
      ->capture_default_str();
  cmd->add_option("--router-f32-slices", opt->router_f32_slices,
                  "cuda: > 0: the router logits on our split-K fp32 GEMM with this many K "
                  "slices; -1: as many as fill the GPU once; 0: cuBLASLt")
      ->check(CLI::Range(-1, 4096))
      ->capture_default_str();
  cmd->add_option("--rope-heads-per-thread", opt->rope_heads_per_thread,
                  "cuda: the RoPE launches' heads per thread (one angle for that many heads), 1..8")
      ->check(CLI::Range(1, 8))
      ->capture_default_str();
  cmd->add_option("--moe-padded-skip-empty", opt->moe_padded_skip_empty,
                  "cuda: with --moe-padded-fp8, the SwiGLU quantiser writes empty slot rows as "
                  "zero rows without computing them")
      ->capture_default_str();
  cmd->add_option("--moe-padded-min-rows", opt->moe_padded_min_rows,
                  "cuda: with --moe-padded-fp8, the least expected hits per local expert that "
                  "take it")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->add_option("--moe-padded-group-rows", opt->moe_padded_group_rows,
                  "cuda: with --moe-padded-fp8, the slot rows C per expert (0: automatic)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  cmd->add_option("--moe-kperm", opt->moe_kperm,
                  "cuda: where the swapped-operand kernel takes both grouped GEMMs, the expert "
                  "inputs k-permuted per 64-wide K tile (one weight load and scale per fragment "
                  "row; false: natural k order)")
      ->capture_default_str();
  cmd->add_option("--moe-rs-max-pass", opt->moe_rs_max_pass,
                  "cuda: the most grouped rows of one expert per pass of the swapped-operand "
                  "kernel, 192 or 224 (each pass decodes the expert's weights again)")
      ->check(CLI::IsMember({192, 224}))
      ->capture_default_str();
  cmd->add_option("--moe-fuse-swiglu", opt->moe_fuse_swiglu,
                  "cuda: where the swapped-operand kernel takes the w1 + w3 launch with it, the "
                  "routed experts' SwiGLU and MXFP8 quantisation in that launch's epilogue (false: "
                  "fp32 gate and up, then the SwiGLU quantiser)")
      ->capture_default_str();
  cmd->add_option("--moe-stream-k", opt->moe_stream_k,
                  "cuda: where the swapped-operand kernel takes the unfused w1 + w3 and w2 "
                  "launches with 192-row passes, its stream-K form (one persistent CTA per SM "
                  "sharing the K tiles of all units; false: one CTA per unit)")
      ->capture_default_str();
  cmd->add_option("--fuse-qkv-a", opt->fuse_qkv_a,
                  "cuda: the attention's wq_a and wkv as one GEMM of [wq_a; wkv] (false: two "
                  "GEMMs)")
      ->capture_default_str();
  cmd->add_option("--fuse-shared-w13", opt->fuse_shared_w13,
                  "cuda: the shared expert's w1 and w3 as one GEMM of [w1; w3] (false: two "
                  "GEMMs)")
      ->capture_default_str();
  cmd->add_option("--moe-shared-overlap", opt->moe_shared_overlap,
                  "cuda: the shared expert on a second stream, overlapping the routed experts "
                  "(false: one stream)")
      ->capture_default_str();
  cmd->add_option("--router-split-k", opt->router_split_k,
                  "cuda: the router logits' fp32 GEMM as this many K-slices in one batched "
                  "call, summed in order by the router (1: one GEMM)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--router-split-tf32", opt->router_split_tf32,
                  "cuda: the MoE router logits as one TF32 GEMM on hi/lo split operands "
                  "(near-fp32, ~10x the fp32 GEMM's error; false: cuBLASLt's exact fp32 GEMM)")
      ->capture_default_str();
  cmd->add_option("--mhc-fuse-expand-mixes", opt->mhc_fuse_expand_mixes,
                  "cuda: each mHC expand and the mixes that follow it on the updated residual "
                  "stream in one launch (false: two launches)")
      ->capture_default_str();
  cmd->add_option("--attn-quant-epilogue", opt->attn_quant_epilogue,
                  "cuda: where the wgmma sparse attention and wo_a's bf16 GEMM run, the "
                  "attention's epilogue writes wo_a's MXFP8-quantised bf16 input (false: the fp32 "
                  "output, then the quantiser)")
      ->capture_default_str();
  cmd->add_option("--attn-fp8-rows-epilogue", opt->attn_fp8_rows_epilogue,
                  "cuda: with --attn-quant-epilogue, where wo_a runs on the row-scaled FP8 GEMM "
                  "and the attention has 64 heads, the epilogue writes wo_a's row-scaled FP8 "
                  "operand itself (false: bf16 MXFP8 values, then the row quantiser)")
      ->capture_default_str();
  cmd->add_option("--mhc-fused-rows-per-thread", opt->mhc_fused_rows_per_thread,
                  "cuda: with --mhc-fuse-expand-mixes, the fused launch's rows per thread "
                  "(tiles of 8 x that many rows), 1..4; 0: the mixes kernel's rule")
      ->check(CLI::Range(0, 4))
      ->capture_default_str();
  cmd->add_option("--mhc-fused-cluster-width", opt->mhc_fused_cluster_width,
                  "cuda: with --mhc-fuse-expand-mixes, the fused launch's blocks per cluster, "
                  "4, 8 or 16 (16: 8 where the GPU cannot hold a cluster of 16); 0: 16 up to 128 rows, "
                  "else 8")
      ->check(CLI::IsMember({0, 4, 8, 16}))
      ->capture_default_str();
  cmd->add_option("--mhc-split-blocks", opt->mhc_split_blocks,
                  "cuda: with --mhc-fuse-expand-mixes, the fused launch without clusters: this "
                  "many blocks per row tile and a second launch that adds their sums (0: "
                  "clusters; -1: 16 up to 128 rows, one wave of blocks up to 1024, else clusters), "
                  "-1..256")
      ->check(CLI::Range(-1, 256))
      ->capture_default_str();
  cmd->add_option("--mhc-tensor-cores", opt->mhc_tensor_cores,
                  "cuda: on the split path of the fused expand + mixes (--mhc-split-blocks), the "
                  "mixes' dots as 3xTF32 tensor-core products (false: FFMA dots)")
      ->capture_default_str();
  cmd->add_option("--mhc-fuse-attn-quant", opt->mhc_fuse_attn_quant,
                  "cuda: where the split expand + mixes launch writes the next layer's normalised "
                  "attention input, it also writes the fused qkv_a GEMM's row-scaled FP8 input "
                  "(false: a quantiser launch in the attention)")
      ->capture_default_str();
  cmd->add_option("--gemm-autotune", opt->gemm_autotune,
                  "cuda: time this many of cuBLASLt's heuristic candidates per GEMM shape on its "
                  "first eager run and keep the fastest (0: the heuristic's first), 0..16")
      ->check(CLI::Range(0, 16))
      ->capture_default_str();
  cmd->add_option("--mhc-fuse-min-rows", opt->mhc_fuse_min_rows,
                  "cuda: with --mhc-fuse-expand-mixes, the fewest rows a forward takes the fused "
                  "launch at (fewer: two launches)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  cmd->add_option("--mhc-fuse-norm", opt->mhc_fuse_norm,
                  "cuda: where the fused expand + mixes launch writes the next site's collapse, "
                  "it also applies that site's RMSNorm (false: a separate RMSNorm launch)")
      ->capture_default_str();
  cmd->add_option("--pdl", opt->pdl,
                  "cuda: programmatic dependent launch of our kernels (each scheduled before its "
                  "predecessor has completed, waiting on the device for its results; false: plain "
                  "launches)")
      ->capture_default_str();
  cmd->add_flag("--dspark", opt->dspark,
                "cuda decode: also time one DSpark draft cycle for the batch (rings committed "
                "from random taps; the config needs draft stages)");
  cmd->add_option("--cuda-graphs", opt->cuda_graphs,
                  "cuda decode: run the timed steps as captured CUDA graphs (the per-component "
                  "breakdown always comes from eager profiled steps)")
      ->capture_default_str();
  cmd->add_option("--host-logits", opt->host_logits,
                  "cuda: copy every logits row to the host after the step (the greedy token ids "
                  "always come back)")
      ->capture_default_str();
  cmd->add_option("--prompt-len", opt->prompt_len, "prompt tokens")->capture_default_str();
  cmd->add_option("--decode-steps", opt->decode_steps, "decode steps")->capture_default_str();
  cmd->add_option("--chunk-size", opt->chunk_size, "prefill chunk (0: whole prompt)")
      ->capture_default_str();
  cmd->add_option("--mode", opt->mode, "oracle|production")->capture_default_str();
  cmd->add_option("--gemm", opt->gemm, "blas (fast) | reference (batch-invariant)")
      ->capture_default_str();
  cmd->add_option("--seed", opt->seed, "prompt seed")->capture_default_str();
  cmd->add_option("-o,--output", opt->output, "result JSON")->capture_default_str();
  cmd->callback([opt] {
    Result<bench::BenchResult> r = make_error(ErrorCode::kInvalidArgument, "--model is required");
    if (opt->backend == "cuda") {
#ifdef MOESERVE_HAVE_CUDA
      r = run_cuda(*opt);
#else
      r = make_error(ErrorCode::kUnimplemented, "this build has no CUDA (MOESERVE_CUDA=OFF)");
#endif
    } else if (!opt->model.empty()) {
      r = run(*opt);
    }
    if (!r) {
      MS_LOG_ERROR("bench forward: {}", r.error().to_string());
      exit_code() = 1;
      return;
    }
    if (auto st = r->write(opt->output); !st) {
      MS_LOG_ERROR("bench forward: {}", st.error().to_string());
      exit_code() = 1;
    }
  });
}

}  // namespace moeserve::app
