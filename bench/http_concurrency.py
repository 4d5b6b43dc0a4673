#!/usr/bin/env python3
"""Many connections against `lmserve serve --http-port`: holds IDLE keep-alive connections open
(each has made one request) while CONCURRENCY streaming completions run at once, and reports
whether every stream completed, how long it took, and the server's resident memory (VmRSS): cold
(model loaded, nothing served), idle (after a warm-up round of the same streams: the KV cache's
pages touched; no connection open), with the idle connections, and at its peak under load (sampled
every 20 ms from /proc), and the server's thread count at each point. The question it answers (issue 21): does the asynchronous server hold
thousands of connections in bounded memory, without a thread each, and serve them all?

Not a timed test: it prints a report (and --json writes it). Standard library only (asyncio).

  bench/http_concurrency.py --server-bin build/bin/lmserve \
      --model "$(scripts/fetch-demo-model.sh)" --idle 2000 --concurrency 1000 --max-tokens 8

It starts the server itself (with --max-queued-requests 1000 and an open-file limit of 4096, as
the issue asks; --server-args adds flags) and stops it with SIGTERM at the end.
"""

import argparse
import asyncio
import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time


def rss_bytes(pid):
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def num_threads(pid):
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


def start_server(args):
    log = tempfile.NamedTemporaryFile(prefix="lmserve-http-concurrency-", suffix=".log",
                                      delete=False)
    cmd = [args.server_bin, "serve", "--model", args.model, "--host", "127.0.0.1", "--port", "0",
           "--http-port", "0", "--max-queued-requests", str(args.max_queued_requests),
           "--http-idle-timeout-s", "600"] + args.server_args.split()

    def limit_files():
        resource.setrlimit(resource.RLIMIT_NOFILE, (args.open_files, args.open_files))

    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log,
                               preexec_fn=limit_files)
    deadline = time.monotonic() + 600
    port = None
    while time.monotonic() < deadline:
        text = open(log.name, encoding="utf-8", errors="replace").read()
        match = re.search(r"HTTP API \(OpenAI-compatible\) on http://127\.0\.0\.1:(\d+)", text)
        if match and "SERVING" in text:
            port = int(match.group(1))
            break
        if process.poll() is not None:
            sys.exit(f"the server exited ({process.returncode}):\n{text}")
        time.sleep(0.05)
    if port is None:
        process.kill()
        sys.exit("the server did not start within 600 s")
    return process, port, log.name


async def http_request(reader, writer, method, path, body=b""):
    """One request on an open connection; returns (status, body bytes). Content-Length only."""
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))
    return status, await reader.readexactly(length)


async def open_idle(port, count, connections):
    """Opens `count` connections, each making one GET /health and then staying open, idle."""
    semaphore = asyncio.Semaphore(200)

    async def one():
        async with semaphore:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            status, _ = await http_request(reader, writer, "GET", "/health")
            if status != 200:
                raise RuntimeError(f"/health answered {status}")
            connections.append((reader, writer))

    await asyncio.gather(*(one() for _ in range(count)))


async def stream_one(port, body, results):
    """One streaming completion on its own connection: counts its events until [DONE]."""
    start = time.monotonic()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                     b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status != 200:
            results.append(("error", f"HTTP {status}", time.monotonic() - start, 0))
            writer.close()
            return
        data = b""
        while b"data: [DONE]" not in data:
            chunk = await reader.read(65536)
            if not chunk:
                break
            data += chunk
        writer.close()
        tokens = sum(len(json.loads(line[6:])["choices"][0].get("token_ids", []))
                     for line in data.decode("utf-8", "replace").split("\r\n")
                     if line.startswith("data: {") and '"choices":[{' in line)
        ok = b"data: [DONE]" in data and b'"error"' not in data
        results.append(("ok" if ok else "error", "" if ok else data[-300:].decode("utf-8",
                                                                                "replace"),
                        time.monotonic() - start, tokens))
    except Exception as e:  # noqa: BLE001
        results.append(("error", repr(e), time.monotonic() - start, 0))


