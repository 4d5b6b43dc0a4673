#!/usr/bin/env bash
# Session 6, run 7: where the skinny GEMM's loop issues its loads (SASS of the one-row kernel in
# each build), and the model benchmark of each build interleaved: head (a45f0c4), exp (the
# shared-memory experiment with its knob off), c1 (__syncwarp after the loads), c7 (peeled flag).
set -uo pipefail
mkdir -p /tmp/b && tar -xJf .gpu/bundle.tar.xz -C /tmp/b; R=/tmp/b/bundle/run
D=/tmp/res7; mkdir -p $D
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $D/device.txt
for v in head exp c1 c7; do
  /usr/local/cuda/bin/cuobjdump -sass .gpu/obj/sk-$v.o | awk '/Function : .*SkinnyGemmKernelI13__nv_bfloat16S4_Li1ELb0E/{p=1;next} /Function :/{p=0} p' > $D/sass-$v.txt
  echo "$v: $(grep -c LDG $D/sass-$v.txt) LDG; loop W loads at lines: $(grep -n 'LDG.E.EF.128' $D/sass-$v.txt | cut -d: -f1 | tr '\n' ' ')"
done
i=0
for b in head exp c1 c7 head exp c1 c7 c7 c1 exp head; do
  i=$((i+1)); MB="--model bench/configs/llama3-8b/config.json --dummy --batches 1,8,64 --context 1024 --prefill-seqs 0"
  extra=""; [[ $i -le 4 ]] && extra="--timeline $D/tl-$b.json"
  echo "== $b" > $D/mb-$i.txt
  timeout 60 $R mb-$b $MB $extra >> $D/mb-$i.txt 2>&1; echo "mb $i $b rc=$?"
  grep -E "^(1|8|64) " $D/mb-$i.txt | sed "s/^/  $b: /" | cut -c1-90
done
tar -C /tmp -czf $OUT/results7.tgz res7; ls -la $OUT
