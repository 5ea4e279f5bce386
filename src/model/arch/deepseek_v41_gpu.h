// DeepseekV41Gpu: the DeepSeek-V4.1 backbone forward on one CUDA device (model.md §2–§5, §7),
// written from the CPU forward (deepseek_v41.cpp) and calling only the launchers of
// backend/cuda/{kernels,model_glue}.h. Weights stay in their checkpoint formats on the device
// (FP8 e4m3 + ue8m0 32x32 blocks, MXFP4 experts; BF16/F32 tensors as fp32), Engram tables in
// pinned host memory the GPU reads directly. Per-sequence caches live in device pools with the
// CPU state's byte formats: SWA rings (e4m3 + ue8m0, 528 B at hd 512), FP4 main entries (288 B),
// FP4 index keys (68 B), compressor partial groups (fp32).
// One forward runs a batch of sequences (prefill chunks and decode rows, concatenated); every
// launch covers the whole batch (the compressor, indexer scores and cache writes read per-sequence
// descriptors). Modes as the CPU model (kOracle / kProduction bounded replay).
// Invariant: forward() advances every sequence it was given by exactly its tokens.
// Linears: FP8/MXFP4 checkpoint weights get MXFP8 input rows (model.md §5), FP8 weights are held
// as bf16 for cuBLASLt, routed experts stay MXFP4 for the grouped GEMM; the MoE groups rows on
// the device (no host sync).
// A forward is planned on the host (positions, SWA slots, compressor and indexer descriptors,
// Engram ids: one metadata upload) and then launched without host synchronisation, so decode
// forwards can run as captured CUDA graphs (GpuModelOptions::cuda_graphs).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"
#include "model/arch/causal_lm.h"
#include "model/config.h"

