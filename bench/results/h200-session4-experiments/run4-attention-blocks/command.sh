#!/usr/bin/env bash
# Session 4, run 4: decode attention at small batches with 8-warp blocks and fewer, longer splits
# (LMSERVE_DECODE_WARPS, LMSERVE_DECODE_MIN_SPLIT_TOKENS: experiment knobs) against d0e61af.
set -uo pipefail
mkdir -p /tmp/n /tmp/o && tar -xJf .gpu/bundle.tar.xz -C /tmp/n && tar -xJf .gpu/base.tar.xz -C /tmp/o
N=/tmp/n/bundle/run; O=/tmp/o/bundle/run
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/device.txt
LMSERVE_DECODE_WARPS=8 LMSERVE_DECODE_MIN_SPLIT_TOKENS=256 timeout 60 $N kernels_gpu_test --gtest_filter='*Decode*' > $OUT/kt-w8.txt 2>&1; echo "decode tests w8 t256 rc=$?"; grep -E "FAILED|PASSED" $OUT/kt-w8.txt | head -5
MB="--model bench/configs/llama3-8b/config.json --dummy --batches 1,8 --context 1024 --prefill-seqs 0"
i=0
for v in old 4:64 8:64 8:128 8:256 8:512 8:2048 4:256 old 8:256 8:512 4:128; do
  i=$((i+1)); R=$N; [[ $v == old ]] && R=$O
  w=${v%%:*}; t=${v##*:}; [[ $v == old ]] && w=4 && t=64
  LMSERVE_DECODE_WARPS=$w LMSERVE_DECODE_MIN_SPLIT_TOKENS=$t timeout 60 $R lmserve-model-bench $MB --timeline /tmp/tl-$i.json > /tmp/mb-$i.txt 2>&1; echo "mb $i $v rc=$?"
  grep -E "^(1|8) " /tmp/mb-$i.txt | sed "s/^/$v /"
  grep -A8 "batch 1 timeline" /tmp/mb-$i.txt | grep -E "Decode" | sed "s/^/   /"
done
tar -C /tmp -czf $OUT/s4.tar.gz $(cd /tmp && ls mb-*.txt tl-*.json)
