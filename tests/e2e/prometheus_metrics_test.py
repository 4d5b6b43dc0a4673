#!/usr/bin/env python3
"""A real Prometheus (Debian's `prometheus`) scrapes `lmserve serve`'s /metrics; its HTTP API must
then agree with what the clients saw: the TTFT histogram counts the requests sent, and
generation_tokens_total the tokens streamed.

Every query in QUERIES_WITH_DATA must return data, and so must every query of the Grafana dashboard and
every recording and alert rule expression (deploy/promql-queries.txt, checked by
tests/deploy/query_prometheus.py with the rules of deploy/prometheus/lmserve-rules.yaml loaded).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_util  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# PromQL that must return at least one series once the test's requests have been scraped.
QUERIES_WITH_DATA = [
    'lmserve_time_to_first_token_seconds_count{model_name="llama-gqa"}',
    "histogram_quantile(0.9, sum by (le) (rate(lmserve_time_to_first_token_seconds_bucket[1m])))",
    "histogram_quantile(0.5, sum by (le) (rate(lmserve_inter_token_latency_seconds_bucket[1m])))",
    "histogram_quantile(0.9, sum by (le) (rate(lmserve_e2e_request_latency_seconds_bucket[1m])))",
    "sum(rate(lmserve_request_queue_time_seconds_sum[1m]))",
    "sum(rate(lmserve_request_prefill_time_seconds_count[1m]))",
    "sum(rate(lmserve_request_decode_time_seconds_count[1m]))",
    "rate(lmserve_generation_tokens_total[1m])",
    "rate(lmserve_prompt_tokens_total[1m])",
    "lmserve_num_requests_running",
    "lmserve_num_requests_waiting",
    "lmserve_kv_cache_usage_perc",
    "lmserve_prefix_cache_queries_total",
    "lmserve_prefix_cache_hits_total",
    "lmserve_num_preemptions_total",
    'lmserve_request_success_total{finished_reason="length"}',
    "lmserve_request_prompt_tokens_count",
    "lmserve_request_generation_tokens_sum",
    "lmserve_iteration_tokens_total_count",
    "histogram_quantile(0.99, sum by (le) (rate(lmserve_engine_step_duration_seconds_bucket[1m])))",
    'lmserve_engine_step_phase_seconds_total{phase="process"}',
    'lmserve_grpc_server_handled_total{grpc_method="CompleteStream",grpc_code="OK"}',
    'lmserve_grpc_server_handled_total{grpc_code="INVALID_ARGUMENT"}',
]


def query(prometheus_port, promql):
    url = (f"http://127.0.0.1:{prometheus_port}/api/v1/query?"
           + urllib.parse.urlencode({"query": promql}))
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    if body.get("status") != "success":
        raise RuntimeError(f"{promql}: {body}")
    return body["data"]["result"]


def scalar(prometheus_port, promql):
    result = query(prometheus_port, promql)
    return float(result[0]["value"][1]) if result else None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--fixtures-dir", required=True)
    args = parser.parse_args()
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        print("FAIL: the prometheus binary is missing (scripts/setup.sh installs it)")
        return 1

    server = e2e_util.Server(args.build_dir, ["--model", e2e_util.fixture_model(args.fixtures_dir),
                                              "--kv-cache-mb", "16", "--metrics-port", "0",
                                              "--http-port", "0"])
    storage = tempfile.mkdtemp(prefix="lmserve-prometheus-")
    prometheus_port = e2e_util.free_port()
    config_path = os.path.join(storage, "prometheus.yml")
    with open(config_path, "w", encoding="utf-8") as f:
        f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                f"rule_files:\n  - {os.path.join(REPO, 'deploy', 'prometheus', 'lmserve-rules.yaml')}\n"
                "scrape_configs:\n  - job_name: lmserve\n    static_configs:\n"
                f"      - targets: ['127.0.0.1:{server.metrics_port}']\n")
    prom_log_path = os.path.join(storage, "prometheus.log")
    with open(prom_log_path, "w", encoding="utf-8") as prom_log:
        prom = subprocess.Popen(
            [prometheus, f"--config.file={config_path}", f"--storage.tsdb.path={storage}/data",
             f"--web.listen-address=127.0.0.1:{prometheus_port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=prom_log)

    def check_alive():
        """Raises at once, with the log of the process, when Prometheus or the server exited."""
        if prom.poll() is not None:
            with open(prom_log_path, encoding="utf-8", errors="replace") as f:
                raise RuntimeError(f"Prometheus exited with code {prom.returncode}; its log:\n"
                                   + f.read())
        exit_description = server.exit_description()
        if exit_description is not None:
            raise e2e_util.ServerExited(f"the server {exit_description}; its log:\n"
                                        + server.log())

    failures = []
    try:
        # Rates need an increase between two scrapes: let Prometheus scrape the idle server first.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            check_alive()
            try:
                if scalar(prometheus_port, 'up{job="lmserve"}') == 1:
                    break
            except OSError:
                pass  # Prometheus is still starting
            time.sleep(0.5)
        else:
            failures.append("Prometheus never scraped the server")
        # Requests: streamed, counting the tokens the client receives.
        num_requests = 6  # over gRPC; every other one over HTTP too
        num_http_requests = 3
        streamed_tokens = 0
        for i in range(num_requests):
            if i == 1:
                # Counter series appear with their first request: let Prometheus see them once
                # before the rest, so that their rates over the load are not zero.
                time.sleep(2.5)
            code, out = server.cli("complete", "--ids", f"{1 + i},{20 + i},7", "--max-tokens",
                                   str(5 + 3 * i), "--temperature", "0", "--ignore-eos", "--json")
            if code != 0:
                raise RuntimeError(f"lmserve-cli failed ({code}): {out}")
            for line in out.splitlines():
                streamed_tokens += len(json.loads(line).get("token_ids", []))
            if i % 2 == 0:  # the OpenAI-compatible HTTP API too (front_end="http")
                body = json.dumps({"prompt": [2 + i, 30 + i, 7], "max_tokens": 4 + i,
                                   "temperature": 0, "ignore_eos": True}).encode()
                with urllib.request.urlopen(urllib.request.Request(
                        f"http://127.0.0.1:{server.http_port}/v1/completions", data=body,
                        headers={"Content-Type": "application/json"}), timeout=60) as response:
                    streamed_tokens += json.loads(response.read())["usage"]["completion_tokens"]
        code, _ = server.cli("complete", "--ids", "1", "--max-tokens", "0")  # INVALID_ARGUMENT
        if code != 1:
            failures.append(f"a bad request exited {code}, not 1")

        # Wait (bounded) until Prometheus has scraped the final values.
        ttft = generated = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            check_alive()
            try:
                ttft = scalar(prometheus_port, "sum(lmserve_time_to_first_token_seconds_count)")
                generated = scalar(prometheus_port, "sum(lmserve_generation_tokens_total)")
                errors = scalar(prometheus_port,
                                'sum(lmserve_grpc_server_handled_total{grpc_code="INVALID_ARGUMENT"})')
            except OSError:
                ttft = generated = errors = None  # Prometheus is still starting
            if (ttft == num_requests + num_http_requests and generated == streamed_tokens
                    and errors == 1):
                break
            time.sleep(0.5)
        if ttft != num_requests + num_http_requests:
            failures.append(f"TTFT histogram count {ttft}, want {num_requests + num_http_requests} "
                            "(requests sent)")
        if generated != streamed_tokens:
            failures.append(f"generation_tokens_total {generated}, want {streamed_tokens} "
                            "(tokens streamed)")
        http_ttft = scalar(prometheus_port,
                           'sum(lmserve_time_to_first_token_seconds_count{front_end="http"})')
        http_ok = scalar(prometheus_port,
                         'sum(lmserve_http_requests_total{route="/v1/completions",code="200"})')
        if http_ttft != num_http_requests or http_ok != num_http_requests:
            failures.append(f"HTTP requests: TTFT count {http_ttft} (front_end=\"http\"), "
                            f"{http_ok} answered 200; want {num_http_requests} each")
        # rate() needs two scrapes after the requests.
        time.sleep(2.5)
        for promql in QUERIES_WITH_DATA:
            try:
                if not query(prometheus_port, promql):
                    failures.append(f"no data: {promql}")
            except (OSError, RuntimeError) as e:
                failures.append(f"query failed: {promql}: {e}")
        # A step's phases up to its end make up its duration (the rest is the masks, none here,
        # and a check of the output); both come from the same engine snapshots.
        phases = scalar(prometheus_port,
                        'sum(lmserve_engine_step_phase_seconds_total{phase!="process"})')
        step_seconds = scalar(prometheus_port, "sum(lmserve_engine_step_duration_seconds_sum)")
        if (phases is None or step_seconds is None
                or not 0.8 * step_seconds <= phases <= 1.0001 * step_seconds + 1e-6):
            failures.append(f"step phases before the step's end sum to {phases} s, the step "
                            f"duration histogram to {step_seconds} s")
        # The dashboard's queries and the rules' expressions, NaN not counted as data.
        checker = subprocess.run(
            [sys.executable, os.path.join(REPO, "tests", "deploy", "query_prometheus.py"),
             "--url", f"http://127.0.0.1:{prometheus_port}", "--strict-nan", "--timeout", "60"],
            capture_output=True, text=True, timeout=120)
        print(checker.stdout.replace(" passed, ", " dashboard/rule queries passed, "), end="")
        if checker.returncode != 0:
            failures.append(f"dashboard/rule queries: {checker.stdout[-2000:]}{checker.stderr[-500:]}")
    finally:
        prom.terminate()
        try:
            prom.wait(timeout=30)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()
        server.stop()
        shutil.rmtree(storage, ignore_errors=True)
    checks = 2 + len(QUERIES_WITH_DATA)
    for failure in failures:
        print("FAIL:", failure)
    print(f"{checks - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
