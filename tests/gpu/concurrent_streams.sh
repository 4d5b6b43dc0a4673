#!/usr/bin/env bash
# The GPU serving check, run by hand on a GPU machine (CI has none): 64 concurrent greedy streams
# of one model through `lmserve serve --backend cuda`, then the same 64 requests through a server
# on the CPU runner. Each pair is compared token by token; where they part, the CPU server's own
# top-2 log-probability margin at that token is printed (its logprobs are asked for: they do not
# change greedy tokens). Exits 1 if a stream failed or parted at a margin of 0.1 or more (bf16
# against fp32 decides near-ties either way; a clear margin means a bug).
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

complete_all() {  # complete_all BACKEND PORT [ARGS...]: 64 concurrent streams, JSON lines out
  local backend=$1 port=$2 start=$(date +%s.%N) pids=()
  shift 2
  for i in "${!prompts[@]}"; do
    ${run}lmserve-cli complete --addr "127.0.0.1:$port" --max-tokens 32 --temperature 0 --json \
      "$@" "${prompts[$i]}" >"$out/$backend-$i.json" 2>"$out/$backend-$i.err" &
    pids+=($!)
  done
  wait "${pids[@]}"  # the clients only: the server runs in the background too
  echo "$backend: 64 streams done in $(awk "BEGIN { print $(date +%s.%N) - $start }") s"
}

serve cuda 50061
complete_all cuda 50061
kill -TERM "$(cat "$out/server-cuda.pid")"; wait "$(cat "$out/server-cuda.pid")" 2>/dev/null
serve cpu 50062
complete_all cpu 50062 --logprobs 2
kill -TERM "$(cat "$out/server-cpu.pid")"; wait "$(cat "$out/server-cpu.pid")" 2>/dev/null

python3 - "$out" "${prompts[@]}" <<'PY'
import json, sys
out, prompts = sys.argv[1], sys.argv[2:]
def read(path):  # token ids, each token's top-2 log-probabilities, text, and whether it finished
    ids, tops, text, finished = [], [], "", False
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            msg = json.loads(line)
            ids += msg.get("token_ids", [])
            text += msg.get("text", "")
            tops += [[t["logprob"] for t in lp.get("top", [])] for lp in msg.get("logprobs", [])]
            finished = finished or "finish_reason" in msg
    return ids, tops, text, finished
same = failed = clear = unknown = 0
worst = 0.0
for i, prompt in enumerate(prompts):
    g_ids, _, g_text, g_done = read(f"{out}/cuda-{i}.json")
    c_ids, c_tops, c_text, c_done = read(f"{out}/cpu-{i}.json")
    if not g_done or not c_done:
        failed += 1
        print(f"stream {i} failed (GPU finished: {g_done}, CPU: {c_done}); see {out}/*-{i}.err")
        continue
    if g_ids == c_ids:
        same += 1
        continue
    j = next((k for k in range(min(len(g_ids), len(c_ids))) if g_ids[k] != c_ids[k]),
             min(len(g_ids), len(c_ids)))  # or where the shorter one ended
    top = c_tops[j] if j < len(c_tops) else []
    if len(top) < 2:
        unknown += 1
        print(f'stream {i} parts at token {j} where one side ended, margin unknown: "{prompt}"')
    else:
        margin = top[0] - top[1]
        worst = max(worst, margin)
        clear += margin >= 0.1
        print(f'stream {i} parts at token {j}, CPU top-2 margin {margin:.4f}: "{prompt}"')
    print(f"  cuda: {g_text!r}")
    print(f"  cpu:  {c_text!r}")
parted = len(prompts) - same - failed
print(f"concurrent streams: {same} of {len(prompts)} identical to the CPU runner, {failed} failed, "
      f"{parted} parted: at CPU margins up to {worst:.4f} ({clear} at 0.1 or more), {unknown} where "
      f"one side ended")
sys.exit(1 if failed or clear else 0)
PY
