#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/*_fuzz.cc) with clang into FUZZ_BUILD_DIR (default:
# build-fuzz) and runs each for LMSERVE_FUZZ_SECONDS (default 30) seconds. Fails on any crash,
# sanitizer report, leak or timeout; the input that caused it is left in build-fuzz/artifacts/.
# Seeds: those fuzz_seeds writes (inputs made by the project's own writers) plus any checked in
# under tests/fuzz/corpus/<fuzzer>/. Found inputs accumulate in build-fuzz/corpus/<fuzzer>/.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${FUZZ_BUILD_DIR:-build-fuzz}
seconds=${LMSERVE_FUZZ_SECONDS:-30}
jobs=${BUILD_JOBS:-$(nproc)}

for tool in clang clang++; do
  command -v "$tool" >/dev/null || { echo "fuzz: $tool not found (scripts/setup.sh installs it)" >&2; exit 1; }
done

# Only the fuzzers and the libraries they link are built: no server, benchmarks or unit tests.
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DLMSERVE_FUZZ=ON -DLMSERVE_CUDA=OFF \
  >/dev/null
cmake --build "$build_dir" -j "$jobs" --target fuzzers fuzz_seeds

seeds="$build_dir/seeds"
rm -rf "$seeds"
"$build_dir/bin/fuzz_seeds" "$seeds"
mkdir -p "$build_dir/artifacts"

status=0
for fuzzer in "$build_dir"/bin/*_fuzz; do
  name=$(basename "$fuzzer")
  corpus="$build_dir/corpus/$name"
  mkdir -p "$corpus"
  seed_dirs=()
  [[ -d "$seeds/$name" ]] && seed_dirs+=("$seeds/$name")
  [[ -d "tests/fuzz/corpus/$name" ]] && seed_dirs+=("tests/fuzz/corpus/$name")
  echo "fuzz: $name for ${seconds}s (seeds: ${seed_dirs[*]:-none})"
  if ! "$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
      -print_final_stats=1 -artifact_prefix="$build_dir/artifacts/$name-" \
      "$corpus" "${seed_dirs[@]}" >"$build_dir/$name.log" 2>&1; then
    echo "fuzz: $name FAILED; the end of $build_dir/$name.log:" >&2
    tail -n 60 "$build_dir/$name.log" >&2
    status=1
  else
    grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$build_dir/$name.log" |
      sed "s/^/fuzz: $name /" || true
  fi
done
exit $status
