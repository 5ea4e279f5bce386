// Host-callable launchers of the CUDA kernels (definitions in *.cu). Plain header: pointers are
// device pointers, `stream` is an opaque cudaStream_t (nullptr = the legacy default stream).
// Every launcher checks its launch and aborts on a CUDA error; none synchronises.
// Layouts are row-major with leading dimensions in elements; counts are int64_t.
// NOTE: only tensor/dtype.h is included: nvcc compiles the .cu files that include this header,
// and fmt (reached through backend.h / check.h) does not compile under nvcc.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace moeserve::cuda {

using Stream = void*;

// ---- Programmatic dependent launch ----------------------------------------------------------

// Whether the launchers below give their kernels the programmatic-stream-serialization launch
// attribute (PDL, sm_90; cuda_util.cuh launch_kernel): a kernel may then be scheduled once every
// CTA of the previous kernel on its stream has exited, before that kernel's completion has been
// processed, which hides part of the launch gap at each of the decode step's ~1,800 dependent
// launches.
// Invariant that keeps stream order: every kernel of ours waits on the device
// (griddepcontrol.wait, its first statement) until its predecessor has completed and its writes
// are visible. Stream capture records the attribute as a programmatic graph edge. Process-wide
// (every stream, thread and model), read at each launch, so a captured CUDA graph keeps the
// setting of its capture. Off until set (GpuModelOptions::programmatic_launch sets it, on by
// default); cuBLASLt, copies and memsets are unaffected.
void set_programmatic_launch(bool on);
[[nodiscard]] bool programmatic_launch();

// ---- Backend-interface ops (fp32) ------------------------------------------------------------

// out[r,:] = x[r,:] * 1/sqrt(mean(x[r,:]^2) + eps) * weight (weight nullptr = ones).
struct RmsNormParams {
  const float* x = nullptr;
  const float* weight = nullptr;
  float* out = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t x_stride = 0;
  int64_t out_stride = 0;
  float eps = 1e-6f;
};
void launch_rms_norm(const RmsNormParams& p, Stream stream);

// Softmax over each row.
struct SoftmaxParams {
  const float* x = nullptr;
  float* out = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t x_stride = 0;
  int64_t out_stride = 0;
};
void launch_softmax(const SoftmaxParams& p, Stream stream);

enum class UnaryFn : uint8_t { kSilu, kSigmoid, kExp };
enum class BinaryFn : uint8_t { kAdd, kMul };

// Elementwise over n contiguous values.
struct UnaryParams {
  UnaryFn op = UnaryFn::kSilu;
  const float* x = nullptr;
  float* out = nullptr;
  int64_t n = 0;
};
void launch_unary(const UnaryParams& p, Stream stream);

// out[i] = a[i] op b[i % b_n]; b_n == n (same shape) or the row length (broadcast along rows).
struct BinaryParams {
  BinaryFn op = BinaryFn::kAdd;
  const float* a = nullptr;
  const float* b = nullptr;
  float* out = nullptr;
  int64_t n = 0;
  int64_t b_n = 0;
};
void launch_binary(const BinaryParams& p, Stream stream);

// ---- V4.1 ops ---------------------------------------------------------------------------------

// kMxfp8: e4m3 codes with one ue8m0 scale byte per 32 along the row in a separate array (only as
// the output of the MXFP8 quantisers below; the GEMMs taking `x_type` accept kF32 and kBF16).
enum class ActivationType : uint8_t { kF32, kBF16, kMxfp8 };

// y[M,N] (fp32, ldy) = x[M,K] (fp32 or bf16 bits, ldx) · dequant(W)^T with W e4m3 [N,K] (row
// pitch K bytes) and ue8m0 scales [ceil(N/32), K/32] (one per 32x32 block; w = e4m3 * 2^(s-127)).
// K % 32 == 0. bf16 tensor-core products with fp32 accumulation: fp32 activations are rounded to
// bf16 on load (the weights are exact in bf16).
struct Fp8BlockGemmParams {
  const void* x = nullptr;
  ActivationType x_type = ActivationType::kF32;
  int64_t ldx = 0;
  const uint8_t* w = nullptr;
  const uint8_t* w_scale = nullptr;
  float* y = nullptr;
  int64_t ldy = 0;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
};
void launch_fp8_block_gemm(const Fp8BlockGemmParams& p, Stream stream);

// As above with MXFP4 weights: e2m1 packed [N, K/2] (element 2i in the low nibble) and ue8m0
// scales [N, K/32] (one per row per 32 along K). Dequantised to bf16 in the kernel (exact).
struct Mxfp4GemmParams {
  const void* x = nullptr;
  ActivationType x_type = ActivationType::kF32;
  int64_t ldx = 0;
  const uint8_t* w = nullptr;
  const uint8_t* w_scale = nullptr;
  float* y = nullptr;
  int64_t ldy = 0;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
};
void launch_mxfp4_gemm(const Mxfp4GemmParams& p, Stream stream);

// FP8 x FP8 block-scaled GEMM on Hopper wgmma (fp8_wgmma_gemm.cu; sm_90a):
//   y[m, n] = sum over K blocks kb of 32: 2^(a_scale[m, kb] - 127) * 2^(w_scale[n/32, kb] - 127)
//             * sum_{k in kb} e4m3(a[m, k]) * e4m3(w[n, k])
// A: e4m3 codes [M, K] (pitch lda bytes) with ue8m0 scales [M, K/32] (pitch lda_scale bytes), the
// output of launch_act_quant_mxfp8 with ActivationType::kMxfp8 (the same values as its bf16
// fake-quant output). W: e4m3 [N, K] (pitch K) with ue8m0 scales [N/32, K/32] (as
// Fp8BlockGemmParams). y fp32 [M, N] (pitch ldy), overwritten.
// Limits: N % 128 == 0, K % 128 == 0, lda % 16 == 0, lda_scale % 4 == 0, ldy even; a and w
// 16-byte, scales 4-byte, y 8-byte aligned; anything else aborts as bad arguments.
// Precision: each 32-term partial comes from the tensor core's FP8 accumulation (products exact,
// summed with ~14 significant bits), promoted to fp32 with its scale product; see the .cu.
// split_k: 0 picks a K split (over a thread-block cluster, reduced in rank order: deterministic)
// when the output tiles do not cover the SMs; 1..8 forces one (tests). Results depend on the
// split (fp32 summation order), never on the run.
struct Fp8WgmmaGemmParams {
  const uint8_t* a = nullptr;
  int64_t lda = 0;
  const uint8_t* a_scale = nullptr;
  int64_t lda_scale = 0;
  const uint8_t* w = nullptr;
  const uint8_t* w_scale = nullptr;
  float* y = nullptr;
  int64_t ldy = 0;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  int split_k = 0;
};
void launch_fp8_wgmma_gemm(const Fp8WgmmaGemmParams& p, Stream stream);

// ---- Row-scaled FP8 (fp8_rows.cu): operands for a plain FP8 GEMM with one scale per row ------
//
// An MXFP8 row (e4m3 codes q_b with one ue8m0 scale s_b per 32-wide block b, values v) is
// refolded onto ONE power-of-two scale per row, 2^(R - 127):
//   folded code = e4m3_rn(v * 2^(127 - R)),   row scale = 2^(R - 127) (a float).
// Activations: R = the largest over the row's blocks of the MXFP8 scale code of the block's own
// MXFP8 values (the rule applied to its output: s_b, or s_b - 1 where the rounding brought the
// block's amax down to 224 * 2^s_b), so R and the codes depend on the values only (the MXFP8
// rule is idempotent on values, not on codes). Weights: R = the row's largest stored s_b.
// A value stays exact while it stays above the e4m3 subnormal step 2^-9 in the row's scale
// (every value of the block that sets R is exact) and is otherwise rounded to that step, an
// absolute error <= 2^-10 * 2^(R - 127), i.e. <= 2^-10 / 224 ~ 4.4e-6 of the row's largest
// |value| (that block's amax is >= 224 * 2^(R - 127)). Blocks 18+ binades below the row's
// largest become 0. The product of two refolded operands is
// then sum_k q_a[m, k] q_w[n, k] * (scale_a[m] * scale_w[n]): a plain FP8 GEMM with outer
// scales (CublasLtGemm GemmPrecision::kFp8RowScaled), where the per-32 scales would need a
// promotion per k32 step (launch_fp8_wgmma_gemm). GpuModelOptions::fp8_row_scaled.

