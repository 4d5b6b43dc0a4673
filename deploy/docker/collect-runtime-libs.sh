#!/usr/bin/env bash
# Usage: collect-runtime-libs.sh OUT BINARY...
# Lays out what the runtime image needs from the build stage, under OUT:
#   OUT/usr/local/bin/<binary>                   the binaries
#   OUT/usr/local/lib/lmserve/<soname>           every shared library they load (ldd), dereferenced
#   OUT/etc/ld.so.conf.d/lmserve.conf            that directory, for ldconfig
# except the libraries every base image has (glibc, libstdc++, libgcc_s) and the CUDA libraries that
# the CUDA runtime image (/usr/local/cuda*) and the NVIDIA container runtime (libcuda, libnvidia-*)
# provide. The build and runtime stages share one distribution release, so copied libraries match.
# tests/deploy/runtime_libs_test.sh runs the result in a chroot holding nothing else.
set -euo pipefail
out=${1:?usage: collect-runtime-libs.sh OUT BINARY...}
shift
[[ $# -gt 0 ]] || { echo "usage: collect-runtime-libs.sh OUT BINARY..." >&2; exit 2; }
libdir=/usr/local/lib/lmserve

# Provided by the base image: glibc (the loader, libc, libm, ...), the C++ runtime.
base_re='^(ld-linux[^/]*|libc|libm|libmvec|libpthread|libdl|librt|libresolv|libutil|libanl|libstdc\+\+|libgcc_s)\.so'
# Provided by the CUDA runtime image or the driver.
cuda_re='^(libcuda|libnvidia-[^/]*|libnvcuvid|libnvoptix)\.so'

mkdir -p "$out/usr/local/bin" "$out$libdir" "$out/etc/ld.so.conf.d"
echo "$libdir" >"$out/etc/ld.so.conf.d/lmserve.conf"

count=0
for binary in "$@"; do
  install -m 0755 "$binary" "$out/usr/local/bin/"
  ldd_out=$(ldd "$binary")
  # libcuda.so.1 is absent where no driver is installed (the build stage); all else must resolve.
  missing=$(awk '$3 == "not" {print $1}' <<<"$ldd_out" | grep -Ev "$cuda_re" || true)
  if [[ -n $missing ]]; then
    echo "collect-runtime-libs: $binary: unresolved libraries: $missing" >&2
    exit 1
  fi
  while read -r soname arrow path _; do
    [[ $arrow == "=>" && $path == /* ]] || continue   # linux-vdso, the loader line, "not found"
    if [[ $soname =~ $base_re || $soname =~ $cuda_re || $path == /usr/local/cuda* ]]; then
      continue
    fi
    if [[ ! -e $out$libdir/$soname ]]; then
      cp -L "$path" "$out$libdir/$soname"
      count=$((count + 1))
    fi
  done <<<"$ldd_out"
done
echo "collect-runtime-libs: $# binaries and $count libraries in $out"
