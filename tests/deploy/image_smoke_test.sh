#!/usr/bin/env bash
# Usage: image_smoke_test.sh BINARY    (ctest: deploy_image_smoke, label deploy)
# A stand-in for `docker run --read-only --tmpfs /tmp -v models:/models:ro lmserve:cpu`, where no
# Docker engine is: tests/deploy/make_image_root.sh builds the image's filesystem (the binaries, their
# collected libraries, glibc), the demo model goes to /models/model.gguf, and then, under chroot as the
# image's user (uid 10001, for whom only /tmp is writable):
#   - the Dockerfile's default command (the cpu variant's CMD, on free ports) serves;
#   - the Dockerfile's HEALTHCHECK command reports SERVING;
#   - a few completions run through lmserve-cli;
#   - /metrics exports exactly the metrics of docs/deploying.md's table (the dashboard, the rules and
#     the HPA are written against that table);
#   - SIGTERM drains and the server exits 0 within its grace period.
# Skips (77) without bin/lmserve's serve command, bin/lmserve-cli or $LMSERVE_DEMO_MODEL.
set -euo pipefail
binary=$(realpath "${1:?usage: image_smoke_test.sh BINARY}")
cli=$(dirname "$binary")/lmserve-cli
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
say() { echo "image_smoke_test: $*"; }
# shellcheck source=tests/testing/wait_ready.sh
source "$repo/tests/testing/wait_ready.sh"

if ! "$binary" serve --help >/dev/null 2>&1 || [[ ! -x $cli ]]; then
  say "SKIP: no lmserve serve or lmserve-cli yet"
  exit 77
fi
if [[ -z ${LMSERVE_DEMO_MODEL:-} || ! -s ${LMSERVE_DEMO_MODEL:-} ]]; then
  say "SKIP: LMSERVE_DEMO_MODEL is not set (scripts/test.sh sets it)"
  exit 77
fi
if [[ $(id -u) -ne 0 ]]; then
  say "SKIP: needs root (chroot, and a user to switch to)"
  exit 77
fi

root=$(mktemp -d)
server_pid=""
cleanup() {
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -KILL "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$root" "$root.log"
}
trap cleanup EXIT
"$here/make_image_root.sh" "$root" "$binary" "$cli" >/dev/null
chmod 755 "$root"
cp "$LMSERVE_DEMO_MODEL" "$root/models/model.gguf"   # a copy: the cached file's mode stays as it is
chmod 644 "$root/models/model.gguf"

# The image's user and environment (the Dockerfile's USER and ENV), nothing of this shell's.
# env and chroot exec what they run, so a background job's $! is the server's own pid.
chroot_bin=$(command -v chroot)
image_env=(env -i HOME=/tmp CUDA_CACHE_PATH=/tmp/cuda-cache PATH=/usr/local/bin:/usr/bin:/bin
           "$chroot_bin" --userspec=10001:10001 "$root")
in_image() { "${image_env[@]}" "$@"; }
# The Dockerfile's commands: the cpu variant's CMD, the HEALTHCHECK's CMD (JSON arrays).
mapfile -t default_cmd < <(python3 - "$repo/Dockerfile" <<'EOF'
import json, re, sys
text = re.sub(r"\\\n", " ", open(sys.argv[1]).read())
cmds = [json.loads(m) for m in re.findall(r"^CMD (\[.*\])$", text, re.M)]
cmd = [c for c in cmds if "--backend=cpu" in c][0]
print("\n".join(["/usr/local/bin/lmserve"] + cmd))
EOF
)
mapfile -t health_cmd < <(python3 - "$repo/Dockerfile" <<'EOF'
import json, re, sys
text = re.sub(r"\\\n", " ", open(sys.argv[1]).read())
print("\n".join(json.loads(re.search(r"^HEALTHCHECK .*?CMD (\[.*\])$", text, re.M).group(1))))
EOF
)
say "CMD: ${default_cmd[*]}"
say "HEALTHCHECK: ${health_cmd[*]}"