namespace moeserve::arch {

struct GpuModelOptions {
  int32_t max_seqs = 8;        // sequence slots (device cache pools)
  int32_t max_context = 4096;  // positions per sequence
  int32_t max_rows = 4096;     // rows per forward (sum over sequences)
  // true: the fp32 linears (BF16 checkpoint tensors: compressor, indexer wk/weights_proj, head,
  // the DSpark Markov head) run on TF32 tensor cores; false: exact fp32 (the test).
  bool tf32_dense = false;
  // Backbone layers to run, ascending (empty: all). Each kept layer's KV / index / candidate
  // owner must be kept too (see subsample_layers).
  std::vector<int32_t> layers;
  // Routed experts held per layer (ids [0, local_experts)); -1: all. Routing is over every
  // expert; hits on experts not held are dropped (one DEP rank's share).
  int32_t local_experts = -1;
  // Bench of one expert-parallel rank: > 1 makes the local experts compute every local hit this
  // many times, the copies standing in for the tokens the other ranks of a DEP group send (so
  // the grouped GEMMs see a DEP rank's rows per expert: 64 x 6 rows per rank, 12 of 384 experts,
  // 32 ranks -> ~192 rows per expert); only this rank's own copy is combined into the output.
  // The all-to-all dispatch and combine themselves are not modelled. Scratch grows with it.
  int32_t moe_ep_ranks = 1;
  // With moe_ep_ranks > 1: true, copy r of a hit stands for rank r's tokens through this rank's
  // hits on expert block r (MoeGroupParams::experts_total: an expert's rows are the sum of
  // moe_ep_ranks different experts' counts, mean 192 and spread ~14 at the DEP32 decode share,
  // as independent ranks would send under uniform routing); false: every local hit copied
  // moe_ep_ranks times (rows per expert 32 x Binomial(2304, 1/384): mean 192, spread ~78, the
  // rounds before r14).
  bool moe_rank_block_replicas = true;
  // true: launch_moe_group places each expert's hits in hit order (MoeGroupParams::ordered), so
  // the layout is the same on every run; false: in the order of its atomics. Each grouped row's
  // result is independent of its place except with moe_padded_fp8 where hits pass the slots (which
  // hits take the overflow path follows the order): there only `ordered` is deterministic. On
  // since r15 (H200: moe.group 1.15 -> 1.52 ms per decode 64x6 step; the op and determinism tests
  // pass on the device).
  bool moe_group_ordered = true;
  // With moe_group_ordered: the staged ordered grouping (cuda::MoeGroupParams::staged: counts in
  // shared memory, batched loads; the same layout). Written in r24 (the one-CTA grouping takes
  // 12.1 us per layer on the main stream at 64 x 6, r18 ncu: chains of dependent global loads).
  // On since r25: CudaV41OrderedGroup.* / CudaV41RankBlocks.* and
  // GpuForward.MoeGroupStagedIsBitIdentical pass; measured (H100, r25 call 2): moe.group 0.855
  // -> 0.748 ms, decode 64 x 6 38.51 -> 38.34 ms, 64 x 1 21.65 -> 21.59 ms.
  bool moe_group_staged = true;
  // Random-weight models: rows of each Engram table kept in pinned host memory (hash ids are
  // drawn uniformly over them).
  int64_t random_engram_rows = int64_t{1} << 20;
  bool profile = false;  // per-component CUDA-event timing
  // true: decode-shaped forwards (every input <= 16 rows, no images, no bounded-replay
  // narrowing, no trace/profile/exact_linears) run as CUDA graphs, one per launch shape (batch,
  // rows per input, logits rows, indexer width rounded up to 512 entries): the first forward of a
  // shape runs eagerly, the second captures it, later ones replay it. The DSpark draft cycle
  // (dspark_draft) likewise, one graph per number of inputs (not with f64_attention either).
  bool cuda_graphs = false;
  // Captured graphs kept at most; past it the least recently replayed one is destroyed (each
  // holds device memory for its nodes; a server sees a new shape per batch composition).
  int32_t max_cuda_graphs = 32;
  // true: forward() copies the logits rows to the host (GpuForwardOutput::logits); false: only
  // the device argmax (greedy) comes back, as a server that samples on the device would copy.
  bool host_logits = true;
  // true: FP8/MXFP4 linears dequantised to fp32 at load and run as exact fp32 GEMMs (cuBLASLt,
  // no TF32) on the same MXFP8 inputs: the test's second GEMM path next to the production one.
  bool exact_linears = false;
  // true: the sparse attention in double with the CPU reference's order of operations
  // (launch_sparse_attention_f64; slow): test mode, removes the attention's fp32 rounding
  // differences from a GPU-vs-CPU comparison.
  bool f64_attention = false;
  // true: the sparse attention with single fp16 q and P operands (2^-11 relative, FlashMLA's
  // precision class, twice the MMA rate); false: fp16 hi + lo pairs (about fp32), which the
  // GPU-vs-CPU model tests use.
  bool fast_attention = false;
  // true: the indexer's batched scores (no candidates, 32 heads) on the sm_90a wgmma kernel
  // (IndexerScoreParams::use_wgmma); false: the mma.sync kernel. Same products (exact bf16 q,
  // exact bf16 keys), fp32 sums in a different order.
  bool indexer_wgmma = true;
  // true (with indexer_wgmma): that kernel on e4m3 operands (IndexerScoreParams::use_fp8: each
  // FP4 key's and query's block scales folded into its e4m3 values, wgmma m64nNk32 at twice the
  // bf16 rate). The same exact products; the sums keep Hopper's ~14-bit k32 accumulation instead
  // of fp32: 4e-4 of the largest score against the CPU's in the op test (1.2e-7 with bf16), where
  // a key's block scales differ. Measured on the H200 (r11, call 2): the indexer scores 4.62 ->
  // 3.92 ms per decode 64 x 6 step (48.31 -> 47.63 ms), prefill 8K after 128K 30.1 -> 25.9 ms
  // (64.7k -> 67.7k tokens/s). On, as the field runs its FP8 indexers (the same ~14-bit sums).
  bool indexer_fp8 = true;
  // true (with indexer_wgmma and indexer_fp8): the Reindex layers' candidate scores on e4m3 wgmma
  // too (IndexerScoreParams::cand_wgmma: one row per CTA, the candidates' records gathered through
  // a cp.async ring several tiles ahead, whole candidate blocks as 16-byte copies) instead of the
  // mma.sync kernel's bf16 products; the sums are indexer_fp8's. Measured on the H200 (r19, call
  // 5): the indexer scores 3.91 -> 2.88 ms per decode 64 x 6 step (38.33 -> 37.48 ms).
  bool indexer_cand_wgmma = true;
  // true: the sparse attention on the sm_90a wgmma kernel (SparseAttentionParams::use_wgmma:
  // persistent blocks over (row, 64 heads) items, each key tile dequantised once per row) where
  // it takes the shape (heads % 64 == 0, sm_90); false: the mma.sync kernel. The same products;
  // fp32 sums in another order (1e-6 of the output apart in the op tests).
  bool attention_wgmma = true;
  // With attention_wgmma and fast_attention, where the wgmma kernel runs
  // (SparseAttentionParams::swa_f16_scale, its own instantiations; the same bits): the SWA keys
  // dequantised by one fp16 multiply by their power-of-two scale instead of through fp32 (3x
  // fewer conversion instructions on the SWA tiles). r17 measured the same change behind runtime
  // branches (branch wip/attn-stage-f16s): the probe's decode phase 34.8k -> 30.4k cycles per
  // item, but the branches slowed the default path more. As a template parameter the default
  // kernels' PTX is unchanged (checked with nvcc --ptx). Written in r17 after the device time
  // ran out: not run. Off.
  bool attention_swa_f16_scale = false;
  // With attention_wgmma and fast_attention: the warp-specialised form of the wgmma kernel
  // (SparseAttentionParams::warp_specialized: two producer warpgroups dequantise 64-key tiles, one
  // consumer computes S over all 512 channels and the softmax, both consumers P . V; the epilogue
  // from the accumulators; the key lists built by consumer B). fp32 sums in another order than
  // the two-warpgroup kernel. New in r20, on since r21
  // (docs/perf/forward-gpu-2026-12-01-r21.md): decode 64 x 6 attention.sparse 8.75 -> 7.14 ms,
  // the attention probe (384 rows) 190 -> 110 us.
  bool attention_ws = true;
  // With attention_ws: consumer B converts each item's q instead of the producers
  // (SparseAttentionParams::ws_q_in_b), so the producers, the ws kernel's limit by r25's phase
  // clocks (busy ~59k of ~72k cycles per item, 15.6k of them on q, while B waits ~29k for P),
  // go from one item's last key tile straight to the next item's first. The same bits. Written
  // in r25 after the session's device time ran out: off until
  // CudaV41.SparseAttentionWsQInBIsBitIdentical and GpuForward.AttentionWsQInBIsBitIdentical
  // pass and rows *_wsqb measure it.
  bool attention_ws_q_in_b = false;
  // true: FP8-weight linears whose shape fits (out % 128, in % 128) run as FP8 x FP8 block-scaled
  // wgmma GEMMs on the e4m3 codes of the MXFP8 inputs (launch_fp8_wgmma_gemm: the tensor core's
  // FP8 accumulation over each 32-wide block, then fp32); false: the bf16 cuBLASLt GEMM on the
  // same values with fp32 accumulation. Ignored with exact_linears. Off by default: the kernel
  // is at ~20% of the FP8 rate and slower than cuBLASLt bf16 at decode shapes
  // (docs/perf/forward-gpu-2026-11-29-r5.md).
  bool fp8_wgmma = false;
  // true: FP8-weight linears (wq_a + wkv, wq_b, wo_a, wo_b, the shared expert, the indexer's
  // wq_b, Engram's wkv, DSpark's projections) run as row-scaled FP8 GEMMs on cuBLASLt
  // (GemmPrecision::kFp8RowScaled, FP8 tensor-core rate): the MXFP8 input refolded onto one
  // power-of-two scale per row (launch_act_quant_fp8_rows), the weight likewise at load
  // (launch_fold_fp8_block_rows: 1 byte per weight, which replaces the bf16 copy). Not bit-exact
  // with MXFP8: a value more than ~9 binades below its row's largest block is rounded to the
  // e4m3 subnormal step, an error <= ~4.4e-6 of the row's largest |value| per operand
  // (kernels.h "Row-scaled FP8"); the products are exact, summed by cuBLASLt's FP8 tensor-core
  // accumulation (1e-4..4e-4 of max|y| from a double product in the op tests). Ignored with
  // exact_linears or fp8_wgmma. Measured on the H200 (docs/perf/forward-gpu-2026-11-30-r13.md):
  // decode 64x6 47.27 -> 45.51 ms, 64x1 21.66 -> 20.61 ms, prefill 8K 70.6k -> 74.9k tok/s.
  bool fp8_row_scaled = true;
  // true: the MoE's grouped MXFP4 GEMMs at rows_hint > 24 on the sm_90a wgmma kernel
  // (GroupedMxfp4GemmParams::use_wgmma: 128 x 256 tiles, weights dequantised to bf16 in shared
  // memory); false: the WMMA table kernel. Same products, fp32 sums in another order. H200, 12
  // experts x 192 rows: 404 -> 236 us (w1/w3), 389 -> 214 us (w2); the DEP32 decode step's MoE
  // 63.5 -> 37.1 ms (docs/perf/forward-gpu-2026-11-30-r6.md).
  bool moe_grouped_wgmma = true;
  // With moe_grouped_wgmma: the swapped-operand wgmma kernel (GroupedMxfp4GemmParams::wgmma_rs:
  // the weights dequantised straight into wgmma's register operand, the activations by TMA) with
  // w1 and w3 in one launch; false: the v1 wgmma kernel. Same products, fp32 sums in another
  // order. H200, 12 experts x 192 rows: w1 + w3 462 -> 247 us, w2 210 -> 120 us; the DEP32 decode
  // step's MoE 37.0 -> 25.9 ms (docs/perf/forward-gpu-2026-11-30-r7.md).
  bool moe_grouped_wgmma_rs = true;
  // With moe_grouped_wgmma_rs, where that kernel takes both grouped GEMMs (w1 + w3 over hidden,
  // w2 over intermediate: cuda::grouped_mxfp4_rs_applies): the quantisers write the expert inputs
  // k-permuted within each 64-wide K tile (ActQuantParams / SwigluQuantParams::kperm64,
  // GroupedMxfp4GemmParams::a_kperm), so each thread's weight fragments come from 8 consecutive
  // packed bytes under one scale (no byte gather). Same products and values; fp32 sums in another
  // order. Otherwise the natural layout. H200, 12 experts x 192 rows: w1 + w3 247 -> 218 us, w2
  // 120 -> 108 us; the DEP32 decode step 56.2 -> 54.2 ms (MoE 25.9 -> 23.8).
  bool moe_kperm = true;
  // true: the routed experts' grouped GEMMs on the FP8 kernel (cuda::launch_grouped_fp8_gemm:
  // e2m1 weights refolded per row to e4m3, wgmma e4m3 x e4m3) where it takes the shapes (hidden
  // and intermediate % 128; sm_90 only, the launcher refuses others): the gathered rows
  // row-scaled e4m3 and K-permuted (launch_act_quant_fp8_rows, kperm_fp8), w1 and w3 into fp32
  // gate and up, the SwiGLU's MXFP8 values (launch_swiglu_quant_mxfp8, fp32) row-scaled the same
  // way for w2. Not bit-exact with
  // MXFP8 (the refolds, kernels.h "Row-scaled FP8"; FP8 tensor-core sums). Off: written in r13
  // without a device run (GpuForward.GreedyDecodeMoeFp8MatchesCpu and
  // CudaFp8Rows.GroupedGemmMatchesCpu are its first checks; tools/device/moe_fp8_probe.cu times
  // its K loop). Trace: moe_fp8.
  bool moe_fp8 = false;
  // true: where a MoE layer's expected hits per local expert (rows_hint) reach
  // moe_padded_min_rows, the routed experts run as strided-batched cuBLASLt FP8 GEMMs (kernels.h
  // "Padded batched FP8 experts"): each expert's hits in a slot of C = round_up(rows_hint +
  // max(rows_hint / 4, 32), 64) rows (launch_moe_pad_plan), the MXFP4 weights refolded once per
  // row to e4m3 (launch_fold_mxfp4_rows: w1 and w3 as one [2 inter, hidden] matrix per expert;
  // +1 byte per weight of device memory, the MXFP4 copy stays), the inputs row-scaled e4m3
  // (launch_act_quant_fp8_rows), w1 + w3 as one unscaled GEMM, the SwiGLU quantiser applying the
  // outer scales (its MXFP8 values row-scaled again for w2), w2 unscaled, the combine applying
  // w2's scales. Hits past an expert's C rows take the grouped MXFP4 path (no hit is dropped).
  // Not bit-exact with MXFP8 (the refolds, kernels.h; cuBLASLt's FP8 sums, as fp8_row_scaled).
  // Measured (H200, r14, DEP32 rank share): decode 64x6 47.38 -> 41.38 ms, 64x1 24.38 -> 21.63 ms,
  // prefill 8K the same (docs/perf/forward-gpu-2026-11-30-r14.md); r15 with the options below
  // 39.74 ms against 46.60 on the grouped path (r15.md). With hits past the slots the
  // grouping's order decides which hits overflow: deterministic with moe_group_ordered only (r14
  // ran it off for that reason; on since r15 with the ordered grouping,
  // GpuForward.MoePaddedFp8IsDeterministicAndGraphIsBitIdentical). Trace: moe_padded.
  bool moe_padded_fp8 = true;
  // With moe_padded_fp8: the least rows_hint that takes the path (fewer expected hits per expert
  // leave too many empty slot rows), and C itself when > 0 (tests: a small C sends hits to the
  // overflow path).
  int64_t moe_padded_min_rows = 16;
  int64_t moe_padded_group_rows = 0;
  // With moe_padded_fp8: the slot rows' e4m3 inputs as each token row quantised once and then
  // gathered into its slots (launch_gather_fp8_rows: the same bits); false: one quantiser CTA per
  // slot row (3,072 at the DEP32 decode share against 384 token rows). Measured (H200, r15,
  // decode 64x6): moe.act_quant 1.25 -> 0.65 ms, step 40.66 -> 39.64 ms.
  bool moe_padded_gather_quant = true;
  // With moe_padded_fp8: the two GEMMs' unscaled sums stored as bf16 (cuBLASLt's D type; each sum
  // rounded once, 2^-9 relative, before the outer scales, which are powers of two) instead of
  // fp32: half the bytes the GEMMs write and the SwiGLU quantiser and the combine read. Not with
  // moe_padded_two_pass_swiglu (its launch reads fp32). Measured (H200, r15, decode 64x6):
  // moe.w2 2.92 -> 2.44 ms, w13 4.74 -> 4.52, step 40.32 -> 39.64 ms.
  bool moe_padded_bf16 = true;
  // With moe_padded_fp8: the one-pass SwiGLU quantiser with a warp per slot row
  // (ActQuantFp8RowsParams::warp_per_row: the same codes) instead of a CTA per row. Measured
  // slower (H200, r15, decode 64x6: swiglu_quant 1.57 -> 3.03 ms, step 39.9 -> 41.6 ms: the
  // kernel is bound by its per-element arithmetic, not by loads in flight, and the warp form has
  // a quarter of the threads). Off.
  bool moe_padded_warp_quant = false;
  // With moe_padded_fp8: the row quantisers (CTA per row) with at least this many
  // 8-column chunks per thread (ActQuantFp8RowsParams::min_chunks_per_thread: 0 automatic, 2, 4,
  // 8; the same codes). ncu (r15): the SwiGLU quantiser at 3,072 rows x 2304 takes 35.9 us per
  // layer at 52% of the SM and 48% of memory throughput, 288 threads of one chunk each; two or
  // four chunks per thread put more loads in flight per thread. Measured (r16, decode 64x6):
  // no gain (swiglu_quant 1.545 -> 1.549 / 1.573 ms at 2 / 4). 0.
  int moe_padded_quant_cpt = 0;
  // With moe_padded_fp8: the overflow's stream-K grouped GEMMs return right after their
  // pdl_wait when no hit passed the slots (GroupedMxfp4GemmParams::sk_exit_empty; the same
  // results). ncu (r15): each of the two empty launches takes 8.3 us per layer. Measured (r16,
  // decode 64x6): moe.overflow 1.30 -> 0.81 ms, step 39.60 -> 38.90 ms. On.
  bool moe_overflow_exit_empty = true;
  // With moe_padded_fp8 and moe_shared_overlap (not with profile or moe_fp8): the overflow's
  // launches (input quantiser, the stream-K w1 + w3 and w2 GEMMs, the SwiGLU quantiser) run on
  // the side stream after the shared expert, from the slot plan on, under the padded GEMMs; the
  // combine waits for them (events; CUDA graphs capture the fork and join). The same kernels on
  // the same inputs: the same results. At decode they have no rows, and their four launches
  // (0.83 ms per 64 x 6 step, r16) then leave the main stream's chain. Written in r16 after the
  // device time ran out: not run. Off.
  bool moe_overflow_side_stream = false;
  // With moe_padded_fp8, in CUDA graphs (not with moe_overflow_side_stream or moe_fp8): the
  // overflow's four launches are captured into the body of a graph IF node (cuda::graph_if_begin)
  // whose condition, set on the device by a one-thread kernel, is "some hit passed the slots"
  // (the overflow offsets' total > 0). A replay without overflow (the decode's usual case)
  // skips them; eager forwards launch them as before. The same kernels on the same inputs where
  // they run: the same results. ncu (r18): the four take ~11 us of GPU time per layer at 64 x 6.
  // Measured (H200, r18 call 3): no gain, decode 64 x 6 38.82 -> 39.00 ms (the setter kernel and
  // the node cost about what the four early-exit launches did). Off.
  bool moe_overflow_graph_if = false;
  // With moe_padded_fp8 and moe_padded_gather_quant, where the shared expert's fused w1 + w3
  // takes row-scaled FP8 input: the FFN input f is quantised once (launch_act_quant_fp8_rows,
  // before the shared expert's fork), and both the shared expert's GEMM and the padded experts'
  // gather read those codes and row scales, instead of two launches computing the same bits
  // (ncu, r18: 8.6 us each per layer at 384 rows). With the side stream (moe_shared_overlap) the
  // launch is the side stream's first, off the main stream's chain, and the gather waits for it
  // (an event). Measured (H200, r18 call 5, on against off): prefill 8K after 128K 112.94 ->
  // 112.12 ms; decode 64 x 6 38.83 / 38.84 ms and 64 x 1 19.79 / 19.94 ms (within the ±0.35 ms
  // between runs: at decode the saved launch sat on the side stream). On: one launch fewer.
  bool moe_quant_once = true;
  // The RoPE launches' heads per thread, 1..8 (cuda::RopeParams::heads_per_thread: one double
  // sincos per thread for that many heads; the same values). q's RoPE (64 heads) computes each
  // angle 64 times at 1. Written in r16; measured in r17 (H200): attention.rope_swa 0.94 ->
  // 0.64 ms per 64 x 6 decode step at 8, the same bits (CudaV41.RopeForwardAndInverse). 8.
  int rope_heads_per_thread = 8;
  // With moe_padded_fp8: the SwiGLU quantiser writes the empty slot rows (routing weight 0) as
  // zero rows without reading or computing them (ActQuantFp8RowsParams::SwigluInput::
  // skip_zero_weight; the same codes: those rows' GEMM sums are exact zeros). At the DEP32 decode
  // share a quarter of the 3,072 slot rows are empty (C = 256 for a mean of 192 hits), and the
  // quantiser (1.56 ms per 64 x 6 step, r16) is bound by its per-element arithmetic. Written in
  // r16; measured in r17 (H200): moe.swiglu_quant 1.53 -> 1.33 ms per 64 x 6 step. On.
  bool moe_padded_skip_empty = true;
  // With moe_padded_fp8: the SwiGLU and w2's input quantiser as two launches (the SwiGLU's MXFP8
  // values in fp32 between them) instead of one; the same codes (a test of the one-pass form).
  bool moe_padded_two_pass_swiglu = false;
  // With moe_grouped_wgmma_rs: the most grouped rows of one expert that one pass of that kernel
  // takes (GroupedMxfp4GemmParams::rs_max_pass): 0 (192) or 224. Each pass decodes the expert's
  // weight tile again; under uniform DEP32 decode routing (32 x Binomial(2304, 1/384) rows per
  // expert, mean 192) an expert runs 1.40 passes at 192 and 1.25 at 224. Same products, each row
  // summed over K in one pass either way (whether wgmma's bits depend on the pass width:
  // CudaV41.GroupedMxfp4GemmWgmma prints it). Measured slower (H200, r9): decode 64x6 52.1 ->
  // 53.1 ms, 64x1 24.1 -> 24.3 ms; the probe's w1 + w3 at 192 rows per expert 218 -> 229 us; with
  // drawn counts 245 -> 236 us. Off.
  int moe_rs_max_pass = 0;
  // With moe_grouped_wgmma_rs and 192-row passes (moe_rs_max_pass 0 or 192): where that kernel
  // takes the unfused w1 + w3 and the w2 launches, its stream-K form
  // (GroupedMxfp4GemmParams::stream_k): one persistent CTA per SM shares the K tiles of every
  // (weight tile, pass, expert) unit, weighted by pass shape, instead of a grid of whole units (at
  // the DEP32 decode share 432 units of w1 + w3 on 132 SMs: 3.27 waves run as 4; w2 3.64 waves; the
  // drawn counts' second passes of a few rows each). A unit cut between CTAs is summed by its first
  // CTA in K order: deterministic, fp32 sums of cut units in another order. The model owns the
  // workspace (132 x 96 KB of fp32 partial tiles and a flag per CTA, allocated at the first
  // launch). The fused SwiGLU launch (moe_fuse_swiglu) keeps the per-unit grid (the stream-K form
  // has the unfused epilogue only). Measured SLOWER on the H200 (r12, call 2): the probe's w1 + w3
  // (k-permuted) 218.0 -> 232.7 us at 192 rows per expert and 237.8 -> 368.7 us at the drawn
  // counts, w2 107.6 -> 141.1 / 119.0 -> 205.8 us; decode 64 x 6 47.36 -> 55.96 ms, 64 x 1 21.58
  // -> 23.23 ms, prefill 8K 117.1 -> 118.0 ms. Not profiled: even with whole units per CTA
  // (sk_ctas = SM count at even counts) it is slower per K tile than the per-unit kernel, so the
  // balance it buys is lost in the segment loop. Kept, off, as the starting point for that.
  bool moe_stream_k = false;
  // With moe_grouped_wgmma_rs, where that kernel takes the w1 + w3 launch with the epilogue
  // (cuda::grouped_mxfp4_rs_applies; intermediate % 32, % 64 with moe_kperm): the clamped SwiGLU,
  // routing weight and MXFP8 fake-quant of w2's input run in that launch's epilogue
  // (GroupedMxfp4GemmParams::swiglu: a CTA holds the same 64 intermediate columns of w1 and w3)
  // instead of writing the fp32 gate and up for launch_swiglu_quant_mxfp8 (neither is allocated).
  // Bit-identical w2 input. Off by default: measured slower on the H200 (DEP32 decode 64 x 6
  // 51.9 -> 52.4 ms; docs/perf/forward-gpu-2026-11-30-r8.md).
  bool moe_fuse_swiglu = false;
  // true: the shared expert's w1 and w3 as one GEMM of [w1; w3] (out 2 * inter) into [rows,
  // 2 * inter], the clamped SwiGLU reading gate and up from its two halves: one launch instead of
  // two at decode's low-efficiency row counts. Built at load by device copies of w1 and w3, whose
  // own copies are then freed (device bytes and the roofline's weight bytes as unfused); only
  // where w1 and w3 have one format and shape (FP8: out % 32, whole scale blocks; the fp32 test
  // weights of exact_linears: any), else that layer keeps the two GEMMs (trace: shared_w13).
  // The same input, GEMM path (cuBLASLt bf16 / fp32, or the FP8 wgmma GEMM where w1 and w3 each
  // fit it) and products; cuBLASLt may pick another algorithm for the wider N (fp32 sums in
  // another order). H200, DEP32 decode 64 x 6: step 54.2 -> 53.7 ms; prefill 8K after 128K: 58.1k
  // -> 58.9k tok/s (docs/perf/forward-gpu-2026-11-30-r8.md).
  bool fuse_shared_w13 = true;
  // true: the attention's wq_a and wkv as one GEMM of [wq_a; wkv] (out q_lora_rank + head_dim,
  // built at load like fuse_shared_w13's, the two copies then freed) on the one quantised input;
  // q_norm and kv_norm read their columns out of the [rows, q_lora_rank + head_dim] output into
  // the contiguous qr and kv (RmsNormParams' strides), so nothing after them changes. At a decode
  // 64 x 6 step cuBLASLt runs the two alone at 45% and 22% of the bf16 rate (384 x 1280 x 5120:
  // 14.3 us, 384 x 512 x 5120: 11.7 us; docs/perf/cuda-ops-2026-11-30-r9.md). Main-model layers
  // only (the DSpark draft stages keep wq_a and wkv); where both have one format and shape (FP8:
  // wq_a's rows a multiple of 32; fp32: any), else the layer keeps two GEMMs (trace: qkv_a). The
  // same products; cuBLASLt may pick another algorithm for the wider N (fp32 sums in another
  // order). Measured on the H200 (r11, call 1): decode 64 x 6 48.79 -> 48.42 ms; 64 x 1 and
  // prefill 8K even (23.38 / 23.33, 126.6 / 126.7 ms). On.
  bool fuse_qkv_a = true;
  // true: the shared expert runs on a second stream, forked from the main one where the MoE
  // starts and joined before the routed experts' combine adds into its output, so its GEMMs fill
  // the SMs the router, the grouping and the grouped GEMMs' last waves leave idle (the shared
  // expert does not depend on the routing). Its own cuBLASLt handle and workspace; CUDA graphs
  // capture the fork and join as edges. Not with profile (the per-component events time one
  // stream: the breakdown then comes from serial work). Same kernels and results.
  bool moe_shared_overlap = true;
  // true: the MoE router logits z = f · Wg^T (model.md §5: fp32) as ONE cuBLASLt TF32 GEMM of
  // K = 3 hidden on split operands (cuda::launch_split_tf32: x = hi + lo, hi exact in TF32):
  // [f_lo | f_hi | f_hi] (written per call, [rows, 3 hidden] of scratch) times
  // [w_hi | w_lo | w_hi]^T (built at load: 3x the gate's device bytes, the gate kept), i.e.
  // lo·hi + hi·lo + hi·hi, dropping lo·lo (2^-22 relative per product), instead of cuBLASLt's
  // exact fp32 GEMM (an FFMA kernel: ~33 us per layer at 384 rows on the H200). Off by default:
  // the H200's tensor cores truncate their fp32 accumulation, so the split's logits are ~10x less
  // accurate than the fp32 GEMM's (6.2e-6 against 6.3e-7 of max|z| at 384 rows; one-pass TF32
  // 2.8e-4), and model.md asks for fp32 routing. It saves 0.8 ms of the DEP32 decode step (52.7
  // -> 51.9 ms) and 0.5% of prefill. Ignored with exact_linears.
  bool router_split_tf32 = false;
  // > 1: the router logits' exact fp32 GEMM (cuBLASLt, FFMA) as router_split_k K-slices in one
  // strided-batched call, summed in slice order by the router kernel (MoeRouterParams::
  // logit_slices): fp32 throughout, another summation order. At decode, m = n = 384 gives
  // cuBLASLt 18 tiles for 132 SMs; 8 slices give 144. Taken where the hidden size divides into
  // the slices, not with exact_linears, router_split_tf32 or trace (the trace reads whole
  // logits). 1: one GEMM. Measured no gain (H200, r9): the DEP32 decode's router part 2.50 ms
  // with one GEMM, 2.69 / 3.47 / 2.50 ms with 8 / 4 / 16 slices; step 51.7 vs 51.9 ms. Off.
  int router_split_k = 1;
  // > 0: the router logits' fp32 GEMM as our split-K FFMA kernel (cuda::launch_router_logits_f32:
  // 128 x 128 tiles of 8 x 8 outputs per thread, this many K slices, at most hidden / 16), the
  // router kernel summing the slices in order; fp32 throughout, another summation order than
  // cuBLASLt's. -1 (default): cuda::router_logits_auto_slices, the slices that fill the SMs once
  // (14 for the decode's 384 x 384 x 5120 logits on the H200), or cuBLASLt where the tiles alone
  // fill them (prefill). Taken before router_split_k; not with exact_linears, router_split_tf32
  // or trace (the trace reads whole logits). 0: cuBLASLt. Measured (H200, r22 call 2): the
  // router part at 64 x 6 2.55 -> 2.14 ms, step 35.89 -> 35.51 ms; at 64 x 1 1.37 -> 1.06 ms,
  // step 19.10 -> 18.93; 7 / 28 slices 3.45 / 2.34 ms; prefill 8K with one slice 5.37 -> 7.57 ms
  // (hence cuBLASLt there). Round 18's 64 x 64 tiles of 4 x 4 per thread were slower than
  // cuBLASLt (57 against 53 us per layer): shared memory and FFMA issue bound them together.
  int router_f32_slices = -1;
  // true: each mHC expand of the layer loop and the mixes that follow it on the updated x (the
  // ffn site's after the attention expand; the next layer's attention site's after the ffn
  // expand, where no Engram and no bounded-replay narrowing come between) run as one launch
  // (cuda::launch_hc_expand_mixes: x read once and written once instead of written, then read
  // again by the mixes), where the rows are at least mhc_fuse_min_rows. x and the fused collapse
  // are the same bits; the mixes' fp32 sums run in another order. The same cost accounting. Not
  // in the DSpark draft stages. Measured on the H200 (r10, call 3): decode 64 x 6 49.88 -> 49.66
  // ms, prefill 8K 130.2 -> 128.4 ms; at 64 rows (decode 64 x 1, one row per thread) the step is
  // ~0.2 ms slower (23.70 -> 23.89 ms), hence the row floor.
  bool mhc_fuse_expand_mixes = true;
  // The fewest rows a forward takes the fused launch at (fewer: the two launches). Was 129 (past
  // the 128 rows that width-8 clusters of one-row tiles fit in one wave) until the automatic
  // cluster width below gave the small batches width 16: measured on the H200 (r12, call 1),
  // decode 64 x 1 22.84 ms with the two launches, 22.39 fused at width 8, 21.51 fused at width 16.
  int64_t mhc_fuse_min_rows = 0;
  // The fused launch's rows per thread (HcExpandMixesParams::rows_per_thread: tiles of 8 x that
  // many rows), 1..4; 0 = the mixes kernel's rule (4 at 384 rows). For timing the tile height.
  int mhc_fused_rows_per_thread = 0;
  // The fused launch's blocks per cluster (HcExpandMixesParams::cluster_width), 4, 8 or 16; 0 =
  // 8. Each block takes 1/width of every row's columns: at decode 64 x 6 (384 rows, 2 rows per
  // thread) width 16 launches 384 blocks instead of 192 (r11's ncu: 192 blocks at two per SM are
  // 0.7 of a wave, 46 us per launch at 24% of HBM). 16 falls back to 8 where the GPU cannot hold
  // a cluster of 16. x' and the collapse are the same bits at every width; the mixes and the
  // fused norm's sum of squares add in another order per width. 0 = automatic: 16 up to
  // mhc_wide_cluster_max_rows rows, else 8. Measured on the H200 (r12, call 1): decode 64 x 1 (64
  // rows) fused 22.39 ms at width 8, 21.51 at 16; decode 64 x 6 (384 rows) 47.44 at 8, 47.85 at
  // 16, 48.01 at 4; prefill 8K 116.6 ms at 8, 119.3 at 16.
  int mhc_fused_cluster_width = 0;
  // The most rows at which the automatic width (mhc_fused_cluster_width 0) is 16. 128: the rows
  // measured faster at 16 were 64; 384 and 8192 were slower. Untimed between 65 and 383.
  int64_t mhc_wide_cluster_max_rows = 128;
  // > 0: the fused expand + mixes launches without clusters (HcExpandMixesParams::split_blocks):
  // that many blocks per row tile each take 1/mhc_split_blocks of the columns and write partial
  // sums to a scratch buffer, and a second launch (a block per row) adds them in block order,
  // ends the mixes and applies the fused norm. x' and the plain collapse are the same bits; the
  // mixes and the norm's sum of squares add in another (fixed) order. Written because the
  // clusters of 8 give 192 blocks at 384 rows, 0.7 of a wave (r11's ncu: 46 us per launch at 24%
  // of HBM). mhc_fused_cluster_width is then ignored. 0: clusters; -1 (default): automatic,
  // cuda::hc_expand_mixes_auto_split (16 up to 128 rows, one wave of blocks up to 1024 rows,
  // clusters past that). Measured on the H200 (r16): decode 64 x 6 mhc.expand 3.95 -> 3.66 ms at
  // 11 blocks, step 39.57 -> 38.88 ms; 64 x 1 2.00 -> 1.71 ms at 16, step 20.50 -> 20.19 ms;
  // prefill 8K slower (9.81 -> 10.15 ms at 20), hence clusters past 1024 rows.
  int mhc_split_blocks = -1;
  // true: the split path's mixes (mhc_split_blocks) take their dots on tensor cores
  // (cuda::HcExpandMixesParams::tensor_cores: mma.sync TF32 in the 3xTF32 form, fp32-level
  // accuracy) instead of FFMA dots, whose 16-byte shared-memory reads per 8 FMAs bounded the
  // decode launch (r19 ncu). x' and the collapse are the same bits; the mixes differ from the FFMA
  // sums at the fp32 rounding level. No effect where the clusters or the two launches run.
  // Written in r23. Its tests pass (r24, r25 on the H100), but it did not measure faster:
  // mhc.expand 3.86 -> 3.99 / 4.01 ms per 64 x 6 step, the step 38.51 -> 38.65 ms (r25 call 2) and
  // 38.68 -> 38.17 ms (r24): no gain the runs agree on, and it changes the mixes' rounding. Off.
  // (The H100's HBM makes the launch bandwidth-bound; the H200 is not measured yet.)
  bool mhc_tensor_cores = false;
  // true: where the fused expand + mixes launch on its split path (mhc_split_blocks) writes the
  // next layer's attention input a = attn_norm(collapse) (mhc_fuse_norm) and that layer's fused
  // qkv_a GEMM takes a row-scaled FP8 input (fp8_row_scaled, fuse_qkv_a), the launch's finish
  // also writes those codes and row scales (cuda::HcExpandMixesParams::collapse_fp8, the bits of
  // launch_act_quant_fp8_rows on a), and the attention skips its quantiser launch (r18 ncu:
  // 8.8 us per layer at 384 rows, on the main stream). The same results. Written in r23; on since
  // r25: CudaV41.HcExpandMixesFp8CollapseMatchesRowQuantiser and
  // GpuForward.MhcFuseAttnQuantIsBitIdentical pass (r24, r25); measured (H100) decode 64 x 6
  // 38.68 -> 38.44 ms (r24), 38.51 -> 38.35 ms (r25 call 2).
  bool mhc_fuse_attn_quant = true;
  // >= 2: the cuBLASLt GEMMs (dense projections, shared expert, the padded experts, the router's
  // fp32 GEMM, the head) pick their algorithm by timing the first gemm_autotune candidates of
  // cuBLASLt's heuristic on a shape's first eager run (cuda::CublasLtGemm::set_autotune; graph
  // captures take the heuristic's first where the shape was not tuned before), instead of the
  // heuristic's first. One choice per shape per process; another process may choose another
  // algorithm (timing), which changes results in the last bits. 0: the heuristic's first.
  int gemm_autotune = 0;
  // true: where the fused expand + mixes launch (mhc_fuse_expand_mixes) writes the next site's
  // collapse (the ffn site's input "f"; the next layer's attention input "a"), it also applies
  // that site's RMSNorm (ffn_norm / the next layer's attn_norm: HcExpandMixesParams::
  // collapse_norm_weight), and the separate RMSNorm launch of that buffer is skipped (at decode
  // 64 x 6 two launches of ~16 us per layer). The same values but for the order of the norm's sum
  // of squares (the cluster's blocks in rank order); the profile counts the norm in mhc.expand.
  // No effect where the two launches run (mhc_fuse_expand_mixes off, fewer rows than
  // mhc_fuse_min_rows, Engram or bounded-replay narrowing next). Measured on the H200 (r11, call 1):
  // decode 64 x 6 49.56 -> 48.79 ms, prefill 8K 128.07 -> 126.60 ms; 64 x 1 the same launches.
  bool mhc_fuse_norm = true;
  // true: where the sparse attention runs on the wgmma kernel
  // (cuda::sparse_attention_wgmma_applies) and wo_a on the bf16 cuBLASLt GEMM (an FP8 weight with
  // MXFP8 input, neither fp8_wgmma's kernel nor exact_linears), the attention's epilogue writes the
  // MXFP8 fake-quant of its output as bf16 bits (SparseAttentionParams::out_mxfp8_bf16), which wo_a
  // reads, instead of the fp32 output [rows, heads * head_dim] that launch_act_quant_mxfp8 reads
  // back (at 384 rows, 64 heads: 50 MB written and read per layer; the fp32 buffer is then not
  // allocated). The same bits (trace: attn_quant_epilogue), the same cost accounting. Not in the
  // DSpark draft stages. Measured on the H200 (r10, call 3): decode 64 x 6 50.32 -> 49.66 ms
  // (wo_a's part 4.50 -> 3.72 ms, the attention 7.93 -> 8.36), prefill 8K 129.6 -> 128.4 ms,
  // decode 64 x 1 the same (23.94 / 23.89 ms).
  bool attn_quant_epilogue = true;
  // true (with attn_quant_epilogue): where wo_a then takes the row-scaled FP8 cuBLASLt path
  // (fp8_row_scaled) and the attention has 64 heads (a work item of the wgmma kernel is a whole
  // row), the epilogue writes wo_a's row-scaled FP8 operand itself (SparseAttentionParams::
  // out_fp8_rows: the codes and row scales launch_act_quant_fp8_rows makes of the bf16 MXFP8
  // values, bit for bit; trace: attn_fp8_rows_epilogue), so the bf16 buffer and that launch go.
  // Measured on the H200 (r19, call 5): prefill 8K 111.02 -> 110.51 ms; decode 64 x 6 37.52 ->
  // 37.48 ms (the attention +0.73 ms, wo_a's part -0.96 ms).
  bool attn_fp8_rows_epilogue = true;
  // true: our kernels are launched with programmatic dependent launch (PDL, sm_90;
  // cuda::set_programmatic_launch): each may be scheduled once every CTA of its predecessor on
  // the stream has exited, and waits on the device (its first statement) until that predecessor
  // has completed and its writes are visible, so the ~1,800 dependent launches of a decode step
  // hide part of their launch gap; CUDA graphs capture them as programmatic edges. cuBLASLt,
  // copies and memsets launch as before. Same kernels and results (GpuForward.ProgrammaticLaunch*).
  // Measured (H200, docs/perf/forward-gpu-2026-11-30-r9.md): DEP32 decode 64x6 52.1 -> 51.4 ms,
  // 64x1 24.1 -> 23.7 ms, prefill 8K +0.8%. PROCESS-WIDE: set when the model is created (load /
  // random), so the last model created decides for every model and stream of the process from
  // then on (graphs keep the setting of their capture).
  bool programmatic_launch = true;
  // true (and the config has draft stages): load / fill the DSpark draft stages and heads, and
  // allocate their context rings (dspark_commit, dspark_draft).
  bool dspark = false;
  bool trace = false;  // keep per-layer attn_norm outputs and layer outputs (trace())
};

// Per-layer values of the last forward (options.trace), as the CPU ForwardTrace: attn_in [rows,
// D] (after bounded-replay narrowing), layer_out [rows, HC, D].
struct GpuForwardTrace {
  std::map<int32_t, std::vector<float>> attn_in;
  std::map<int32_t, std::vector<float>> layer_out;
  std::map<int32_t, std::vector<float>> attn_out;     // attention output y [rows, D]
  std::map<int32_t, std::vector<float>> ffn_in;       // ffn_norm output [rows, D]
  std::map<int32_t, std::vector<float>> ffn_out;      // MoE output [rows, D]
  std::map<int32_t, std::vector<int32_t>> experts;    // routed experts [rows, top_k]
  std::map<int32_t, std::vector<float>> router_logits;  // z = f · Wg^T [rows, routed experts]
  std::map<int32_t, bool> moe_kperm;  // grouped GEMMs on k-permuted inputs (options.moe_kperm)
  std::map<int32_t, bool> moe_fp8;    // routed experts on the FP8 grouped GEMM (options.moe_fp8)
  std::map<int32_t, int64_t> moe_padded;  // slot rows C of the padded FP8 experts (0: not taken)
  std::map<int32_t, bool> moe_fuse_swiglu;  // SwiGLU in the w1 + w3 epilogue (moe_fuse_swiglu)
  // grouped GEMM launches (w1 + w3, w2) that took the stream-K form (moe_stream_k): 0 to 2
  std::map<int32_t, int> moe_stream_k;
  // cluster width of the ffn site's fused mHC expand + mixes launch (mhc_fused_cluster_width and
  // its automatic rule, as cuda::hc_expand_mixes_cluster_width reports it); 0: the two launches
  std::map<int32_t, int> mhc_cluster_width;
  std::map<int32_t, bool> shared_w13;  // shared expert's w1 + w3 as one GEMM (fuse_shared_w13)
  std::map<int32_t, bool> moe_quant_once;  // f quantised once for both MoE paths (moe_quant_once)
  std::map<int32_t, bool> qkv_a;       // the attention's wq_a + wkv as one GEMM (fuse_qkv_a)
  // The fused qkv_a GEMM's row-scaled FP8 input written by the previous expand + mixes launch
  // (mhc_fuse_attn_quant) instead of a quantiser launch.
  std::map<int32_t, bool> attn_quant_fused;
  // wo_a's input quantised in the attention's epilogue (attn_quant_epilogue)
  std::map<int32_t, bool> attn_quant_epilogue;
  // ... and as wo_a's row-scaled FP8 operand (attn_fp8_rows_epilogue)
  std::map<int32_t, bool> attn_fp8_rows_epilogue;
  // Reindex layers' candidate scores on the e4m3 wgmma kernel (indexer_cand_wgmma)
  std::map<int32_t, bool> indexer_cand_wgmma;
  std::map<int32_t, std::vector<int32_t>> selected;  // index sources: [rows, index_topk] entries
  std::map<int32_t, std::vector<float>> scores;      // index sources: [rows, width] scores
  std::map<int32_t, int64_t> score_width;            // columns of scores[l]
  std::vector<int32_t> candidates;                   // [rows, blocks * block] (seq-local ids)
};

// `count` layers spread over the backbone plus every owner they need (ascending).
[[nodiscard]] std::vector<int32_t> subsample_layers(const ModelConfig& config, int32_t count);

enum class GpuComponent : uint8_t {
  kMoe,
  kDense,
  kAttention,
  kIndexer,
  kMhc,
  kEngram,
  kSampling,
  kOther,
  kCount
};
[[nodiscard]] const char* gpu_component_name(GpuComponent c);
inline constexpr size_t kNumGpuComponents = static_cast<size_t>(GpuComponent::kCount);

struct GpuSequenceInput {
  int32_t seq = -1;  // from new_sequence()
  std::span<const int32_t> tokens;
  std::span<const uint8_t> is_image;  // empty or one flag per token
  int32_t prompt_len = -1;            // kProduction, first chunk: prompt length (-1: this call)
  bool want_logits = true;            // logits of the last row
  // The DSpark taps of this input's rows that reach the tap layers (all rows in kOracle; the
  // rows after the bounded-replay floor in kProduction), as SequenceOutput::main_hidden: the
  // residual stream entering each dspark_target_layer_ids layer, averaged over the streams.
  bool want_main_hidden = false;
  // With want_main_hidden: false keeps the taps on the device only (for dspark_commit_taps):
  // main_hidden_positions is filled, main_hidden stays empty, no device-to-host copy.
  bool main_hidden_to_host = true;
};

struct GpuForwardOutput {
  std::vector<int32_t> logit_inputs;  // input index of each logits row
  std::vector<float> logits;          // [logit_inputs.size(), V] (empty without host_logits)
  std::vector<int32_t> greedy;        // argmax per logits row (on the device)
  // Per input (empty unless want_main_hidden): [rows, taps * D] and the rows' positions.
  std::vector<std::vector<float>> main_hidden;
  std::vector<std::vector<int32_t>> main_hidden_positions;
};

// One DSpark draft cycle of one sequence (model.md §6.2): its anchor (the token the target
// emitted, at the position after the committed ring) and the outputs.
// Commit positions [first, first + count) of the last forward's input `input` (its sequence)
// from that forward's device taps (DeepseekV41Gpu::dspark_commit_taps).
struct GpuTapCommit {
  int32_t input = 0;
  int32_t first = 0;
  int32_t count = 0;
};
struct GpuDraftInput {
  int32_t seq = -1;
  int32_t anchor = 0;
};
struct GpuDraftOutput {
  // Per input i, block position j (B = dspark_block_size): index i * B + j.
  std::vector<int32_t> tokens;       // greedy drafts (argmax of base + Markov logits)
  std::vector<float> confidences;    // sigmoid(conf_w · [hb_j; m_j])
  std::vector<float> logits;         // [inputs * B, V] base + Markov (only with host_logits)
  std::vector<float> base_logits;    // [inputs * B, V] head(norm(hb)) (only with host_logits)
};

// What one forward read and computed (the roofline's numerators).
struct GpuForwardCost {
  double weight_bytes = 0;  // weights read (as held on the device)
  double kv_bytes = 0;      // cache bytes read by attention and the indexers
  double flops = 0;         // matrix FLOPs (linears, attention, indexer scores)
  // The part of `flops` whose operands are both FP8-representable (MXFP8 activations times
  // FP8/MXFP4 weights): an FP8 tensor-core GEMM can run it (the roofline's FP8 rate).
  double fp8_flops = 0;
  // The routed experts' grouped rows (every local hit, bench replicas included) and, with
  // moe_padded_fp8, those past their expert's slot rows (the grouped path's share) and the slot
  // rows the padded GEMMs ran (local experts x C per layer). Not part of the roofline.
  double moe_rows = 0;
  double moe_overflow_rows = 0;
  double moe_slot_rows = 0;
};

class DeepseekV41Gpu {
 public:
  [[nodiscard]] static Result<std::unique_ptr<DeepseekV41Gpu>> load(
      const std::filesystem::path& dir, const GpuModelOptions& options);
  // Real shapes of `config`, weights filled on the device with launch_fill_random (no files).
  [[nodiscard]] static Result<std::unique_ptr<DeepseekV41Gpu>> random(
      const ModelConfig& config, const GpuModelOptions& options, uint64_t seed);
  ~DeepseekV41Gpu();
  DeepseekV41Gpu(const DeepseekV41Gpu&) = delete;
  DeepseekV41Gpu& operator=(const DeepseekV41Gpu&) = delete;

