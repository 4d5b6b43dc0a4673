#!/usr/bin/env bash
# Usage: make_image_root.sh ROOT BINARY...
# Builds in ROOT (empty or absent) the runtime image's filesystem as far as the binaries need it: what
# deploy/docker/collect-runtime-libs.sh collects (the binaries and their libraries), plus from this
# machine only what every Debian or Ubuntu base image has (the loader, glibc, libstdc++, libgcc_s),
# by this script's own list, not the collection script's. Then ldconfig, as the Dockerfile runs it,
# and an empty world-writable /tmp and a /models, as the image has. For the deploy tests, which run
# the binaries in ROOT with chroot.
set -euo pipefail
root=${1:?usage: make_image_root.sh ROOT BINARY...}
shift
repo=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$root"
"$repo/deploy/docker/collect-runtime-libs.sh" "$root" "$@"

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
done < <(for b in "$@"; do ldd "$b"; done)
echo 'include /etc/ld.so.conf.d/*.conf' >"$root/etc/ld.so.conf"
echo /lib/x86_64-linux-gnu >"$root/etc/ld.so.conf.d/base.conf"
ldconfig -r "$root"
mkdir -p "$root/tmp" "$root/models"
chmod 1777 "$root/tmp"
