#!/usr/bin/env bash
# Session 5, run 3: the skinny GEMM walking one row of W a warp (eight 16-byte pieces in flight a
# lane, twice the blocks) for the projections named in LMSERVE_SKINNY_ONE_ROW, same binaries.
set -uo pipefail
mkdir -p /tmp/n && tar -xJf .gpu/bundle.tar.xz -C /tmp/n; N=/tmp/n/bundle/run
export LMSERVE_FIXTURES_DIR=$PWD/.gpu/fixtures
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout 120 $N kernels_gpu_test --gtest_filter='SkinnyGemm*' > $OUT/kt-skinny.txt 2>&1; echo "skinny tests rc=$?"; grep -E "FAILED|PASSED|Failure|Expected|Which|seed" $OUT/kt-skinny.txt | head -20
MB="--model bench/configs/llama3-8b/config.json --dummy --batches 1 --context 1024 --prefill-seqs 0"
i=0
for v in none down o down,o down,lm qkv,o,down,lm none down down,o down,lm none down; do
  i=$((i+1))
  echo "== one row: $v" > $OUT/mb-$i.txt
  LMSERVE_SKINNY_ONE_ROW=$v timeout 60 $N lmserve-model-bench $MB --timeline $OUT/tl-$i.json >> $OUT/mb-$i.txt 2>&1; echo "mb $i $v rc=$?"
  grep -E "^1 " $OUT/mb-$i.txt | sed "s/^/$v /"
done
