#!/usr/bin/env bash
# Session 4, run 6: a shallower ring for decode attention's 2-warp blocks (batch 64):
# LMSERVE_DECODE_STAGES=2 (experiment knob) against d0e61af's 3.
set -uo pipefail
mkdir -p /tmp/n /tmp/o && tar -xJf .gpu/bundle.tar.xz -C /tmp/n && tar -xJf .gpu/base.tar.xz -C /tmp/o
N=/tmp/n/bundle/run; O=/tmp/o/bundle/run
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/device.txt
for st in 2; do LMSERVE_DECODE_STAGES=$st timeout 60 $N kernels_gpu_test --gtest_filter='*Decode*' > $OUT/kt-s$st.txt 2>&1; echo "decode tests stages=$st rc=$?"; grep -E "FAILED|PASSED" $OUT/kt-s$st.txt | head -3; done
MB="--model bench/configs/llama3-8b/config.json --dummy --batches 64,128 --context 1024 --prefill-seqs 0"
i=0
for v in old 2 old 2; do
  i=$((i+1)); R=$N; [[ $v == old ]] && R=$O
  LMSERVE_DECODE_STAGES=$v timeout 60 $R lmserve-model-bench $MB --timeline /tmp/tl-$i.json > $OUT/mb-$i-$v.txt 2>&1; echo "mb $i $v rc=$?"
  grep -E "^(64|128) " $OUT/mb-$i-$v.txt | sed "s/^/$v /"
  grep -A4 "batch 64 timeline" $OUT/mb-$i-$v.txt | grep -E "Decode" | sed "s/^/   /"
done
for v in old 2; do R=$N; [[ $v == old ]] && R=$O
  LMSERVE_DECODE_STAGES=$v timeout 60 $R lmserve-kernels-bench --filter decode > $OUT/kb-$v.txt 2>&1; echo "kb $v rc=$?"; grep -i "decode" $OUT/kb-$v.txt | head -4
done
