#!/usr/bin/env python3
"""bench/serve_sweep.py end to end: a fixture model served on free ports, a two-point sweep, and the
results folder it writes (results.json with provenance and both points, summary.md; plot.png when
gnuplot is installed). Then a server that exits at once (a bad --model) with an hour's
--ready-timeout: the sweep must fail at once with the server's log, not wait (a sweep that waited
would run into this test's own timeout; nothing asserts on times). Exit 77 (skipped) when the
binaries are not built."""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_sweep(arguments, timeout):
    """Runs serve_sweep.py; on a timeout, SIGTERM (it then stops its server) and SIGKILL."""
    sweep = subprocess.Popen([sys.executable, os.path.join(SOURCE, "bench", "serve_sweep.py")]
                             + arguments, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        stdout, stderr = sweep.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        sweep.terminate()
        try:
            stdout, stderr = sweep.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            sweep.kill()
            stdout, stderr = sweep.communicate()
        stderr += f"\n[serve_sweep_test: the sweep was stopped after {timeout} s]"
    return subprocess.CompletedProcess(sweep.args, sweep.returncode, stdout, stderr)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--fixtures-dir", required=True)
    args = parser.parse_args()
    server = os.path.join(args.build_dir, "bin", "lmserve")
    client = os.path.join(args.build_dir, "bin", "lmserve-bench")
    model = os.path.join(args.fixtures_dir, "hf-tiny", "llama-gqa")
    for path in (server, client, model):
        if not os.path.exists(path):
            print(f"skipped: {path} is missing")
            return 77
    with tempfile.TemporaryDirectory() as out:
        run = run_sweep(["--name", "test-sweep", "--out-dir", out, "--server",
                         f"{server} serve --model {model} --kv-cache-mb 16 --threads 1",
                         "--port", "0", "--metrics-port", "0", "--client", client,
                         "--concurrency", "1,2", "--min-prompts", "4",
                         "--client-args", "--input-len 8 --output-len 4",
                         "--ready-timeout", "120"], timeout=200)
        if run.returncode != 0:
            print(run.stdout, run.stderr)
            return 1
        with open(os.path.join(out, "results.json")) as f:
            results = json.load(f)
        failures = []

        def check(condition, what):
            if not condition:
                failures.append(what)

        check(results["machine"].get("cpu_cores"), "machine.cpu_cores")
        check(results["commit"], "commit")
        check("serve --model" in results["server_command"], "server_command")
        check(results.get("server_exit_code") == 0, "the server drained and exited 0")
        check([p.get("concurrency") for p in results["points"]] == [1, 2], "two points")
        for point in results["points"]:
            r = point.get("result", {})
            check(r.get("completed") == 4 and r.get("failed") == 0, f"{point['label']}: 4 ok")
            check(r.get("total_output_tokens") == 16, f"{point['label']}: 16 tokens")
            check(r.get("server_ttft", {}).get("server_ttft_count") == 4,
                  f"{point['label']}: the server saw the 4 measured requests (no warm-up)")
        with open(os.path.join(out, "summary.md")) as f:
            summary = f.read()
        check("| concurrency 2 | 4/4 |" in summary, "summary.md rows")
        if shutil.which("gnuplot"):
            check(os.path.getsize(os.path.join(out, "plot.png")) > 1000, "plot.png")
        if failures:
            print("failed:", failures, "\n", run.stderr)
            return 1
    with tempfile.TemporaryDirectory() as out:
        run = run_sweep(["--name", "test-dead-server", "--out-dir", out, "--server",
                         f"{server} serve --model /nonexistent/lmserve-model --threads 1",
                         "--port", "0", "--metrics-port", "0", "--client", client,
                         "--concurrency", "1", "--no-plot", "--ready-timeout", "3600"],
                        timeout=60)
        reported = run.stderr
        for part in ("the server exited with code 1 before", "cannot serve the model",
                     "/nonexistent/lmserve-model"):
            if part not in reported:
                print(f"failed: the sweep's report of a dead server lacks {part!r} "
                      f"(exit {run.returncode}):\n{reported}")
                return 1
        if run.returncode != 1:
            print(f"failed: the sweep of a dead server exited {run.returncode}, not 1")
            return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