// out[r, :cols] (pitch ldo bytes), row_scale[r] = the row-scaled MXFP8 of x's row r (pitch ldx
// elements, fp32 or bf16 bits by x_type): each 32-wide block quantised by the MXFP8 rule of
// launch_act_quant_mxfp8 (its codes and scales bit for bit), then refolded as above. The MXFP8
// rule is idempotent on its own output, so a bf16 x that already holds MXFP8 values (an
// attention epilogue's o16) gives those values' codes. cols % 32 == 0, cols <= 65536,
// ldx >= cols, ldo >= cols; else bad arguments. One CTA per row holds the row in registers
// (one launch, x read once, out written once).
// in_row_scale / in_col_scale (optional, both or neither): x is first multiplied by
// (in_row_scale[r] * in_col_scale[c]), in that order: an unscaled row-scaled GEMM's output
// (LtGemmParams::unscaled) quantised as if launch_scale_rows_cols had scaled it, bit for bit.
struct ActQuantFp8RowsParams {
  const void* x = nullptr;
  ActivationType x_type = ActivationType::kF32;  // kF32 or kBF16
  int64_t ldx = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  uint8_t* out = nullptr;
  int64_t ldo = 0;
  float* row_scale = nullptr;  // [rows]
  const float* in_row_scale = nullptr;  // [rows] (output rows)
  const float* in_col_scale = nullptr;  // [cols]
  // Optional, as ActQuantParams: output row r reads x's row row_index[r] (< 0: a row of zeros);
  // the row count is read on the device (rows: its upper bound, the grid).
  const int32_t* row_index = nullptr;
  const int32_t* device_rows = nullptr;
  // The codes stored K-permuted within each 64-wide block for an FP8 grouped GEMM whose threads
  // decode 8 consecutive packed weight bytes per k32 step pair (tools/device/moe_fp8_probe.cu):
  // column 32 s + 16 j + 4 t + e (s, j < 2; t, e < 4) holds k = 16 t + 8 s + 4 j + e. The same
  // codes and row scales as without it. cols % 64 == 0.
  bool kperm_fp8 = false;
  // One warp per row instead of one CTA per row (up to 6144 columns; more columns take the CTA
  // form): the same codes and row scales, more rows in flight (the padded experts' slot rows).
  bool warp_per_row = false;
  // The CTA-per-row form: at least this many 8-column chunks per thread (0 or 1: the automatic
  // count, 1 up to 8192 columns; 2, 4, 8): fewer threads per row, each with more loads in flight.
  // The same codes and row scales.
  int min_chunks_per_thread = 0;
  // Optional SwiGLU input (the padded FP8 experts' w2 input in one pass): with up set, x is the
  // gate (x_type: fp32 or bf16, pitch ldx; up the same type and pitch; bf16 values widened
  // exactly first) and the value quantised at (r, c) is
  // swiglu_clamped(g', u', limit) * row_weight[r] (launch_swiglu_quant_mxfp8's order), where
  // g' = gate * row_scale[r] * gate_col_scale[(r / group_rows) * ld_col_scale + c] and u' the
  // same with up_col_scale when row_scale is set, else the values as stored. The same codes and
  // row scales as launch_swiglu_quant_mxfp8 (fp32 output) followed by this launch on its output.
  // Not with in_row_scale / in_col_scale.
  struct SwigluInput {
    const void* up = nullptr;
    const float* row_weight = nullptr;
    float limit = 10.0f;
    const float* row_scale = nullptr;
    const float* gate_col_scale = nullptr;
    const float* up_col_scale = nullptr;
    int64_t ld_col_scale = 0;
    int64_t group_rows = 0;
    // Rows whose row_weight is exactly 0 are written as zero rows (zero codes, the zero-row
    // scale) without reading x or up: the padded experts' empty slot rows (weight 0), a quarter
    // of the slots at the DEP32 decode share. The same codes wherever such a row's SwiGLU times
    // 0 is +0 (the padded path: the empty slots' GEMM rows are exact zeros); any x or up there,
    // NaN too, is not read. Needs up and row_weight.
    bool skip_zero_weight = false;
  } swiglu;
};
void launch_act_quant_fp8_rows(const ActQuantFp8RowsParams& p, Stream stream);

// The rows of a row-scaled FP8 operand gathered: out row r = src row row_index[r] (codes and row
// scale), or for row_index[r] < 0 a row of zero codes with the scale launch_act_quant_fp8_rows
// gives such a row. So launch_act_quant_fp8_rows over x's rows followed by this gather gives the
// codes and scales of launch_act_quant_fp8_rows with row_index, bit for bit (each output row
// depends on its source row only), quantising each source row once (the padded experts' inputs:
// 384 token rows into 3072 slot rows at the DEP32 decode share). cols % 16 == 0; src, out and
// their pitches 16-byte aligned.
struct GatherFp8RowsParams {
  const uint8_t* src = nullptr;
  int64_t ld_src = 0;
  const float* src_scale = nullptr;
  const int32_t* row_index = nullptr;  // [rows]
  int64_t rows = 0;
  int64_t cols = 0;
  uint8_t* out = nullptr;
  int64_t ldo = 0;
  float* out_scale = nullptr;  // [rows]
};
void launch_gather_fp8_rows(const GatherFp8RowsParams& p, Stream stream);

// The checkpoint FP8 weight w (e4m3 [n, k], ue8m0 scales [ceil(n/32), k/32], one per 32x32
// block) refolded per row: out [n, k] e4m3, row_scale[n] (the refold above, R per weight row
// over its k/32 blocks). k % 32 == 0, else bad arguments.
void launch_fold_fp8_block_rows(const uint8_t* w, const uint8_t* w_scale, int64_t n, int64_t k,
                                uint8_t* out, float* row_scale, Stream stream);

// y[m, n] (fp32, pitch ldy) *= row_scale[m] * col_scale[n] (the outer scales of a row-scaled FP8
// GEMM run without them).
void launch_scale_rows_cols(float* y, int64_t ldy, int64_t m, int64_t n, const float* row_scale,
                            const float* col_scale, Stream stream);

// ---- quantised-activation GEMM path (model.md §5) and the device-side MoE -----------------

// MXFP8 activation fake-quant before an FP8/MXFP4-weight GEMM (model.md §5 [UNCERTAIN] choice:
// block 32 along K, common/fake_quant.h fq_fp8_block32_pow2: s = 2^ceil(log2(max(amax,1e-4)/448)),
// q = e4m3(x / s) * s). out[r, :cols] = fq(x[row(r), :cols]) with row(r) = row_index ? row_index[r]
// : r, for r < (device_rows ? *device_rows : rows); out is bf16 bits (exact: e4m3 * 2^k) or fp32,
// or (kMxfp8) the e4m3 codes themselves (out, pitch ldo bytes) with the block's ue8m0 scale code
// in out_scale[r * ldo_scale + c / 32] (the same rule: code = e4m3(x / s), s = 2^(scale - 127), so
// e4m3 * s is the bf16/fp32 output bit for bit; launch_fp8_wgmma_gemm's A operand).
// cols % 32 == 0.
// kperm64 (bf16 output only, cols % 64 == 0; else bad arguments): within every 64-wide column
// tile the output is stored k-permuted for GroupedMxfp4GemmParams::a_kperm (see there): the value
// of column k = 16 t + 4 s + 2 h + v of the tile goes to column 16 s + 8 h + 2 t + v. The values
// and their 32-wide quantisation blocks are those of the natural output; only their places move.
struct ActQuantParams {
  const float* x = nullptr;
  int64_t ldx = 0;
  const int32_t* row_index = nullptr;
  int64_t rows = 0;                      // rows to write (upper bound when device_rows is set)
  const int32_t* device_rows = nullptr;  // optional: the row count, read on the device
  int64_t cols = 0;
  void* out = nullptr;
  ActivationType out_type = ActivationType::kBF16;
  int64_t ldo = 0;
  uint8_t* out_scale = nullptr;  // kMxfp8 only: [rows, cols / 32] ue8m0 codes
  int64_t ldo_scale = 0;         // kMxfp8 only: >= cols / 32
  bool kperm64 = false;          // kBF16 only: k-permuted columns (above)
};
void launch_act_quant_mxfp8(const ActQuantParams& p, Stream stream);

// out[r, c] = fq(silu(min(g, limit)) * clamp(u, ±limit) * row_weight[r]) (the routed expert's
// clamped SwiGLU times its routing weight, then the MXFP8 fake-quant of w2's input) for r <
// *device_rows (or rows); bf16 bits, fp32 or e4m3 codes + ue8m0 scales as above. cols % 32 == 0.
// kperm64: the k-permuted bf16 output of ActQuantParams::kperm64 (cols % 64 == 0).
struct SwigluQuantParams {
  const float* gate = nullptr;
  const float* up = nullptr;
  int64_t ld = 0;  // pitch of gate and up
  const float* row_weight = nullptr;
  int64_t rows = 0;
  const int32_t* device_rows = nullptr;
  int64_t cols = 0;
  float limit = 10.0f;
  void* out = nullptr;
  ActivationType out_type = ActivationType::kBF16;
  int64_t ldo = 0;
  uint8_t* out_scale = nullptr;  // kMxfp8 only
  int64_t ldo_scale = 0;
  bool kperm64 = false;  // kBF16 only: k-permuted columns (ActQuantParams::kperm64)
  // Optional (the padded FP8 experts: gate and up from an unscaled FP8 GEMM): before the SwiGLU,
  // gate[r, c] *= in_row_scale[r] * gate_col_scale[g * ld_col_scale + c] and up[r, c] *=
  // in_row_scale[r] * up_col_scale[g * ld_col_scale + c], g = r / group_rows. All three set or
  // none; then group_rows >= 1.
  const float* in_row_scale = nullptr;
  const float* gate_col_scale = nullptr;
  const float* up_col_scale = nullptr;
  int64_t ld_col_scale = 0;
  int64_t group_rows = 0;
};
void launch_swiglu_quant_mxfp8(const SwigluQuantParams& p, Stream stream);

