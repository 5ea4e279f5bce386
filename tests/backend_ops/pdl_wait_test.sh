#!/usr/bin/env bash
# Every kernel of src/backend/cuda/*.cu may run with the programmatic-dependent-launch attribute
# (kernels.h set_programmatic_launch), so each must call pdl_wait() as the first statement of its
# body (the INVARIANT of cuda_util.cuh: before any memory access or early return); and every
# launch goes through launch_kernel / launch_kernel_clusters (no <<<...>>>, no other
# cudaLaunchKernelEx), so the switch covers all of them. Source check: no device needed.
set -euo pipefail
cd "$(dirname "$0")/../.."
status=0
for f in src/backend/cuda/*.cu; do
  # From each line declaring a __global__ function (not in a // comment) to its body's `{`, then
  # the first non-blank text after that brace.
  awk -v file="$f" '
    function check(s) {
      body = 0
      if (s !~ /^[[:space:]]*pdl_wait\(\);/) {
        print file ":" line ": kernel whose first statement is not pdl_wait(): " s
        bad = 1
      }
    }
    /^[^\/]*__global__/ { want = 1; line = FNR }
    want && /\{/ { sub(/^[^{]*\{/, ""); want = 0; body = 1 }
    body && /[^[:space:]]/ { check($0) }
    END { exit bad }' "$f" || status=1
done
if grep -n '<<<' src/backend/cuda/*.cu; then
  echo "plain <<<...>>> launches: launch through launch_kernel (cuda_util.cuh)"
  status=1
fi
if grep -n 'cudaLaunchKernelEx' src/backend/cuda/*.cu; then
  echo "cudaLaunchKernelEx outside launch_kernel_clusters (cuda_util.cuh)"
  status=1
fi
[[ $status == 0 ]] && echo "pdl_wait: ok"
exit $status
