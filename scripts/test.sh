#!/usr/bin/env bash
# The README's second command: sets up (Debian packages, the demo model), builds, and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/ci-deploy-checks.sh  # Dockerfile lint, manifest schemas, promtool rules and tests
LMSERVE_DEMO_MODEL=$(scripts/fetch-demo-model.sh)
export LMSERVE_DEMO_MODEL
# The official openai Python package (pinned, in a venv): the HTTP API's end-to-end client.
LMSERVE_OPENAI_PYTHON=$(scripts/openai-venv.sh)
export LMSERVE_OPENAI_PYTHON
scripts/build.sh "$@"
scripts/fuzz.sh  # the libFuzzer targets, each for a bounded time (LMSERVE_FUZZ_SECONDS)
# Last, so that its summary closes the output.
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" --timeout 900
