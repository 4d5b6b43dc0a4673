#!/usr/bin/env bash
# Session 4, run 2: the split merge through memory (no second kernel) against d0e61af, and with
# clusters (LMSERVE_DECODE_CLUSTERS=1) once more.
set -uo pipefail
mkdir -p /tmp/n /tmp/o && tar -xJf .gpu/bundle.tar.xz -C /tmp/n && tar -xJf .gpu/base.tar.xz -C /tmp/o
N=/tmp/n/bundle/run; O=/tmp/o/bundle/run
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/device.txt
for c in 0 1; do LMSERVE_DECODE_CLUSTERS=$c timeout 100 $N kernels_gpu_test --gtest_filter='*Decode*' > $OUT/kt-c$c.txt 2>&1; echo "decode tests clusters=$c rc=$?"; grep -E "FAILED|PASSED|Failure" $OUT/kt-c$c.txt | head; done
MB="--model bench/configs/llama3-8b/config.json --dummy --batches 1,8,64 --context 1024 --prefill-seqs 0"
i=0
for v in new old newc new old; do
  i=$((i+1)); R=$N; c=0; [[ $v == old ]] && R=$O; [[ $v == newc ]] && c=1
  extra=""; [[ $i == 1 ]] && extra="--timeline /tmp/tl.json"
  LMSERVE_DECODE_CLUSTERS=$c timeout 100 $R lmserve-model-bench $MB $extra > /tmp/mb-$i-$v.txt 2>&1; echo "mb $i $v rc=$?"
  grep -E "^(1|8|64) " /tmp/mb-$i-$v.txt | sed "s/^/$v /"
done
grep -A9 "batch 1 timeline" /tmp/mb-1-new.txt; grep -A12 "batch 8 timeline" /tmp/mb-1-new.txt
for v in new old; do R=$N; [[ $v == old ]] && R=$O
  timeout 60 $R lmserve-kernels-bench --filter decode > /tmp/kb-$v.txt 2>&1; echo "kb $v rc=$?"; grep -i "decode" /tmp/kb-$v.txt | head -8
done
tar -C /tmp -czf $OUT/s2.tar.gz tl.json $(cd /tmp && ls mb-*.txt kb-*.txt)
