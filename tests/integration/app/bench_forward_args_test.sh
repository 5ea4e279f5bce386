#!/usr/bin/env bash
# `moeserve bench forward` refuses bad arguments with a clear error and exit code != 0 before any
# work: --ep-ranks outside 1..256 (the CUDA decode bench of one DEP rank's MoE work; the range is
# checked when the command line is parsed, in every build), --moe-rs-max-pass other than the
# pass widths the swapped-operand kernel has (192, 224), --router-split-k outside 1..64,
# --mhc-fused-rows-per-thread outside 0..4, and values of the boolean options that are not
# booleans (refused as that option's value, not as an unknown argument: the options exist in
# every build).
set -euo pipefail
bin=${MOESERVE_BIN:?MOESERVE_BIN not set}
for bad in 0 -3 257; do
  if out=$("$bin" bench forward --backend cuda --random-weights \
      --config configs/deepseek-v4.1-flash/config.json --batch 1 --context 8 --ep-ranks "$bad" 2>&1); then
    echo "--ep-ranks $bad accepted: $out"
    exit 1
  fi
  grep -q -- "--ep-ranks" <<<"$out" || { echo "error does not name --ep-ranks: $out"; exit 1; }
done
for bad in 0 64 193 256 maybe; do
  if out=$("$bin" bench forward --backend cuda --random-weights \
      --config configs/deepseek-v4.1-flash/config.json --batch 1 --context 8 --moe-rs-max-pass "$bad" 2>&1); then
    echo "--moe-rs-max-pass $bad accepted: $out"
    exit 1
  fi
  grep -q -- "--moe-rs-max-pass" <<<"$out" || { echo "error does not name --moe-rs-max-pass: $out"; exit 1; }
done
for bad in 0 65 -1 maybe; do
  if out=$("$bin" bench forward --backend cuda --random-weights \
      --config configs/deepseek-v4.1-flash/config.json --batch 1 --context 8 --router-split-k "$bad" 2>&1); then
    echo "--router-split-k $bad accepted: $out"
    exit 1
  fi
  grep -q -- "--router-split-k" <<<"$out" || { echo "error does not name --router-split-k: $out"; exit 1; }
done
for bad in -1 5 maybe; do
  if out=$("$bin" bench forward --backend cuda --random-weights \
      --config configs/deepseek-v4.1-flash/config.json --batch 1 --context 8 --mhc-fused-rows-per-thread "$bad" 2>&1); then
    echo "--mhc-fused-rows-per-thread $bad accepted: $out"
    exit 1
  fi
  grep -q -- "--mhc-fused-rows-per-thread" <<<"$out" || { echo "error does not name --mhc-fused-rows-per-thread: $out"; exit 1; }
done
for opt in --moe-fuse-swiglu --router-split-tf32 --moe-shared-overlap --fast-attention --pdl \
    --mhc-fuse-expand-mixes --attn-quant-epilogue; do
  if out=$("$bin" bench forward --backend cuda --random-weights \
      --config configs/deepseek-v4.1-flash/config.json --batch 1 --context 8 "$opt" maybe 2>&1); then
    echo "$opt maybe accepted: $out"
    exit 1
  fi
  grep -q -- "$opt" <<<"$out" || { echo "error does not name $opt: $out"; exit 1; }
  if grep -q "not expected" <<<"$out"; then
    echo "$opt is not an option: $out"
    exit 1
  fi
done
echo "bench_forward_args: ok"
