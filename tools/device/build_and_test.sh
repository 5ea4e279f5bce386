#!/usr/bin/env bash
# Runs ON THE DEVICE machine, from the repo root: builds moeserve with CUDA (cuda-release preset,
# sm_90a) against the sysroot that tools/device/stage.sh staged into .device/sysroot, runs the GPU
# tests and the op benchmark, and writes logs + JSON into OUT_DIR. See docs/device.md.
#
#   usage: tools/device/build_and_test.sh OUT_DIR
#   env:   STEPS (default "env unpack gtest configure build test bench torch"; add "fwdbench" for
#          the GPU forward benchmarks of tools/device/bench_forward.sh), JOBS (default nproc),
#          BUILD_TARGETS (build only these targets), TEST_FILTER (gtest filter of the op tests),
#          GPU_FWD_ARGS (extra arguments of the GPU forward test, e.g. a gtest filter),
#          MEMCHECK=0 (skip the compute-sanitizer passes of the test step), BUILD_DIR (default
#          build/cuda-release), CMAKE_EXTRA (more configure arguments, e.g. a variant's
#          -DCMAKE_CUDA_FLAGS=-DMOESERVE_PDL_EARLY_TRIGGER in its own BUILD_DIR)
#
# Everything is compiled on the device with its own compiler (googletest too); from the sysroot
# only headers and C libraries are used (fmt and spdlog header-only), so no C++ ABI crosses
# machines. A failing step is recorded and the later steps still run; summary.json has each rc.
set -uo pipefail

out=${1:?usage: build_and_test.sh OUT_DIR}
mkdir -p "$out"
root=$(pwd)
sysroot="$root/.device/sysroot"
build="$root/${BUILD_DIR:-build/cuda-release}"
jobs=${JOBS:-$(nproc)}
steps=${STEPS:-env unpack gtest configure build test bench torch}
log="$out/build_and_test.log"
exec > >(tee -a "$log") 2>&1

[[ -d "$sysroot/usr/include" ]] || { echo "no $sysroot: run tools/device/stage.sh here and carry .device"; exit 2; }
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
libdir="$sysroot/usr/lib/x86_64-linux-gnu"
export LD_LIBRARY_PATH="$libdir:$libdir/blas${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# pkg-config sees only the sysroot's .pc files, with their /usr prefix mapped into it.
export PKG_CONFIG_LIBDIR="$libdir/pkgconfig:$sysroot/usr/share/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$sysroot"
pkg_config=$(command -v pkg-config || echo "$sysroot/usr/bin/pkgconf")

declare -A rc
run_step() {  # name command...
  local name=$1
  shift
  echo "=== $name: $*"
  local t0=$SECONDS
  "$@"
  rc[$name]=$?
  echo "=== $name: rc=${rc[$name]} ($((SECONDS - t0)) s)"
}

step_env() {
  uname -srm
  ldd --version | head -1
  g++ --version | head -1
  cmake --version | head -1
  ninja --version
  nvcc --version | tail -2
  echo "pkg-config: $pkg_config"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv
  nproc
  cat .device/COMMIT 2>/dev/null || true
}