// Groups the top-k hits of `rows` tokens by local expert on the device (no host sync): hits on
// experts in [0, local) are kept; image rows (image[r] != 0, when ids_vl is given) take the
// bias_vl routing (ids_vl, weights_vl). Outputs: offsets[local + 1] (exclusive prefix of the
// per-expert counts; offsets[local] = kept hits), perm_row[p] = token of grouped hit p,
// perm_weight[p] its routing weight, inv[r * k + j] = grouped position of hit (r, j) or -1.
// The order inside one expert follows the kernel's atomics (each row's grouped-GEMM result does
// not depend on it), unless `ordered`: then inside one expert the grouped hits are in hit order
// (token-major, a hit's copies in replica order), so the same routing gives the same layout on
// every run (the padded FP8 experts' slots depend on it); scratch: moe_group_scratch_ints(local)
// ints of device memory. `ordered` was written in r14 without a device run
// (CudaV41.MoeGroupOrdered* and GpuForward.MoePaddedFp8IsDeterministic... are its first checks).
// replicas > 1 (a bench of one expert-parallel rank): copies stand in for the tokens the other
// ranks would send (same perm_row and weight); inv points at copy 0 (the hit itself), so a combine
// over inv adds this rank's own hits once. With experts_total > local (the layer's routed
// experts), copy r of a hit on expert id goes to local expert m = (id - r * local) mod
// experts_total when m < local: replica r stands for another rank's tokens by this rank's hits on
// expert block r, so an expert's count is a sum of `replicas` different experts' counts (about
// rows * k * replicas / experts_total with the spread of independent ranks), not one count times
// `replicas`. Otherwise (experts_total <= local) every hit on a local expert is grouped
// `replicas` times. offsets and perm_row / perm_weight hold replicas * rows * k entries at most.
// local <= 4096.
struct MoeGroupParams {
  const int32_t* ids = nullptr;  // [rows, k]
  const float* weights = nullptr;
  const int32_t* ids_vl = nullptr;
  const float* weights_vl = nullptr;
  const uint8_t* image = nullptr;
  int64_t rows = 0;
  int k = 0;
  int local = 0;
  int32_t* offsets = nullptr;
  int32_t* perm_row = nullptr;
  float* perm_weight = nullptr;
  int32_t* inv = nullptr;
  int replicas = 1;
  int experts_total = 0;
  bool ordered = false;
  int32_t* scratch = nullptr;
  // With `ordered`: the staged kernel (the same positions): counts and offsets in shared memory
  // where they fit (moe_group_ordered_smem_bytes), hits read a batch at a time with their loads
  // first, each scan's counts read before it is scanned. scratch is still required. Written in
  // r24 against the one-CTA kernel's chains of dependent global loads (12.1 us per layer at the
  // DEP32 64 x 6 decode share, r18 ncu); not yet run on a GPU.
  bool staged = false;
};
void launch_moe_group(const MoeGroupParams& p, Stream stream);
int64_t moe_group_scratch_ints(int local);
// With MoeGroupParams::ordered: the shared memory the launch for `local` experts and `hits` hits
// (rows * k) takes for its counts, or 0 where they do not fit and go through scratch instead
// (the same positions either way; tests pick shapes on both sides).
size_t moe_group_ordered_smem_bytes(int local, int64_t hits);

// The SwiGLU + MXFP8 epilogue of a grouped GEMM with two weight sets (GroupedMxfp4GemmParams::
// swiglu): out = what launch_swiglu_quant_mxfp8 writes (bf16 output) from gate = y and up = y_b.
struct GroupedSwigluEpilogue {
  void* out = nullptr;                // bf16 [grouped rows, n], pitch ldo; null: no epilogue
  int64_t ldo = 0;                    // >= n, % 8 == 0; out 16-byte aligned
  const float* row_weight = nullptr;  // per grouped row (SwigluQuantParams::row_weight; null: 1)
  float limit = 10.0f;                // SwigluQuantParams::limit
  bool kperm64 = false;               // SwigluQuantParams::kperm64 (n % 64 == 0)
};

// Grouped MXFP4 GEMM over the grouped rows: for expert e and offsets[e] <= r < offsets[e + 1]:
// y[r, :n] = a[r, :k] · dequant(W_e)^T, with a bf16 (MXFP8 values), W_e packed e2m1 [n, k/2] at
// w[e] and ue8m0 scales [n, k/32] at w_scale[e] (device arrays of device pointers). Row counts
// stay on the device; max_rows bounds every expert's count (e.g. the token count). k % 32 == 0,
// a 16-byte aligned with lda % 8 == 0. rows_hint (expected rows per expert) picks the tile.
struct GroupedMxfp4GemmParams {
  const void* a = nullptr;
  int64_t lda = 0;
  const int32_t* offsets = nullptr;
  int num_experts = 0;
  int64_t max_rows = 0;
  const uint8_t* const* w = nullptr;
  const uint8_t* const* w_scale = nullptr;
  float* y = nullptr;
  int64_t ldy = 0;
  int64_t n = 0;
  int64_t k = 0;
  int64_t rows_hint = 0;
  // sm_90a wgmma kernel for rows_hint > 24 (128-row x 256-column tiles, weights dequantised to
  // bf16 in shared memory, K % 128 == 0, n and ldy even, y 8-byte aligned); otherwise, or off
  // Hopper, the table kernels. Off here; the model turns it on (GpuModelOptions).
  bool use_wgmma = false;
  // With use_wgmma: the swapped-operand kernel instead (D = W · A^T per expert: 128 weight rows
  // per CTA as wgmma's register operand, dequantised straight into the fragment; up to 192 rows
  // of A per pass as the shared-memory operand, 224 with rs_max_pass). Same conditions as
  // use_wgmma, except y needs only 4-byte alignment, and a_rows > 0.
  bool wgmma_rs = false;
  // With wgmma_rs: the most grouped rows of one expert in one CTA pass (0 or 192: 192, or 224).
  // Every pass decodes the CTA's weight tile again, so an expert of R rows costs ceil(R / max)
  // decodes; a pass takes the shape of its rows rounded up to 64 (64, 128, 192), or 224 for
  // 193-224 rows. Other values: launch_grouped_mxfp4_gemm aborts as bad arguments.
  int rs_max_pass = 0;
  // Rows of A the kernel may read (allocated, whatever the counts): the swapped-operand kernel
  // loads A by TMA in boxes of 64 rows (32 with rs_max_pass 224) and needs this bound; 0
  // (unknown): it is not taken.
  int64_t a_rows = 0;
  // Optional second weight set over the same A (the MoE's w1 and w3 in one launch):
  // y_b = A · dequant(w_b)^T with the same n, k and ldy. Kernels that cannot take both in one
  // launch run twice.
  const uint8_t* const* w_b = nullptr;
  const uint8_t* const* w_scale_b = nullptr;
  float* y_b = nullptr;
  // A is stored k-permuted within every 64-wide K tile of each row (the ActQuantParams::kperm64 /
  // SwigluQuantParams::kperm64 output): column 16 s + 8 h + 2 t + v of a tile (s < 4, h < 2,
  // t < 4, v < 2) holds k = 16 t + 4 s + 2 h + v of that tile. The swapped-operand kernel then
  // decodes each fragment from 8 consecutive packed weight bytes under one scale instead of
  // gathering bytes of 8 words under two. Only that kernel reads this layout: a launch it does
  // not take (grouped_mxfp4_rs_applies false) aborts as bad arguments instead of computing with
  // permuted columns.
  bool a_kperm = false;
  // Optional, with w_b (the MoE's w1 + w3; swiglu.out set): y and y_b are not written (both
  // null, ldy unused); instead the swapped-operand kernel's epilogue writes swiglu.out[r, :n] for
  // the grouped rows r < offsets[num_experts], bit for bit what launch_swiglu_quant_mxfp8 writes
  // (bf16 output; gate = y, up = y_b, row_weight, limit, kperm64 as in swiglu) after the unfused
  // launch: the same fp32 accumulators (a CTA takes 64 columns of both sets, warpgroup 0 those of
  // W and warpgroup 1 the same of W_b, instead of 128 of one set), then the same SwiGLU and MXFP8
  // operations. Saves the fp32 y and y_b (written and read back: 16 bytes per element of out) and
  // a launch. Only that kernel has the epilogue: grouped_mxfp4_rs_applies says whether it takes
  // the launch, checking also w_b set, y and y_b null, n % 32 == 0 (n % 64 with kperm64), ldo
  // and out (GroupedSwigluEpilogue); a launch it does not take aborts as bad arguments.
  GroupedSwigluEpilogue swiglu;
  // With wgmma_rs, where the swapped-operand kernel takes the launch: its stream-K form instead
  // of the grid of (128 weight rows, pass, expert) CTAs. A persistent grid of sk_ctas CTAs (0:
  // one per SM; at most the SM count) walks the concatenated K tiles of every (weight tile, pass,
  // expert) unit, read from offsets on the device, each CTA an equal share of them weighted by
  // pass shape (a 64-row pass's tile costs 2, a 128-row one 3, a 192-row one 4). A unit cut
  // between CTAs is summed by the CTA holding its first K tile: the others store their fp32 partial
  // tiles in sk_workspace (slot = CTA index) and raise sk_flags[CTA index]; it waits for those
  // flags, adds the partials in K order (deterministic: the cuts depend on the counts and sk_ctas
  // only) and resets the flags to 0. Same products; fp32 sums of a cut unit in another order.
  // Only with the unfused epilogue (swiglu.out null) and 192-row passes (rs_max_pass 0 or 192):
  // otherwise launch_grouped_mxfp4_gemm aborts as bad arguments; so it does when stream_k is set
  // and the workspace (grouped_mxfp4_stream_k_workspace: sk_workspace_floats floats, sk_flag_count
  // flags) is missing or short. The flags must be 0 before the first launch (cudaMemset once at
  // allocation); every launch leaves them 0. Launches sharing a workspace must not overlap in time
  // (stream order does this).
  bool stream_k = false;
  // With stream_k: every CTA returns right after its pdl_wait when offsets[num_experts] (the
  // grouped row count) is 0: no unit, so no partial tile and no flag (ncu, r15: the empty launch
  // otherwise takes 8.3 us, the schedule and the ring's set-up for no work; the padded experts'
  // overflow launches are empty in almost every decode layer). The same results.
  bool sk_exit_empty = false;
  int sk_ctas = 0;
  float* sk_workspace = nullptr;
  int64_t sk_workspace_floats = 0;
  int32_t* sk_flags = nullptr;
  int64_t sk_flag_count = 0;
};
// FP8 grouped MXFP4 GEMM (moe_grouped_fp8.cu, sm_90a; the K loop of moe_fp8.cuh): per expert
// e and grouped row r in [offsets[e], offsets[e + 1]):
//   y[r, j] = a_scale[r] * 2^(w_ref[e][j] - 127) * sum_k a[r, k'] * e4m3(w[e][j, k] refolded)
// with a the row-scaled e4m3 codes of the grouped rows in the kperm_fp8 layout
// (ActQuantFp8RowsParams: launch_act_quant_fp8_rows with row_index / device_rows / kperm_fp8),
// a_scale their row scales, w / w_scale the expert's MXFP4 weights (packed e2m1 [n, k / 2], ue8m0
// [n, k / 32]) and w_ref[e] its rows' fold references (launch_mxfp4_row_ref). Products of the
// refolded values are exact; the sums are the tensor core's FP8 sums (as cuBLASLt's:
// ~1e-4..1e-3 of max |y|). CTAs of 128 weight rows x up to 192 grouped rows (grid: n / 128,
// ceil(max_rows / 192), experts; the counts are read on the device).
// Limits: n % 128 == 0, k % 128 == 0, lda % 16 == 0, a 16-byte aligned, ldy >= n; else bad
// arguments. Written without a device run (r13): the op test CudaFp8Rows.GroupedGemmMatchesCpu
// is its first check.
struct GroupedFp8GemmParams {
  const uint8_t* a = nullptr;
  int64_t lda = 0;
  const float* a_scale = nullptr;
  const int32_t* offsets = nullptr;
  int num_experts = 0;
  int64_t max_rows = 0;  // rows per expert, upper bound (the grid)
  const uint8_t* const* w = nullptr;
  const uint8_t* const* w_scale = nullptr;
  const uint8_t* const* w_ref = nullptr;
  float* y = nullptr;
  int64_t ldy = 0;
  int64_t n = 0;
  int64_t k = 0;
};
void launch_grouped_fp8_gemm(const GroupedFp8GemmParams& p, Stream stream);

