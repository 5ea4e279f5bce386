#!/usr/bin/env bash
# Runs ON THE DEVICE machine: a kernel-level profile of one `moeserve bench forward` case under
# Nsight Systems (when the image has nsys), printing the CUDA kernel summary (time per kernel
# name, largest first) to OUT_DIR/profile_<name>.txt. Used to find what a forward step spends
# its GPU time on beyond the per-component CUDA-event totals the bench reports.
#
#   usage: BIN=build/cuda-release/bin/moeserve tools/device/profile_forward.sh OUT_DIR [bench args...]
#   env:   PROFILE_NAME (default "decode")
set -uo pipefail
out=${1:?usage: profile_forward.sh OUT_DIR [bench args...]}
shift
bin=${BIN:-build/cuda-release/bin/moeserve}
name=${PROFILE_NAME:-decode}
mkdir -p "$out"
nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
if [[ -z "$nsys" ]]; then
  echo "profile_forward: no nsys on this machine" | tee "$out/profile_$name.txt"
  exit 0
fi
args=("$@")
[[ ${#args[@]} -gt 0 ]] || args=(--batch 64 --context 131072 --tokens-per-seq 6 --local-experts 12 --layers 4)
"$nsys" profile -o "/tmp/prof_$name" --force-overwrite true -t cuda --stats=false \
  "$bin" bench forward --backend cuda --random-weights --config configs/deepseek-v4.1-flash/config.json \
  --iterations 2 "${args[@]}" -o "/tmp/prof_$name.json" >"/tmp/prof_$name.log" 2>&1
"$nsys" stats -r cuda_gpu_kern_sum -f csv -o "/tmp/prof_${name}" "/tmp/prof_$name.nsys-rep" >/dev/null 2>&1
csv=$(ls /tmp/prof_${name}*cuda_gpu_kern_sum*.csv 2>/dev/null | head -1)
if [[ -z "$csv" ]]; then
  tail -20 "/tmp/prof_$name.log"
  echo "profile_forward: nsys stats produced no kernel summary" | tee "$out/profile_$name.txt"
  exit 0
fi
python3 - "$csv" "$out/profile_$name.txt" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
total = sum(float(r["Total Time (ns)"]) for r in rows)
with open(sys.argv[2], "w") as f:
    f.write(f"{'share':>6} {'total ms':>9} {'calls':>7} {'avg us':>8}  kernel\n")
    for r in rows[:40]:
        t = float(r["Total Time (ns)"])
        f.write(f"{100*t/total:5.1f}% {t/1e6:9.3f} {int(r['Instances']):7d} {float(r['Avg (ns)'])/1e3:8.1f}  {r['Name'][:110]}\n")
print(open(sys.argv[2]).read())
PY
