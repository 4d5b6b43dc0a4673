#!/usr/bin/env bash
# Usage: server_flags_test.sh BINARY    (ctest: deploy_server_flags, label deploy)
# The deployment starts the server with flags of its own: the Deployment's args (base and overlays)
# and the Dockerfile's default commands. Each must be an option of `lmserve serve` (an unknown option
# stops the server, so a renamed flag would crash every pod), and the HEALTHCHECK needs the
# `lmserve-cli health --addr` (bin/lmserve-cli beside BINARY). Skips (77) while the binary has no
# `serve` command.
set -euo pipefail
binary=${1:?usage: server_flags_test.sh BINARY}
repo=$(cd "$(dirname "$0")/../.." && pwd)

if ! serve_help=$("$binary" serve --help 2>&1); then
  echo "server_flags_test: SKIP: this lmserve has no serve command yet"
  exit 77
fi
mapfile -t options < <(grep -oE '^  --[a-z0-9-]+' <<<"$serve_help" | sed 's/^  --//')

# The flags the deployment passes: list items of the Deployment's args, JSON-patch values of the
# overlays, and the Dockerfile's CMD arrays.
mapfile -t used < <(
  {
    grep -hoE '^ *- --[a-z0-9-]+' "$repo"/deploy/kubernetes/base/deployment.yaml
    grep -rhoE 'value: --[a-z0-9-]+' "$repo"/deploy/kubernetes/overlays
    grep -E '^CMD ' "$repo/Dockerfile" | grep -oE '"--[a-z0-9-]+'
  } | grep -oE -- '--[a-z0-9-]+$' | sed 's/^--//' | sort -u)

failed=0
for flag in "${used[@]}"; do
  if printf '%s\n' "${options[@]}" | grep -qx -- "$flag"; then
    echo "server_flags_test: --$flag: an option of lmserve serve"
  else
    echo "server_flags_test: FAIL: the deployment passes --$flag, which lmserve serve does not know"
    failed=1
  fi
done
[[ ${#used[@]} -gt 3 ]] || { echo "server_flags_test: FAIL: found only ${#used[@]} flags"; failed=1; }
[[ $failed -eq 0 ]] || exit 1

cli=$(dirname "$binary")/lmserve-cli
if [[ ! -x $cli ]] || ! health_help=$("$cli" health --help 2>&1) || ! grep -q -- '--addr' <<<"$health_help"; then
  echo "server_flags_test: FAIL: no 'lmserve-cli health --addr' beside $binary:"
  echo "  the Dockerfile's HEALTHCHECK runs 'lmserve-cli health --addr 127.0.0.1:50051'"
  exit 1
fi
echo "server_flags_test: PASS: ${#used[@]} flags are options of lmserve serve; lmserve-cli health --addr exists"
