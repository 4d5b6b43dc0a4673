#!/usr/bin/env python3
"""A stand-in for lmserve's /metrics: every metric of docs/deploying.md's table, with the type and
labels the table gives, moving as under a steady load. For scripts/ci-deploy-checks.sh, which points
a real Prometheus at it with the rules loaded and runs tests/deploy/query_prometheus.py: the queries
are checked against a real Prometheus without building the server. (The server's own metrics test
does the same against the real server.)

Usage: fake_exporter.py PORTFILE   (listens on a free loopback port, writes it to PORTFILE; stops
by itself after 120 s)
"""

import http.server
import os
import re
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
START = time.monotonic()
MODEL = 'model_name="demo"'
# Labels beyond model_name, as the metric table describes them.
EXTRA_LABELS = {
    "lmserve_request_success_total": [f'finished_reason="{r}"' for r in
                                      ("stop", "length", "abort", "error")],
    "lmserve_grpc_server_handled_total": ['grpc_method="Complete",grpc_code="OK"',
                                          'grpc_method="Complete",grpc_code="INVALID_ARGUMENT"'],
    "lmserve_http_requests_total": ['route="/v1/completions",code="200"',
                                    'route="/v1/chat/completions",code="400"'],
    "lmserve_time_to_first_token_seconds": ['front_end="grpc"', 'front_end="http"'],
    "lmserve_engine_step_phase_seconds_total": [f'phase="{p}"' for p in
                                                ("prepare", "launch", "finish", "process")],
}
BUCKETS = [0.01, 0.1, 1, 10, 100, 1000]


def metrics_from_docs():
    with open(os.path.join(ROOT, "docs", "deploying.md"), encoding="utf-8") as f:
        rows = re.findall(r"^\| `(lmserve_[a-z0-9_]+)` \| (histogram|counter|gauge) \|", f.read(),
                          re.MULTILINE)
    if len(rows) < 10:
        sys.exit("fake_exporter: no metric table in docs/deploying.md")
    return rows


def render(metrics):
    t = time.monotonic() - START
    lines = []
    for name, kind in metrics:
        lines.append(f"# TYPE {name} {kind}")
        for extra in EXTRA_LABELS.get(name, [""]):
            labels = MODEL + ("," + extra if extra else "")
            if kind == "gauge":
                lines.append(f"{name}{{{labels}}} 0.5")
            elif kind == "counter":
                lines.append(f"{name}{{{labels}}} {int(7 * t)}")
            else:
                count = int(5 * t)  # observations of 0.5 (seconds or tokens)
                for le in BUCKETS:
                    lines.append(f'{name}_bucket{{{labels},le="{le}"}} {count if le >= 0.5 else 0}')
                lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {count}')
                lines.append(f"{name}_sum{{{labels}}} {0.5 * count}")
                lines.append(f"{name}_count{{{labels}}} {count}")
    return ("\n".join(lines) + "\n").encode()


def main():
    metrics = metrics_from_docs()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = render(metrics)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    with open(sys.argv[1] + ".tmp", "w", encoding="utf-8") as f:
        f.write(str(server.server_address[1]))
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    threading.Timer(120, server.shutdown).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
