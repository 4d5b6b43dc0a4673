#!/usr/bin/env bash
# Session 6, run 10: RMSNorm with every load before its first store, QKV post-processing with the
# rotation, bias and cache slot loaded before its wait (new), against 95a8f8b (old), interleaved.
set -uo pipefail
mkdir -p /tmp/b && tar -xJf .gpu/bundle.tar.xz -C /tmp/b; R=/tmp/b/bundle/run
export LMSERVE_FIXTURES_DIR=$PWD/.gpu/fixtures
D=/tmp/res10; mkdir -p $D
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $D/device.txt
for o in norm qkv_postprocess; do /usr/local/cuda/bin/cuobjdump -sass .gpu/obj/$o.cu.o > $D/$o.sass; done
awk '/Function : .*RmsNormKernelI13__nv_bfloat16Li2ELb1E/{p=1;next} /Function :/{p=0} p' $D/norm.sass | grep -E "LDG|STG" | sed -E 's/^\s+//; s/\s*;.*$//' | head -8
timeout 240 $R kernels_gpu_test > $D/kernels_gpu_test.txt 2>&1; echo "kernels_gpu_test rc=$?"; tail -1 $D/kernels_gpu_test.txt
timeout 200 $R runner_gpu_test > $D/runner_gpu_test.txt 2>&1; echo "runner_gpu_test rc=$?"; grep -E "PASSED|FAILED" $D/runner_gpu_test.txt | head -4
timeout 200 /usr/local/cuda/bin/compute-sanitizer --tool racecheck $R kernels_gpu_test --gtest_filter='*Norm*:*Qkv*' > $D/racecheck.txt 2>&1; echo "racecheck rc=$?"; grep -E "SUMMARY|PASSED" $D/racecheck.txt | head -2
i=0
for b in old new old new old new new old new old; do
  i=$((i+1)); MB="--model bench/configs/llama3-8b/config.json --dummy --batches 1,8,64 --context 1024 --prefill-seqs 0"
  extra=""; [[ $i -le 2 ]] && extra="--timeline $D/tl-$b.json"
  echo "== $b" > $D/mb-$i.txt
  timeout 60 $R mb-$b $MB $extra >> $D/mb-$i.txt 2>&1; echo "mb $i $b rc=$?"
  grep -E "^(1|8|64) " $D/mb-$i.txt | sed "s/^/  $b: /" | cut -c1-90
done
tar -C /tmp -czf $OUT/results10.tgz res10; ls -la $OUT