// ref[r] = max_b w_scale[r, b] - 6 for r < n (w_scale ue8m0 [n, k / 32]): the fold reference of
// each MXFP4 weight row for launch_grouped_fp8_gemm. k % 32 == 0.
void launch_mxfp4_row_ref(const uint8_t* w_scale, int64_t n, int64_t k, uint8_t* ref,
                          Stream stream);

// ---- Padded batched FP8 experts (GpuModelOptions::moe_padded_fp8) ---------------------------
// The routed experts as strided-batched cuBLASLt FP8 GEMMs: each local expert's hits in a slot of
// `group_rows` (C) rows, the weights refolded to e4m3 once, the GEMMs unscaled and their outer
// scales applied by the consumers (launch_swiglu_quant_mxfp8's in_row_scale / *_col_scale, and
// launch_moe_combine_padded). Hits past an expert's C rows ("overflow") keep the grouped layout
// for the grouped MXFP4 kernel, so no hit is ever dropped.

// An MXFP4 weight (packed e2m1 [n, k / 2], element 2i in the low nibble; ue8m0 [n, k / 32])
// refolded per row onto e4m3 [n, k] (natural k order): code = e2m1 * 2^(s_b - R + 6), with R the
// row's largest scale code, and row_scale[r] = 2^(R - 133), so that code * row_scale is the MXFP4
// value. Exact for blocks with s_b >= R - 14 (e2m1's 0.5 step lands on e4m3's 2^-9 subnormal step
// at the edge); blocks further below round to nearest even on that step, an error of at most
// 2^-10 * row_scale = 2^-16 of the largest block's scale 2^(R - 127). k % 32 == 0.
void launch_fold_mxfp4_rows(const uint8_t* w, const uint8_t* w_scale, int64_t n, int64_t k,
                            uint8_t* out, float* row_scale, Stream stream);

// The slot layout of the grouped hits (launch_moe_group's offsets, perm_row, perm_weight, inv).
// Expert e's grouped hit i (position offsets[e] + i) goes to slot row e * C + i when i < C, else
// to overflow row ov_offsets[e] + i - C, where ov_offsets[e] = Σ_{e' < e} max(count_e' - C, 0)
// (ov_offsets[local] = the overflow total). Outputs: pad_row [local * C] (the token row, -1 for
// an empty slot row), pad_weight (0 there), ov_row / ov_weight [grouped_bound], ov_offsets
// [local + 1], pad_inv [hits] (inv's positions mapped: slot row, or local * C + overflow row;
// -1 stays -1). grouped_bound: the grouped hits' upper bound (the count is offsets[local], read
// on the device). local <= 4096, C >= 1.
struct MoePadPlanParams {
  const int32_t* offsets = nullptr;
  const int32_t* perm_row = nullptr;
  const float* perm_weight = nullptr;
  const int32_t* inv = nullptr;
  int64_t hits = 0;
  int local = 0;
  int64_t group_rows = 0;
  int64_t grouped_bound = 0;
  int32_t* pad_row = nullptr;
  float* pad_weight = nullptr;
  int32_t* pad_inv = nullptr;
  int32_t* ov_offsets = nullptr;
  int32_t* ov_row = nullptr;
  float* ov_weight = nullptr;
};
void launch_moe_pad_plan(const MoePadPlanParams& p, Stream stream);

// Which kernel a launch took (the last one when a second weight set ran as a second launch).
enum class GroupedMxfp4Kernel { kNone, kTable, kSkinny, kWgmma, kWgmmaRs, kWgmmaRsStreamK };
GroupedMxfp4Kernel launch_grouped_mxfp4_gemm(const GroupedMxfp4GemmParams& p, Stream stream);
// The stream-K launch's grid and workspace (GroupedMxfp4GemmParams::stream_k) for sk_ctas (0:
// the SM count of the current device): ctas CTAs, a 128 x 192 fp32 partial tile per CTA, one
// flag per CTA.
struct GroupedStreamKWorkspace {
  int ctas = 0;
  int64_t floats = 0;
  int64_t flags = 0;
};
[[nodiscard]] GroupedStreamKWorkspace grouped_mxfp4_stream_k_workspace(int sk_ctas);
// Whether launch_grouped_mxfp4_gemm takes the swapped-operand kernel for p (the flags, shape and
// alignment conditions, and a Hopper device; the same test the launch makes), so a caller can
// decide on a_kperm and swiglu before producing A. (A launch whose TMA descriptor the driver still
// refuses falls back, or with a_kperm or swiglu aborts.)
[[nodiscard]] bool grouped_mxfp4_rs_applies(const GroupedMxfp4GemmParams& p);

