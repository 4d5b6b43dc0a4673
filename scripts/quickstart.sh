#!/usr/bin/env bash
# The README's first command: sets up (Debian packages), builds, fetches the demo model
# (SmolLM2-135M-Instruct, GGUF Q4_1), starts `lmserve serve` on it, waits until it is SERVING and
# streams a completion with lmserve-cli. On a terminal the server then keeps serving until Ctrl-C
# (a graceful drain); without one (CI, scripts) or with LMSERVE_QUICKSTART_EXIT=1 it drains and
# the script ends.
#
# Environment: LMSERVE_PORT and LMSERVE_METRICS_PORT on 127.0.0.1 (default: 50051 and 9400 on a
# terminal, any free port otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
model=$(scripts/fetch-demo-model.sh)
keep_serving=false
if [[ -t 0 && -t 1 && ${LMSERVE_QUICKSTART_EXIT:-0} != 1 ]]; then keep_serving=true; fi
if $keep_serving; then
  port=${LMSERVE_PORT:-50051}
  metrics_port=${LMSERVE_METRICS_PORT:-9400}
else
  port=${LMSERVE_PORT:-0}
  metrics_port=${LMSERVE_METRICS_PORT:-0}
fi
log=$(mktemp -t lmserve-quickstart.XXXXXX.log)

serve=(build/bin/lmserve serve --model "$model" --served-model-name SmolLM2-135M-Instruct
       --host 127.0.0.1 --port "$port" --metrics-port "$metrics_port")
echo "quickstart: starting ${serve[*]} (log: $log)"
"${serve[@]}" 2>"$log" &
server_pid=$!
stop_server() {
  if kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
}
trap stop_server EXIT

# The ports it bound are in its log.
for _ in $(seq 600); do
  grep -q "listening on" "$log" && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 0.1
done
port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -1)
[[ -n $port ]] || { echo "quickstart: the server did not start; its log:" >&2; cat "$log" >&2; exit 1; }

cli=(build/bin/lmserve-cli)
export LMSERVE_ADDR="127.0.0.1:$port"
deadline=$((SECONDS + 600))
until "${cli[@]}" health >/dev/null 2>&1; do  # each check has its own 5 s deadline
  if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "quickstart: the server exited before it was SERVING; its log:" >&2
    cat "$log" >&2
    exit 1
  fi
  if ((SECONDS >= deadline)); then
    echo "quickstart: the server did not become SERVING within 600 s; its log:" >&2
    cat "$log" >&2
    exit 1
  fi
  sleep 0.5
done
metrics_port=$(sed -n 's|.*metrics on http://127\.0\.0\.1:\([0-9]*\)/metrics.*|\1|p' "$log" | head -1)
echo "quickstart: SERVING on $LMSERVE_ADDR (metrics: http://127.0.0.1:$metrics_port/metrics)"

prompt="The capital of France is"
echo "quickstart: lmserve-cli complete \"$prompt\" --max-tokens 32 --temperature 0"
"${cli[@]}" complete "$prompt" --max-tokens 32 --temperature 0

if $keep_serving; then
  echo "quickstart: serving on $LMSERVE_ADDR until Ctrl-C. In another terminal:"
  echo "  build/bin/lmserve-cli complete --addr $LMSERVE_ADDR \"$prompt\""
  echo "  build/bin/lmserve-cli chat --addr $LMSERVE_ADDR"
  trap 'stop_server; exit 0' INT TERM
  wait "$server_pid"
  exit 0
fi
stop_server
trap - EXIT
echo "quickstart: the server drained and stopped. To run it yourself:"
echo "  build/bin/lmserve serve --model $model --port 50051 --metrics-port 9400"
echo "  build/bin/lmserve-cli complete \"$prompt\"     # in another terminal"
echo "  build/bin/lmserve-cli chat                     # an interactive chat"
