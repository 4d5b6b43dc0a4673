#!/usr/bin/env bash
# The README's first command: sets up (Debian packages), builds, fetches the demo model
# (SmolLM2-135M-Instruct, GGUF Q4_1) and runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
model=$(scripts/fetch-demo-model.sh)
echo "quickstart: greedy continuation of \"The capital of France is\" by $model"
exec build/bin/lmserve generate --model "$model" --prompt "The capital of France is" --max-tokens 32