// out[N, K] (bf16 bits) = dequant(W) of an FP8 e4m3 [N, K] weight with 32x32 ue8m0 block scales
// (exact: e4m3 * 2^k is a bf16 value). K % 32 == 0.
void launch_dequant_fp8_block_to_bf16(const uint8_t* w, const uint8_t* w_scale, int64_t n,
                                      int64_t k, void* out, Stream stream);

// The MoE router of model.md §5, one block per token (fp32 throughout):
//   z = x · Wg^T / temperature, s = sqrt(softplus(z)) (softplus(z) = z above 20),
//   ids = top_k of s + bias (descending; ties -> lowest expert id),
//   weights = s[ids] / (sum s[ids] + 1e-20) * route_scale.
// num_experts <= 1024, top_k <= 16.
struct MoeRouterParams {
  const float* x = nullptr;  // [num_tokens, hidden], ldx
  int64_t ldx = 0;
  const float* gate_weight = nullptr;  // [num_experts, hidden], contiguous
  const float* bias = nullptr;         // [num_experts] (nullptr = zeros)
  int64_t num_tokens = 0;
  int64_t hidden = 0;
  int64_t num_experts = 0;
  int top_k = 6;
  float temperature = 1.0f;
  float route_scale = 1.5f;
  int32_t* topk_ids = nullptr;    // [num_tokens, top_k]
  float* topk_weights = nullptr;  // [num_tokens, top_k]
  // Optional: x · Wg^T [num_tokens, num_experts] already computed (e.g. one fp32 GEMM for the
  // batch); then x and gate_weight are not read.
  const float* logits = nullptr;
  // With logits: logits holds logit_slices partial products over disjoint K ranges (a split-K
  // GEMM's slices; slice s at logits + s * slice_stride, slice_stride >= num_tokens *
  // num_experts), summed in slice order, z = ((l_0 + l_1) + l_2) + ... in fp32.
  int logit_slices = 1;
  int64_t slice_stride = 0;
};
void launch_moe_router(const MoeRouterParams& p, Stream stream);

// The router logits' fp32 GEMM as split-K slices for launch_moe_router's logit_slices:
// out[s][t][e] = sum over k in slice s of x[t, k] * w[e, k], FFMA in increasing k (one
// accumulator per output), slice s covering the 16-wide k chunks [s C / S, (s + 1) C / S) of the
// C = hidden / 16 chunks. An output tile of 128 rows x 128 experts per CTA (256 threads, 8 x 8
// outputs each, up to 255 registers: one CTA per SM; 64 x 128 and 128 threads where rows <= 64,
// two per SM), so the decode's 384 x 384 logits are 9 tiles: 14 slices make 126 CTAs for the
// H200's 132 SMs. fp32 throughout (model.md §5:
// fp32 routing), deterministic; another summation order than cuBLASLt's FFMA GEMM. The bits depend
// only on the slices, not on the tile. hidden % 16 == 0, 1 <= slices <= hidden / 16; x rows and w
// 16-byte aligned (ldx % 4 == 0).
struct RouterLogitsParams {
  const float* x = nullptr;  // [rows, hidden], pitch ldx
  int64_t ldx = 0;
  const float* w = nullptr;  // [experts, hidden], contiguous
  int64_t rows = 0;
  int64_t experts = 0;
  int64_t hidden = 0;
  int slices = 1;
  float* out = nullptr;  // [slices][rows][experts]
};
void launch_router_logits_f32(const RouterLogitsParams& p, Stream stream);
// The slices that fill the device's SMs once with launch_router_logits_f32's tiles (one CTA per
// SM, two for 64-row tiles), at most 32 and at most one per 4 chunks of 16; 0 where that is
// fewer than 2 (the tiles alone fill the SMs, as at prefill: cuBLASLt is faster there).
int router_logits_auto_slices(int64_t rows, int64_t experts, int64_t hidden);

// One operand of a split-TF32 GEMM (an fp32-class product as ONE TF32 tensor-core GEMM of
// K = 3 cols; the model's router logits, GpuModelOptions::router_split_tf32). Each x = hi + lo:
// hi = x rounded to TF32 (the low 13 mantissa bits cleared, round to nearest even on the fp32
// bits; a finite x that would round past the largest finite value is truncated instead;
// non-finite x: hi = x, lo = 0), lo = x - hi (exact in fp32, |lo| <= 2^-11 |x|).
// out[r, :3 cols] (pitch ldo) holds lo in third lo_part (0, 1 or 2) and hi in the other two, so
// A' = [a_lo | a_hi | a_hi] (lo_part 0) and W' = [w_hi | w_lo | w_hi] (lo_part 1) give
// A' · W'^T = a_lo w_hi^T + a_hi w_lo^T + a_hi w_hi^T: a · w^T without a_lo w_lo^T (2^-22 of
// |a||w| per product); hi is exact in TF32, the GEMM's TF32 rounding of lo costs <= 2^-21 more.
// x [rows, cols], pitch ldx.
struct SplitTf32Params {
  const float* x = nullptr;
  int64_t ldx = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  float* out = nullptr;
  int64_t ldo = 0;  // >= 3 cols
  int lo_part = 0;
};
void launch_split_tf32(const SplitTf32Params& p, Stream stream);

// Greedy sampling: out[r] = argmax_c logits[r, c] (ties -> lowest c; logits finite).
// `scratch` holds `rows` uint64 (device) that the launcher overwrites.
struct ArgmaxParams {
  const float* logits = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;
  int32_t* out = nullptr;
  uint64_t* scratch = nullptr;
};
void launch_argmax_rows(const ArgmaxParams& p, Stream stream);

// ---- V4.1 attention-side ops (round 2; CPU references in backend/cpu/v41_ops.h) -------------
// fp32 activations; cache records as in v41_ops.h (SWA 528 B, main 288 B, index key 68 B).

// RoPE in place on x[r, h, head_dim - rd ..): pairs (2i, 2i+1) rotated by pos[r] * freqs[i]
// (angles and sin/cos in double; freqs: device doubles [rd/2] from cpu::rope_frequencies).
struct RopeParams {
  float* x = nullptr;
  int64_t rows = 0;
  int64_t row_stride = 0;
  int heads = 1;
  int64_t head_stride = 0;
  int head_dim = 0;
  int rd = 64;
  const int32_t* pos = nullptr;
  const double* freqs = nullptr;
  bool inverse = false;
  // Heads per thread, 1..8: one angle (double sincos) per thread for that many heads of a row
  // and pair (the same values at every setting). Refused outside 1..8 ("bad arguments").
  int heads_per_thread = 1;
};
void launch_rope(const RopeParams& p, Stream stream);

// out = silu(min(g, limit)) * clamp(u, +-limit) * (row_weight ? row_weight[r] : 1).
struct SwigluParams {
  const float* gate = nullptr;
  int64_t ld_gate = 0;
  const float* up = nullptr;
  int64_t ld_up = 0;
  float* out = nullptr;
  int64_t ld_out = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  float limit = 10.0f;
  const float* row_weight = nullptr;
};
void launch_swiglu_clamped(const SwigluParams& p, Stream stream);

// mHC mixes (model.md §3): x [rows, hc*dim] (pitch ldx), fn [(2+hc)*hc, hc*dim], base, scale [3]
// -> pre [rows,hc], post [rows,hc], comb [rows,hc,hc]. hc <= 4. One launch: thread-block clusters
// of 8 split hc*dim, each block a register-tiled fp32 dot over its slice (x read once; with
// 16-byte rows and hc*dim % 4 == 0 through a 4-deep cp.async ring), the partials reduced through
// distributed shared memory in a fixed order (deterministic), then one warp per row for the RMS
// scaling, sigmoids, softmax and Sinkhorn. fp32 FMA, no TF32.
struct HcMixesParams {
  const float* x = nullptr;
  int64_t ldx = 0;
  int64_t rows = 0;
  int hc = 4;
  int64_t dim = 0;
  const float* fn = nullptr;
  const float* base = nullptr;
  const float* scale = nullptr;
  float rms_eps = 1e-20f;
  float hc_eps = 1e-6f;
  int sinkhorn_iters = 20;
  float* pre = nullptr;
  float* post = nullptr;
  float* comb = nullptr;
  // Rows per thread of the staged (16-byte) path, 1..4 (tiles of 8 * that many rows); 0 = the
  // fewest whose clusters fit in one wave on this GPU. Tests and the bench pin it.
  int rows_per_thread = 0;
};
void launch_hc_mixes(const HcMixesParams& p, Stream stream);

// out[r,:] = Σ_k pre[r,k] x[r,k,:]  (x [rows, hc, dim]).
struct HcCollapseParams {
  const float* x = nullptr;
  int64_t rows = 0;
  int hc = 4;
  int64_t dim = 0;
  const float* pre = nullptr;
  float* out = nullptr;
};
void launch_hc_collapse(const HcCollapseParams& p, Stream stream);

