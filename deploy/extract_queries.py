#!/usr/bin/env python3
"""Lists every PromQL expression that the deployment depends on, one per line, ready to run against
a Prometheus that scrapes lmserve and loads deploy/prometheus/lmserve-rules.yaml:

  - each target of the Grafana dashboards (deploy/grafana/*.json), and the series behind each
    `label_values(...)` template variable, with the dashboard variables filled in: $__rate_interval,
    $__interval -> 1m, $__range -> 5m, every other variable -> .* (its "All" value);
  - each recording rule's expression (deploy/prometheus/*.yaml);
  - each alert's value: its expression without the final comparison with a threshold (`X > 2` gives
    `X`), since the alert itself returns data only while it fires. Alert expressions must have that
    form (one comparison at the top, a number on its right); this script fails on any other;
  - the Prometheus adapter's metrics query (deploy/kubernetes/prometheus-adapter/values.yaml) for the
    HorizontalPodAutoscaler's metric, with no label matchers, grouped by pod.

The list is committed as deploy/promql-queries.txt (--check: fail if it is stale; CI runs that), so a
test needs no Python to read it. --with-source prefixes each line with where it comes from and a tab.
Whitespace is collapsed: each query is one line. Duplicates are listed once.
"""

import argparse
import glob
import json
import os
import re
import sys

import yaml

ROOT = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(ROOT, "promql-queries.txt")
INTERVALS = {"__rate_interval": "1m", "__interval": "1m", "__range": "5m"}
COMPARISONS = ("==", "!=", ">=", "<=", ">", "<")


class ExtractError(Exception):
    pass


def one_line(expr):
    """Collapses whitespace outside string literals."""
    out, i, quote = [], 0, None
    while i < len(expr):
        c = expr[i]
        if quote:
            out.append(c)
            if c == "\\" and quote != "`":
                out.append(expr[i + 1])
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"'`":
            quote = c
            out.append(c)
        elif c.isspace():
            if out and out[-1] != " ":
                out.append(" ")
        else:
            out.append(c)
        i += 1
    return "".join(out).strip()


def fill_variables(expr, where):
    def sub(match):
        name = match.group(1) or match.group(2)
        return INTERVALS.get(name, ".*")

    filled = re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", sub, expr)
    if "$" in filled:
        raise ExtractError(f"{where}: a variable is left in {filled!r}")
    return filled


def top_level_comparisons(expr):
    """(position, operator) of each comparison outside brackets and strings."""
    found, depth, quote, i = [], 0, None, 0
    while i < len(expr):
        c = expr[i]
        if quote:
            if c == "\\" and quote != "`":
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"'`":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0:
            for op in COMPARISONS:
                if expr.startswith(op, i):
                    found.append((i, op))
                    i += len(op) - 1
                    break
        i += 1
    return found


def alert_value(expr, where):
    expr = one_line(expr)
    comparisons = top_level_comparisons(expr)
    if re.search(r"\b(and|or|unless)\b", re.sub(r'"[^"]*"', "", expr)) and len(comparisons) != 1:
        raise ExtractError(f"{where}: write the alert as `value > threshold`: {expr!r}")
    if len(comparisons) != 1:
        raise ExtractError(f"{where}: expected one top-level comparison in {expr!r}")
    position, op = comparisons[0]
    rhs = expr[position + len(op):].strip()
    if rhs.startswith("bool "):
        rhs = rhs[5:].strip()
    try:
        float(rhs)
    except ValueError as e:
        raise ExtractError(f"{where}: the threshold {rhs!r} is not a number") from e
    return expr[:position].strip()


def walk_panels(panels):
    for panel in panels:
        yield panel
        yield from walk_panels(panel.get("panels", []))


def dashboard_queries(path):
    with open(path, encoding="utf-8") as f:
        dashboard = json.load(f)
    name = os.path.relpath(path, os.path.dirname(ROOT))
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable["query"]
        query = query.get("query", "") if isinstance(query, dict) else query
        match = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", query)
        if not match:
            raise ExtractError(f"{name}: variable {variable['name']}: not label_values(...)")
        where = f"{name}:variable {variable['name']}"
        yield where, fill_variables(one_line(match.group(1)), where)
    for panel in walk_panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            where = f"{name}:panel {panel['id']} {panel['title']!r} {target['refId']}"
            if not target.get("expr"):
                raise ExtractError(f"{where}: no expr")
            yield where, fill_variables(one_line(target["expr"]), where)


def rule_queries(path):
    with open(path, encoding="utf-8") as f:
        rules = yaml.safe_load(f)
    name = os.path.relpath(path, os.path.dirname(ROOT))
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                yield f"{name}:{group['name']}:{rule['record']}", one_line(rule["expr"])
            else:
                where = f"{name}:{group['name']}:{rule['alert']}"
                yield where, alert_value(rule["expr"], where)


def adapter_queries(path):
    with open(path, encoding="utf-8") as f:
        values = yaml.safe_load(f)
    name = os.path.relpath(path, os.path.dirname(ROOT))
    for rule in values["rules"]["custom"]:
        series = re.match(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)", rule["seriesQuery"]).group(1)
        query = (rule["metricsQuery"].replace("<<.Series>>", series)
                 .replace("<<.LabelMatchers>>", "").replace("<<.GroupBy>>", "pod")
                 .replace("{}", ""))
        if "<<" in query:
            raise ExtractError(f"{name}: template left in {query!r}")
        yield f"{name}:{rule['name']['as']}", one_line(query)


def all_queries():
    sources = []
    for path in sorted(glob.glob(os.path.join(ROOT, "grafana", "*.json"))):
        sources += dashboard_queries(path)
    for path in sorted(glob.glob(os.path.join(ROOT, "prometheus", "*rules.yaml"))):
        sources += rule_queries(path)
    sources += adapter_queries(os.path.join(ROOT, "kubernetes", "prometheus-adapter", "values.yaml"))
    seen, unique = set(), []
    for where, query in sources:
        if query not in seen:
            seen.add(query)
            unique.append((where, query))
    return unique


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help=f"fail if {os.path.basename(OUT)} is not what this script writes")
    parser.add_argument("--write", action="store_true", help=f"write {os.path.basename(OUT)}")
    parser.add_argument("--with-source", action="store_true",
                        help="print SOURCE<TAB>QUERY lines instead")
    args = parser.parse_args()
    try:
        queries = all_queries()
    except (ExtractError, KeyError, ValueError, OSError) as e:
        print(f"extract_queries.py: {e}", file=sys.stderr)
        return 1
    text = "".join(f"{q}\n" for _, q in queries)
    if args.check:
        with open(OUT, encoding="utf-8") as f:
            if f.read() != text:
                print(f"extract_queries.py: {OUT} is stale: run deploy/extract_queries.py --write",
                      file=sys.stderr)
                return 1
        print(f"extract_queries.py: {os.path.basename(OUT)} is current ({len(queries)} queries)")
    elif args.write:
        with open(OUT, "w", encoding="utf-8") as f:
            f.write(text)
    elif args.with_source:
        sys.stdout.write("".join(f"{w}\t{q}\n" for w, q in queries))
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
