#!/usr/bin/env bash
# r25 call 1: validate the r24 commit (staged grouping, tc test) and sweep cheap options.
set -uo pipefail
OUT=${1:?}; R=/tmp/r; mkdir -p $R/fwd; T0=$SECONDS
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv > $S
STEPS='env unpack gtest configure' bash tools/device/build_and_test.sh $R > $R/setup.log 2>&1
true
t=$SECONDS; cmake --build build/cuda-release -j 16 --target cuda_v41_ops cuda_ops moeserve integration_model_gpu_forward_test -- -k 0 > $R/build.log 2>&1
echo "build rc=$? $((SECONDS-t)) s" >> $S; tail -20 $R/build.log > $OUT/build_tail.log
B=build/cuda-release
export LD_LIBRARY_PATH=$PWD/.device/sysroot/usr/lib/x86_64-linux-gnu:$PWD/.device/sysroot/usr/lib/x86_64-linux-gnu/blas
t=$SECONDS; timeout 200 $(find $B -name cuda_v41_ops -type f | head -1) --gtest_filter='*MoeGroup*:CudaV41.HcExpandMixes*:*SparseAttentionWarpSpecialized*:*SparseAttentionWsPipeline*' > $R/v41.log 2>&1
echo "cuda_v41_ops rc=$? $((SECONDS-t)) s $(grep -E '^\[  (PASSED|FAILED)' $R/v41.log | tr '\n' ' ')" >> $S
FT=$(find $B -name integration_model_gpu_forward_test -type f | head -1)
t=$SECONDS; timeout 240 $FT --gtest_filter='*MoeGroupStaged*:*MhcFusedClusterWidths*:*MhcFuseAttnQuant*:*AttentionWsPipeline*' > $R/fwdtest.log 2>&1
echo "fwd test rc=$? $((SECONDS-t)) s $(grep -E '^\[  (PASSED|FAILED)' $R/fwdtest.log | tr '\n' ' ')" >> $S
true
t=$SECONDS
FWD_RUNS="decode_s6 decode_s6_wsp decode_s6_gstaged decode_s6_tc decode_s6_aq decode_s6_r23 decode_s6_c192 decode_s6_c208 decode_s6_c224 decode_s6_c240 decode_s6_c288 decode_s6_c176 decode_s6_c160 decode_s1 decode_s1_wsp decode_s1_gstaged prefill8k_prod prefill8k_prod_wsp" FWD_ITERS=3 FWD_TIMEOUT=90 BIN=$B/bin/moeserve bash tools/device/bench_forward.sh $R/fwd > $R/fwd.log 2>&1
echo "rows $((SECONDS-t)) s" >> $S
for f in $R/fwd/*.json; do python3 - "$f" >> $S <<'PY'
import json,sys
d=json.load(open(sys.argv[1])); r=d['results']; p=r['part_gpu_ms']
print("%-22s %7.3f roof %6.3f w13 %.3f w2 %.3f ov %.3f grp %.3f expand %.3f attn %.3f ovrows %d" % (sys.argv[1].split('/')[-1][:-5], r['step_ms_median'], d['roofline']['roofline_ms'], p['moe.w13'], p['moe.w2'], p['moe.overflow'], p['moe.group'], p['mhc.expand'], p['attention.sparse'], d['roofline'].get('moe_overflow_rows',0)))
PY
done
echo "total $((SECONDS-T0)) s" >> $S
cp $R/v41.log $R/fwdtest.log $R/probe.log $OUT/ ; tar czf $OUT/fwd.tgz -C $R fwd setup.log build.log fwd.log
cat $S
