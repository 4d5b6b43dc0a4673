#!/usr/bin/env python3
"""Serving sweep: starts a server, runs `lmserve-bench serve` at each concurrency (or request rate),
and writes bench/results/NAME/: results.json (machine, commit, commands, every point's result),
summary.md, plot.png (TTFT and ITL p50/p99 against output token throughput), and the logs.

    bench/serve_sweep.py --name cpu-demo-sweep \\
        --server "build/bin/lmserve serve --model ~/.cache/lmserve/models/X.gguf" \\
        --concurrency 1,2,4,8,16 --client-args "--input-len 128 --output-len 64"

The server command is run as given with `--port`/`--metrics-port` appended (--no-port-args to leave
it alone), so it can be a wrapper: `--server ".gpu/bundle/run lmserve serve --model M"` and
`--client ".gpu/bundle/run lmserve-bench"` run bundled binaries. `--server none` measures a server
that is already running (e.g. a peer over --backend http). Each point runs its own warm-up
(lmserve-bench's default: one request per slot of concurrency), and the tool scrapes the server's
/metrics after the warm-up and after the run, so the server's TTFT mean covers the same requests.
Plotting needs gnuplot and is skipped without it (--no-plot skips it anyway); sweep_report.py makes
the plot later from results.json alone. Standard library only.
"""

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep_report  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def machine_info():
    info = {"hostname": platform.node(), "kernel": platform.release(), "cpu_cores": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            kib = int(f.readline().split()[1])
            info["memory_gib"] = round(kib / 2**20, 1)
        info["load_average_before"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        pass
    if shutil.which("nvidia-smi"):
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True)
        if result.returncode == 0:
            info["gpus"] = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    return info


def git_commit():
    # A copy of the tree on another machine (the GPU machine's) may carry a stale .git: the
    # caller's LMSERVE_COMMIT wins.
    if os.environ.get("LMSERVE_COMMIT"):
        return os.environ["LMSERVE_COMMIT"]
    try:
        commit = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def log_tail(log_path, limit=6000):
    """The end of the server's log, for error messages."""
    try:
        with open(log_path, errors="replace") as f:
            text = f.read()
    except OSError as error:
        return f"(cannot read {log_path}: {error})"
    return text if len(text) <= limit else "...\n" + text[-limit:]


def check_server(server, log_path, before):
    """Raises at once, with the end of the server's log, when the server has exited."""
    if server is not None and server.poll() is not None:
        code = server.returncode
        how = f"exited with code {code}" if code >= 0 else f"was killed by signal {-code}"
        raise RuntimeError(f"the server {how} before {before}; the end of {log_path}:\n"
                           + log_tail(log_path))


def wait_metrics(url, server, log_path, timeout):
    """Waits until `url` answers (the server is up); fails at once if the server exits first."""
    deadline = time.time() + timeout
    while True:
        check_server(server, log_path, f"{url} answered")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.time() >= deadline:
            raise RuntimeError(f"the server is still running, but {url} did not answer within "
                               f"{timeout} s; the end of {log_path}:\n" + log_tail(log_path))
        time.sleep(0.5)


def ports_from_log(log_path, server, port, metrics_port, timeout):
    """Reads the ports a server given port 0 chose from its log; fails at once if it exits."""
    deadline = time.time() + timeout
    while True:
        exited = server.poll() is not None  # before the read: a last line before exit counts
        with open(log_path, errors="replace") as f:
            log = f.read()
        listening = re.search(r"listening on [^\s]*:(\d+)", log)
        metrics = re.search(r"metrics on http://[^\s]*:(\d+)/metrics", log)
        if (port != 0 or listening) and (metrics_port != 0 or metrics):
            return (port or int(listening.group(1)),
                    metrics_port if metrics_port != 0 else int(metrics.group(1)))
        if exited:
            check_server(server, log_path, "it logged its ports")
        if time.time() >= deadline:
            raise RuntimeError(f"the server is still running, but logged no port within "
                               f"{timeout} s; the end of {log_path}:\n" + log_tail(log_path))
        time.sleep(0.2)


def run_client(command, log_path, server, server_log_path):
    """Runs one point's client, its output into `log_path`; returns (exit code, output). If the
    server exits meanwhile, stops the client and raises with the end of the server's log."""
    with open(log_path, "w") as log:
        client = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            while client.poll() is None:
                if server is not None and server.poll() is not None:
                    client.kill()
                    client.wait()
                    check_server(server, server_log_path, "the point's client finished")
                time.sleep(0.2)
        finally:
            if client.poll() is None:
                client.kill()
                client.wait()
    with open(log_path, errors="replace") as f:
        return client.returncode, f.read()


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", required=True, help="the results folder's name")
    parser.add_argument("--out-dir", help="default: bench/results/NAME")
    parser.add_argument("--server", required=True,
                        help="the server command (a shell-quoted string), or 'none'")
    parser.add_argument("--no-port-args", action="store_true",
                        help="do not append --port/--metrics-port to the server command")
    parser.add_argument("--client", default=os.path.join(REPO, "build/bin/lmserve-bench"),
                        help="the lmserve-bench command (a shell-quoted string)")
    parser.add_argument("--backend", default="grpc", choices=["grpc", "http"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=50151,
                        help="the server's gRPC (or HTTP) port; 0: any free port, read from the "
                             "server's log ('listening on HOST:PORT')")
    parser.add_argument("--metrics-port", type=int, default=9451,
                        help="the server's metrics port; 0: any free port, read from the log "
                             "('metrics on http://...'); -1: do not scrape")
    parser.add_argument("--url", help="http: the base URL (default http://HOST:PORT)")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--concurrency", help="comma-separated concurrencies, e.g. 1,2,4,8,16")
    group.add_argument("--rates", help="comma-separated request rates (req/s), e.g. 1,2,4,inf")
    parser.add_argument("--prompts-per-slot", type=int, default=2,
                        help="requests per point: this times the concurrency (rates: times "
                             "the rate times 30 s), at least --min-prompts")
    parser.add_argument("--min-prompts", type=int, default=8)
    parser.add_argument("--client-args", default="",
                        help="more lmserve-bench serve options (a shell-quoted string)")
    parser.add_argument("--ready-timeout", type=float, default=600)
    parser.add_argument("--notes", default="", help="recorded in results.json and summary.md")
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args()

    out_dir = args.out_dir or os.path.join(REPO, "bench", "results", args.name)
    os.makedirs(os.path.join(out_dir, "points"), exist_ok=True)
    scrape = args.metrics_port >= 0
    results = {
        "name": args.name,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": machine_info(),
        "sweep_command": " ".join(shlex.quote(a) for a in sys.argv),
        "notes": args.notes,
        "points": [],
    }

    # SIGTERM (a caller's timeout) ends the sweep as Ctrl-C does: the server is stopped too.
    def interrupted(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, interrupted)

    server = None
    server_log = None
    server_log_path = os.path.join(out_dir, "server.log")
    if args.server != "none":
        server_cmd = shlex.split(os.path.expanduser(args.server))
        server_cmd = [os.path.expanduser(a) for a in server_cmd]
        if not args.no_port_args:
            server_cmd += ["--host", args.host, "--port", str(args.port)]
            if scrape:
                server_cmd += ["--metrics-port", str(args.metrics_port)]
        results["server_command"] = " ".join(shlex.quote(a) for a in server_cmd)
        server_log = open(server_log_path, "w")
        print(f"serve_sweep: starting {results['server_command']}", file=sys.stderr)
        server = subprocess.Popen(server_cmd, stdout=server_log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    else:
        results["server_command"] = "none (already running)"

    exit_code = 0
    try:
        port, metrics_port = args.port, args.metrics_port
        if server is not None and (port == 0 or metrics_port == 0):
            port, metrics_port = ports_from_log(server_log_path, server, port, metrics_port,
                                                args.ready_timeout)
        metrics_url = f"http://{args.host}:{metrics_port}/metrics" if scrape else ""
        if server is not None and metrics_url:
            wait_metrics(metrics_url, server, server_log_path, args.ready_timeout)
        client_cmd = [os.path.expanduser(a) for a in shlex.split(args.client)] + ["serve"]
        if args.backend == "grpc":
            client_cmd += ["--backend", "grpc", "--addr", f"{args.host}:{port}"]
        else:
            client_cmd += ["--backend", "http", "--url", args.url or f"http://{args.host}:{port}"]
        if metrics_url:
            client_cmd += ["--metrics-url", metrics_url]
        client_cmd += shlex.split(args.client_args)
        results["client_command"] = " ".join(shlex.quote(a) for a in client_cmd)

        if args.concurrency:
            points = [("concurrency", int(c)) for c in args.concurrency.split(",")]
        else:
            points = [("rate", r) for r in args.rates.split(",")]
        # A seed per point: the same synthetic prompts again would hit the server's prefix cache
        # and flatter TTFT (unless the client arguments fix a seed).
        own_seed = "--seed" not in shlex.split(args.client_args)
        for index, (kind, value) in enumerate(points):
            if kind == "concurrency":
                num_prompts = max(args.min_prompts, args.prompts_per_slot * value)
                load = ["--concurrency", str(value)]
                label = f"c{value}"
            else:
                rate = float(value)
                num_prompts = args.min_prompts if rate == float("inf") else max(
                    args.min_prompts, int(args.prompts_per_slot * rate * 30))
                load = ["--request-rate", value]
                label = f"r{value}"
            json_path = os.path.join(out_dir, "points", f"{label}.json")
            command = client_cmd + load + [
                "--num-prompts", str(num_prompts), "--wait-ready-s", str(args.ready_timeout),
                "--label", f"{kind} {value}", "--result-json", json_path]
            if own_seed:
                command += ["--seed", str(index + 1)]
            print(f"serve_sweep: {kind} {value}: {' '.join(shlex.quote(a) for a in command)}",
                  file=sys.stderr)
            check_server(server, server_log_path, f"the point {kind} {value}")
            started = time.time()
            point_log = os.path.join(out_dir, "points", f"{label}.log")
            returncode, output = run_client(command, point_log, server, server_log_path)
            sys.stderr.write(output)
            point = {"label": f"{kind} {value}", kind: value,
                     "command": " ".join(shlex.quote(a) for a in command),
                     "exit_code": returncode, "wall_s": round(time.time() - started, 1)}
            try:
                with open(json_path) as f:
                    point["result"] = json.load(f)
            except (OSError, json.JSONDecodeError) as error:
                point["error"] = f"no result (exit {returncode}): {error}"
                exit_code = 1
            results["points"].append(point)
            # Written after every point: an interrupted sweep keeps what it measured.
            with open(os.path.join(out_dir, "results.json"), "w") as f:
                json.dump(results, f, indent=2)
    except (RuntimeError, KeyboardInterrupt) as error:
        print(f"serve_sweep: {error}", file=sys.stderr)
        results["error"] = str(error)
        exit_code = 1
    finally:
        if server is not None:
            if server.poll() is None:
                os.killpg(server.pid, signal.SIGTERM)
                try:
                    server.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(server.pid, signal.SIGKILL)
                    server.wait()
            results["server_exit_code"] = server.returncode
            server_log.close()
        with open(os.path.join(out_dir, "results.json"), "w") as f:
            json.dump(results, f, indent=2)

    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(sweep_report.summary_markdown(results))
    if not args.no_plot:
        sweep_report.write_plot(results, os.path.join(out_dir, "plot.png"))
    print(f"serve_sweep: wrote {out_dir}", file=sys.stderr)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
