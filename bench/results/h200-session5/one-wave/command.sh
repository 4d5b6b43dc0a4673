#!/usr/bin/env bash
# Session 5, run 4: the skinny GEMM on a grid of one wave (a warp takes several units where the
# blocks would take more than one wave: gate/up, LM head) against one unit a warp
# (LMSERVE_SKINNY_PERSISTENT=0), same binaries, interleaved.
set -uo pipefail
mkdir -p /tmp/n /tmp/r && tar -xJf .gpu/bundle.tar.xz -C /tmp/n; N=/tmp/n/bundle/run
export LMSERVE_FIXTURES_DIR=$PWD/.gpu/fixtures
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout 120 $N kernels_gpu_test --gtest_filter='SkinnyGemm*' > /tmp/r/kt-skinny.txt 2>&1; echo "skinny tests rc=$?"; grep -E "FAILED|PASSED|Failure|Expected|Which|seed" /tmp/r/kt-skinny.txt | head -20
MB="--model bench/configs/llama3-8b/config.json --dummy --batches 1,8 --context 1024 --prefill-seqs 0"
i=0
for v in 0 1 0 1 0 1; do
  i=$((i+1))
  echo "== persistent $v" > /tmp/r/mb-$i.txt
  LMSERVE_SKINNY_PERSISTENT=$v timeout 60 $N lmserve-model-bench $MB --timeline /tmp/r/tl-$i.json >> /tmp/r/mb-$i.txt 2>&1; echo "mb $i $v rc=$?"
  grep -E "^(1|8) " /tmp/r/mb-$i.txt | sed "s/^/$v /"
done
for v in 0 1; do
  echo "== persistent $v" > /tmp/r/kb-$v.txt
  LMSERVE_SKINNY_PERSISTENT=$v timeout 60 $N lmserve-kernels-bench --filter skinny --iters 20 >> /tmp/r/kb-$v.txt 2>&1; echo "kb $v rc=$?"
  grep -E "skinny GEMM.* m (1|8) " /tmp/r/kb-$v.txt | sed "s/^/  /"
done
tar -czf $OUT/results.tgz -C /tmp/r .
