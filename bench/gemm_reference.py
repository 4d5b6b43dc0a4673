#!/usr/bin/env python3
"""Times torch's bf16 GEMMs (cuBLAS) on the shapes behind lmserve-model-bench's prefill floor, with
constant and with random data, in short bursts and sustained, and prints TFLOP/s (2 m n k a GEMM).

Why: lmserve-model-bench's prefill floor is the step's FLOPs over the rate of an 8192^3 cuBLASLt
GEMM measured in the same run, on buffers memset to 0x3b (every bf16 element the same value), 3
warm-ups and 10 timed runs. A tensor-core GEMM's speed depends on its data: the power its bit flips
draw sets the clock the GPU can hold. The model's GEMMs multiply random weights (the dummy load
format) by activations, step after step. This script measures the same GEMMs both ways:

  constant: every element 0x3b3b (the bench's memset);
  random:   x uniform in [-1, 1), W uniform within 1/sqrt(k) (the dummy weights' range);
  burst:    3 warm-ups, then the median of 10 timed runs (the bench's GemmRate);
  sustained: back-to-back runs for --sustain-ms first, then the median of 20 timed runs.

Then the prefill's four projections of a Llama-3-8B layer (qkv 4096 -> 6144, o 4096 -> 4096,
gate_up 4096 -> 28672, down 14336 -> 4096, m = 4096 tokens) in a loop, as a prefill step runs
them, for --sustain-ms, each one's median reported; and, where pynvml is installed, the SM clock
and the power drawn after each sustained phase.

Usage: python3 bench/gemm_reference.py [--sustain-ms 1000] [--tokens 4096] [--json out.json]
"""

import argparse
import json
import statistics
import time

import torch

LAYER = [("qkv", 4096, 6144), ("o_proj", 4096, 4096), ("gate_up", 4096, 28672),
         ("down_proj", 14336, 4096)]


def nvml_sample():
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        return {"sm_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
                "throttle_reasons": pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)}
    except Exception as e:  # pynvml missing or no permission
        return {"nvml": str(e)[:80]}


def operands(m, k, n, data):
    if data == "constant":
        x = torch.empty(m, k, dtype=torch.int16, device="cuda").fill_(0x3b3b).view(torch.bfloat16)
        w = torch.empty(n, k, dtype=torch.int16, device="cuda").fill_(0x3b3b).view(torch.bfloat16)
    else:
        x = (torch.rand(m, k, device="cuda") * 2 - 1).to(torch.bfloat16)
        bound = 1.0 / k ** 0.5
        w = ((torch.rand(n, k, device="cuda") * 2 - 1) * bound).to(torch.bfloat16)
    y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    return x, w, y


def timed(fn, count):
    times = []
    for _ in range(count):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))  # ms
    return times


def sustain(fn, ms):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    while (time.perf_counter() - t0) * 1e3 < ms:
        for _ in range(8):
            fn()
        torch.cuda.synchronize()


def gemm_rate(m, k, n, data, mode, sustain_ms):
    x, w, y = operands(m, k, n, data)
    fn = lambda: torch.matmul(x, w.t(), out=y)
    if mode == "burst":
        torch.cuda.synchronize()
        time.sleep(0.5)  # let the clocks recover from whatever ran before
        timed(fn, 3)
        times = timed(fn, 10)
    else:
        sustain(fn, sustain_ms)
        times = timed(fn, 20)
    ms = statistics.median(times)
    result = {"m": m, "k": k, "n": n, "data": data, "mode": mode, "ms": ms,
              "tflops": 2.0 * m * n * k / (ms * 1e-3) / 1e12}
    if mode == "sustained":
        result.update(nvml_sample())
    return result


def layer_loop(tokens, data, sustain_ms):
    ops = [(name, *operands(tokens, k, n, data)) for name, k, n in LAYER]
    fns = [(name, (lambda x=x, w=w, y=y: torch.matmul(x, w.t(), out=y))) for name, x, w, y in ops]
    sustain(lambda: [fn() for _, fn in fns], sustain_ms)
    times = {name: [] for name, _ in fns}
    for _ in range(20):
        for name, fn in fns:
            times[name] += timed(fn, 1)
    out = {"data": data, "tokens": tokens, "projections": []}
    total_ms, total_flops = 0.0, 0.0
    for name, k, n in LAYER:
        ms = statistics.median(times[name])
        flops = 2.0 * tokens * n * k
        total_ms += ms
        total_flops += flops
        out["projections"].append({"name": name, "k": k, "n": n, "ms": ms,
                                   "tflops": flops / (ms * 1e-3) / 1e12})
    out["layer_ms"] = total_ms
    out["layer_tflops"] = total_flops / (total_ms * 1e-3) / 1e12
    out.update(nvml_sample())
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sustain-ms", type=float, default=1000)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__} "
          f"(CUDA {torch.version.cuda}); idle: {nvml_sample()}")
    results = {"device": torch.cuda.get_device_name(), "square": [], "layer": []}
    print("\n8192^3 bf16 GEMM (the floor's):")
    for data in ("constant", "random"):
        for mode in ("burst", "sustained"):
            r = gemm_rate(8192, 8192, 8192, data, mode, args.sustain_ms)
            results["square"].append(r)
            extra = {k: v for k, v in r.items() if k in ("sm_mhz", "power_w", "throttle_reasons")}
            print(f"  {data:8s} {mode:9s} {r['ms']:7.3f} ms {r['tflops']:6.0f} TFLOP/s  {extra}")
    print(f"\nthe prefill's projections at m = {args.tokens}, in a loop (median of each):")
    for data in ("constant", "random"):
        r = layer_loop(args.tokens, data, args.sustain_ms)
        results["layer"].append(r)
        cells = ", ".join(f"{p['name']} {p['ms']:.3f} ms ({p['tflops']:.0f})"
                          for p in r["projections"])
        extra = {k: v for k, v in r.items() if k in ("sm_mhz", "power_w", "throttle_reasons")}
        print(f"  {data:8s} {cells}; a layer {r['layer_ms']:.3f} ms ({r['layer_tflops']:.0f} "
              f"TFLOP/s), x32 {32 * r['layer_ms']:.2f} ms  {extra}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
