#!/usr/bin/env bash
# Configures and builds lmserve into BUILD_DIR (default: build). Extra arguments go to CMake's
# configure step, e.g. scripts/build.sh -DLMSERVE_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo})
if [[ ${CI:-} == true ]]; then
  cmake_args+=(-DLMSERVE_WERROR=ON)  # warnings are errors in CI
fi
cmake -S . -B "$build_dir" "${cmake_args[@]}" "$@" >/dev/null
cmake --build "$build_dir" -j "${BUILD_JOBS:-$(nproc)}"
