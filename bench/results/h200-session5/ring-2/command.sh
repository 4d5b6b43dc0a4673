#!/usr/bin/env bash
# Session 5, run 2: the ring with its stage fills split into bulk copies of COPY_KB
# (LMSERVE_SKINNY_RING=STAGE_KB,STAGES,BLOCKS_PER_SM,COPY_KB), isolated and in the step.
set -uo pipefail
mkdir -p /tmp/n && tar -xJf .gpu/bundle.tar.xz -C /tmp/n; N=/tmp/n/bundle/run
export LMSERVE_FIXTURES_DIR=$PWD/.gpu/fixtures
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout 120 $N kernels_gpu_test --gtest_filter='SkinnyGemm*' > $OUT/kt-skinny.txt 2>&1; echo "skinny tests rc=$?"; grep -E "FAILED|PASSED|Failure|Expected|Which|seed" $OUT/kt-skinny.txt | head -20
i=0
for v in 0 32,3,1,32 32,3,1,4 32,3,1,1 16,6,2,4 32,4,1,4 64,3,1,8 8,8,2,2; do
  i=$((i+1))
  echo "== ring $v" > $OUT/kb-$i.txt
  LMSERVE_SKINNY_RING=$v timeout 60 $N lmserve-kernels-bench --filter skinny --iters 20 >> $OUT/kb-$i.txt 2>&1; echo "kb $i $v rc=$?"
  grep -E "skinny GEMM.* m 1 " $OUT/kb-$i.txt | sed "s/^/  /"
done
MB="--model bench/configs/llama3-8b/config.json --dummy --batches 1 --context 1024 --prefill-seqs 0"
i=0
for v in 0 32,3,1,4 32,3,1,1 16,6,2,4 0 32,3,1,4 32,3,1,1 16,6,2,4; do
  i=$((i+1))
  echo "== ring $v" > $OUT/mb-$i.txt
  LMSERVE_SKINNY_RING=$v timeout 60 $N lmserve-model-bench $MB --timeline $OUT/tl-$i.json >> $OUT/mb-$i.txt 2>&1; echo "mb $i $v rc=$?"
  grep -E "^1 " $OUT/mb-$i.txt | sed "s/^/$v /"
done
