#!/usr/bin/env bash
# Session 5, run 7: HEAD (the sampler's split argmax): sanitizers on the new test, every GPU test,
# the model benchmark twice.
set -uo pipefail
mkdir -p /tmp/n /tmp/r && tar -xJf .gpu/bundle.tar.xz -C /tmp/n; N=/tmp/n/bundle/run
export LMSERVE_FIXTURES_DIR=$PWD/.gpu/fixtures
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee /tmp/r/device.txt
echo "commit $(cat .gpu/commit)" | tee -a /tmp/r/device.txt
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do
  timeout 150 $CS --tool $tool --target-processes all $N kernels_gpu_test --gtest_filter='SamplingGpuTest.Split*:ArgmaxGpuTest.*' > /tmp/r/$tool.txt 2>&1; echo "$tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" /tmp/r/$tool.txt | head -4
done
timeout 200 $N kernels_gpu_test > /tmp/r/kernels_gpu_test.txt 2>&1; echo "kernels_gpu_test rc=$?"; tail -2 /tmp/r/kernels_gpu_test.txt
timeout 150 $N runner_gpu_test > /tmp/r/runner_gpu_test.txt 2>&1; echo "runner_gpu_test rc=$?"; grep -E "PASSED|FAILED|SKIPPED|relative L2" /tmp/r/runner_gpu_test.txt | head -10
MB="--model bench/configs/llama3-8b/config.json --dummy --batches 1,8,64,256 --context 1024"
for i in 1 2; do
  timeout 120 $N lmserve-model-bench $MB --json /tmp/r/llama3-8b-$i.json --timeline /tmp/r/timeline-$i.json > /tmp/r/model_bench-$i.txt 2>&1; echo "mb $i rc=$?"
  grep -E "^(1|8|64|256) |^prefill|copy bandwidth" /tmp/r/model_bench-$i.txt
done
tar -czf $OUT/results.tgz -C /tmp/r .
