#!/usr/bin/env bash
# Usage: runtime_libs_test.sh BINARY    (ctest: deploy_runtime_libs, label deploy)
# BINARY is bin/lmserve; bin/lmserve-cli beside it is taken too where it exists, as the image does.
# The runtime image is a base image plus what deploy/docker/collect-runtime-libs.sh collects in the
# build stage. This test builds that root filesystem with nothing else in it: the collection, and from
# this machine only what every Debian or Ubuntu base image has (the loader, glibc, libstdc++,
# libgcc_s). It runs ldconfig in it, as the Dockerfile does, then `lmserve --help` (and
# `lmserve-cli health --help`) in a chroot: a library the collection missed fails to load there. (CUDA libraries, which the CUDA runtime image
# provides, are not exercised by a CPU build.)
set -euo pipefail
binary=$(realpath "${1:?usage: runtime_libs_test.sh BINARY}")
repo=$(cd "$(dirname "$0")/../.." && pwd)
if [[ $(id -u) -ne 0 ]]; then
  # chroot and ldconfig -r need root; a user namespace gives that where the kernel allows it.
  if unshare -r true 2>/dev/null; then exec unshare -r "$0" "$@"; fi
  echo "runtime_libs_test: SKIP: needs root or user namespaces for chroot"
  exit 77
fi

binaries=("$binary")
cli=$(dirname "$binary")/lmserve-cli
[[ -x $cli ]] && binaries+=("$cli")

root=$(mktemp -d)
trap 'rm -rf "$root" "$root.out"' EXIT
"$repo/deploy/docker/collect-runtime-libs.sh" "$root" "${binaries[@]}"

# What a base image has, by this test's own list (not the collection script's).
base_re='^(ld-linux[^/]*|libc|libm|libmvec|libpthread|libdl|librt|libresolv|libutil|libanl|libstdc\+\+|libgcc_s)\.so'
while read -r first second third _; do
  if [[ $second == "=>" && $third == /* ]]; then
    soname=$first path=$third
  elif [[ $first == /* ]]; then
    soname=$(basename "$first") path=$first   # the loader, at the path the binary names
  else
    continue
  fi
  [[ $soname =~ $base_re ]] || continue
  if [[ $first == /* ]]; then
    mkdir -p "$root$(dirname "$first")"
    cp -L "$path" "$root$first"
  else
    mkdir -p "$root/lib/x86_64-linux-gnu"
    cp -L "$path" "$root/lib/x86_64-linux-gnu/$soname"
  fi
done < <(for b in "${binaries[@]}"; do ldd "$b"; done)
echo 'include /etc/ld.so.conf.d/*.conf' >"$root/etc/ld.so.conf"
echo /lib/x86_64-linux-gnu >"$root/etc/ld.so.conf.d/base.conf"
ldconfig -r "$root"

echo "runtime_libs_test: the root filesystem:"
(cd "$root" && find . -type f | sort | sed 's/^/  /')
commands=("/usr/local/bin/lmserve --help")
[[ -x $cli ]] && commands+=("/usr/local/bin/lmserve-cli health --help")
for command in "${commands[@]}"; do
  # shellcheck disable=SC2086  # the command's words
  if ! chroot "$root" $command >"$root.out" 2>&1; then
    cat "$root.out"
    echo "runtime_libs_test: FAIL: '$command' does not run with the collected libraries"
    exit 1
  fi
  echo "runtime_libs_test: '$command' runs"
done
echo "runtime_libs_test: PASS: ${#binaries[@]} binaries run in a root holding only glibc, libstdc++ and the collection"
