#!/usr/bin/env bash
# Stages what a GPU build of moeserve needs from our Debian 12 packages into .device/sysroot (an
# ignored folder that travels to the device machine with `carry: [".device"]`). Run HERE, on the
# Debian 12 build machine, from anywhere inside the repo: downloads the .debs (apt-get download;
# nothing is installed), unpacks them with dpkg -x, prunes docs and what the device build does not
# use, and makes absolute symlinks relative. See docs/device.md.
#
# What is staged and why:
#   headers:  fmt, spdlog (used header-only: MOESERVE_HEADER_ONLY_DEPS), nlohmann-json, tl-expected,
#             CLI11 (+ their CMake package files, which are relocatable)
#   source:   googletest (built on the device with the device's compiler: no C++ ABI mismatch)
#   BLAS:     netlib libblas3 (+ cblas.h, libgfortran5, libquadmath0): the CPU reference backend
#             only needs cblas_sgemm, and the OpenBLAS .so (36 MB) would not fit the tree limit
#   C libs:   xxhash (kv), pcre2-8 + utf8proc (tokenizer): headers, .pc files and runtime .so
#   pkgconf:  for the FindPkgConfig REQUIRED in cmake/MoeserveDeps.cmake if the device has none
#   boost:    libboost1.81-dev (server: Beast/Asio headers) is 150 MB unpacked, so its .deb (10 MB)
#             is kept whole in .device/debs/ and unpacked on the device by build_and_test.sh
# Not staged (nothing in the build uses them yet): zmq, gloo, OpenBLAS.
set -euo pipefail

root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
dest="$root/.device/sysroot"
packages=(libfmt-dev libspdlog-dev nlohmann-json3-dev libexpected-dev libcli11-dev googletest
          libblas3 libblas-dev libgfortran5 libquadmath0 pkgconf-bin libpkgconf3
          libxxhash-dev libxxhash0 libpcre2-dev libpcre2-8-0 libutf8proc-dev libutf8proc2)
packed=(libboost1.81-dev)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download "${packages[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
ls "$work"/*.deb >/dev/null

rm -rf "$dest" "$root/.device/debs"
mkdir -p "$dest" "$root/.device/debs"
(cd "$root/.device/debs" && apt-get download "${packed[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
for deb in "$work"/*.deb; do dpkg -x "$deb" "$dest"; done

# Prune: documentation, static BLAS, googletest's docs/samples/tests.
rm -rf "$dest"/usr/share/{doc,man,info,lintian,bug}
find "$dest" -name "*.a" -delete  # static libs: the build links the .so files
rm -rf "$dest"/usr/src/googletest/{googletest,googlemock}/{docs,samples,test}

# Debian installs cblas.h through update-alternatives (not in the .deb): give the netlib header
# that name in a folder of its own, which build_and_test.sh passes as OPENBLAS_INCLUDE_DIR.
mkdir -p "$dest/usr/include/moeserve-cblas"
cp "$dest/usr/include/x86_64-linux-gnu/cblas-netlib.h" "$dest/usr/include/moeserve-cblas/cblas.h"
cp "$dest/usr/include/x86_64-linux-gnu/cblas_mangling.h" "$dest/usr/include/moeserve-cblas/"

# Absolute symlinks would point into the device's /: make them relative to the sysroot.
while IFS= read -r link; do
  target=$(readlink "$link")
  if [[ "$target" == /* ]]; then
    ln -sfn "$(realpath -m --relative-to="$(dirname "$link")" "$dest$target")" "$link"
  fi
done < <(find "$dest" -type l)
find "$dest" -xtype l -delete  # links to the .so files of packages not staged (libfmt.so, ...)

git -C "$root" rev-parse --short=12 HEAD > "$root/.device/COMMIT" 2>/dev/null || true
echo "staged $(find "$dest" -type f | wc -l) files into $dest: $(du -sh "$dest" | cut -f1)"
echo "packed .debs in $root/.device/debs: $(du -sh "$root/.device/debs" | cut -f1); all of .device: $(du -sh "$root/.device" | cut -f1)"
