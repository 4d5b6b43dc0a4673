#!/usr/bin/env bash
# The GPU serving check, run by hand on a GPU machine (CI has none): 64 concurrent greedy streams
# of one model through `lmserve serve --backend cuda`; the same 64 prompts one at a time on that
# server, with the top-2 log-probabilities of each token; then the 64 concurrent streams through a
# server on the CPU runner, with log-probabilities too (they do not change greedy tokens).
#
# It reports, stream by stream, where the GPU's concurrent output parts from the CPU's and from
# the GPU's own one-at-a-time output, with each side's top-2 margin at that token: two engines
# that round differently decide a near-tie differently, and the sum of the two margins is how far
# apart their logit differences are there. Exits 1 if a stream failed or if the two engines'
# logit differences at a parting are 1.0 or more apart (a gross error, not rounding).
#
# With DTYPE float32 the GPU server runs the CUDA runner in fp32 (`--dtype float32`), the CPU
# runner's numerical twin up to the order of its sums: the report's first number, how many of the
# 64 outputs are identical to the CPU's, is then the one that matters, and a parting is expected
# only at a near-tie: the script also exits 1 if the CPU's margin at a parting is 1e-3 or more
# (fp32 logits of this size differ by about 1e-4 between summation orders).
#
# Usage: tests/gpu/concurrent_streams.sh RUN MODEL OUTDIR [DTYPE]
#   RUN: the command prefix that runs a built binary by name: "build/bin/" (then build/bin/lmserve)
#        or ".gpu/bundle/run " (a bundle made by the workspace's bundle-binaries tool; note the
#        space).
#   MODEL: the model path (the demo GGUF). OUTDIR: where outputs and server logs go.
#   DTYPE: the CUDA server's --dtype: auto (the default: bfloat16), bfloat16 or float32. The CPU
#          server always runs in float32.
set -uo pipefail
run=$1 model=$2 out=$3 dtype=${4:-auto}
case "$dtype" in
  auto|bfloat16|float32) ;;
  *) echo "DTYPE must be auto, bfloat16 or float32, not '$dtype'"; exit 2 ;;
esac
mkdir -p "$out"
subjects=(France Japan Brazil Canada Egypt India Italy Kenya Mexico Norway Peru Spain Sweden Chile
          Greece Turkey)
templates=("The capital of %s is" "A short history of %s:" "The most famous food of %s is"
           "Three facts about %s: 1.")
prompts=()
for s in "${subjects[@]}"; do
  for t in "${templates[@]}"; do prompts+=("$(printf "$t" "$s")"); done
done

# shellcheck source=tests/testing/wait_ready.sh
source "$(cd "$(dirname "$0")/.." && pwd)/testing/wait_ready.sh"

serve() {  # serve BACKEND PORT [ARGS...]: fails at once, with the log, if the server exits
  local backend=$1 port=$2
  shift 2
  ${run}lmserve serve --model "$model" --backend "$backend" --port "$port" --max-num-seqs 64 \
    --max-num-batched-tokens 2048 "$@" >"$out/server-$backend.log" 2>&1 &
  local pid=$!
  echo "$pid" >"$out/server-$backend.pid"
  wait_ready "$pid" "$out/server-$backend.log" 300 "the $backend server" \
    ${run}lmserve-cli health --addr "127.0.0.1:$port" || { kill -KILL "$pid" 2>/dev/null; exit 1; }
}

complete_all() {  # complete_all BACKEND PORT [ARGS...]: 64 concurrent streams, JSON lines out
  local backend=$1 port=$2 start=$(date +%s.%N) pids=()
  shift 2
  for i in "${!prompts[@]}"; do
    ${run}lmserve-cli complete --addr "127.0.0.1:$port" --max-tokens 32 --temperature 0 --json \
      --timeout-s 900 "$@" "${prompts[$i]}" >"$out/$backend-$i.json" 2>"$out/$backend-$i.err" &
    pids+=($!)
  done
  wait "${pids[@]}"  # the clients only: the server runs in the background too
  echo "$backend: 64 streams done in $(awk "BEGIN { print $(date +%s.%N) - $start }") s"
}

