#!/usr/bin/env bash
# Runs HERE before a device call: writes the code's commit into .device/STAMP, which `run` carries
# with .device. build_and_test.sh bakes it into the build (MOESERVE_GIT_COMMIT_OVERRIDE), so the
# JSON of benchmarks run on the device names the measured code: the short HEAD, plus "+dirty" when
# the working tree differs from it. (The device copy's own git metadata is a base checkout.)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$root/.device"
stamp=$(git -C "$root" rev-parse --short=12 HEAD)
if ! git -C "$root" diff --quiet HEAD -- || [[ -n "$(git -C "$root" ls-files --others --exclude-standard)" ]]; then
  stamp="$stamp+dirty"
fi
echo "$stamp" > "$root/.device/STAMP"
echo "device stamp: $stamp"
