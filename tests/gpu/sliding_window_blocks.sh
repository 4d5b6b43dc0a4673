#!/usr/bin/env bash
# Sliding-window KV memory, end to end: one long greedy request (by default a 30,000-token prompt
# of token ids and 2,700 generated tokens, a 32,700-token sequence) on a Mistral-7B-shaped model
# with dummy weights and a window of 4096 (bench/configs/mistral-7b-sliding), through
# `lmserve serve` and `lmserve-cli complete`, while /metrics is scraped every 0.2 s. The blocks in
# use (lmserve_kv_cache_used_blocks, and lmserve_kv_cache_group_used_blocks of the window's group)
# must stay within what the window and one step's chunk need, ceil((W - 1 + chunk) / 16) + 1,
# against ceil(32,700 / 16) = 2,044 blocks for the whole context; the request must generate all its
# tokens. Prints the largest counts seen and the bound; exits 1 if either fails, 77 (skipped) for
# the CUDA backend on a machine without an NVIDIA GPU.
#
# Usage: tests/gpu/sliding_window_blocks.sh RUN OUTDIR [BACKEND MODEL PROMPT_TOKENS MAX_TOKENS]
#   RUN: the command prefix that runs a built binary by name: "build/bin/" or ".gpu/bundle/run ".
#   OUTDIR: where the server log, the completion and the metrics samples go.
#   BACKEND: cuda (the default) or cpu. MODEL: a model directory (default: the Mistral-7B shape,
#   served with --load-format dummy; any other is served from its checkpoint). PROMPT_TOKENS and
#   MAX_TOKENS: the request's (default 30000 and 2700). The window is read from MODEL's
#   config.json.
#   SCRAPE_SECONDS (environment): the scrape interval (default 0.2).
#   The CPU form runs in CI on the mistral-sliding fixture (window 16): see tests/CMakeLists.txt.
set -uo pipefail
run=$1 out=$2 backend=${3:-cuda}
root=$(cd "$(dirname "$0")/../.." && pwd)
model=${4:-$root/bench/configs/mistral-7b-sliding}
prompt_tokens=${5:-30000} max_tokens=${6:-2700}
chunk=2048  # --max-num-batched-tokens below: the most one step computes of the prompt
block=16
mkdir -p "$out"
if [[ $backend == cuda ]] && ! nvidia-smi -L >/dev/null 2>&1; then
  echo "sliding_window_blocks: skipped: no NVIDIA GPU on this machine (nvidia-smi -L failed)"
  exit 77
fi
load_format=()
[[ $model == "$root/bench/configs/"* ]] && load_format=(--load-format dummy)
window=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1] + "/config.json"))["sliding_window"])' "$model")

# shellcheck source=tests/testing/wait_ready.sh
source "$root/tests/testing/wait_ready.sh"
port=$((51000 + RANDOM % 1000)) metrics_port=$((52000 + RANDOM % 1000))
${run}lmserve serve --model "$model" "${load_format[@]}" --backend "$backend" --port "$port" \
  --metrics-port "$metrics_port" --max-num-seqs 4 --max-num-batched-tokens "$chunk" --threads 1 \
  >"$out/server.log" 2>&1 &
server=$!
stop_server() { kill -TERM "$server" 2>/dev/null; wait "$server" 2>/dev/null; }
wait_ready "$server" "$out/server.log" 900 "the $backend server" \
  ${run}lmserve-cli health --addr "127.0.0.1:$port" || { kill -KILL "$server"; exit 1; }

# Token ids 3..99 (at most 3 characters each, so that 30,000 of them fit one argument).
ids=$(python3 -c 'import sys; n = int(sys.argv[1]); print(",".join(str(3 + (i * 7919) % 97) for i in range(n)))' "$prompt_tokens")
: >"$out/metrics.txt"
(
  while true; do
    curl -s "http://127.0.0.1:$metrics_port/metrics" |
      grep -E '^lmserve_kv_cache_(used_blocks|group_used_blocks|blocks)\{' >>"$out/metrics.txt"
    sleep "${SCRAPE_SECONDS:-0.2}"
  done
) &
scraper=$!
start=$(date +%s.%N)
${run}lmserve-cli complete --addr "127.0.0.1:$port" --ids "$ids" --max-tokens "$max_tokens" \
  --temperature 0 --ignore-eos --json --no-stream --timeout-s 3600 >"$out/completion.json" \
  2>"$out/completion.err"
status=$?
sleep 0.5
kill "$scraper" 2>/dev/null
wait "$scraper" 2>/dev/null
echo "request: exit $status in $(awk "BEGIN { print $(date +%s.%N) - $start }") s"
stop_server

python3 - "$out" "$status" "$prompt_tokens" "$max_tokens" "$window" "$chunk" "$block" <<'PY'
import json, math, re, sys
out, status, prompt, max_tokens, window, chunk, block = sys.argv[1], *map(int, sys.argv[2:])
ok = True
generated = 0
try:
    text = open(f"{out}/completion.json").read()
    # The usage of the (last) response: completion tokens generated.
    found = re.findall(r'"completion_tokens"\s*:\s*"?(\d+)', text)
    generated = int(found[-1]) if found else 0
except OSError:
    pass
if status != 0 or generated != max_tokens:
    print(f"FAIL: the request exited {status} with {generated} of {max_tokens} tokens "
          f"(see {out}/completion.err, {out}/server.log)")
    ok = False
used = group = total = 0
for line in open(f"{out}/metrics.txt"):
    name, value = line.split("{")[0], float(line.rsplit(" ", 1)[1])
    if name == "lmserve_kv_cache_used_blocks":
        used = max(used, value)
    elif name == "lmserve_kv_cache_group_used_blocks" and f'window="{window}"' in line:
        group = max(group, value)
    elif name == "lmserve_kv_cache_blocks":
        total = max(total, value)
bound = math.ceil((window - 1 + min(chunk, prompt)) / block) + 1
whole = math.ceil((prompt + max_tokens) / block)
print(f"sequence of {prompt + max_tokens} tokens, window {window}: at most {used:.0f} KV blocks in "
      f"use ({group:.0f} in the window's group) of {total:.0f}; bound {bound}, "
      f"the whole context {whole}")
if used == 0 or group == 0:
    print("FAIL: no metrics sample shows the request's blocks")
    ok = False
if used > bound or group > bound:
    print(f"FAIL: more blocks in use than the window and a chunk need ({bound})")
    ok = False
sys.exit(0 if ok else 1)
PY
