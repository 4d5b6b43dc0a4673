#!/usr/bin/env bash
# The README's second command: sets up (Debian packages, the demo model), builds, and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/ci-deploy-checks.sh  # Dockerfile lint, manifest schemas, promtool rules and tests
LMSERVE_DEMO_MODEL=$(scripts/fetch-demo-model.sh)
export LMSERVE_DEMO_MODEL
scripts/build.sh "$@"
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" --timeout 900
if [[ -x scripts/fuzz.sh ]]; then
  scripts/fuzz.sh
fi
