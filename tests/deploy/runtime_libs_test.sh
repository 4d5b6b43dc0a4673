#!/usr/bin/env bash
# Usage: runtime_libs_test.sh BINARY    (ctest: deploy_runtime_libs, label deploy)
# BINARY is bin/lmserve; bin/lmserve-cli beside it is taken too where it exists, as the image does.
# The runtime image is a base image plus what deploy/docker/collect-runtime-libs.sh collects in the
# build stage: tests/deploy/make_image_root.sh builds that filesystem with nothing else in it, and
# `lmserve --help` (and `lmserve-cli health --help`) must run there under chroot: a library the
# collection missed fails to load. (CUDA libraries, which the CUDA runtime image provides, are not
# exercised by a CPU build.)
set -euo pipefail
binary=$(realpath "${1:?usage: runtime_libs_test.sh BINARY}")
here=$(cd "$(dirname "$0")" && pwd)
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
"$here/make_image_root.sh" "$root" "${binaries[@]}"
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
