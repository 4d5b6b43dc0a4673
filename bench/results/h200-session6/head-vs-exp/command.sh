#!/usr/bin/env bash
# Session 6, run 6: HEAD's model benchmark (mb-head) against the experiment's binary with its knob
# off (mb-exp, LMSERVE_SKINNY_SMEM_NEXT unset), interleaved on one lease.
set -uo pipefail
mkdir -p /tmp/b && tar -xJf .gpu/bundle.tar.xz -C /tmp/b; R=/tmp/b/bundle/run
D=/tmp/res6; mkdir -p $D
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $D/device.txt
i=0
for b in head exp head exp head exp head exp head exp exp head; do
  i=$((i+1)); MB="--model bench/configs/llama3-8b/config.json --dummy --batches 1,8,64 --context 1024 --prefill-seqs 0"
  extra=""; [[ $i -le 2 ]] && extra="--timeline $D/tl-$b.json"
  echo "== $b" > $D/mb-$i.txt
  timeout 60 $R mb-$b $MB $extra >> $D/mb-$i.txt 2>&1; echo "mb $i $b rc=$?"
  grep -E "^(1|8|64) " $D/mb-$i.txt | sed "s/^/  $b: /" | cut -c1-90
done
tar -C /tmp -czf $OUT/results6.tgz res6; ls -la $OUT
