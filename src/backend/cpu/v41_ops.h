// CPU references of the DeepSeek-V4.1 attention-side ops (model.md §2.2–2.5, §3, §4, §5) that the
// CUDA kernels of backend/cuda/kernels.h are tested against. Spec-faithful straight loops, sums in
// double, over raw row-major pointers (fp32 activations; cache records as bytes) so the CPU model
// forward can call them too. Cache record layouts (one request, one layer):
//   SWA ring row (FP8):     dim e4m3 codes, then dim/32 ue8m0 scales        (512 -> 528 B)
//   main entry (FP4):       dim/2 e2m1 bytes (element 2i low nibble), dim/16 e4m3 scales (288 B)
//   index key (FP4):        dim/2 e2m1 bytes, dim/32 ue8m0 scales            (128 -> 68 B)
// Encodings are common/numeric.h's, quantisation rules common/fake_quant.h's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace moeserve::cpu {

// ---- RoPE (§2.2) -------------------------------------------------------------------------------

struct YarnParams {
  double factor = 16.0;
  int64_t original_max_position = 65536;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
};

// f_i = base^(-2i/rd), i < rd/2; with YaRN (compress rope) the correction-range ramp of §2.2
// (no mscale). main rope: base 1e4, yarn nullptr; compress rope: base 1.6e5 + YaRN x16.
[[nodiscard]] std::vector<double> rope_frequencies(double base, int rd, const YarnParams* yarn);

// In place on x[r, h, head_dim - rd .. head_dim) (row r at x + r*row_stride, head h at
// + h*head_stride): pairs (2i, 2i+1) rotated by angle pos[r]*freqs[i] (inverse: by -angle).
void rope(float* x, int64_t rows, int64_t row_stride, int heads, int64_t head_stride, int head_dim,
          int rd, const int32_t* pos, const double* freqs, bool inverse);

// ---- clamped SwiGLU (§5)
// -------------------------------------------------------------------------

// out[r,c] = silu(min(g, limit)) * clamp(u, -limit, limit) * (row_weight ? row_weight[r] : 1).
void swiglu_clamped(const float* gate, int64_t ld_gate, const float* up, int64_t ld_up, float* out,
                    int64_t ld_out, int64_t rows, int64_t cols, float limit,
                    const float* row_weight);

// ---- mHC (§3) ----------------------------------------------------------------------------------

// x: [rows, hc*dim] (row pitch ldx); fn [(2+hc)*hc, hc*dim], base [(2+hc)*hc], scale [3].
// mix = (f @ fn^T) * rsqrt(mean(f^2) + rms_eps); pre [rows,hc], post [rows,hc],
// comb [rows,hc,hc] (comb[j,k]) after softmax over k, +hc_eps, and `iters` Sinkhorn iterations
// (the first is the column normalisation after the softmax).
void hc_mixes(const float* x, int64_t ldx, int64_t rows, int hc, int64_t dim, const float* fn,
              const float* base, const float* scale, float rms_eps, float hc_eps, int iters,
              float* pre, float* post, float* comb);
// out[r, :] = Σ_k pre[r,k] x[r,k,:]   (x [rows, hc, dim], out [rows, dim]).
void hc_collapse(const float* x, int64_t rows, int hc, int64_t dim, const float* pre, float* out);
// x'[r,k,:] = post[r,k] * y[r,:] + Σ_j comb[r,j,k] x[r,j,:]  (in place on x).
void hc_expand(float* x, const float* y, int64_t rows, int hc, int64_t dim, const float* post,
               const float* comb);

// ---- cache writers (§2.2, §2.3)
// -------------------------------------------------------------------

[[nodiscard]] constexpr int64_t swa_row_bytes(int dim) { return dim + dim / 32; }
[[nodiscard]] constexpr int64_t main_entry_bytes(int dim) { return dim / 2 + dim / 16; }
[[nodiscard]] constexpr int64_t index_key_bytes(int dim) { return dim / 2 + dim / 32; }

// ring[pos[r] % ring_size] = FP8 record of kv[r, :dim]; rows overwritten later in the same call
// (pos[rows-1] - pos[r] >= ring_size; positions increasing) are skipped.
void swa_write_fp8(const float* kv, int64_t ld_kv, int64_t rows, int dim, const int32_t* pos,
                   uint8_t* ring, int ring_size);

enum class Fp4Record : uint8_t { kMainBlock16E4m3, kIndexBlock32Ue8m0 };
[[nodiscard]] constexpr int64_t fp4_record_bytes(Fp4Record f, int dim) {
  return f == Fp4Record::kMainBlock16E4m3 ? main_entry_bytes(dim) : index_key_bytes(dim);
}
// cache[first_entry + r] = FP4 record of x[r, :dim].
void fp4_cache_write(const float* x, int64_t ldx, int64_t rows, int dim, Fp4Record format,
                     uint8_t* cache, int64_t first_entry);

// Record -> floats (dequantised).
void swa_record_to_float(const uint8_t* record, int dim, float* out);
void fp4_record_to_float(const uint8_t* record, int dim, Fp4Record format, float* out);

// ---- compressor (§2.3)
// ---------------------------------------------------------------------------

