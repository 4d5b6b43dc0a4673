#!/usr/bin/env bash
# Session 4, run 3: the skinny GEMM with one row a warp and 8 pieces in flight (LMSERVE_SKINNY_ROWS
# unset) against two rows and 4 pieces (=2, the old kernel) and the d0e61af binaries.
set -uo pipefail
mkdir -p /tmp/n /tmp/o && tar -xJf .gpu/bundle.tar.xz -C /tmp/n && tar -xJf .gpu/base.tar.xz -C /tmp/o
N=/tmp/n/bundle/run; O=/tmp/o/bundle/run
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/device.txt
for r in 1 2; do LMSERVE_SKINNY_ROWS=$r timeout 60 $N kernels_gpu_test --gtest_filter='*Skinny*:*Gemm*' > $OUT/kt-r$r.txt 2>&1; echo "skinny tests rows=$r rc=$?"; grep -E "FAILED|PASSED|Failure" $OUT/kt-r$r.txt | head; done
MB="--model bench/configs/llama3-8b/config.json --dummy --batches 1,8,64 --context 1024 --prefill-seqs 0"
i=0
for v in new old new2 new old new2 new; do
  i=$((i+1)); R=$N; r=1; [[ $v == old ]] && R=$O; [[ $v == new2 ]] && r=2
  extra=""; [[ $i == 1 ]] && extra="--timeline /tmp/tl.json"
  LMSERVE_SKINNY_ROWS=$r timeout 100 $R lmserve-model-bench $MB $extra > /tmp/mb-$i-$v.txt 2>&1; echo "mb $i $v rc=$?"
  grep -E "^(1|8|64) " /tmp/mb-$i-$v.txt | sed "s/^/$v /"
done
grep -A9 "batch 1 timeline" /tmp/mb-1-new.txt
tar -C /tmp -czf $OUT/s3.tar.gz tl.json $(cd /tmp && ls mb-*.txt)