serve cuda 50061 --dtype "$dtype"
echo "cuda server: $(grep -o 'runner: cuda in [a-z0-9]*' "$out/server-cuda.log" | head -1)"
complete_all cuda 50061
for i in "${!prompts[@]}"; do  # one at a time, with margins
  ${run}lmserve-cli complete --addr "127.0.0.1:50061" --max-tokens 32 --temperature 0 --json \
    --timeout-s 300 --logprobs 2 "${prompts[$i]}" >"$out/cuda1-$i.json" 2>"$out/cuda1-$i.err"
done
kill -TERM "$(cat "$out/server-cuda.pid")"; wait "$(cat "$out/server-cuda.pid")" 2>/dev/null
serve cpu 50062
complete_all cpu 50062 --logprobs 2
kill -TERM "$(cat "$out/server-cpu.pid")"; wait "$(cat "$out/server-cpu.pid")" 2>/dev/null

python3 - "$out" "$dtype" "${prompts[@]}" <<'PY'
import json, sys
out, dtype, prompts = sys.argv[1], sys.argv[2], sys.argv[3:]
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
def parting(a, b):  # the first index where two token lists differ (or the shorter one ends)
    n = min(len(a), len(b))
    return next((k for k in range(n) if a[k] != b[k]), n)
def margin(tops, j):
    return tops[j][0] - tops[j][1] if j < len(tops) and len(tops[j]) >= 2 else None
def show(m):  # float32 margins at a parting can be far below 1e-4
    return "?" if m is None else f"{m:.4f}" if m >= 1e-3 else f"{m:.2e}"
same = failed = gross = variant = clear = 0
apart = []
for i, prompt in enumerate(prompts):
    g_ids, _, g_text, g_done = read(f"{out}/cuda-{i}.json")
    s_ids, s_tops, _, s_done = read(f"{out}/cuda1-{i}.json")
    c_ids, c_tops, c_text, c_done = read(f"{out}/cpu-{i}.json")
    if not (g_done and s_done and c_done):
        failed += 1
        print(f"stream {i} failed (finished: GPU {g_done}, GPU alone {s_done}, CPU {c_done}); "
              f"see {out}/*-{i}.err")
        continue
    if g_ids != s_ids:
        variant += 1
        j = parting(g_ids, s_ids)
        print(f"stream {i}: the GPU alone parts from the GPU under load at token {j}, "
              f"its margin {show(margin(s_tops, j))}")
    if g_ids == c_ids:
        same += 1
        continue
    j = parting(g_ids, c_ids)
    m_cpu = margin(c_tops, j)
    # The GPU's margin at j, where its one-at-a-time run took the same tokens up to j.
    m_gpu = margin(s_tops, j) if s_ids[:j + 1] == g_ids[:j + 1] else None
    if m_cpu is not None and m_gpu is not None:
        apart.append(m_cpu + m_gpu)
        gross += m_cpu + m_gpu >= 1.0
    clear += dtype == "float32" and m_cpu is not None and m_cpu >= 1e-3
    print(f'stream {i} parts from the CPU at token {j}: CPU margin {show(m_cpu)}, GPU margin '
          f'{show(m_gpu)}: "{prompt}"')
    print(f"  cuda: {g_text!r}")
    print(f"  cpu:  {c_text!r}")
parted = len(prompts) - same - failed
label = "concurrent streams" if dtype == "auto" else f"concurrent streams (cuda --dtype {dtype})"
print(f"{label}: {same} of {len(prompts)} identical to the CPU runner, {failed} failed, "
      f"{parted} parted; the engines' logit differences at the parting tokens "
      f"{min(apart, default=0):.4f}-{max(apart, default=0):.4f} apart ({gross} at 1.0 or more); "
      f"{variant} outputs differ between the GPU under load and alone")
if dtype == "float32":
    print(f"float32: {clear} partings at a CPU margin of 1e-3 or more (only near-ties are "
          "expected)")
sys.exit(1 if failed or gross or clear else 0)
PY