// In place: x'[r,k,:] = post[r,k] y[r,:] + Σ_j comb[r,j,k] x[r,j,:]. With collapse_out set, also
// collapse_out[r,:] = Σ_k collapse_pre[r,k] x'[r,k,:] (the next site's collapse, fused: the same
// values as launch_hc_collapse on the updated x).
struct HcExpandParams {
  float* x = nullptr;
  const float* y = nullptr;
  int64_t rows = 0;
  int hc = 4;
  int64_t dim = 0;
  const float* post = nullptr;
  const float* comb = nullptr;
  const float* collapse_pre = nullptr;
  float* collapse_out = nullptr;
};
void launch_hc_expand(const HcExpandParams& p, Stream stream);

// launch_hc_expand followed by launch_hc_mixes of the updated x, in one launch: in place
// x'[r,k,:] = post[r,k] y[r,:] + Σ_j comb[r,j,k] x[r,j,:] (x [rows, hc, dim], pitch hc*dim; y
// [rows, dim]); with collapse_out set, collapse_out[r,:] = Σ_k collapse_pre[r,k] x'[r,k,:]; then
// the mixes of x' with fn, base, scale (as HcMixesParams) into mix_pre, mix_post, mix_comb. x' and
// collapse_out are the bits launch_hc_expand writes; the mixes are the same fp32 sums in another
// order. The one-kernel path takes hc == 4, dim % 32 == 0 and 16-byte aligned x, y, fn and
// collapse_out; other shapes run the two launches. The mixes outputs must not overlap x, y, post,
// comb or collapse_pre. With collapse_norm_weight set, collapse_out[r,:] is instead the RMSNorm of
// that collapse, v * 1/sqrt(mean(v^2) + collapse_norm_eps) * collapse_norm_weight (v the collapse
// above): launch_rms_norm's operations on it but for the order of the sum of squares, which the
// one-kernel path adds per block and then over the cluster's blocks in rank order (deterministic;
// no second pass over collapse_out in global memory). Where the one-kernel path does not take the
// shape, or its shared memory (which holds the block's collapse values until the row's sum is
// known) would not fit, the collapse is normalised by launch_rms_norm in place. Refuses
// (cuda_call_failed, "bad arguments") hc outside 1..4, dim < 1, rows < 0, a missing pointer,
// collapse_out without collapse_pre (or the reverse), collapse_norm_weight without collapse_out,
// collapse_norm_eps not >= 0 (NaN too), rows_per_thread outside 0..4, cluster_width other than
// 0, 4, 8 and 16, split_blocks outside 0..256 and split_blocks without partials.
struct HcExpandMixesParams {
  float* x = nullptr;
  const float* y = nullptr;
  int64_t rows = 0;
  int hc = 4;
  int64_t dim = 0;
  const float* post = nullptr;
  const float* comb = nullptr;
  const float* collapse_pre = nullptr;
  float* collapse_out = nullptr;
  const float* fn = nullptr;
  const float* base = nullptr;
  const float* scale = nullptr;
  float rms_eps = 1e-20f;
  float hc_eps = 1e-6f;
  int sinkhorn_iters = 20;
  float* mix_pre = nullptr;
  float* mix_post = nullptr;
  float* mix_comb = nullptr;
  // Rows per thread of the fused kernel's dots, 1..4 (tiles of 8 * that many rows); 0 = the rule
  // of HcMixesParams::rows_per_thread (not measured for this kernel).
  int rows_per_thread = 0;
  // Optional RMSNorm of collapse_out [dim] weights (nullptr: collapse_out is the plain collapse).
  const float* collapse_norm_weight = nullptr;
  float collapse_norm_eps = 1e-6f;
  // Blocks per cluster of the one-kernel path, 4, 8 or 16 (0 = 8): each block takes 1/width of
  // every row's columns, so a wider cluster puts more, shorter blocks in flight (at 384 rows and
  // 2 rows per thread: 96 / 192 / 384 blocks). 16 is a non-portable cluster size: where this GPU
  // cannot make a cluster of 16 of the kernel's blocks resident (cudaOccupancyMaxActiveClusters),
  // the launch runs at 8 (hc_expand_mixes_cluster_width says which). x' and collapse_out are the
  // same bits at every width; the mixes (and the norm's sum of squares) add their partial sums in
  // another order at each width (the blocks' own columns, then the blocks in rank order): a few
  // fp32 ulps apart, the same bits from run to run.
  int cluster_width = 0;
  // >= 1: the one-kernel path without clusters (cluster_width is then ignored): split_blocks
  // blocks per row tile, each taking every split_blocks-th 32-column chunk (at dim 5120 and 20
  // blocks: 8 chunks each; 384 rows at 2 rows per thread: 480 blocks, against 192 in clusters of
  // 8), write their sums to `partials`, and a second launch (a block per row) adds them in block
  // order, ends the mixes and, with collapse_norm_weight, normalises collapse_out in place. x'
  // and the plain collapse are the same bits as on the cluster path; the mixes and the norm's sum
  // of squares add the same kind of partial sums (a block's chunks, then the blocks in order),
  // the same bits from run to run at one split_blocks. 0: clusters.
  int split_blocks = 0;
  // With split_blocks: scratch of hc_expand_mixes_partials_floats(rows, hc, split_blocks) floats,
  // not shared with any other operand.
  float* partials = nullptr;
  // With split_blocks: the mixes' dots on tensor cores, mma.sync m16n8k8 TF32 in the 3xTF32 form
  // (each fp32 operand split into a TF32 hi and the remainder; hi*hi + hi*lo + lo*hi, the big and
  // the small terms in separate fp32 sums), instead of FFMA dots. x' and collapse_out are the same
  // bits; the mixes are within fp32-level error of the FFMA sums (another order and the dropped
  // lo*lo term, below 2^-22 of each product), deterministic. No effect on the cluster path or the
  // two-launch shapes.
  bool tensor_cores = false;
  // With split_blocks and collapse_norm_weight (both or neither set): also the row-scaled FP8
  // operand of the normalised collapse, written by the finish launch from the values it stores
  // into collapse_out: collapse_fp8 [rows, dim] e4m3 codes (pitch dim) and collapse_fp8_scale
  // [rows], the same bits launch_act_quant_fp8_rows writes for collapse_out (fp32, pitch dim), so
  // that the GEMM reading it next needs no quantiser launch (GpuModelOptions::mhc_fuse_attn_quant).
  uint8_t* collapse_fp8 = nullptr;
  float* collapse_fp8_scale = nullptr;
};
void launch_hc_expand_mixes(const HcExpandMixesParams& p, Stream stream);
// The split_blocks the model's automatic rule takes for `rows` (0: clusters): 16 up to 128 rows;
// up to 1024 rows, the blocks of one wave at two per SM over the tiles of 16 rows (2 x SMs /
// ceil(rows / 16), at least 2: 11 at 384 rows on the H200's 132 SMs); past that 0. Measured on
// the H200 (r16): mhc.expand at decode 64 x 6 (384 rows) 3.95 -> 3.66 ms at 11 (10: 3.75, 16:
// 4.15); 64 x 1 (64 rows) 2.00 -> 1.71 ms at 16; prefill 8K (8192 rows) 9.81 -> 10.15 ms at 20.
[[nodiscard]] int hc_expand_mixes_auto_split(int64_t rows);
// The floats of HcExpandMixesParams::partials for a split launch: split_blocks x rows x
// ((2 + hc) hc + 2).
[[nodiscard]] inline int64_t hc_expand_mixes_partials_floats(int64_t rows, int hc,
                                                             int split_blocks) {
  return static_cast<int64_t>(split_blocks) * rows * ((2 + hc) * hc + 2);
}
// The cluster width launch_hc_expand_mixes(p) runs its one kernel at (4, 8 or 16: cluster_width,
// or 8 where 16 cannot be resident on this GPU), 0 where p runs as two launches, on the split
// path (split_blocks) or has no rows.
// Refuses bad arguments as the launch does.
[[nodiscard]] int hc_expand_mixes_cluster_width(const HcExpandMixesParams& p);

// SWA ring write: ring[pos[r] % ring_size] = FP8 record (block-32 pow2 ue8m0) of kv[r, :dim];
// rows overwritten later in the same call are skipped (positions increasing). dim % 32 == 0.
struct SwaWriteParams {
  const float* kv = nullptr;
  int64_t ld_kv = 0;
  int64_t rows = 0;
  int dim = 512;
  const int32_t* pos = nullptr;
  uint8_t* ring = nullptr;
  int ring_size = 128;
};
void launch_swa_write_fp8(const SwaWriteParams& p, Stream stream);

// The sparse attention's SWA source list of every row (model.md §2.2; the forward's SWA slots):
// out[r, k] for k < window is the record index of position kp = pos[r] - k:
//   -1                                      if kp < max(0, floor[r]),
//   chunk_base + r - k                      if kp >= first_pos[r] (a row of this chunk, staged at
//                                           chunk_base + its row index),
//   slot[r] * window + kp % window          else (the sequence's ring).
// first_pos[r] / floor[r]: the first position of the row's chunk and the row's replay floor.
struct SwaIndexParams {
  const int32_t* pos = nullptr;
  const int64_t* slot = nullptr;
  const int32_t* first_pos = nullptr;
  const int32_t* floor = nullptr;
  int64_t rows = 0;
  int window = 128;
  int64_t chunk_base = 0;
  int32_t* out = nullptr;  // [rows, window]
};
void launch_swa_index(const SwaIndexParams& p, Stream stream);