# The .debs kept packed (boost headers), unpacked outside the tree.
step_unpack() {
  local deb status=0
  mkdir -p /tmp/moeserve-packed
  for deb in .device/debs/*.deb; do
    [[ -e "$deb" ]] || continue
    if command -v dpkg >/dev/null; then
      dpkg -x "$deb" /tmp/moeserve-packed || status=$?
    else
      (cd /tmp/moeserve-packed && ar p "$root/$deb" data.tar.xz | tar xJ) || status=$?
    fi
  done
  return $status
}

step_gtest() {
  cmake -S "$sysroot/usr/src/googletest" -B /tmp/moeserve-gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX=/tmp/moeserve-gtest -DBUILD_GMOCK=ON -DINSTALL_GTEST=ON >/dev/null &&
    cmake --build /tmp/moeserve-gtest-build -j "$jobs" >/dev/null &&
    cmake --install /tmp/moeserve-gtest-build >/dev/null
}

step_configure() {
  # NOTE: CMake < 3.26 has no CUDA20 flag for nvcc; these give it (newer CMake sets the same).
  # shellcheck disable=SC2086  # CMAKE_EXTRA: words on purpose
  cmake --preset cuda-release -B "$build" ${CMAKE_EXTRA:-} \
    -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20 \
    -DMOESERVE_HEADER_ONLY_DEPS=ON \
    "-DCMAKE_PREFIX_PATH=/tmp/moeserve-gtest;$sysroot/usr;/tmp/moeserve-packed/usr" \
    "-DCMAKE_INCLUDE_PATH=$sysroot/usr/include" \
    "-DCMAKE_LIBRARY_PATH=$libdir;$libdir/blas" \
    "-DOPENBLAS_INCLUDE_DIR=$sysroot/usr/include/moeserve-cblas" \
    "-DOPENBLAS_LIBRARY=$libdir/blas/libblas.so.3" \
    "-DPKG_CONFIG_EXECUTABLE=$pkg_config" \
    "-DMOESERVE_GIT_COMMIT_OVERRIDE=$(cat .device/STAMP 2>/dev/null || true)"
}

step_build() {
  # BUILD_TARGETS: build only these (saves device minutes when the CPU-only targets are not run).
  if [[ -n "${BUILD_TARGETS:-}" ]]; then
    # shellcheck disable=SC2086
    cmake --build "$build" -j "$jobs" --target $BUILD_TARGETS
    return $?
  fi
  # -k 0: keep going, so one broken target elsewhere does not hide the GPU results.
  cmake --build "$build" -j "$jobs" -- -k 0
  local status=$?
  # The targets this script needs, once more, so their errors end the log.
  cmake --build "$build" -j "$jobs" --target cuda_ops cuda_v41_ops backend_ops cuda_ops_bench \
    moeserve integration_model_gpu_forward_test || status=$?
  return $status
}

step_test() {
  local status=0
  local filter=${TEST_FILTER:-*}
  "$build/tests/backend_ops/cuda_ops" --gtest_filter="$filter" --gtest_output="json:$out/cuda_ops.json" || status=$?
  "$build/tests/backend_ops/cuda_v41_ops" --gtest_filter="$filter" --gtest_output="json:$out/cuda_v41_ops.json" || status=$?
  if [[ -z "${BUILD_TARGETS:-}" ]]; then
    "$build/tests/backend_ops/backend_ops" --gtest_output="json:$out/backend_ops.json" || status=$?
  fi
  # The GPU forward against the CPU forward (tiny model); its output goes to the main log only
  # (the device tool returns at most 8 files from OUT).
  # shellcheck disable=SC2086
  "$build/tests/integration/model/integration_model_gpu_forward_test" ${GPU_FWD_ARGS:-} || status=$?
  if [[ -z "${BUILD_TARGETS:-}" ]]; then
    ctest --test-dir "$build" -L gpu -E integration_model_gpu_forward_test --output-on-failure || status=$?
  fi
  if [[ "${MEMCHECK:-1}" != 0 ]] && command -v compute-sanitizer >/dev/null; then
    timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$build/tests/backend_ops/cuda_ops" \
      --gtest_filter='*7x100x160*:*r3_c1001*:*r2_c7*:*t1_h64*:*Ties*' >/tmp/memcheck.log 2>&1 || status=$?
    tail -5 /tmp/memcheck.log
    # The round-2 ops except the large top-k / sampling cases (memcheck is slow on them).
    timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$build/tests/backend_ops/cuda_v41_ops" \
      --gtest_filter='CudaV41.*:-*Topk*:*Sampling*:*CandidateBlocks*' >>/tmp/memcheck.log 2>&1 || status=$?
    tail -5 /tmp/memcheck.log
  fi
  return $status
}

step_bench() {
  "$build/tests/backend_ops/cuda_ops_bench" "$out"
}

# `moeserve bench forward --backend cuda` runs (tools/device/bench_forward.sh; FWD_SET picks them).
step_fwdbench() {
  BIN="$build/bin/moeserve" bash tools/device/bench_forward.sh "$out"
}

# torch.topk on the bench's top-k shapes (the device image has PyTorch), for comparison.
step_torch() {
  python3 tools/device/topk_torch.py "$out"
}

for s in $steps; do run_step "$s" "step_$s"; done

{
  echo "{"
  first=1
  for s in $steps; do
    [[ $first == 1 ]] || echo ","
    first=0
    printf '  "%s": %s' "$s" "${rc[$s]}"
  done
  echo
  echo "}"
} >"$out/summary.json"
cat "$out/summary.json"
for s in $steps; do [[ ${rc[$s]} == 0 ]] || exit 1; done
