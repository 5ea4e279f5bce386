#!/usr/bin/env bash
# Runs ON THE DEVICE machine: a per-kernel GPU time table of one `moeserve bench forward` case,
# from Nsight Systems when the image has nsys, else Nsight Compute (gpu__time_duration per kernel,
# kernels serialised; the numbers are each kernel's own duration, without overlap). Writes
# OUT_DIR/profile_<name>.txt (time per kernel name, largest first) and prints it.
#
#   usage: BIN=build/cuda-release/bin/moeserve tools/device/profile_forward.sh OUT_DIR [bench args...]
#   env:   PROFILE_NAME (default "decode")
set -uo pipefail
out=${1:?usage: profile_forward.sh OUT_DIR [bench args...]}
shift
bin=${BIN:-build/cuda-release/bin/moeserve}
name=${PROFILE_NAME:-decode}
mkdir -p "$out"
args=("$@")
[[ ${#args[@]} -gt 0 ]] || args=(--batch 64 --context 131072 --tokens-per-seq 6 --local-experts 12 --layers 4)
bench=("$bin" bench forward --backend cuda --random-weights --config configs/deepseek-v4.1-flash/config.json
  --iterations 1 "${args[@]}" -o "/tmp/prof_$name.json")
csv=/tmp/prof_$name.csv
if command -v nsys >/dev/null; then
  nsys profile -o "/tmp/prof_$name" --force-overwrite true -t cuda "${bench[@]}" >"/tmp/prof_$name.log" 2>&1
  nsys stats -r cuda_gpu_trace -f csv -o "/tmp/prof_${name}_trace" "/tmp/prof_$name.nsys-rep" >/dev/null 2>&1
  tool=nsys
  csv=$(ls /tmp/prof_${name}_trace*.csv 2>/dev/null | head -1)
elif command -v ncu >/dev/null || [[ -x /usr/local/cuda/bin/ncu ]]; then
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  "$ncu" --metrics gpu__time_duration.sum --csv --print-units base "${bench[@]}" >"$csv" 2>"/tmp/prof_$name.log"
  tool=ncu
else
  echo "profile_forward: neither nsys nor ncu on this machine" | tee "$out/profile_$name.txt"
  exit 0
fi
python3 - "$tool" "$csv" "$out/profile_$name.txt" <<'PY'
import csv, sys, collections
tool, path, dst = sys.argv[1:4]
tot = collections.Counter(); cnt = collections.Counter()
lines = [l for l in open(path, errors="replace") if l.startswith('"')]
for r in csv.DictReader(lines):
    if tool == "ncu":
        if r.get("Metric Name") != "gpu__time_duration.sum": continue
        name, ns = r["Kernel Name"], float(r["Metric Value"].replace(",", ""))
    else:
        name, ns = r.get("Name", ""), float(r.get("Duration (ns)", 0) or 0)
    # Weight / cache fill kernels of --random-weights and the synthetic KV fill are not the step.
    base = name.split("(")[0].rsplit("::", 1)[-1].split("<")[0]
    if base in ("fill_kernel", "fill_records_kernel", "dequant_fp8_kernel"): continue
    name = name.split("(")[0][:100]
    tot[name] += ns; cnt[name] += 1
total = sum(tot.values())
with open(dst, "w") as f:
    f.write(f"{tool}: {sum(cnt.values())} kernels, {total/1e6:.3f} ms in all (warm-up + 1 timed step; load-time fills excluded)\n")
    f.write(f"{'share':>6} {'total ms':>9} {'calls':>6} {'avg us':>8}  kernel\n")
    for n, t in tot.most_common(45):
        f.write(f"{100*t/total:5.1f}% {t/1e6:9.3f} {cnt[n]:6d} {t/cnt[n]/1e3:8.1f}  {n}\n")
print(open(dst).read())
PY
