#!/usr/bin/env bash
# Session 4, run 1: correctness of the in-kernel split merge and the two-stage skinny GEMM, then
# A/B of the model benchmark against the d0e61af binaries (interleaved).
set -uo pipefail
mkdir -p /tmp/n /tmp/o && tar -xJf .gpu/bundle.tar.xz -C /tmp/n && tar -xJf .gpu/base.tar.xz -C /tmp/o
N=/tmp/n/bundle/run; O=/tmp/o/bundle/run
export LMSERVE_FIXTURES_DIR=$PWD/.gpu/fixtures
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout 150 $N kernels_gpu_test --gtest_filter='*Decode*:*Skinny*' > $OUT/kt_focus.txt 2>&1; echo "focus rc=$?"; grep -E "FAILED|PASSED|Failure" $OUT/kt_focus.txt | head -20
LMSERVE_SKINNY_STAGES=1 timeout 60 $N kernels_gpu_test --gtest_filter='*Skinny*' > $OUT/kt_skinny1.txt 2>&1; echo "skinny1 rc=$?"
MB="--model bench/configs/llama3-8b/config.json --dummy --batches 1,8,64 --context 1024 --prefill-seqs 0"
i=0
for v in new old new1 new old new1; do
  i=$((i+1)); R=$N; env=""; [[ $v == old ]] && R=$O; [[ $v == new1 ]] && env="LMSERVE_SKINNY_STAGES=1"
  extra=""; [[ $i == 1 ]] && extra="--timeline $OUT/timeline-new.json"
  env $env timeout 100 $R lmserve-model-bench $MB $extra > $OUT/mb-$i-$v.txt 2>&1; echo "mb $i $v rc=$?"
  grep -E "^(1|8|64) " $OUT/mb-$i-$v.txt | sed "s/^/$v /"
done
grep -A8 "batch 1 timeline" $OUT/mb-1-new.txt
for v in new old; do R=$N; [[ $v == old ]] && R=$O
  timeout 60 $R lmserve-kernels-bench --filter decode > $OUT/kb-$v.txt 2>&1; echo "kb $v rc=$?"; grep -i "decode" $OUT/kb-$v.txt | head -8
done
timeout 150 $N kernels_gpu_test > $OUT/kernels_gpu_test.txt 2>&1; echo "kernels_gpu_test rc=$?"; tail -3 $OUT/kernels_gpu_test.txt
timeout 100 $N runner_gpu_test > $OUT/runner_gpu_test.txt 2>&1; echo "runner_gpu_test rc=$?"; grep -E "PASSED|FAILED|SKIPPED|rel" $OUT/runner_gpu_test.txt | head -20