async def run(args, pid, port):
    report = {"idle_connections": args.idle, "concurrency": args.concurrency,
              "max_tokens": args.max_tokens}
    await asyncio.sleep(1.0)
    report["rss_cold_mib"] = rss_bytes(pid) / 2**20
    body = json.dumps({"prompt": list(range(100, 100 + args.input_tokens)),
                       "max_tokens": args.max_tokens, "ignore_eos": True, "temperature": 0,
                       "stream": True, "return_token_ids": True}).encode()
    if args.warmup:
        # One round first: the KV cache's pages (allocated at start-up, touched as blocks are first
        # used) and the allocator's arenas reach their working size, so that "idle" is the
        # server's steady state and the growth under load is what the connections cost.
        warm = []
        await asyncio.gather(*(stream_one(port, body, warm) for _ in range(args.concurrency)))
        report["warmup_streams_completed"] = sum(1 for r in warm if r[0] == "ok")
        await asyncio.sleep(1.0)
    report["rss_idle_mib"] = rss_bytes(pid) / 2**20
    report["threads_idle"] = num_threads(pid)
    connections = []
    t0 = time.monotonic()
    await open_idle(port, args.idle, connections)
    report["idle_open_seconds"] = time.monotonic() - t0
    await asyncio.sleep(1.0)
    report["rss_with_idle_connections_mib"] = rss_bytes(pid) / 2**20
    report["threads_with_idle_connections"] = num_threads(pid)

    peak = [rss_bytes(pid)]
    threads = [num_threads(pid)]
    stop = asyncio.Event()

    async def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], rss_bytes(pid))
            threads[0] = max(threads[0], num_threads(pid))
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    results = []
    t0 = time.monotonic()
    await asyncio.gather(*(stream_one(port, body, results) for _ in range(args.concurrency)))
    report["streams_seconds"] = time.monotonic() - t0
    stop.set()
    await sampler
    report["rss_peak_under_load_mib"] = peak[0] / 2**20
    report["threads_peak"] = threads[0]
    report["streams_completed"] = sum(1 for r in results if r[0] == "ok")
    report["streams_failed"] = sum(1 for r in results if r[0] != "ok")
    report["stream_tokens"] = sum(r[3] for r in results)
    errors = sorted({r[1] for r in results if r[0] != "ok"})
    report["errors"] = errors[:10]
    latencies = sorted(r[2] for r in results if r[0] == "ok")
    if latencies:
        report["stream_seconds_p50"] = latencies[len(latencies) // 2]
        report["stream_seconds_max"] = latencies[-1]

    # Were the idle connections kept? Each must still answer.
    alive = 0
    for reader, writer in connections:
        try:
            status, _ = await asyncio.wait_for(http_request(reader, writer, "GET", "/health"), 30)
            alive += status == 200
        except Exception:  # noqa: BLE001
            pass
        writer.close()
    report["idle_connections_still_open"] = alive
    report["rss_growth_under_load_mib"] = report["rss_peak_under_load_mib"] - report["rss_idle_mib"]
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server-bin", default="build/bin/lmserve")
    parser.add_argument("--model", required=True)
    parser.add_argument("--server-args", default="", help="more `lmserve serve` flags")
    parser.add_argument("--idle", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--input-tokens", type=int, default=16)
    parser.add_argument("--max-queued-requests", type=int, default=1000)
    parser.add_argument("--open-files", type=int, default=4096)
    parser.add_argument("--no-warmup", dest="warmup", action="store_false",
                        help="measure idle RSS before any request (the KV cache not yet touched)")
    parser.add_argument("--json", help="write the report here too")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this client's own connections
    process, port, log = start_server(args)
    try:
        report = asyncio.run(run(args, process.pid, port))
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
    report["server_exit_code"] = process.returncode
    report["server_log"] = log
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    ok = (report["streams_completed"] == args.concurrency and
          report["idle_connections_still_open"] == args.idle)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
