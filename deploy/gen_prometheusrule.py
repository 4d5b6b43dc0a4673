#!/usr/bin/env python3
"""Writes deploy/kubernetes/base/prometheusrule.yaml, the Prometheus Operator's PrometheusRule holding
the groups of deploy/prometheus/lmserve-rules.yaml (one source for both ways of loading the rules).
With --check, writes nothing and fails if the committed file differs (CI runs it so)."""

import argparse
import os
import sys

import yaml

ROOT = os.path.dirname(os.path.abspath(__file__))
RULES = os.path.join(ROOT, "prometheus", "lmserve-rules.yaml")
OUT = os.path.join(ROOT, "kubernetes", "base", "prometheusrule.yaml")
HEADER = """\
# GENERATED from deploy/prometheus/lmserve-rules.yaml by deploy/gen_prometheusrule.py: edit the rules
# there and rerun it (CI fails when this file is stale). The Prometheus Operator loads PrometheusRules
# that its Prometheus' ruleSelector matches: add the labels yours selects (e.g. `release: ...`).
"""


class LiteralDumper(yaml.SafeDumper):
    pass


def _str(dumper, value):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


LiteralDumper.add_representer(str, _str)


def generate():
    with open(RULES, encoding="utf-8") as f:
        rules = yaml.safe_load(f)
    doc = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "lmserve",
            "labels": {"app.kubernetes.io/name": "lmserve", "app.kubernetes.io/component": "server"},
        },
        "spec": {"groups": rules["groups"]},
    }
    return HEADER + yaml.dump(doc, Dumper=LiteralDumper, sort_keys=False, width=100)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = generate()
    if args.check:
        with open(OUT, encoding="utf-8") as f:
            if f.read() != text:
                print(f"gen_prometheusrule.py: {OUT} is stale: run deploy/gen_prometheusrule.py",
                      file=sys.stderr)
                return 1
        print("gen_prometheusrule.py: prometheusrule.yaml matches the rules file")
        return 0
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
