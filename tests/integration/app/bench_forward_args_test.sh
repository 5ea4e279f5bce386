#!/usr/bin/env bash
# `moeserve bench forward` refuses bad arguments with a clear error and exit code != 0 before any
# work: --ep-ranks outside 1..256 (the CUDA decode bench of one DEP rank's MoE work; the range is
# checked when the command line is parsed, in every build), --moe-rs-max-pass other than the
# pass widths the swapped-operand kernel has (192, 224), --router-split-k outside 1..64,
# --mhc-fused-rows-per-thread outside 0..4, --mhc-fused-cluster-width other than 0, 4, 8 and 16,
# a negative --mhc-fuse-min-rows, and values of the boolean options that are not booleans
# (refused as that option's value, not as an unknown argument: the options exist in every build).
set -euo pipefail
bin=${MOESERVE_BIN:?MOESERVE_BIN not set}
# refuse OPTION VALUE...: each value is refused, and the error names OPTION as an option.
refuse() {
  local opt=$1 bad out
  shift
  for bad in "$@"; do
    if out=$("$bin" bench forward --backend cuda --random-weights \
        --config configs/deepseek-v4.1-flash/config.json --batch 1 --context 8 "$opt" "$bad" 2>&1); then
      echo "$opt $bad accepted: $out"
      exit 1
    fi
    grep -q -- "$opt" <<<"$out" || { echo "error does not name $opt: $out"; exit 1; }
    if grep -q "not expected" <<<"$out"; then
      echo "$opt is not an option: $out"
      exit 1
    fi
  done
}
refuse --ep-ranks 0 -3 257
refuse --moe-rs-max-pass 0 64 193 256 maybe
refuse --router-split-k 0 65 -1 maybe
refuse --mhc-fused-rows-per-thread -1 5 maybe
refuse --mhc-fused-cluster-width -1 1 2 5 12 32 maybe
refuse --mhc-fuse-min-rows -1 many
for opt in --moe-fuse-swiglu --router-split-tf32 --moe-shared-overlap --fast-attention --pdl \
    --mhc-fuse-expand-mixes --attn-quant-epilogue --mhc-fuse-norm --fuse-qkv-a --indexer-fp8 \
    --moe-stream-k; do
  refuse "$opt" maybe
done
echo "bench_forward_args: ok"
