#!/usr/bin/env bash
# Installs everything moeserve needs to build and test on a fresh Debian 12 machine (as root, or
# with sudo): the Debian packages of architecture.md §6 and the Python packages the tests use.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git python3 python3-pip
  libboost1.81-dev nlohmann-json3-dev libpcre2-dev libopenblas-openmp-dev libgloo-dev
  libzmq3-dev cppzmq-dev libcli11-dev libspdlog-dev libfmt-dev libexpected-dev libxxhash-dev
  libutf8proc-dev libgtest-dev libgmock-dev libbenchmark-dev curl
)
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${APT_PACKAGES[@]}" >/dev/null

# Python: the numpy oracle, tokenizer parity, server and bench tests.
PY=${PYTHON:-python3}
$PY -m pip install -q --disable-pip-version-check -r "$(dirname "$0")/requirements-test.txt"
echo "install_deps: done"
