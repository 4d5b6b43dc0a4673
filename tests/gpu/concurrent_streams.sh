#!/usr/bin/env bash
# The GPU serving check, run by hand on a GPU machine (CI has none): 64 concurrent greedy streams
# of one model through `lmserve serve --backend cuda`, then the same 64 requests through a server
# on the CPU runner; every output must be the same text.
#
# Usage: tests/gpu/concurrent_streams.sh RUN MODEL OUTDIR
#   RUN: the command prefix that runs a built binary by name: "build/bin/" (then build/bin/lmserve)
#        or ".gpu/bundle/run " (a bundle from ../shared/tools/bundle-binaries; note the space).
#   MODEL: the model path (the demo GGUF). OUTDIR: where outputs and server logs go.
set -uo pipefail
run=$1 model=$2 out=$3
mkdir -p "$out"
subjects=(France Japan Brazil Canada Egypt India Italy Kenya Mexico Norway Peru Spain Sweden Chile
          Greece Turkey)
templates=("The capital of %s is" "A short history of %s:" "The most famous food of %s is"
           "Three facts about %s: 1.")
prompts=()
for s in "${subjects[@]}"; do
  for t in "${templates[@]}"; do prompts+=("$(printf "$t" "$s")"); done
done

serve() {  # serve BACKEND PORT
  ${run}lmserve serve --model "$model" --backend "$1" --port "$2" --max-num-seqs 64 \
    --max-num-batched-tokens 2048 >"$out/server-$1.log" 2>&1 &
  echo $! >"$out/server-$1.pid"
  ${run}lmserve-cli health --addr "127.0.0.1:$2" --wait 300 >/dev/null || {
    echo "the $1 server did not become healthy"; tail -20 "$out/server-$1.log"; exit 1; }
}

complete_all() {  # complete_all BACKEND PORT: 64 concurrent streams
  local start=$(date +%s.%N) pids=()
  for i in "${!prompts[@]}"; do
    ${run}lmserve-cli complete --addr "127.0.0.1:$2" --max-tokens 32 --temperature 0 \
      "${prompts[$i]}" >"$out/$1-$i.txt" 2>"$out/$1-$i.err" &
    pids+=($!)
  done
  wait "${pids[@]}"  # the clients only: the server runs in the background too
  echo "$1: 64 streams done in $(awk "BEGIN { print $(date +%s.%N) - $start }") s"
}

serve cuda 50061
complete_all cuda 50061
kill -TERM "$(cat "$out/server-cuda.pid")"; wait "$(cat "$out/server-cuda.pid")" 2>/dev/null
serve cpu 50062
complete_all cpu 50062
kill -TERM "$(cat "$out/server-cpu.pid")"; wait "$(cat "$out/server-cpu.pid")" 2>/dev/null

same=0 failed=0
for i in "${!prompts[@]}"; do
  if [[ -s "$out/cuda-$i.err" ]] && grep -qi "error" "$out/cuda-$i.err"; then
    failed=$((failed + 1)); echo "stream $i failed: $(head -c 300 "$out/cuda-$i.err")"
  elif cmp -s "$out/cuda-$i.txt" "$out/cpu-$i.txt"; then
    same=$((same + 1))
  else
    echo "stream $i differs: \"${prompts[$i]}\""
    echo "  cuda: $(tr '\n' ' ' <"$out/cuda-$i.txt")"
    echo "  cpu:  $(tr '\n' ' ' <"$out/cpu-$i.txt")"
  fi
done
echo "concurrent streams: $same of ${#prompts[@]} identical to the CPU runner, $failed failed"
grep -h "runner:" "$out"/server-*.log
[[ $same -eq ${#prompts[@]} ]]
