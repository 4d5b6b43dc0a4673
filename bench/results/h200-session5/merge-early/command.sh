#!/usr/bin/env bash
# Session 5, run 8: the decode attention merge letting the O projection launch before it waits
# (LMSERVE_MERGE_EARLY set), against it unset, same binary, interleaved.
set -uo pipefail
mkdir -p /tmp/n /tmp/r && tar -xJf .gpu/bundle.tar.xz -C /tmp/n; N=/tmp/n/bundle/run
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee /tmp/r/device.txt
MB="--model bench/configs/llama3-8b/config.json --dummy --batches 1,8,64 --context 1024 --prefill-seqs 0"
i=0
for v in off on off on off on; do
  i=$((i+1))
  echo "== merge early: $v" > /tmp/r/mb-$i.txt
  if [[ $v == on ]]; then export LMSERVE_MERGE_EARLY=1; else unset LMSERVE_MERGE_EARLY; fi
  timeout 60 $N lmserve-model-bench $MB --timeline /tmp/r/tl-$i.json >> /tmp/r/mb-$i.txt 2>&1; echo "mb $i $v rc=$?"
  grep -E "^(1|8|64) " /tmp/r/mb-$i.txt | sed "s/^/$v /"
done
tar -czf $OUT/results.tgz -C /tmp/r .
