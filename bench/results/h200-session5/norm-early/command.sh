#!/usr/bin/env bash
# Session 5, run 6: fused add + RMSNorm kernels letting the next kernel (a GEMM) launch before
# they wait (LMSERVE_NORM_EARLY=in,post,final subsets), same binaries, interleaved.
set -uo pipefail
mkdir -p /tmp/n /tmp/r && tar -xJf .gpu/bundle.tar.xz -C /tmp/n; N=/tmp/n/bundle/run
export LMSERVE_FIXTURES_DIR=$PWD/.gpu/fixtures
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/device.txt
MB="--model bench/configs/llama3-8b/config.json --dummy --batches 1,8,64 --context 1024 --prefill-seqs 0"
i=0
for v in none in post in,post in,post,final none in post in,post in,post,final none in,post; do
  i=$((i+1))
  echo "== norm early: $v" > /tmp/r/mb-$i.txt
  LMSERVE_NORM_EARLY=$v timeout 60 $N lmserve-model-bench $MB --timeline /tmp/r/tl-$i.json >> /tmp/r/mb-$i.txt 2>&1; echo "mb $i $v rc=$?"
  grep -E "^(1|8|64) " /tmp/r/mb-$i.txt | sed "s/^/$v /"
done
LMSERVE_NORM_EARLY=in,post timeout 150 $N runner_gpu_test > /tmp/r/runner_gpu_test.txt 2>&1; echo "runner_gpu_test (in,post) rc=$?"; grep -E "PASSED|FAILED" /tmp/r/runner_gpu_test.txt | head -4
tar -czf $OUT/results.tgz -C /tmp/r .
