#!/usr/bin/env python3
"""Asserts that every PromQL expression of deploy/promql-queries.txt returns data from a running
Prometheus: for the server's metrics test, which runs a real Prometheus against a real lmserve under
load. Python's standard library only.

The Prometheus must scrape lmserve and load deploy/prometheus/lmserve-rules.yaml (`rule_files:`):
some lines are recorded series. Run this while the load runs or within ~30 s after it (the dashboard's
rates look 1 minute back). This script first waits until every target has been scraped twice and every
rule group evaluated after that, so rates and recorded series exist.

  query_prometheus.py --url http://127.0.0.1:9090 [--queries deploy/promql-queries.txt]
                      [--timeout 60] [--strict-nan]

A query passes when Prometheus answers `success` with a non-empty result. A NaN value (a quantile or
a ratio over a window with no observations) counts as data unless --strict-nan. Prints one line per
failure and closes with `N passed, M failed`; exits 1 if any failed.
"""

import argparse
import datetime
import json
import re
import math
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def api(url, path, **params):
    query = urllib.parse.urlencode(params)
    with urllib.request.urlopen(f"{url}{path}?{query}", timeout=10) as response:
        return json.load(response)


def timestamp(text):
    """Prometheus' RFC 3339 times (nanoseconds, Z or an offset) as seconds since the epoch."""
    match = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text)
    if not match:
        raise ValueError(f"not a time: {text!r}")
    zone = "+00:00" if match.group(3) == "Z" else match.group(3)
    base = datetime.datetime.fromisoformat(match.group(1) + zone).timestamp()
    return base + float("0." + (match.group(2) or "0"))


def wait_for_rules(url, timeout):
    """Waits until the targets have been scraped twice (rate() needs two samples) and every rule
    group has been evaluated after that. Returns None when ready, else why not."""
    deadline = time.monotonic() + timeout
    first_scrape = second_scrape = None
    while True:
        try:
            targets = api(url, "/api/v1/targets")["data"]["activeTargets"]
            scraped = [timestamp(t["lastScrape"]) for t in targets if t["health"] == "up"]
            if scraped and len(scraped) == len(targets):
                if first_scrape is None:
                    first_scrape = max(scraped)
                elif second_scrape is None and min(scraped) > first_scrape:
                    second_scrape = max(scraped)
            groups = api(url, "/api/v1/rules")["data"]["groups"]
            evaluated = [timestamp(g["lastEvaluation"]) for g in groups]
            if second_scrape is not None and groups and min(evaluated) > second_scrape:
                return None
            reason = (f"targets up: {len(scraped)} of {len(targets)}, scraped twice: "
                      f"{second_scrape is not None}, rule groups: {len(groups)}")
        except (urllib.error.URLError, OSError, KeyError, ValueError) as e:
            reason = str(e)
        if time.monotonic() > deadline:
            return reason
        time.sleep(0.25)


def value_of(sample):
    return float(sample["value"][1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the Prometheus, e.g. http://127.0.0.1:9090")
    parser.add_argument("--queries", default=os.path.join(REPO, "deploy", "promql-queries.txt"))
    parser.add_argument("--timeout", type=float, default=60,
                        help="seconds to wait for the first scrape and rule evaluation")
    parser.add_argument("--strict-nan", action="store_true", help="a NaN result fails")
    args = parser.parse_args()
    url = args.url.rstrip("/")

    not_ready = wait_for_rules(url, args.timeout)
    if not_ready:
        print(f"query_prometheus: Prometheus at {url} not ready after {args.timeout:g} s: "
              f"{not_ready}")
        print("0 passed, 1 failed")
        return 1

    with open(args.queries, encoding="utf-8") as f:
        queries = [line.strip() for line in f if line.strip()]
    passed = failed = 0
    for query in queries:
        try:
            answer = api(url, "/api/v1/query", query=query)
        except urllib.error.HTTPError as e:
            answer = json.load(e)
        except (urllib.error.URLError, OSError) as e:
            answer = {"status": "error", "error": str(e)}
        result = answer.get("data", {}).get("result", [])
        if answer.get("status") != "success":
            problem = f"error: {answer.get('error')}"
        elif not result:
            problem = "no data"
        elif answer["data"]["resultType"] == "vector" and args.strict_nan and all(
                math.isnan(value_of(s)) for s in result):
            problem = "only NaN"
        else:
            problem = None
        if problem:
            failed += 1
            print(f"query_prometheus: FAIL ({problem}): {query}")
        else:
            passed += 1
    print(f"query_prometheus: {len(queries)} queries against {url}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
