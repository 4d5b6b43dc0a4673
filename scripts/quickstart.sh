#!/usr/bin/env bash
# The README's first command: sets up (Debian packages), builds, fetches the demo model
# (SmolLM2-135M-Instruct, GGUF Q4_1), starts `lmserve serve` on it in the background, waits until it
# is SERVING, streams a completion with lmserve-cli, then stops the server with SIGTERM (a graceful
# drain) and prints how to run it yourself. Non-interactive: it ends on its own (CI can run it).
#
# Environment: LMSERVE_PORT and LMSERVE_METRICS_PORT on 127.0.0.1 (default 0: any free port).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
model=$(scripts/fetch-demo-model.sh)
port=${LMSERVE_PORT:-0}
metrics_port=${LMSERVE_METRICS_PORT:-0}
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
if ! "${cli[@]}" health --wait 600 >/dev/null; then
  echo "quickstart: the server did not become SERVING; its log:" >&2
  cat "$log" >&2
  exit 1
fi
metrics_port=$(sed -n 's|.*metrics on http://127\.0\.0\.1:\([0-9]*\)/metrics.*|\1|p' "$log" | head -1)
echo "quickstart: SERVING on $LMSERVE_ADDR (metrics: http://127.0.0.1:$metrics_port/metrics)"

prompt="The capital of France is"
if "${cli[@]}" info | grep -q '"has_tokenizer":true'; then
  echo "quickstart: lmserve-cli complete \"$prompt\" --max-tokens 32 --temperature 0"
  "${cli[@]}" complete "$prompt" --max-tokens 32 --temperature 0
else
  # Until the tokenizer reads GGUF files, the server takes token ids: these are the prompt's ids
  # in SmolLM2's vocabulary (tokenizer.ggml.tokens of the GGUF file).
  echo "quickstart: this build serves token ids only (no tokenizer for the model yet);" \
       "streaming a completion of \"$prompt\" as ids:"
  "${cli[@]}" complete --ids 504,3575,282,4649,314 --max-tokens 32 --temperature 0
fi

stop_server
trap - EXIT
echo "quickstart: the server drained and stopped. To run it yourself:"
echo "  build/bin/lmserve serve --model $model --port 50051 --metrics-port 9400"
echo "  build/bin/lmserve-cli complete \"$prompt\"     # in another terminal"
echo "  build/bin/lmserve-cli chat                     # an interactive chat"
