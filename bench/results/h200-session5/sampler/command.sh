#!/usr/bin/env bash
# Session 5, run 5: greedy rows of small launches split over several blocks (the sampler's
# workspace); tests, and the model benchmark with timelines (SampleKernel's share).
set -uo pipefail
mkdir -p /tmp/n /tmp/r && tar -xJf .gpu/bundle.tar.xz -C /tmp/n; N=/tmp/n/bundle/run
export LMSERVE_FIXTURES_DIR=$PWD/.gpu/fixtures
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout 120 $N kernels_gpu_test --gtest_filter='Sampling*:Argmax*' > /tmp/r/kt-sampling.txt 2>&1; echo "sampling tests rc=$?"; grep -E "FAILED|PASSED|Failure|Expected|Which|seed|OK" /tmp/r/kt-sampling.txt | head -20
MB="--model bench/configs/llama3-8b/config.json --dummy --batches 1,8,64 --context 1024 --prefill-seqs 0"
for i in 1 2; do
  timeout 90 $N lmserve-model-bench $MB --timeline /tmp/r/tl-$i.json > /tmp/r/mb-$i.txt 2>&1; echo "mb $i rc=$?"
  grep -E "^(1|8|64) |SampleKernel" /tmp/r/mb-$i.txt
done
timeout 200 $N kernels_gpu_test > /tmp/r/kernels_gpu_test.txt 2>&1; echo "kernels_gpu_test rc=$?"; tail -2 /tmp/r/kernels_gpu_test.txt
timeout 120 $N runner_gpu_test > /tmp/r/runner_gpu_test.txt 2>&1; echo "runner_gpu_test rc=$?"; grep -E "PASSED|FAILED|SKIPPED" /tmp/r/runner_gpu_test.txt | head -6
tar -czf $OUT/results.tgz -C /tmp/r .
