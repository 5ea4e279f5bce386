// The math shared by the DeepSeek-V4.1 backbone and its DSpark draft (model.md §2.2, §2.5, §3, §5):
// linears on the backend, RMSNorm, RoPE (main / compress with YaRN), mHC mixes + Sinkhorn,
// collapse/expand, the MoE with its router, the attention core with sinks, exact top-k.
// Activations are row-major fp32 std::vectors; reductions accumulate in double.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/arch/deepseek_v41_weights.h"
#include "model/config.h"

namespace moeserve::arch {

// How linears run: on the backend's GEMM, or (batch_invariant) on the CPU reference GEMM whose
// per-row result does not depend on the number of rows (double accumulation).
// NOTE: batch invariance is what makes chunked prefill ≡ one-shot prefill exactly: an fp32 GEMM
// whose summation order changes with M perturbs values by ~1e-7, and a value near an FP4/FP8
// rounding boundary of a cache entry or indexer query then flips, changing top-k selections.
struct LinearOps {
  Backend& backend;
  bool batch_invariant = true;
};

// MXFP8 activations (model.md §5): every row of x[rows, in] fake-quantised in blocks of 32 along
// `in` by fq_fp8_block32_pow2 (amax clamped to 1e-4, s = 2^ceil(log2(amax/448)), e4m3 codes).
// `in` must be a multiple of 32.
// NOTE: [UNCERTAIN] in the spec: V4 used block-128 ue8m0 FP8 activations; V4.1 engines are taken
// to use MXFP8 (block 32), inferred from the 32x32 weight blocks and TRT-LLM's
// projection_quantization="mxfp8". The GPU kernels round the same GEMM inputs.
[[nodiscard]] std::vector<float> quantize_activations_mxfp8(std::span<const float> x, int64_t rows,
                                                            int64_t in);

// y[rows, out] = x[rows, in] · W[out, in]^T; with mxfp8_input, x goes through
// quantize_activations_mxfp8 first.
[[nodiscard]] std::vector<float> linear(const LinearOps& ops, std::span<const float> x,
                                        int64_t rows, TensorView w, bool mxfp8_input = false);
[[nodiscard]] inline std::vector<float> linear(const LinearOps& ops, std::span<const float> x,
                                               int64_t rows, const HostTensor& w) {
  return linear(ops, x, rows, w.view());
}
// A checkpoint linear: MXFP8 inputs exactly when the checkpoint stored it FP8 / MXFP4
// (block_scaled); BF16/F32 linears (compressor, indexer wk / weights_proj, router, head) see x.
[[nodiscard]] inline std::vector<float> linear(const LinearOps& ops, std::span<const float> x,
                                               int64_t rows, const LinearWeight& w) {
  return linear(ops, x, rows, w.weight.view(), w.block_scaled);
}

// In place: x[r,:] *= rsqrt(mean(x[r,:]^2) + eps) * weight (weight may be null = ones).
void rms_norm_rows(std::span<float> x, int64_t rows, int64_t dim, const float* weight, double eps);

// Rounds every value to bf16 (round-to-nearest-even) and back.
void round_to_bf16(std::span<float> x);

// RoPE over the trailing `rd` channels: interleaved pairs (x[2i], x[2i+1]) rotated as complex
// numbers by pos * f_i. kMain: theta = rope_theta. kCompress: compress_rope_theta with YaRN when
// rope_scaling is enabled (no mscale).
class Rope {
 public:
  Rope(const ModelConfig& config, RopeKind kind);
  // x points at the rd rotated channels.
  void apply(float* x, int64_t pos, bool inverse = false) const;
  [[nodiscard]] int32_t dim() const { return rd_; }

 private:
  int32_t rd_ = 0;
  std::vector<double> freqs_;  // [rd/2]
};

// mHC coefficients of one site for n rows (§3): pre/post [n, HC], comb [n, HC, HC] (comb[j,k]).
struct HcCoeffs {
  std::vector<double> pre, post, comb;
};
[[nodiscard]] HcCoeffs hc_mixes(const ModelConfig& config, const HcWeights& w,
                                std::span<const float> x, int64_t rows);
// out[r, D] = Σ_k pre[r,k] x[r,k,:].
[[nodiscard]] std::vector<float> hc_collapse(std::span<const float> x, int64_t rows, int32_t hc,
                                             int64_t dim, std::span<const double> pre);
// x'[r,k,:] = post[r,k] * y[r,:] + Σ_j comb[r,j,k] x[r,j,:].
void hc_expand(std::span<float> x, int64_t rows, int32_t hc, int64_t dim, std::span<const float> y,
               const HcCoeffs& coeffs);
// Identity pre-mix (stream 0) for n rows: [n, HC].
[[nodiscard]] std::vector<double> identity_pre(int64_t rows, int32_t hc);

// Indices of the k best allowed scores: higher score first, ties -> lowest index.
// NOTE: the tie rule is the oracle's documented choice (README choice 1); scores are compared
// with ==, so -0.0 ties +0.0. k is clamped to the number of allowed entries.
[[nodiscard]] std::vector<int32_t> topk_indices(std::span<const double> scores,
                                                std::span<const uint8_t> allowed, int32_t k);

// Routing of one MoE call, for tests and load statistics.
struct MoeTrace {
  std::vector<int32_t> experts;  // [rows, top_k] chosen expert ids
};
// y[rows, D] = routed experts (sqrt-softplus router, bias for selection only, bias_vl for image
// rows, weights normalised (sum + 1e-20) * routed_scaling_factor) + shared expert (§5).
[[nodiscard]] std::vector<float> moe_forward(const LinearOps& ops, const ModelConfig& config,
                                             const MoeWeights& w, int32_t top_k,
                                             std::span<const float> x, int64_t rows,
                                             std::span<const uint8_t> is_image, MoeTrace* trace);

// One query row: out[H, hd] = softmax_with_sink(q·K^T * hd^-0.5) · K, K = V = keys[nk, hd].
void attention_row(std::span<const float> q, int32_t heads, int32_t head_dim,
                   std::span<const float> keys, int64_t num_keys, std::span<const float> sink,
                   std::span<float> out);

// Grouped low-rank output projection (§2.5): o.view(n, G, H*hd/G)[g] @ wo_a[g]^T -> [n, G*O],
// then wo_b -> [n, D].
[[nodiscard]] std::vector<float> output_projection(const LinearOps& ops, const ModelConfig& config,
                                                   const AttentionWeights& w,
                                                   std::span<const float> o, int64_t rows);

}  // namespace moeserve::arch
