#!/usr/bin/env bash
# Session 5, run 1: the skinny GEMM's ring kernel for one-row steps (bulk-copy stages, one block
# an SM) against the register kernel (LMSERVE_SKINNY_RING=0), same binaries, interleaved.
set -uo pipefail
mkdir -p /tmp/n && tar -xJf .gpu/bundle.tar.xz -C /tmp/n; N=/tmp/n/bundle/run
export LMSERVE_FIXTURES_DIR=$PWD/.gpu/fixtures
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout 120 $N kernels_gpu_test --gtest_filter='SkinnyGemm*' > $OUT/kt-skinny.txt 2>&1; echo "skinny tests rc=$?"; grep -E "FAILED|PASSED|Failure|Expected|Which|seed" $OUT/kt-skinny.txt | head -20
MB="--model bench/configs/llama3-8b/config.json --dummy --batches 1 --context 1024 --prefill-seqs 0"
i=0
for v in 0 32,3,1 0 32,3,1 16,4,1 32,2,1 16,3,2 24,3,1; do
  i=$((i+1))
  LMSERVE_SKINNY_RING=$v timeout 60 $N lmserve-model-bench $MB > $OUT/mb-$i-$v.txt 2>&1; echo "mb $i $v rc=$?"
  grep -E "^1 " $OUT/mb-$i-$v.txt | sed "s/^/$v /"
done
for v in 0 32,3,1; do
  LMSERVE_SKINNY_RING=$v timeout 60 $N lmserve-model-bench $MB --timeline $OUT/tl-$v.json > $OUT/mbt-$v.txt 2>&1; echo "mbt $v rc=$?"
  grep -E "^1 " $OUT/mbt-$v.txt | sed "s/^/$v /"
done
timeout 150 $N kernels_gpu_test > $OUT/kernels_gpu_test.txt 2>&1; echo "kernels_gpu_test rc=$?"; tail -2 $OUT/kernels_gpu_test.txt
timeout 100 $N runner_gpu_test > $OUT/runner_gpu_test.txt 2>&1; echo "runner_gpu_test rc=$?"; grep -E "PASSED|FAILED|SKIPPED" $OUT/runner_gpu_test.txt | head -8
