#!/usr/bin/env bash
# Runs a Python test under the python of the openai venv (scripts/openai-venv.sh): $LMSERVE_OPENAI_PYTHON
# when set, else the venv, created on first use. Exits 77 (skip) when it cannot be had (no network).
set -uo pipefail
python=${LMSERVE_OPENAI_PYTHON:-}
if [[ -z $python ]]; then
  if ! python=$("$(dirname "$0")/../../scripts/openai-venv.sh"); then
    echo "SKIP: the openai venv could not be installed (scripts/openai-venv.sh)"
    exit 77
  fi
fi
exec "$python" "$@"
