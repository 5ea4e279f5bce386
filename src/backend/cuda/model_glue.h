// Small data-movement kernels the GPU model forward needs between the V4.1 op launchers: row
// gather, the deterministic MoE combine, selection resolution (top-k slot -> cache entry), FP4
// index-query dequantisation, record copies into the SWA rings, fills. Plain header (device
// pointers, opaque stream); definitions in model_glue.cu. None synchronises.
#pragma once

#include <cstdint>

namespace moeserve::cuda {

using Stream = void*;

// dst[i, :cols] = src[idx[i], :cols] (fp32; pitches in elements).
void launch_gather_rows(const float* src, int64_t ld_src, const int32_t* idx, int64_t n,
                        int64_t cols, float* dst, int64_t ld_dst, Stream stream);

// y[t, :] += Σ_{j<k, inv[t,j] >= 0} src[inv[t,j], :] in j order (deterministic MoE combine).
void launch_moe_combine(const float* src, const int32_t* inv, int64_t rows, int k, int64_t cols,
                        float* y, Stream stream);

// The combine of the padded FP8 experts (kernels.h launch_moe_pad_plan): y[t, :] += Σ_{j<k} v(p)
// over p = pad_inv[t, j] >= 0 in j order, where v(p) = src[p, c] * row_scale[p] *
// col_scale[(p / group_rows) * cols + c] for a slot row p < slot_rows (the unscaled FP8 GEMM's
// outer scales), else v(p) = overflow[p - slot_rows, c] (already scaled). k <= 16. src is fp32,
// or with src_bf16 bf16 (the values widened exactly, then the same sums).
struct MoeCombinePaddedParams {
  const void* src = nullptr;         // [slot_rows, cols]
  bool src_bf16 = false;
  const float* row_scale = nullptr;  // [slot_rows]
  const float* col_scale = nullptr;  // [slot_rows / group_rows, cols]
  int64_t slot_rows = 0;
  int64_t group_rows = 0;
  const float* overflow = nullptr;  // [overflow rows, cols]
  const int32_t* inv = nullptr;     // [rows, k]
  int64_t rows = 0;
  int k = 0;
  int64_t cols = 0;
  float* y = nullptr;
};
void launch_moe_combine_padded(const MoeCombinePaddedParams& p, Stream stream);

// out[r, i] = e < 0 ? -1 : e + row_slot[r] * slot_stride, e = cand ? (idx < 0 ? -1 :
// cand[r, idx]) : idx, idx = idx_in[r, i] (top-k slot -> entry of the sequence's cache slot).
void launch_resolve_selection(const int32_t* idx_in, const int32_t* cand, int64_t n_cand,
                              const int64_t* row_slot, int64_t slot_stride, int64_t rows, int k,
                              int32_t* out, Stream stream);

// In place on x [n, dim] (dim % 32 == 0): the FP4 (block 32, ue8m0) fake-quant value of each
// element, from the records `rec` (written by launch_fp4_cache_write kIndexBlock32Ue8m0).
void launch_fp4_index_records_to_float(const uint8_t* rec, int64_t n, int dim, float* out,
                                       Stream stream);

// dst[dst_idx[i]] = src[src_row0 + i] for records of `rec_bytes` (dst_idx < 0: skipped).
void launch_copy_records(const uint8_t* src, int64_t n, int64_t rec_bytes, const int64_t* dst_idx,
                         uint8_t* dst, Stream stream);

void launch_fill_f32(float* x, int64_t n, float value, Stream stream);

// In place: each row of x [rows, k] sorted ascending, negative values (-1 = none) last
// (k <= 2048). Used to order candidate blocks by entry id, so top-k ties over the candidate
// list resolve to the lowest entry id as on the CPU.
void launch_sort_rows_ascending(int32_t* x, int64_t rows, int k, Stream stream);

// Plausible random cache records: per record `code_bytes` random code bytes (e4m3 without NaN
// when fp8_codes, else any byte = two e2m1 nibbles), then `scale_bytes` scale bytes uniform in
// [scale_lo, scale_hi].
void launch_fill_records(uint8_t* rec, int64_t n, int64_t code_bytes, int64_t scale_bytes,
                         bool fp8_codes, int scale_lo, int scale_hi, uint64_t seed, Stream stream);

}  // namespace moeserve::cuda
