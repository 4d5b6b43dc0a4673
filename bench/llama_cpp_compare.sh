#!/usr/bin/env bash
# Usage: bench/llama_cpp_compare.sh [GGUF] [THREADS] [REPEATS]
#   GGUF     default: the demo model (scripts/fetch-demo-model.sh)
#   THREADS  comma-separated thread counts, default 1,2
#   REPEATS  runs of each engine per thread count, alternating, default 5
#
# lmserve's CPU runner beside llama.cpp on the same GGUF and thread counts (issue 22): decode of 64
# tokens (llama.cpp's tg64) and a 128-token prompt (pp128), tokens per second, the median of
# REPEATS runs, the engines taking turns so that the machine's drift hits both alike. lmserve's
# figures are lmserve-cpu-runner-bench's (build/bin; scripts/build.sh builds it), llama.cpp's are
# llama-bench's, built here from the source in the llama-cpp-python sdist on PyPI (the version
# below: the llama.cpp of issue 22's baseline) into $LMSERVE_CACHE_DIR/llama.cpp-$VERSION, with
# llama.cpp's own defaults (GGML_NATIVE: this machine's SIMD). Also prints lmserve's peak RSS.
# LMSERVE_BENCH_ARGS adds arguments to lmserve's runs (e.g. --int8-activations, or --dtype float32).
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.3.36
gguf=${1:-$(scripts/fetch-demo-model.sh)}
threads=${2:-1,2}
repeats=${3:-5}
cache=${LMSERVE_CACHE_DIR:-$HOME/.cache/lmserve}
src="$cache/llama.cpp-$version"
bench_lmserve=build/bin/lmserve-cpu-runner-bench
[[ -x $bench_lmserve ]] || { echo "$bench_lmserve: build it first (scripts/build.sh)" >&2; exit 1; }

if [[ ! -x $src/build/bin/llama-bench ]]; then
  tmp=$(mktemp -d)
  python3 -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$tmp"
  mkdir -p "$src"
  tar -xzf "$tmp"/llama_cpp_python-"$version".tar.gz -C "$tmp"
  cp -r "$tmp/llama_cpp_python-$version/vendor/llama.cpp/." "$src/"
  rm -rf "$tmp"
  echo "building llama-bench in $src (log: $src/build.log)" >&2
  if ! { cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
           -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF &&
         cmake --build "$src/build" --target llama-bench -j "$(nproc)"; } >"$src/build.log" 2>&1; then
    tail -20 "$src/build.log" >&2
    exit 1
  fi
fi
llama_bench=$src/build/bin/llama-bench

median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

echo "model: $gguf"
echo "llama.cpp: llama-cpp-python $version's vendor/llama.cpp ($llama_bench)"
echo "lmserve: $bench_lmserve ${LMSERVE_BENCH_ARGS:-}"
printf "%-8s %-14s %12s %12s %8s\n" threads test lmserve llama.cpp ratio
IFS=, read -ra counts <<<"$threads"
for t in "${counts[@]}"; do
  : >/tmp/lmc-l-pp; : >/tmp/lmc-l-tg; : >/tmp/lmc-c-pp; : >/tmp/lmc-c-tg; : >/tmp/lmc-rss
  for ((i = 0; i < repeats; i++)); do
    # shellcheck disable=SC2086  # LMSERVE_BENCH_ARGS: words
    out=$("$bench_lmserve" --model "$gguf" --threads "$t" --prompt-tokens 128 --decode-tokens 64 \
      --repeats 1 ${LMSERVE_BENCH_ARGS:-})
    awk '$1 == "prefill" {print $2}' <<<"$out" >>/tmp/lmc-l-pp
    awk '$1 == "decode" {print $2}' <<<"$out" >>/tmp/lmc-l-tg
    awk '$1 == "peak" {print $3}' <<<"$out" >>/tmp/lmc-rss
    json=$("$llama_bench" -m "$gguf" -t "$t" -p 128 -n 64 -r 1 -o json 2>/dev/null)
    python3 -c 'import json, sys
for r in json.load(sys.stdin):
    print(("pp" if r["n_prompt"] else "tg"), r["avg_ts"])' <<<"$json" |
      awk '{print $2 >> ("/tmp/lmc-c-" $1)}'
  done
  for test in pp tg; do
    l=$(median </tmp/lmc-l-$test); c=$(median </tmp/lmc-c-$test)
    name=$([[ $test == pp ]] && echo "prefill pp128" || echo "decode tg64")
    printf "%-8s %-14s %12.1f %12.1f %7.2fx\n" "$t" "$name" "$l" "$c" "$(echo "$l / $c" | bc -l)"
  done
  echo "         lmserve peak RSS (MiB, median): $(median </tmp/lmc-rss); the GGUF: $(($(stat -c %s "$gguf") >> 20)) MiB"
done
rm -f /tmp/lmc-*
