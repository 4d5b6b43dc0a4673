#!/usr/bin/env python3
"""Times torch's scaled_dot_product_attention (cuDNN and FlashAttention backends) on contiguous
tensors of the prefill shapes lmserve-kernels-bench measures (--filter prefill), and prints TFLOP/s
with the same FLOP count: 4 * head_dim * heads * sum over sequences of len * (len + 1) / 2 (causal:
about half the square).

The reference of issue 25's targets: lmserve's paged prefill attention (block size 16) against
these figures, in the same lease. Sequences of equal length run as one batch ([batch, heads, len,
head_dim], bf16, 32 query and 8 KV heads, enable_gqa). Each backend warms up, then its median over
--iters timed runs (CUDA events) is reported; a backend that refuses a shape says so.

Usage: python3 bench/sdpa_reference.py [--iters 50] [--json out.json]
"""

import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# (name, batch, seq_len, head_dim): the kernel bench's prefill rows.
SHAPES = [
    ("prefill attention", 1, 8192, 128),
    ("prefill attention (4 seqs)", 4, 2048, 128),
    ("prefill attention d64", 1, 8192, 64),
    ("prefill attention (4 x 1024)", 4, 1024, 128),
]
HEADS, KV_HEADS = 32, 8
BACKENDS = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)]


def flops(batch, seq_len, head_dim):
    return 4.0 * head_dim * HEADS * batch * seq_len * (seq_len + 1) / 2


def time_backend(backend, q, k, v, iters):
    with sdpa_kernel([backend]):
        fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000.0)  # us
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 1
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"cuDNN {torch.backends.cudnn.version()}")
    print(f"{'shape':34} {'backend':8} {'median us':>10} {'TFLOP/s':>8}")
    results = []
    for name, batch, seq_len, head_dim in SHAPES:
        torch.manual_seed(0)
        q = torch.randn(batch, HEADS, seq_len, head_dim, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(batch, KV_HEADS, seq_len, head_dim, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(batch, KV_HEADS, seq_len, head_dim, device="cuda", dtype=torch.bfloat16)
        for backend_name, backend in BACKENDS:
            note = ""
            try:
                us = time_backend(backend, q, k, v, args.iters)
            except RuntimeError:
                # A backend without GQA: the KV heads repeated (contiguous), the same FLOPs.
                group = HEADS // KV_HEADS
                try:
                    us = time_backend(backend, q, k.repeat_interleave(group, dim=1).contiguous(),
                                      v.repeat_interleave(group, dim=1).contiguous(), args.iters)
                    note = " (KV heads repeated)"
                except RuntimeError as e:  # a backend that does not take the shape
                    print(f"{name:34} {backend_name:8} refused: {str(e).splitlines()[0][:80]}")
                    continue
            tflops = flops(batch, seq_len, head_dim) / us / 1e6
            print(f"{name:34} {backend_name:8} {us:10.1f} {tflops:8.1f}{note}")
            results.append({"name": name, "batch": batch, "seq_len": seq_len,
                            "head_dim": head_dim, "backend": backend_name, "median_us": us,
                            "tflops": tflops, "kv_repeated": bool(note)})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