# Serve on free ports: the CMD with its three port values replaced.
for _ in 1 2 3 4 5; do
  port=$((20000 + RANDOM % 20000))
  metrics_port=$((port + 1))
  http_port=$((port + 2))
  command=("${default_cmd[@]/#--port=*/--port=$port}")
  command=("${command[@]/#--metrics-port=*/--metrics-port=$metrics_port}")
  command=("${command[@]/#--http-port=*/--http-port=$http_port}")
  "${image_env[@]}" "${command[@]}" >"$root.log" 2>&1 &
  server_pid=$!
  sleep 1
  kill -0 "$server_pid" 2>/dev/null && break
  wait "$server_pid" || true
  server_pid=""
done
if [[ -z $server_pid ]]; then
  cat "$root.log"
  say "FAIL: the default command did not start"
  exit 1
fi

# The HEALTHCHECK command, polled while the server lives (up to 120 s).
health=("${health_cmd[@]/127.0.0.1:50051/127.0.0.1:$port}")
if ! wait_ready "$server_pid" "$root.log" 120 image_smoke_test in_image "${health[@]}"; then
  say "FAIL: the HEALTHCHECK command did not report SERVING"
  exit 1
fi
say "the HEALTHCHECK command reports SERVING"

for i in 1 2 3; do
  if ! in_image /usr/local/bin/lmserve-cli complete --addr "127.0.0.1:$port" --ids 1,2,3,$i \
      --max-tokens 4 --timeout-s 60 >/dev/null; then
    cat "$root.log"
    say "FAIL: a completion failed"
    exit 1
  fi
done
say "3 completions served"
# And one through the OpenAI-compatible HTTP API of the same CMD.
if ! python3 - "$http_port" <<'EOF'
import json, sys, urllib.request
body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 4}).encode()
request = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
answer = json.loads(urllib.request.urlopen(request, timeout=60).read())
sys.exit(0 if answer["usage"]["completion_tokens"] == 4 else 1)
EOF
then
  cat "$root.log"
  say "FAIL: a completion over HTTP failed"
  exit 1
fi
say "a completion served over HTTP"

if ! python3 - "$metrics_port" "$repo/docs/deploying.md" <<'EOF'
import re, sys, urllib.request
exported = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
families = set(re.findall(r"^# TYPE (lmserve_[a-z0-9_]+) ", exported, re.M))
documented = set(re.findall(r"^\| `(lmserve_[a-z0-9_]+)` \|", open(sys.argv[2]).read(), re.M))
ok = True
for name in sorted(documented - families):
    print(f"image_smoke_test: docs/deploying.md describes {name}, which /metrics does not export")
    ok = False
for name in sorted(families - documented):
    print(f"image_smoke_test: /metrics exports {name}, which docs/deploying.md does not describe")
    ok = False
if not re.search(r'^lmserve_grpc_server_handled_total\{.*grpc_code="OK"', exported, re.M):
    print("image_smoke_test: no OK calls counted in lmserve_grpc_server_handled_total")
    ok = False
print(f"image_smoke_test: /metrics exports {len(families)} lmserve_ metrics")
sys.exit(0 if ok else 1)
EOF
then
  say "FAIL: /metrics and docs/deploying.md disagree"
  exit 1
fi

kill -TERM "$server_pid"
for _ in $(seq 300); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$server_pid" 2>/dev/null; then
  say "FAIL: still running 30 s after SIGTERM"
  exit 1
fi
status=0
wait "$server_pid" || status=$?
server_pid=""
if [[ $status -ne 0 ]]; then
  tail -20 "$root.log"
  say "FAIL: exited $status after SIGTERM, not 0"
  exit 1
fi
say "PASS: served as uid 10001 with only /tmp writable, healthy, documented metrics, drained on SIGTERM"
