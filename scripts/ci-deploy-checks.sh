#!/usr/bin/env bash
# The deployment checks (docs/deploying.md, "Checks"): the Dockerfile lint, the Kubernetes manifests
# against the Kubernetes schemas, the Prometheus rules and their unit tests, the dashboard's queries,
# and the cross-checks of tests/deploy/check_deploy.py. Needs no build, no cluster, no Docker engine.
# scripts/test.sh runs it (so CI does). Needs promtool (Debian's prometheus package, which
# scripts/setup.sh installs); the Python tools are pinned in deploy/ci-requirements.txt and installed
# into a venv under ~/.cache/lmserve (LMSERVE_CACHE_DIR overrides) on first use.
set -euo pipefail
cd "$(dirname "$0")/.."

out=${BUILD_DIR:-build}/deploy-checks
rm -rf "$out"
mkdir -p "$out"

# ---- tools --------------------------------------------------------------------------------------
command -v promtool >/dev/null || { echo "ci-deploy-checks: no promtool: run scripts/setup.sh" >&2; exit 1; }
cache_dir=${LMSERVE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lmserve}
venv="$cache_dir/deploy-venv-$(sha256sum deploy/ci-requirements.txt | cut -c1-12)"
if [[ ! -f $venv/.complete ]]; then
  echo "ci-deploy-checks: installing deploy/ci-requirements.txt into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    -r deploy/ci-requirements.txt
  touch "$venv/.complete"
fi
py="$venv/bin/python"

passed=0
failed=0
check() {  # check NAME COMMAND...: runs one check, its output in $out/NAME.log
  local name=$1
  shift
  if "$@" >"$out/$name.log" 2>&1; then
    passed=$((passed + 1))
    echo "ci-deploy-checks: PASS $name"
  else
    failed=$((failed + 1))
    echo "ci-deploy-checks: FAIL $name ($*):"
    sed 's/^/    /' "$out/$name.log"
  fi
}

# ---- Dockerfile ---------------------------------------------------------------------------------
check hadolint "$venv/bin/hadolint" --no-color Dockerfile

# ---- generated files are current ----------------------------------------------------------------
check prometheusrule-current "$py" deploy/gen_prometheusrule.py --check
check queries-current "$py" deploy/extract_queries.py --check

# ---- Kubernetes ---------------------------------------------------------------------------------
for overlay in gpu cpu; do
  check "render-$overlay" "$py" deploy/kubernetes/render.py "deploy/kubernetes/overlays/$overlay" \
    --out "$out/$overlay.yaml" --compare-kubectl
done
# Every core object against the schemas of the oldest Kubernetes with gRPC probes (1.27) and the
# newest that kubernetes-validate ships. --strict rejects unknown fields. It has no CRD schemas:
# ServiceMonitor and PrometheusRule get a warning there and check_deploy.py's checks here.
manifests=()
for f in deploy/kubernetes/base/*.yaml; do
  [[ $(basename "$f") == kustomization.yaml ]] || manifests+=("$f")
done
manifests+=("$out/gpu.yaml" "$out/cpu.yaml")
for version in 1.27.0 1.37.0; do
  check "kubernetes-validate-$version" "$venv/bin/kubernetes-validate" --strict --quiet \
    -k "$version" "${manifests[@]}"
done
check check-deploy "$py" tests/deploy/check_deploy.py "$out/gpu.yaml" "$out/cpu.yaml" --self-test

# ---- Prometheus ---------------------------------------------------------------------------------
check promtool-check-rules promtool check rules deploy/prometheus/lmserve-rules.yaml
check promtool-check-config promtool check config deploy/prometheus/prometheus.yml
# Every query of the dashboard, the alerts' values and the adapter's query parse: promtool checks
# them as the expressions of recording rules in a scratch file.
"$py" - deploy/promql-queries.txt "$out/queries-as-rules.yaml" <<'EOF'
import json, sys
queries = open(sys.argv[1], encoding="utf-8").read().splitlines()
with open(sys.argv[2], "w", encoding="utf-8") as f:
    f.write("groups:\n  - name: deploy-queries\n    rules:\n")
    for i, query in enumerate(queries, 1):
        f.write(f"      - record: lmserve_ci:query_{i}\n        expr: {json.dumps(query)}\n")
EOF
check promtool-parse-queries promtool check rules "$out/queries-as-rules.yaml"
check promtool-test-rules promtool test rules tests/deploy/prometheus/rules_test.yaml

# A real Prometheus (Debian's), with the rules loaded, scraping tests/deploy/fake_exporter.py (every
# metric of docs/deploying.md's table, moving): every line of deploy/promql-queries.txt must return
# data that is not NaN. Loopback only; both processes are stopped here.
queries_in_prometheus() {
  local dir=$out/prometheus exporter_pid prometheus_pid="" port rc
  mkdir -p "$dir"
  python3 tests/deploy/fake_exporter.py "$dir/exporter.port" &
  exporter_pid=$!
  for _ in $(seq 100); do [[ -s $dir/exporter.port ]] && break; sleep 0.1; done
  cat >"$dir/prometheus.yml" <<EOF
global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: ["$PWD/deploy/prometheus/lmserve-rules.yaml"]
scrape_configs:
  - job_name: lmserve
    static_configs: [{targets: ["127.0.0.1:$(cat "$dir/exporter.port")"]}]
EOF
  for _ in 1 2 3 4 5; do  # a free port for Prometheus' web listener
    port=$((20000 + RANDOM % 20000))
    prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/data" \
      --web.listen-address="127.0.0.1:$port" >"$dir/prometheus.log" 2>&1 &
    prometheus_pid=$!
    sleep 1
    kill -0 "$prometheus_pid" 2>/dev/null && break
    prometheus_pid=""
  done
  if [[ -z $prometheus_pid ]]; then
    cat "$dir/prometheus.log"
    rc=1
  else
    rc=0
    python3 tests/deploy/query_prometheus.py --url "http://127.0.0.1:$port" --timeout 60 \
      --strict-nan || rc=$?
    kill "$prometheus_pid"
  fi
  kill "$exporter_pid"
  wait
  return "$rc"
}
check prometheus-queries queries_in_prometheus

echo "ci-deploy-checks: $passed passed, $failed failed (logs in $out)"
[[ $failed -eq 0 ]]
