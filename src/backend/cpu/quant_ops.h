// CPU references of the V4.1-specific ops that the CUDA kernels are tested against (model.md §1.3,
// §5): block-scaled FP8 and MXFP4 weight GEMMs, the MoE router and greedy sampling. Straight loops
// in double precision over weights decoded with common/numeric.h; OpenMP over output rows.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace moeserve::cpu {

// y[M,N] (F32) = x[M,K] (F32 or BF16) · dequant(W)^T, W F8E4M3 [N,K] with F8E8M0 scales
// [ceil(N/32), K/32] (32x32 blocks). K % 32 == 0; all views contiguous in their last dim.
void fp8_block_gemm(TensorView x, TensorView w, TensorView w_scale, TensorView y);

// Same with MXFP4 weights: W FP4_E2M1 [N,K] (packed [N,K/2], element 2i in the low nibble) and
// F8E8M0 scales [N, K/32]. W and its scales must be contiguous.
void mxfp4_gemm(TensorView x, TensorView w, TensorView w_scale, TensorView y);

struct MoeRouterConfig {
  int top_k = 6;
  float temperature = 1.0f;
  float route_scale = 1.5f;
};

// z = x[T,H] · gate_weight[E,H]^T / temperature (F32), s = sqrt(softplus(z)) (softplus(z) = z
// above 20); topk_ids[T,k] (I32) = top-k experts by s + bias (descending, ties -> lowest id; bias
// F32 [E] or empty = zeros); topk_weights[T,k] (F32) = s[id] / (sum s[ids] + 1e-20) * route_scale.
void moe_router(TensorView x, TensorView gate_weight, TensorView bias,
                const MoeRouterConfig& config, TensorView topk_ids, TensorView topk_weights);

// out[r] (I32) = argmax over logits[r, :] (F32), ties -> lowest index.
void argmax_rows(TensorView logits, TensorView out);

}  // namespace moeserve::cpu
