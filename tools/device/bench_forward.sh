#!/usr/bin/env bash
# Runs ON THE DEVICE machine (from build_and_test.sh's fwdbench step or by hand): the
# `moeserve bench forward --backend cuda` runs of docs/perf/forward-gpu-*.md, each writing
# OUT_DIR/fwd_<name>.json and .log. A failing run is recorded and the next one still runs.
#
#   usage: BIN=build/cuda-release/bin/moeserve tools/device/bench_forward.sh OUT_DIR
#   env:   FWD_RUNS (default: all names below, in order), FWD_ITERS (default 3),
#          FWD_TIMEOUT (seconds per run, default 240)
set -uo pipefail

out=${1:?usage: bench_forward.sh OUT_DIR}
bin=${BIN:-build/cuda-release/bin/moeserve}
iters=${FWD_ITERS:-3}
cfg=configs/deepseek-v4.1-flash/config.json
runs=${FWD_RUNS:-decode_s6 decode_s1 prefill8k_prod prefill8k_oracle prefill32k_prod prefill32k_oracle}
mkdir -p "$out"

# DEP32 rank share: 40 layers, 12 of 384 experts per layer, 64 requests at 128K context.
# --ep-ranks 32: the local experts compute the tokens all 32 ranks send them (~192 rows per
# expert at 64 x 6), as a DEP32 rank does; the *_own rows keep only this rank's hits (~6 rows per
# expert: the rows of rounds 1-6).
args_decode_s6="--batch 64 --context 131072 --tokens-per-seq 6 --local-experts 12 --ep-ranks 32"
args_decode_s1="--batch 64 --context 131072 --tokens-per-seq 1 --local-experts 12 --ep-ranks 32"
args_decode_s6_own="--batch 64 --context 131072 --tokens-per-seq 6 --local-experts 12"
args_decode_s1_own="--batch 64 --context 131072 --tokens-per-seq 1 --local-experts 12"
# The sparse attention on single fp16 operands (the default since round 8; fast: set
# explicitly) and on hi + lo pairs (split: the default until round 7).
args_decode_s6_fast="$args_decode_s6 --fast-attention true"
args_decode_s1_fast="$args_decode_s1 --fast-attention true"
args_decode_s6_split="$args_decode_s6 --fast-attention false"
# The shared expert serialised with the routed experts (default: on a second stream).
args_decode_s6_serial="$args_decode_s6 --moe-shared-overlap false"
args_decode_s1_serial="$args_decode_s1 --moe-shared-overlap false"
args_prefill8k_prod_serial="--new-tokens 8192 --cached 131072 --layers 8 --local-experts 12 --mode production --moe-shared-overlap false"
# The indexer scores on mma.sync instead of wgmma; the dense FP8 linears on the FP8 wgmma GEMM
# instead of cuBLASLt bf16 (not the default: slower).
args_decode_s6_noidxw="$args_decode_s6 --indexer-wgmma false"
# The sparse attention on mma.sync instead of wgmma (hi + lo and single fp16).
args_decode_s6_noattw="$args_decode_s6 --attention-wgmma false"
args_decode_s6_fast_noattw="$args_decode_s6_fast --attention-wgmma false"
args_decode_s6_split_noattw="$args_decode_s6_split --attention-wgmma false"
args_decode_s6_fp8w="$args_decode_s6 --fp8-wgmma true"
# The routed experts' grouped GEMMs (rows_hint > 24: the DEP rows): the default is the
# swapped-operand wgmma kernel (round 7); moev1: the v1 wgmma kernel (the round-6 default);
# nomoegw: the WMMA table kernel. moers: the default flags set explicitly.
args_decode_s6_moegw="$args_decode_s6 --moe-grouped-wgmma true"
args_decode_s6_moev1="$args_decode_s6 --moe-grouped-wgmma-rs false"
args_decode_s1_moev1="$args_decode_s1 --moe-grouped-wgmma-rs false"
args_decode_s6_nomoegw="$args_decode_s6 --moe-grouped-wgmma false"
args_decode_s6_moers="$args_decode_s6 --moe-grouped-wgmma true --moe-grouped-wgmma-rs true"
args_decode_s1_moers="$args_decode_s1 --moe-grouped-wgmma true --moe-grouped-wgmma-rs true"
# The swapped-operand kernel on k-permuted expert inputs (GpuModelOptions::moe_kperm, the default
# since round 7; kperm: the flag set explicitly), and on natural-order inputs (nokperm).
args_decode_s6_kperm="$args_decode_s6 --moe-kperm true"
args_decode_s6_nokperm="$args_decode_s6 --moe-kperm false"
# The swapped-operand kernel with passes of up to 224 grouped rows (GpuModelOptions::
# moe_rs_max_pass; 192 by default, 224 measured slower in r9): experts of 193-224 rows take one
# weight decode instead of two (1.40 -> 1.25 passes per expert at 64 x 6).
args_decode_s6_pass224="$args_decode_s6 --moe-rs-max-pass 224"
args_decode_s1_pass224="$args_decode_s1 --moe-rs-max-pass 224"
# The swapped-operand kernel's stream-K form for the unfused w1 + w3 and w2 launches
# (GpuModelOptions::moe_stream_k; off: measured slower in r12, 64 x 6 47.4 -> 56.0 ms): one persistent CTA per SM shares
# the K tiles of all (weight tile, pass, expert) units instead of 3.27 / 3.64 waves of whole units.
args_decode_s6_sk="$args_decode_s6 --moe-stream-k true"
args_decode_s1_sk="$args_decode_s1 --moe-stream-k true"
args_decode_s6_sk_serial="$args_decode_s6_sk --moe-shared-overlap false"
# The routed experts' SwiGLU + MXFP8 quantisation in the w1 + w3 launch's epilogue
# (GpuModelOptions::moe_fuse_swiglu; off by default: measured slower, r8).
args_decode_s6_fswq="$args_decode_s6 --moe-fuse-swiglu true"
args_decode_s1_fswq="$args_decode_s1 --moe-fuse-swiglu true"
# Each mHC expand and the mixes after it in one launch (GpuModelOptions::mhc_fuse_expand_mixes,
# from mhc_fuse_min_rows = 129 rows) and wo_a's MXFP8-quantised bf16 input written by the wgmma
# attention's epilogue (attn_quant_epilogue): both on by default since r10. The *_fmix / *_aqe
# rows name them explicitly (the defaults now); *_nofmix, *_noaqe and *_off2 turn them off;
# *_fmix1/2/3 pin the fused launch's tile height (the default rule: 2 rows per thread at 384).
args_decode_s6_fmix="$args_decode_s6 --mhc-fuse-expand-mixes true"
args_decode_s1_fmix="$args_decode_s1 --mhc-fuse-expand-mixes true"
args_decode_s6_aqe="$args_decode_s6 --attn-quant-epilogue true"
args_decode_s1_aqe="$args_decode_s1 --attn-quant-epilogue true"
args_decode_s6_fmix_aqe="$args_decode_s6_fmix --attn-quant-epilogue true"
args_decode_s1_fmix_aqe="$args_decode_s1_fmix --attn-quant-epilogue true"
args_decode_s6_nofmix="$args_decode_s6 --mhc-fuse-expand-mixes false"
args_decode_s1_nofmix="$args_decode_s1 --mhc-fuse-expand-mixes false"
args_decode_s6_noaqe="$args_decode_s6 --attn-quant-epilogue false"
args_decode_s1_noaqe="$args_decode_s1 --attn-quant-epilogue false"
args_decode_s6_off2="$args_decode_s6 --mhc-fuse-expand-mixes false --attn-quant-epilogue false"
args_decode_s1_off2="$args_decode_s1 --mhc-fuse-expand-mixes false --attn-quant-epilogue false"
args_decode_s6_fmix1="$args_decode_s6_fmix --mhc-fused-rows-per-thread 1"
args_decode_s6_fmix2="$args_decode_s6_fmix --mhc-fused-rows-per-thread 2"
args_decode_s6_fmix3="$args_decode_s6_fmix --mhc-fused-rows-per-thread 3"
# The RMSNorms of the collapses that the fused launch writes, as separate launches
# (GpuModelOptions::mhc_fuse_norm, on by default since r11): *_nonorm turns the fused norm off.
# Only where the fused launch runs (>= 129 rows): at 64 x 1 both rows run the same launches.
args_decode_s6_nonorm="$args_decode_s6 --mhc-fuse-norm false"
args_decode_s1_nonorm="$args_decode_s1 --mhc-fuse-norm false"
# The fused expand + mixes launch with clusters of 4, 8 or 16 blocks
# (GpuModelOptions::mhc_fused_cluster_width; 0 = automatic since r12: 16 up to 128 rows, else 8;
# the fused launch at every row count, mhc_fuse_min_rows 0). At 64 x 6 (384 rows, 2 rows per
# thread) width 16 launches 384 blocks of half the columns each, width 4 96. At 64 x 1 width 16
# at one row per thread is 128 blocks, one wave. cw16_rpt1 / cw16_rpt3 pin the tile height at
# width 16 (768 / 256 blocks at 384 rows; RPT 3 holds 165 registers, so one block per SM).
# decode_s1_cw8: the fused launch at width 8; decode_s1_2l: the two launches (r11's default at
# 64 rows, mhc_fuse_min_rows 129).
args_decode_s6_cw4="$args_decode_s6 --mhc-fused-cluster-width 4"
args_decode_s6_cw16="$args_decode_s6 --mhc-fused-cluster-width 16"
args_decode_s6_cw16_rpt1="$args_decode_s6_cw16 --mhc-fused-rows-per-thread 1"
args_decode_s6_cw16_rpt3="$args_decode_s6_cw16 --mhc-fused-rows-per-thread 3"
args_decode_s1_fmin0="$args_decode_s1 --mhc-fuse-min-rows 0"
args_decode_s1_cw16="$args_decode_s1_fmin0 --mhc-fused-cluster-width 16"
args_decode_s1_cw8="$args_decode_s1 --mhc-fused-cluster-width 8"
args_decode_s1_2l="$args_decode_s1 --mhc-fuse-min-rows 129"
# The attention's wq_a and wkv as two GEMMs (GpuModelOptions::fuse_qkv_a, on by default since r11).
args_decode_s6_nofqkv="$args_decode_s6 --fuse-qkv-a false"
args_decode_s1_nofqkv="$args_decode_s1 --fuse-qkv-a false"
# The indexer's wgmma scores on bf16 operands (GpuModelOptions::indexer_fp8, on by default since r11).
args_decode_s6_noifp8="$args_decode_s6 --indexer-fp8 false"
args_decode_s1_noifp8="$args_decode_s1 --indexer-fp8 false"
# The same plus one DSpark draft cycle for the batch (the draft stages' rings committed from
# random taps): draft time, its components and roofline, step + draft.
args_decode_s6_dspark="$args_decode_s6 --dspark"
# Without CUDA graphs (every launch from the host; graphs are the decode default).
args_decode_s6_eager="$args_decode_s6 --cuda-graphs false"
args_decode_s1_eager="$args_decode_s1 --cuda-graphs false"
# The shared expert's w1 and w3 as one GEMM (GpuModelOptions::fuse_shared_w13; the default since
# round 8: sw13 sets it explicitly) and as two (nosw13).
args_decode_s6_sw13="$args_decode_s6 --fuse-shared-w13 true"
args_decode_s6_nosw13="$args_decode_s6 --fuse-shared-w13 false"
# The router logits on the split-TF32 GEMM (router_tf32) instead of cuBLASLt's exact fp32 GEMM
# (an FFMA kernel; the default); router_fp32 sets the default explicitly.
args_decode_s6_router_fp32="$args_decode_s6 --router-split-tf32 false"
args_decode_s6_router_tf32="$args_decode_s6 --router-split-tf32 true"
# The router's fp32 GEMM as 4 / 8 / 16 K-slices in one batched call instead of one GEMM
# (GpuModelOptions::router_split_k; 1 by default, no gain measured in r9).
args_decode_s6_rsk4="$args_decode_s6 --router-split-k 4"
args_decode_s6_rsk8="$args_decode_s6 --router-split-k 8"
args_decode_s6_rsk16="$args_decode_s6 --router-split-k 16"
args_decode_s1_rsk8="$args_decode_s1 --router-split-k 8"
# Without programmatic dependent launch of our kernels (GpuModelOptions::programmatic_launch; on
# by default since r9).
args_decode_s6_nopdl="$args_decode_s6 --pdl false"
args_decode_s1_nopdl="$args_decode_s1 --pdl false"
# Prefill after a 128K cached prefix on an 8-layer subsample (+ owners), production vs oracle.
args_prefill8k_prod="--new-tokens 8192 --cached 131072 --layers 8 --local-experts 12 --mode production"
args_prefill8k_prod_moev1="$args_prefill8k_prod --moe-grouped-wgmma-rs false"
args_prefill8k_prod_kperm="$args_prefill8k_prod --moe-kperm true"
args_prefill8k_prod_sw13="$args_prefill8k_prod --fuse-shared-w13 true"
args_prefill8k_prod_fswq="$args_prefill8k_prod --moe-fuse-swiglu true"
args_prefill8k_prod_sk="$args_prefill8k_prod --moe-stream-k true"
args_prefill8k_prod_fmix="$args_prefill8k_prod --mhc-fuse-expand-mixes true"
args_prefill8k_prod_aqe="$args_prefill8k_prod --attn-quant-epilogue true"
args_prefill8k_prod_nofmix="$args_prefill8k_prod --mhc-fuse-expand-mixes false"
args_prefill8k_prod_noaqe="$args_prefill8k_prod --attn-quant-epilogue false"
args_prefill8k_prod_off2="$args_prefill8k_prod --mhc-fuse-expand-mixes false --attn-quant-epilogue false"
args_prefill8k_prod_nofqkv="$args_prefill8k_prod --fuse-qkv-a false"
args_prefill8k_prod_noifp8="$args_prefill8k_prod --indexer-fp8 false"
args_prefill8k_prod_fmix_aqe="$args_prefill8k_prod --mhc-fuse-expand-mixes true --attn-quant-epilogue true"
args_prefill8k_prod_nonorm="$args_prefill8k_prod --mhc-fuse-norm false"
args_prefill8k_prod_cw16="$args_prefill8k_prod --mhc-fused-cluster-width 16"
args_prefill8k_prod_router_fp32="$args_prefill8k_prod --router-split-tf32 false"
args_prefill8k_prod_nopdl="$args_prefill8k_prod --pdl false"
args_prefill8k_prod_rsk8="$args_prefill8k_prod --router-split-k 8"
args_prefill8k_oracle="--new-tokens 8192 --cached 131072 --layers 8 --local-experts 12 --mode oracle"
args_prefill32k_prod="--new-tokens 32768 --cached 131072 --layers 8 --local-experts 12 --mode production"
args_prefill8k_prod_noidxw="$args_prefill8k_prod --indexer-wgmma false"
args_prefill32k_oracle="--new-tokens 32768 --cached 131072 --layers 8 --local-experts 12 --mode oracle"
# Row-scaled FP8 linears (GpuModelOptions::fp8_row_scaled) on / off.
args_decode_s6_f8r="$args_decode_s6 --fp8-row-scaled true"
args_decode_s1_f8r="$args_decode_s1 --fp8-row-scaled true"
args_decode_s6_dspark_f8r="$args_decode_s6_dspark --fp8-row-scaled true"
args_prefill8k_prod_f8r="$args_prefill8k_prod --fp8-row-scaled true"
args_prefill32k_prod_f8r="$args_prefill32k_prod --fp8-row-scaled true"
args_decode_s6_nof8r="$args_decode_s6 --fp8-row-scaled false"
args_decode_s1_nof8r="$args_decode_s1 --fp8-row-scaled false"
args_prefill8k_prod_nof8r="$args_prefill8k_prod --fp8-row-scaled false"
# The routed experts on the FP8 grouped GEMM (GpuModelOptions::moe_fp8).
args_decode_s6_mfp8="$args_decode_s6 --moe-fp8 true"
args_decode_s1_mfp8="$args_decode_s1 --moe-fp8 true"
args_prefill8k_prod_mfp8="$args_prefill8k_prod --moe-fp8 true"
# The routed experts as padded batched cuBLASLt FP8 GEMMs (GpuModelOptions::moe_padded_fp8), and
# that with the ordered grouping (moe_group_ordered); round 13's setup (copies as DEP replicas).
args_decode_s6_pad="$args_decode_s6 --moe-padded-fp8 true"
args_decode_s1_pad="$args_decode_s1 --moe-padded-fp8 true"
args_decode_s6_dspark_pad="$args_decode_s6_dspark --moe-padded-fp8 true"
args_prefill8k_prod_pad="$args_prefill8k_prod --moe-padded-fp8 true"
args_prefill32k_prod_pad="$args_prefill32k_prod --moe-padded-fp8 true"
args_decode_s6_padord="$args_decode_s6_pad --moe-group-ordered true"
args_prefill8k_prod_padord="$args_prefill8k_prod_pad --moe-group-ordered true"
args_decode_s6_ord="$args_decode_s6 --moe-group-ordered true"
args_decode_s1_padord="$args_decode_s1_pad --moe-group-ordered true"
# r15: the padded path and the ordered grouping are the defaults; rows without them, and without
# the padded path's gathered input quantiser / bf16 GEMM sums.
args_decode_s6_nopad="$args_decode_s6 --moe-padded-fp8 false --moe-group-ordered false"
args_decode_s1_nopad="$args_decode_s1 --moe-padded-fp8 false --moe-group-ordered false"
args_prefill8k_prod_nopad="$args_prefill8k_prod --moe-padded-fp8 false --moe-group-ordered false"
args_decode_s6_nogather="$args_decode_s6 --moe-padded-gather-quant false"
args_decode_s6_nobf16="$args_decode_s6 --moe-padded-bf16 false"
args_decode_s6_warpq="$args_decode_s6 --moe-padded-warp-quant true"
args_decode_s6_cpt2="$args_decode_s6 --moe-padded-quant-cpt 2"
args_decode_s6_cpt4="$args_decode_s6 --moe-padded-quant-cpt 4"
args_decode_s6_ovexit="$args_decode_s6 --moe-overflow-exit-empty true"
args_decode_s6_r15next="$args_decode_s6 --moe-overflow-exit-empty true --moe-padded-quant-cpt 2"
args_decode_s6_noovexit="$args_decode_s6 --moe-overflow-exit-empty false"
args_decode_s6_ovside="$args_decode_s6 --moe-overflow-side-stream true"
args_decode_s1_ovside="$args_decode_s1 --moe-overflow-side-stream true"
args_prefill8k_prod_ovside="$args_prefill8k_prod --moe-overflow-side-stream true"
# r18: the overflow in a graph IF node (_ovif), f quantised once for both MoE paths (_qonce), both (_r18).
args_decode_s6_ovif="$args_decode_s6 --moe-overflow-graph-if true"
args_decode_s1_ovif="$args_decode_s1 --moe-overflow-graph-if true"
args_decode_s6_qonce="$args_decode_s6 --moe-quant-once true"
args_decode_s1_qonce="$args_decode_s1 --moe-quant-once true"
args_decode_s6_noqonce="$args_decode_s6 --moe-quant-once false"
args_decode_s1_noqonce="$args_decode_s1 --moe-quant-once false"
args_prefill8k_prod_noqonce="$args_prefill8k_prod --moe-quant-once false"
args_decode_s6_r18="$args_decode_s6 --moe-overflow-graph-if true --moe-quant-once true"
args_decode_s1_r18="$args_decode_s1 --moe-overflow-graph-if true --moe-quant-once true"
args_prefill8k_prod_r18="$args_prefill8k_prod --moe-overflow-graph-if true --moe-quant-once true"
# r18: the router logits on our split-K fp32 GEMM (_rl<slices>).
args_decode_s6_rl11="$args_decode_s6 --router-f32-slices 11"
args_decode_s6_rl8="$args_decode_s6 --router-f32-slices 8"
args_decode_s6_rl22="$args_decode_s6 --router-f32-slices 22"
args_decode_s1_rl11="$args_decode_s1 --router-f32-slices 11"
args_decode_s1_rl22="$args_decode_s1 --router-f32-slices 22"
args_prefill8k_prod_rl11="$args_prefill8k_prod --router-f32-slices 11"
# r22: the 8 x 8-per-thread router GEMM, automatic slices (_rla; the default), a given count, or
# cuBLASLt (_rl0).
args_decode_s6_rla="$args_decode_s6 --router-f32-slices -1"
args_decode_s6_rl0="$args_decode_s6 --router-f32-slices 0"
args_decode_s1_rl0="$args_decode_s1 --router-f32-slices 0"
args_decode_s6_rl7="$args_decode_s6 --router-f32-slices 7"
args_decode_s6_rl28="$args_decode_s6 --router-f32-slices 28"
args_decode_s1_rla="$args_decode_s1 --router-f32-slices -1"
args_prefill8k_prod_rla="$args_prefill8k_prod --router-f32-slices -1"
# r19: the attention's epilogue writing wo_a's row-scaled FP8 operand (_norows: off).
args_decode_s6_norows="$args_decode_s6 --attn-fp8-rows-epilogue false"
args_decode_s1_norows="$args_decode_s1 --attn-fp8-rows-epilogue false"
args_prefill8k_prod_norows="$args_prefill8k_prod --attn-fp8-rows-epilogue false"
# r19: the Reindex layers' candidate scores on e4m3 wgmma (_cand).
args_decode_s6_cand="$args_decode_s6 --indexer-cand-wgmma true"
args_decode_s1_cand="$args_decode_s1 --indexer-cand-wgmma true"
args_prefill8k_prod_cand="$args_prefill8k_prod --indexer-cand-wgmma true"
args_decode_s6_nocand="$args_decode_s6 --indexer-cand-wgmma false"
args_decode_s1_nocand="$args_decode_s1 --indexer-cand-wgmma false"
args_prefill8k_prod_nocand="$args_prefill8k_prod --indexer-cand-wgmma false"
# r19 (for r20): the mHC expand + mixes at 4 rows per thread (32-row tiles: half the re-reads of
# the mixes' weights), automatic split and 20 blocks.
args_decode_s6_mr4="$args_decode_s6 --mhc-fused-rows-per-thread 4"
args_decode_s6_mr4s20="$args_decode_s6 --mhc-fused-rows-per-thread 4 --mhc-split-blocks 20"
args_decode_s1_mr4="$args_decode_s1 --mhc-fused-rows-per-thread 4"
args_decode_s6_msplit10="$args_decode_s6 --mhc-split-blocks 10"
# r20: the wgmma attention's warp-specialised form (_ws: on; _nows: off).
args_decode_s6_ws="$args_decode_s6 --attention-ws true"
args_decode_s1_ws="$args_decode_s1 --attention-ws true"
args_prefill8k_prod_ws="$args_prefill8k_prod --attention-ws true"
args_decode_s6_nows="$args_decode_s6 --attention-ws false"
args_decode_s1_nows="$args_decode_s1 --attention-ws false"
args_prefill8k_prod_nows="$args_prefill8k_prod --attention-ws false"
args_decode_s6_msplit20="$args_decode_s6 --mhc-split-blocks 20"
args_decode_s6_msplit40="$args_decode_s6 --mhc-split-blocks 40"
args_decode_s6_msplit11="$args_decode_s6 --mhc-split-blocks 11"
args_decode_s6_msplit16="$args_decode_s6 --mhc-split-blocks 16"
args_decode_s6_msplit22r1="$args_decode_s6 --mhc-split-blocks 22 --mhc-fused-rows-per-thread 1"
args_decode_s6_rope8="$args_decode_s6 --rope-heads-per-thread 8"
args_decode_s6_c224="$args_decode_s6 --moe-padded-group-rows 224"
args_decode_s6_c224side="$args_decode_s6 --moe-padded-group-rows 224 --moe-overflow-side-stream true"
args_decode_s6_c192side="$args_decode_s6 --moe-padded-group-rows 192 --moe-overflow-side-stream true"
args_decode_s6_skipempty="$args_decode_s6 --moe-padded-skip-empty true"
args_decode_s1_rope8="$args_decode_s1 --rope-heads-per-thread 8"
args_decode_s6_rope1="$args_decode_s6 --rope-heads-per-thread 1"
args_decode_s1_rope1="$args_decode_s1 --rope-heads-per-thread 1"
args_decode_s6_noskipempty="$args_decode_s6 --moe-padded-skip-empty false"
args_decode_s6_aswa="$args_decode_s6 --attention-swa-f16-scale true"
args_decode_s1_aswa="$args_decode_s1 --attention-swa-f16-scale true"
args_prefill8k_prod_aswa="$args_prefill8k_prod --attention-swa-f16-scale true"
args_decode_s1_msplit16="$args_decode_s1 --mhc-split-blocks 16"
args_decode_s1_msplit20="$args_decode_s1 --mhc-split-blocks 20"
args_decode_s1_msplit40="$args_decode_s1 --mhc-split-blocks 40"
args_prefill8k_prod_msplit20="$args_prefill8k_prod --mhc-split-blocks 20"
args_decode_s6_tune8="$args_decode_s6 --gemm-autotune 8"
args_decode_s6_tune16="$args_decode_s6 --gemm-autotune 16"
args_decode_s1_tune8="$args_decode_s1 --gemm-autotune 8"
args_prefill8k_prod_tune8="$args_prefill8k_prod --gemm-autotune 8"
args_decode_s6_dspark_tune8="$args_decode_s6_dspark --gemm-autotune 8"
args_decode_s6_r14pad="$args_decode_s6 --moe-padded-gather-quant false --moe-padded-bf16 false"
args_decode_s6_r13="$args_decode_s6 --rank-block-replicas false"
# r23 (written without a device run, off): the split path's mixes on 3xTF32 tensor cores
# (GpuModelOptions::mhc_tensor_cores; *_tc), the split finish writing the fused qkv_a GEMM's
# row-scaled FP8 input (mhc_fuse_attn_quant; *_aq), both (*_r23); *_tc_r4s22: the tensor-core
# form at 4 rows per thread (32-row tiles, half the fn re-reads) and 22 blocks per tile.
args_decode_s6_tc="$args_decode_s6 --mhc-tensor-cores true"
args_decode_s1_tc="$args_decode_s1 --mhc-tensor-cores true"
args_decode_s6_aq="$args_decode_s6 --mhc-fuse-attn-quant true"
args_decode_s1_aq="$args_decode_s1 --mhc-fuse-attn-quant true"
args_decode_s6_r23="$args_decode_s6 --mhc-tensor-cores true --mhc-fuse-attn-quant true"
args_decode_s1_r23="$args_decode_s1 --mhc-tensor-cores true --mhc-fuse-attn-quant true"
args_decode_s6_tc_r4s22="$args_decode_s6_tc --mhc-fused-rows-per-thread 4 --mhc-split-blocks 22"
args_decode_s1_r13="$args_decode_s1 --rank-block-replicas false"
# r24 (written without a device run after it, off): the staged ordered MoE grouping
# (GpuModelOptions::moe_group_staged).
args_decode_s6_gstaged="$args_decode_s6 --moe-group-staged true"
args_decode_s1_gstaged="$args_decode_s1 --moe-group-staged true"
args_prefill8k_prod_gstaged="$args_prefill8k_prod --moe-group-staged true"
# r25: the padded experts' slot rows C pinned (GpuModelOptions::moe_padded_group_rows; the
# automatic rule gives 256 at 64 x 6, ~192 hits per expert): fewer padded rows per GEMM, hits past
# C on the grouped path. Measured (H100, r25): every pinned C from 160 to 288 is slower than 256.
# r25 (written after the device time ran out, off): the ws attention's q converted by consumer B
# instead of the producers (GpuModelOptions::attention_ws_q_in_b).
args_decode_s6_wsqb="$args_decode_s6 --attention-ws-q-in-b true"
args_decode_s1_wsqb="$args_decode_s1 --attention-ws-q-in-b true"
args_prefill8k_prod_wsqb="$args_prefill8k_prod --attention-ws-q-in-b true"
for c in 160 176 192 208 224 240 288; do
  eval "args_decode_s6_c$c=\"\$args_decode_s6 --moe-padded-group-rows $c\""
done

status=0
for name in $runs; do
  var="args_$name"
  echo "=== fwd $name: ${!var}"
  t0=$SECONDS
  # shellcheck disable=SC2086
  timeout "${FWD_TIMEOUT:-240}" "$bin" bench forward --backend cuda --random-weights --config "$cfg" \
    --iterations "$iters" ${!var} -o "$out/fwd_$name.json" 2>&1 | tee "$out/fwd_$name.log"
  rc=${PIPESTATUS[0]}
  echo "=== fwd $name: rc=$rc ($((SECONDS - t0)) s)"
  [[ $rc == 0 ]] || status=1
done
exit $status
