#!/usr/bin/env bash
# Configures (cpu-debug: ASan + UBSan), builds and runs every CPU test (everything but label gpu).
# Then, where nvcc is installed, compiles the CUDA sources (the smoke build of docs/device.md §3:
# the CUDA backend and the GPU model forward, sm_90a; nothing runs without a GPU).
# Usage: tools/run_tests.sh [extra ctest args, e.g. -L unit]; MOESERVE_SKIP_CUDA_SMOKE=1 skips it.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
cmake --preset cpu-debug
cmake --build --preset cpu-debug -j "$JOBS"
ctest --preset cpu-debug -j "$JOBS" "$@"

nvcc_bin=$(command -v nvcc || true)
[[ -z "$nvcc_bin" && -x /usr/local/cuda/bin/nvcc ]] && nvcc_bin=/usr/local/cuda/bin/nvcc
if [[ -n "$nvcc_bin" && -z "${MOESERVE_SKIP_CUDA_SMOKE:-}" ]]; then
  echo "cuda smoke build with $nvcc_bin"
  cmake -S . -B build/cuda-smoke -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOESERVE_CUDA=ON \
    -DCMAKE_CUDA_COMPILER="$nvcc_bin" -DCMAKE_CUDA_ARCHITECTURES=90a -DMOESERVE_BUILD_TESTS=OFF \
    -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 \
    -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20 >/dev/null
  cmake --build build/cuda-smoke -j "$JOBS" --target moeserve_backend \
    src/model/CMakeFiles/moeserve_model.dir/arch/deepseek_v41_gpu.cpp.o
else
  echo "cuda smoke build skipped (no nvcc)"
fi
