#!/usr/bin/env bash
# Configures (cpu-debug: ASan + UBSan), builds and runs every CPU test (everything but label gpu).
# Usage: tools/run_tests.sh [extra ctest args, e.g. -L unit]
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
cmake --preset cpu-debug
cmake --build --preset cpu-debug -j "$JOBS"
ctest --preset cpu-debug -j "$JOBS" "$@"