  [[nodiscard]] const ModelConfig& config() const;
  [[nodiscard]] const std::vector<int32_t>& layers() const;
  [[nodiscard]] void* stream() const;
  [[nodiscard]] size_t weight_bytes() const;  // device bytes of the weights
  [[nodiscard]] size_t cache_bytes() const;   // device bytes of the cache pools

  [[nodiscard]] Result<int32_t> new_sequence();
  void release_sequence(int32_t seq);
  [[nodiscard]] int32_t num_tokens(int32_t seq) const;
  // Synthetic KV fill: the sequence's caches hold random plausible records as if `context`
  // tokens had been consumed (SWA rings, every global entry, index keys; empty partial groups).
  // replay_start: the bounded-replay floor the sequence then carries (a prompt of length P
  // continuing past `context` has P - window).
  void synthetic_fill(int32_t seq, int32_t context, uint64_t seed, int32_t replay_start = 0);

  [[nodiscard]] Result<GpuForwardOutput> forward(std::span<const GpuSequenceInput> inputs,
                                                 ForwardMode mode);

  // DSpark (config with draft stages; GpuModelOptions::dspark). dspark_commit pushes committed
  // positions [first, first + n) of `seq` (consecutive, continuing the ring) with their target
  // taps main_hidden [n, taps * D] (host) into every stage's context ring, as
  // DSparkDraft::commit. dspark_draft runs one draft cycle for every input, batched (rows
  // ordered block position major), as DSparkDraft::draft; each sequence needs committed context.
  [[nodiscard]] Status dspark_commit(int32_t seq, int32_t first, std::span<const float> main_hidden);
  // The same from the taps the last forward left on the device (its inputs with
  // want_main_hidden), batched over sequences, with no host copy: the verify -> commit -> draft
  // loop of DSpark decoding. Refused when that input had no taps or the positions are not among
  // its tapped rows.
  [[nodiscard]] Status dspark_commit_taps(std::span<const GpuTapCommit> commits);
  [[nodiscard]] Result<GpuDraftOutput> dspark_draft(std::span<const GpuDraftInput> inputs);