enum class Fp4Record : uint8_t { kMainBlock16E4m3, kIndexBlock32Ue8m0 };
// cache[first_entry + r] = FP4 record of x[r, :dim] (main: block 16 e4m3 scales, 288 B at 512;
// index key: block 32 ue8m0, 68 B at 128).
struct Fp4CacheWriteParams {
  const float* x = nullptr;
  int64_t ldx = 0;
  int64_t rows = 0;
  int dim = 512;
  Fp4Record format = Fp4Record::kMainBlock16E4m3;
  uint8_t* cache = nullptr;
  int64_t first_entry = 0;
};
void launch_fp4_cache_write(const Fp4CacheWriteParams& p, Stream stream);

// Scattered FP4 cache writes, `count` (1 or 2) of them in one launch: for each write w,
// write[w].cache[entries[r]] = FP4 record of write[w].x[r, :dim] for r < write[w].rows
// (first_entry is not used); rows with entries[r] < 0 are skipped. Records are the same bytes as
// launch_fp4_cache_write's.
struct Fp4ScatterWriteParams {
  Fp4CacheWriteParams write[2];
  int count = 1;
  const int64_t* entries = nullptr;  // device [max rows]
};
void launch_fp4_cache_scatter_write(const Fp4ScatterWriteParams& p, Stream stream);

// Compressor (model.md §2.3) for rows at consecutive positions [start_pos, start_pos + rows):
// out [compressor_groups, dim] = norm(bf16(gated pool over each completed group of `ratio`)),
// partial groups carried in state_kv/state_gate [ratio-1, dim] (slot = pos % ratio). gate is
// unused for ratio 1. dim <= 1024.
struct CompressorParams {
  const float* kv = nullptr;
  const float* gate = nullptr;
  int64_t ld = 0;
  int64_t rows = 0;
  int dim = 512;
  int ratio = 2;
  int64_t start_pos = 0;
  float* state_kv = nullptr;
  float* state_gate = nullptr;
  const float* norm_weight = nullptr;
  float eps = 1e-20f;
  float* out = nullptr;
};
void launch_compressor(const CompressorParams& p, Stream stream);

// One sequence of a batched compressor call (a plain record: the host builds an array of them and
// uploads it). items = max(groups, 1 if a trailing partial group is stored else 0), where groups =
// (start_pos + rows) / ratio - start_pos / ratio; item_begin is the exclusive prefix sum of items.
struct CompressorSeq {
  int64_t row_begin = 0;  // first row of the sequence in kv / gate
  int64_t rows = 0;
  int64_t start_pos = 0;
  int64_t state_slot = 0;  // state at state_kv / state_gate + state_slot * state_stride
  int64_t out_group = 0;   // its first group's row in out
  int64_t item_begin = 0;
};
static_assert(sizeof(CompressorSeq) == 6 * sizeof(int64_t));
[[nodiscard]] int64_t compressor_items(int64_t start_pos, int64_t rows, int ratio);
// launch_compressor for num_seqs sequences in one launch, one block per item; the same bytes as
// one launch_compressor per sequence (distinct state slots). seqs is a device array.
struct CompressorBatchParams {
  const float* kv = nullptr;
  const float* gate = nullptr;
  int64_t ld = 0;
  int dim = 512;
  int ratio = 2;
  const CompressorSeq* seqs = nullptr;
  int num_seqs = 0;
  int64_t num_items = 0;  // sum of the items of all sequences (the grid)
  float* state_kv = nullptr;
  float* state_gate = nullptr;
  int64_t state_stride = 0;  // floats between state slots
  const float* norm_weight = nullptr;
  float eps = 1e-20f;
  float* out = nullptr;
};
void launch_compressor_batch(const CompressorBatchParams& p, Stream stream);

// Indexer scores (model.md §2.4) over FP4 index-key records; see cpu::indexer_scores.
// heads <= 64, head_dim == 128. bf16 tensor cores (mma.sync) on key tiles dequantised once per
// CTA into shared memory and shared by up to 8 query rows of one sequence.
// Single-sequence form (n_seqs == 0): rows [0, rows) score against keys[0, n_keys).
// Batched form (n_seqs > 0): sequence i owns rows [seqs[4i], seqs[4i] + seqs[4i+1]) and the key
// records keys + (seqs[4i+2] + j) * 68 for j < seqs[4i+3]; scores[r, :] has max_seq_keys columns
// (n_cand with candidates), those past a row's visible count -inf. Candidate ids are
// sequence-local entry ids. max_seq_rows / max_seq_keys are host values bounding the arrays.
// q_exact_bf16: every q value is a bf16 (the model's FP4 fake-quantised queries) - one MMA per
// tile instead of the hi + lo split that keeps fp32 queries to ~2^-16 relative.
struct IndexerScoreParams {
  const float* q = nullptr;  // [rows, heads, head_dim]
  const float* w = nullptr;  // [rows, heads]
  int64_t rows = 0;
  int heads = 32;
  int head_dim = 128;
  const uint8_t* keys = nullptr;
  int64_t n_keys = 0;  // single-sequence form
  const int32_t* pos = nullptr;
  int ratio = 1;
  const int32_t* candidates = nullptr;  // [rows, n_cand] or null
  int64_t n_cand = 0;
  float scale = 0.08838834764831845f;  // 128^-0.5
  float* scores = nullptr;
  int64_t ld = 0;
  int n_seqs = 0;                 // 0: single-sequence form
  const int64_t* seqs = nullptr;  // device [n_seqs, 4]: first row, rows, first key record, keys
  int64_t max_seq_rows = 0;
  int64_t max_seq_keys = 0;
  bool q_exact_bf16 = false;
  // Hopper (sm_90a) only, off by default: warpgroup MMA (wgmma, m64nNk16, N = 32 x rows of a
  // sequence per CTA) instead of mma.sync. Taken only with q_exact_bf16, no candidates and
  // heads == 32 (candidates: cand_wgmma below); every other shape runs the mma.sync kernels
  // whatever this says. Same numbers:
  // bf16 products, fp32 accumulation (summation order differs, so not bit-identical).
  bool use_wgmma = false;
  // With use_wgmma (where that kernel runs): e4m3 operands (wgmma m64nNk32, twice the bf16 rate)
  // instead of bf16. Each key's and each query vector's power-of-two block scales fold into its
  // e4m3 values relative to one power of two per vector, taken out again in the epilogue, so the
  // products stay exact for FP4 queries (q values e2m1 times a power of two per 32 dims, as the
  // forward's) and keys whose block scales lie within 2^11 of each other; other values round to
  // e4m3. The sums differ: Hopper adds each k32 step's products and the accumulator with ~14
  // significant bits (truncating) where the bf16 kernel sums in fp32 (v41_select.cu, kFp8).
  bool use_fp8 = false;
  // With use_wgmma and use_fp8, candidates, q_exact_bf16 and 32 heads: the candidates' scores on
  // e4m3 wgmma too (one row per CTA, the gathered records through a cp.async ring), instead of the
  // mma.sync kernel. use_fp8's operands and sums.
  bool cand_wgmma = false;
};
void launch_indexer_scores(const IndexerScoreParams& p, Stream stream);
// Whether launch_indexer_scores runs p's candidates on the e4m3 wgmma kernel (cand_wgmma and the
// conditions it names).
[[nodiscard]] bool indexer_cand_wgmma_applies(const IndexerScoreParams& p);

// Exact row top-k (k <= 2048; -inf and NaN dropped; sorted by score desc, ties -> lower index;
// -1 / -inf padding): one block per row, a radix select over the order-preserving score bits
// (three shared-memory histogram passes, 11 + 11 + 10 bits), a collect pass (index order where the
// k-th score is tied) and a bitonic sort of the k survivors. Rows of <= 24576 scores are read once;
// longer rows twice where the k-th key's top 11 bits leave <= 6144 candidates (compacted into
// shared memory; a cut inside a tie reads the row once more), else four times.
struct TopkParams {
  const float* scores = nullptr;
  int64_t rows = 0;
  int64_t n = 0;
  int64_t ld = 0;
  int k = 512;
  int32_t* out_idx = nullptr;
  float* out_val = nullptr;      // nullable
  int32_t* out_count = nullptr;  // nullable
  void* scratch = nullptr;       // topk_scratch_bytes (0 today; kept for the interface)
};
[[nodiscard]] size_t topk_scratch_bytes(int64_t rows, int64_t n);
void launch_topk(const TopkParams& p, Stream stream);

