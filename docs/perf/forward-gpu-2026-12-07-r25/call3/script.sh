#!/usr/bin/env bash
# r25 call 3: the ws attention's phase clocks, plain and pipelined, and ncu pipe utilisation.
set -uo pipefail
OUT=${1:?}; S=$OUT/summary.txt; T0=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $S
nvcc -O3 -std=c++20 -arch=sm_90a -I src -DMOESERVE_ATTN_CLOCKS tools/device/attn_ws_probe.cu -o /tmp/pc > /tmp/b1.log 2>&1 &
nvcc -O3 -std=c++20 -arch=sm_90a -I src -lineinfo tools/device/attn_ws_probe.cu -o /tmp/pn > /tmp/b2.log 2>&1 &
wait; echo "built $((SECONDS-T0)) s" >> $S
timeout 60 /tmp/pc > $OUT/probe_clocks.txt 2>&1; echo "clocks rc=$?" >> $S
M=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active
# ws kernels in launch order: 132 rows ws (1 + 23), wsp (1 + 23); 384 rows ws (1 + 23) at 48, wsp at 72.
for sk in 48 72; do
  timeout 120 ncu --metrics $M -k regex:sparse_attention_ws_kernel --launch-skip $sk --launch-count 1 /tmp/pn > $OUT/ncu_$sk.txt 2>&1
  echo "ncu $sk rc=$?" >> $S
done
grep -E "^rows|ws pipelined" $OUT/probe_clocks.txt >> $S
for sk in 48 72; do grep -E "ws_kernel|hmma|lsu|shared|dram|duration|warps_active|issue_active" $OUT/ncu_$sk.txt >> $S; done
echo "total $((SECONDS-T0)) s" >> $S
cat $S; cat $OUT/probe_clocks.txt | tail -60
