#!/usr/bin/env bash
# Installs the official OpenAI Python SDK (tests/e2e/openai-requirements.txt, every version pinned)
# into a venv under ~/.cache/lmserve (LMSERVE_CACHE_DIR overrides), keyed by the requirements file,
# and prints the venv's python. Idempotent: a complete venv is reused and nothing is downloaded.
# scripts/test.sh runs it before ctest; tests/e2e/openai_http_test.py runs under that python.
set -euo pipefail
cd "$(dirname "$0")/.."
requirements=tests/e2e/openai-requirements.txt
cache_dir=${LMSERVE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lmserve}
venv="$cache_dir/openai-venv-$(sha256sum "$requirements" | cut -c1-12)"
if [[ ! -f $venv/.complete ]]; then
  echo "openai-venv: installing $requirements into $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    -r "$requirements" >&2
  "$venv/bin/python" -c "import openai" >&2
  touch "$venv/.complete"
fi
echo "$venv/bin/python"