// Candidate-source block scores: see cpu::block_max_scores; out [rows, ceil(n/block)].
struct BlockMaxParams {
  const float* scores = nullptr;
  int64_t rows = 0;
  int64_t n = 0;
  int64_t ld = 0;
  int block = 8;
  const int32_t* pos = nullptr;
  int ratio = 1;
  float* out = nullptr;
};
void launch_block_max_scores(const BlockMaxParams& p, Stream stream);
// cand[t, i*block + e] = block_ids[t,i]*block + e (or -1): see cpu::blocks_to_candidates.
struct BlocksToCandidatesParams {
  const int32_t* block_ids = nullptr;
  int64_t rows = 0;
  int kb = 0;
  int block = 8;
  int64_t n_keys = 0;
  int32_t* cand = nullptr;
};
void launch_blocks_to_candidates(const BlocksToCandidatesParams& p, Stream stream);

// Sparse attention (model.md §2.5): see cpu::sparse_attention. head_dim == 512, heads % 16 == 0.
// swa_idx null: the decode window (cpu::swa_window_indices with swa_window, ring_size, swa_floor).
struct SparseAttentionParams {
  const float* q = nullptr;  // [rows, heads, head_dim]
  int64_t rows = 0;
  int heads = 64;
  int head_dim = 512;
  const uint8_t* swa = nullptr;
  const int32_t* swa_idx = nullptr;
  int swa_k = 128;
  int ring_size = 128;
  int64_t swa_floor = 0;
  const uint8_t* glob = nullptr;
  const int32_t* glob_idx = nullptr;
  int glob_k = 0;
  const float* sink = nullptr;
  float scale = 0.04419417382415922f;  // 512^-0.5
  const int32_t* pos = nullptr;
  const double* freqs = nullptr;  // null: no inverse RoPE
  int rd = 64;
  float* out = nullptr;
  // Optional: when set, the wgmma kernel writes here, instead of out, the bf16 bits of the MXFP8
  // fake-quant of each output row [rows, heads * head_dim] (32-channel blocks along it): exactly
  // what launch_act_quant_mxfp8 (ActivationType::kBF16, ldo = heads * head_dim) writes from the
  // fp32 output, without the fp32 round trip through memory. out is then not written (may be
  // null). Only the wgmma kernel has it: set it only where sparse_attention_wgmma_applies(p)
  // (8-byte aligned); otherwise launch_sparse_attention aborts as bad arguments, and so does
  // launch_sparse_attention_f64 whenever it is set.
  uint16_t* out_mxfp8_bf16 = nullptr;
  // Optional, instead of out and out_mxfp8_bf16: the wgmma kernel's epilogue writes the row-scaled
  // FP8 operand of each output row (wo_a's input): the e4m3 codes [rows, heads * head_dim] (4-byte
  // aligned) and the row scales [rows] that launch_act_quant_fp8_rows writes from
  // out_mxfp8_bf16's values (ActivationType::kBF16), bit for bit, without the bf16 round trip
  // through memory. Both set or neither; heads == 64 (a work item is then a whole row); set only
  // where sparse_attention_wgmma_applies(p), as out_mxfp8_bf16.
  uint8_t* out_fp8_rows = nullptr;
  float* out_row_scale = nullptr;
  // true: q and P as fp16 hi + lo pairs (about fp32; the GPU-vs-CPU model tests rely on it).
  // false: single fp16 operands (2^-11 relative; twice the MMA rate), FlashMLA's precision class.
  bool split_precision = true;
  // true: the warpgroup-MMA kernel (v41_attention_wgmma.cu; needs sm_90a) when the shape fits
  // (heads % 64 == 0: one CTA per row and 64 heads, each key tile dequantised once); other shapes
  // take the mma.sync kernel. Same precision modes and results to rounding.
  bool use_wgmma = false;
  // The wgmma kernel in single fp16 precision only (split precision and the other kernels ignore
  // it): an SWA (FP8) key's codes dequantised by one fp16 multiply by their power-of-two block
  // scale where that scale is an fp16 value (2^-24 .. 2^15), else through fp32 as without it.
  // One rounding of the same exact product either way: the same bits. Its own instantiations.
  bool swa_f16_scale = false;
  // The wgmma kernel's warp-specialised form (single fp16 precision, rd <= 64; otherwise the
  // two-warpgroup kernel): two producer warpgroups gather and dequantise 64-key tiles and convert
  // q, one consumer computes S over all 512 channels, the softmax and half of P . V, the other the
  // second half from P in shared memory and builds the key lists. Results agree with the
  // two-warpgroup kernel to fp32 rounding (S summed in one accumulator, not two halves); the
  // epilogues' outputs (fp32, out_mxfp8_bf16, out_fp8_rows) keep their definitions bit for bit
  // relative to its own fp32 values.
  bool warp_specialized = false;
  // With warp_specialized: consumer B, not the producers, converts q (each item's after B's
  // epilogue of the item before), so the producers go from an item's last key tile straight to
  // the next item's first. The same conversion: the same bits.
  bool ws_q_in_b = false;
};
void launch_sparse_attention(const SparseAttentionParams& p, Stream stream);
// Whether launch_sparse_attention takes the wgmma kernel for p (use_wgmma, the shape, a Hopper
// device; out_mxfp8_bf16, when set, 8-byte aligned): the launches that may set out_mxfp8_bf16.
[[nodiscard]] bool sparse_attention_wgmma_applies(const SparseAttentionParams& p);
// The same in double precision with the CPU reference's order of operations (one block per row
// and head; logits, max, denominator and outputs in key order): a test mode for comparing the GPU
// forward with the CPU forward (arch::GpuModelOptions::f64_attention). Slow.
void launch_sparse_attention_f64(const SparseAttentionParams& p, Stream stream);

// Host memory the GPU reads directly (Engram tables): cuMem host allocation with 2 MB granules
// mapped into the device's address space when the driver offers it, else cudaHostAlloc(mapped).
struct PinnedHostBuffer {
  void* host = nullptr;    // CPU address
  void* device = nullptr;  // the same memory as the GPU addresses it
  size_t bytes = 0;
  bool cumem = false;  // true: cuMemCreate(HOST) path (granule below)
  size_t granule = 0;
  uint64_t handle = 0;
};
[[nodiscard]] PinnedHostBuffer allocate_pinned_host(size_t bytes, bool try_cumem);
void free_pinned_host(PinnedHostBuffer& b);

// Engram row gather (prefetch): out_codes[i] = codes[ids[i]] (dim bytes), out_scales[i] =
// scales[ids[i]] (dim/32 bytes), codes/scales device-visible (PinnedHostBuffer::device), 16-byte
// reads over the bus. dim % 16 == 0.
struct EngramGatherParams {
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
  int dim = 256;
  const int64_t* ids = nullptr;  // device
  int64_t n = 0;
  uint8_t* out_codes = nullptr;
  uint8_t* out_scales = nullptr;
};
void launch_engram_gather(const EngramGatherParams& p, Stream stream);
// e[i, :] = e4m3 codes[i] * ue8m0 scales[i, c/32] (the gathered rows, device).
struct EngramDequantParams {
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
  int dim = 256;
  int64_t n = 0;
  float* out = nullptr;
};
void launch_engram_dequant(const EngramDequantParams& p, Stream stream);
// The gate of model.md §4; see cpu::engram_gate.
struct EngramGateParams {
  float* x = nullptr;
  const float* key = nullptr;
  int64_t ld_key = 0;
  const float* val = nullptr;
  int64_t ld_val = 0;
  const float* wprod = nullptr;
  const uint8_t* is_image = nullptr;
  int64_t rows = 0;
  int hc = 4;
  int64_t dim = 0;
  float eps = 1e-20f;
  float* gate_out = nullptr;
};
void launch_engram_gate(const EngramGateParams& p, Stream stream);

// Top-k / top-p sampling (cpu::sample_rows), deterministic per row seed. seeds: device [rows].
struct SampleParams {
  const float* logits = nullptr;
  int64_t rows = 0;
  int64_t vocab = 0;
  int64_t ld = 0;
  float temperature = 1.0f;
  int top_k = 50;
  float top_p = 1.0f;
  const uint64_t* seeds = nullptr;
  int32_t* out = nullptr;
  void* scratch = nullptr;  // sample_scratch_bytes
};
[[nodiscard]] size_t sample_scratch_bytes(int64_t rows, int64_t vocab, int top_k);
void launch_sample(const SampleParams& p, Stream stream);

// ---- test and benchmark data ----------------------------------------------------------------

// Fills device memory with deterministic pseudo-random values from `seed` (never all zeros):
// kF32/kBF16 uniform in [lo, hi); kF8E4M3 random e4m3 codes (no NaN); kU8/kF8E8M0 bytes in
// [lo, hi] (integers); kFp4E2m1 random bytes (two nibbles each).
struct FillParams {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t numel = 0;  // elements (kFp4E2m1: bytes = numel / 2)
  uint64_t seed = 1;
  float lo = -1.0f;
  float hi = 1.0f;
};
void launch_fill_random(const FillParams& p, Stream stream);

}  // namespace moeserve::cuda
