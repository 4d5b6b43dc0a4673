#!/usr/bin/env bash
# Session 6, run 5: the skinny GEMM's second step of W requested into shared memory (cp.async)
# right after the wait (1) or before it (2), against the register kernel alone (0), interleaved.
set -uo pipefail
mkdir -p /tmp/b && tar -xJf .gpu/bundle.tar.xz -C /tmp/b; R=/tmp/b/bundle/run
export LMSERVE_FIXTURES_DIR=$PWD/.gpu/fixtures
D=/tmp/res5; mkdir -p $D
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $D/device.txt
for v in 1 2; do
  LMSERVE_SKINNY_SMEM_NEXT=$v timeout 120 $R kernels_gpu_test --gtest_filter='SkinnyGemm*' > $D/kt-skinny-$v.txt 2>&1; echo "skinny tests mode $v rc=$?"; tail -1 $D/kt-skinny-$v.txt
done
MB="--model bench/configs/llama3-8b/config.json --dummy --batches 1,8,64 --context 1024 --prefill-seqs 0"
i=0
for v in 0 1 2 0 1 2 0 1 2 1 0; do
  i=$((i+1)); extra=""; [[ $i -le 3 ]] && extra="--timeline $D/tl-$i.json"
  echo "== mode $v" > $D/mb-$i.txt
  LMSERVE_SKINNY_SMEM_NEXT=$v timeout 60 $R lmserve-model-bench $MB $extra >> $D/mb-$i.txt 2>&1; echo "mb $i mode $v rc=$?"
  grep -E "^(1|8|64) " $D/mb-$i.txt | sed "s/^/  mode $v: /" | cut -c1-90
done
LMSERVE_SKINNY_SMEM_NEXT=1 timeout 150 $R runner_gpu_test > $D/runner_gpu_test-1.txt 2>&1; echo "runner_gpu_test mode 1 rc=$?"; tail -3 $D/runner_gpu_test-1.txt
tar -C /tmp -czf $OUT/results5.tgz res5; ls -la $OUT
