// `moeserve bench forward --backend cpu --model DIR`: prefill and decode tokens/s of the forward
// (src/model/arch) on one request, a table on stdout and a BenchResult JSON. CPU roofline: the
// bytes of weights one decode token reads (as the CPU backend holds them: fp32) over the measured
// memcpy bandwidth, against the measured decode step time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "app/commands.h"
#include "backend/backend.h"
#include "bench/bench_result.h"
#include "common/logging.h"
#include "model/arch/registry.h"

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

}  // namespace

void register_bench_forward(CLI::App& bench) {
  auto opt = std::make_shared<BenchForwardOptions>();
  CLI::App* cmd =
      bench.add_subcommand("forward", "Prefill and decode tokens/s of the forward pass");
  cmd->add_option("--backend", opt->backend, "cpu")->capture_default_str();
  cmd->add_option("--model", opt->model, "checkpoint directory")->required();
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
    auto r = run(*opt);
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