// Groups completed by rows at positions [start_pos, start_pos + rows): floor((s+T)/r) - floor(s/r).
[[nodiscard]] constexpr int64_t compressor_groups(int64_t start_pos, int64_t rows, int ratio) {
  return (start_pos + rows) / ratio - start_pos / ratio;
}
// kv, gate: [rows, dim] (pitch ld) for consecutive positions start_pos...; gate unused when
// ratio == 1. state_kv/state_gate: [ratio-1, dim] carry of the open group (slot = pos % ratio),
// read for positions < start_pos of the first group and written for the trailing partial group.
// out[g, dim] = norm(bf16(Σ_t softmax_t(gate[t,c]) kv[t,c])) with RMSNorm(norm_weight, eps), one
// row per completed group (ratio 1: norm(bf16(kv))).
void compressor(const float* kv, const float* gate, int64_t ld, int64_t rows, int dim, int ratio,
                int64_t start_pos, float* state_kv, float* state_gate, const float* norm_weight,
                float eps, float* out);

// ---- indexer (§2.4)
// ------------------------------------------------------------------------------

// S[t, j] = scale * Σ_h w[t,h] relu(q[t,h,:] · key_j), key_j the dequantised index-key record j,
// for j < min(n_keys, (pos[t]+1)/ratio), else -inf. With candidates ([rows, n_cand] entry ids,
// -1 = none), S is [rows, n_cand] over those ids. scores pitch ld.
void indexer_scores(const float* q, const float* w, int64_t rows, int heads, int head_dim,
                    const uint8_t* keys, int64_t n_keys, const int32_t* pos, int ratio,
                    const int32_t* candidates, int64_t n_cand, float scale, float* scores,
                    int64_t ld);

// Exact top-k of each row, -inf entries dropped: out_idx[r, :k] sorted by score descending, ties
// -> lower index; unused slots -1 (out_val -inf). out_val / out_count may be null.
void topk_rows(const float* scores, int64_t rows, int64_t n, int64_t ld, int k, int32_t* out_idx,
               float* out_val, int32_t* out_count);

// B[t, b] = max_{j in [b*block, b*block+block)} S[t, j] (j < n); the block holding the row's
// newest visible entry, (min(n, (pos+1)/ratio) - 1) / block, is pinned to +inf.
void block_max_scores(const float* scores, int64_t rows, int64_t n, int64_t ld, int block,
                      const int32_t* pos, int ratio, float* out);
// cand[t, i*block + e] = ids[t,i]*block + e if ids[t,i] >= 0 and that entry < n_keys, else -1.
void blocks_to_candidates(const int32_t* block_ids, int64_t rows, int kb, int block, int64_t n_keys,
                          int32_t* cand);

// ---- sparse attention (§2.5)
// ---------------------------------------------------------------------

// Per query t and head h: keys = SWA records swa[swa_idx[t, i]] (FP8, i < swa_k) and main
// entries glob[glob_idx[t, i]] (FP4, i < glob_k), -1 ids skipped; K = V.
// logit = q·K * scale; p = softmax with exp(sink[h] - m) in the denominator; out = Σ p V; then
// the trailing rd channels of out are rotated by -pos[t]*freqs (freqs null: no rotation).
// q, out: [rows, heads, head_dim].
void sparse_attention(const float* q, int64_t rows, int heads, int head_dim, const uint8_t* swa,
                      const int32_t* swa_idx, int swa_k, const uint8_t* glob,
                      const int32_t* glob_idx, int glob_k, const float* sink, float scale,
                      const int32_t* pos, const double* freqs, int rd, float* out);
// The decode SWA list: idx[t, i] = (pos[t] - i) % ring_size for pos[t] - i >= max(0, floor),
// i < window, else -1.
void swa_window_indices(const int32_t* pos, int64_t rows, int window, int ring_size, int64_t floor,
                        int32_t* idx);

// ---- Engram (§4)
// ---------------------------------------------------------------------------------

// e[i, :dim] = e4m3 codes[ids[i]] * ue8m0 scales[ids[i], c/32] (tables [rows, dim], [rows,
// dim/32]).
void engram_gather(const uint8_t* codes, const uint8_t* scales, int dim, const int64_t* ids,
                   int64_t n, float* out);
// The gate of §4 on x [rows, hc, dim] in place: key [rows, hc*dim] (pitch ld_key), val
// [rows, dim] (pitch ld_val), wprod [hc, dim] (q_weight * k_weight); is_image (nullable) rows get
// g = 0. gate_out [rows, hc] nullable.
void engram_gate(float* x, const float* key, int64_t ld_key, const float* val, int64_t ld_val,
                 const float* wprod, const uint8_t* is_image, int64_t rows, int hc, int64_t dim,
                 float eps, float* gate_out);

// ---- sampling
// --------------------------------------------------------------------------------------

// The per-row uniform of sample_rows: splitmix64(seed), top 24 bits * 2^-24, in [0, 1).
[[nodiscard]] float sample_uniform(uint64_t seed);
// Per row: the top_k logits (ties -> lower index; 1 <= top_k <= 2048), p_i ∝ exp((l_i - l_0) /
// temperature) over them in descending order, the shortest prefix whose mass reaches top_p of the
// total, and the first i with cumulative mass > u * prefix mass, u = sample_uniform(seeds[r]).
// temperature <= 0: greedy (the top logit).
void sample_rows(const float* logits, int64_t rows, int64_t vocab, int64_t ld, float temperature,
                 int top_k, float top_p, const uint64_t* seeds, int32_t* out);

}  // namespace moeserve::cpu