  // Per-component GPU milliseconds accumulated since reset_profile() (options.profile).
  [[nodiscard]] std::array<double, kNumGpuComponents> component_ms() const;
  // The same split finer, by named part of a component, "<component>.<part>" ("moe.router",
  // "moe.w13", "mhc.mixes", ...; a component's time outside its named parts is
  // "<component>.other"): the parts of a component sum to its component_ms().
  [[nodiscard]] std::map<std::string, double> part_ms() const;
  void reset_profile();
  void set_profile(bool on);
  [[nodiscard]] const GpuForwardCost& last_cost() const;
  // Forwards that replayed / captured a CUDA graph so far.
  [[nodiscard]] int64_t graph_replays() const;
  [[nodiscard]] int64_t graph_captures() const;
  // DSpark draft cycles (dspark_draft) that replayed / captured a CUDA graph so far (the draft's
  // graphs share the max_cuda_graphs bound with the forward's).
  [[nodiscard]] int64_t draft_graph_replays() const;
  [[nodiscard]] int64_t draft_graph_captures() const;
  [[nodiscard]] int64_t graphs_held() const;  // captured graphs kept now (<= max_cuda_graphs)
  // GEMM shapes this model's cuBLASLt instances tuned by timing (gemm_autotune; not counting the
  // choices taken from an earlier instance of the process).
  [[nodiscard]] int64_t gemm_tuned_shapes() const;
  [[nodiscard]] const GpuForwardTrace& trace() const;

  struct Impl;

 private:
  explicit DeepseekV41Gpu(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve::arch
