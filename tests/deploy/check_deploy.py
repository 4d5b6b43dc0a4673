#!/usr/bin/env python3
"""Structural and cross-reference checks of the deployment files, beyond what the Kubernetes schemas,
hadolint and promtool check one file at a time:

  Kubernetes (each rendered overlay)
    - the Prometheus Operator kinds, which the core schemas lack: ServiceMonitor and PrometheusRule,
      against the subset of their CRDs these files use (known fields and types, hand-written here);
      the PrometheusRule holds exactly the groups of deploy/prometheus/lmserve-rules.yaml
    - security: non-root pod, every container with a read-only root filesystem, no privilege
      escalation, all capabilities dropped; the only writable mounts are volumes
    - the server's flags agree with the manifests: --port / --http-port / --metrics-port with the
      container ports,
      Service target ports, ServiceMonitor port, scrape annotations; --host listens on every interface;
      --model lies on the read-only model volume
    - probes: startup and liveness through gRPC health on the gRPC port, readiness through GET
      /health on the HTTP API's port; the startup probe allows at least 5 minutes
    - shutdown: terminationGracePeriodSeconds >= preStop sleep + --grace-period-s + 10 s
    - selectors of the Services, the PodDisruptionBudget and the ServiceMonitor match the pods
    - the HorizontalPodAutoscaler targets the Deployment on the metric the Prometheus adapter's rule
      (deploy/kubernetes/prometheus-adapter/values.yaml) serves
    - the gpu overlay asks for a GPU and runs --backend=cuda on the cuda image; the cpu overlay neither
  Dockerfile: a non-root USER, a HEALTHCHECK through `lmserve-cli health`, the build through
    scripts/setup.sh and scripts/build.sh, the default command's ports equal to the manifests'
  Prometheus rules: every alert has a `promtool test rules` case where it fires and one where it does
    not; every alert has summary and description annotations and a severity
  Grafana: unique panel ids, every target on the ${datasource} variable, panels inside the 24 columns
  Metrics: every lmserve_ metric that a query uses is described in docs/deploying.md, and every metric
    described there is used by the dashboard or the rules

Usage: check_deploy.py RENDERED_GPU_YAML RENDERED_CPU_YAML [--self-test]
--self-test also breaks the inputs in known ways and requires each break to be caught.
"""

import copy
import json
import os
import re
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOSTS_ALL_INTERFACES = {"0.0.0.0", "[::]", "::"}


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def load_inputs(gpu_yaml, cpu_yaml):
    def objects(path):
        with open(path, encoding="utf-8") as f:
            return [o for o in yaml.safe_load_all(f) if o]

    return {
        "overlays": {"gpu": objects(gpu_yaml), "cpu": objects(cpu_yaml)},
        "rules": yaml.safe_load(read("deploy/prometheus/lmserve-rules.yaml")),
        "rules_test": yaml.safe_load(read("tests/deploy/prometheus/rules_test.yaml")),
        "adapter": yaml.safe_load(read("deploy/kubernetes/prometheus-adapter/values.yaml")),
        "dashboard": json.loads(read("deploy/grafana/lmserve-dashboard.json")),
        "dockerfile": read("Dockerfile"),
        "docs": read("docs/deploying.md"),
        "queries": read("deploy/promql-queries.txt").splitlines(),
    }


# ---- a small type checker for the CRD subsets ------------------------------------------------------
# A schema is a type (str, int, bool), a dict {field: schema} (no other fields allowed; a field ending
# in "!" is required), a list [schema] (a list of those), or "map" (string keys and string values).
def check_schema(value, schema, where, errors):
    if schema == "map":
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            errors.append(f"{where}: expected a map of strings")
    elif isinstance(schema, dict):
        if not isinstance(value, dict):
            errors.append(f"{where}: expected a mapping")
            return
        fields = {k.rstrip("!"): v for k, v in schema.items()}
        for key in schema:
            if key.endswith("!") and key[:-1] not in value:
                errors.append(f"{where}: {key[:-1]} is required")
        for key, item in value.items():
            if key not in fields:
                errors.append(f"{where}: unknown field {key}")
            else:
                check_schema(item, fields[key], f"{where}.{key}", errors)
    elif isinstance(schema, list):
        if not isinstance(value, list):
            errors.append(f"{where}: expected a list")
            return
        for i, item in enumerate(value):
            check_schema(item, schema[0], f"{where}[{i}]", errors)
    elif schema is int:
        if not isinstance(value, int) or isinstance(value, bool):
            errors.append(f"{where}: expected an integer")
    elif not isinstance(value, schema):
        errors.append(f"{where}: expected {schema.__name__}")


METADATA = {"name!": str, "namespace": str, "labels": "map", "annotations": "map"}
LABEL_SELECTOR = {"matchLabels": "map", "matchExpressions": [{"key!": str, "operator!": str,
                                                                 "values": [str]}]}
DURATION = str
SERVICE_MONITOR = {
    "apiVersion!": str, "kind!": str, "metadata!": METADATA,
    "spec!": {
        "selector!": LABEL_SELECTOR,
        "namespaceSelector": {"any": bool, "matchNames": [str]},
        "jobLabel": str, "targetLabels": [str], "podTargetLabels": [str],
        "endpoints!": [{
            "port": str, "targetPort": (int, str), "path": str, "scheme": str,
            "interval": DURATION, "scrapeTimeout": DURATION, "honorLabels": bool,
            "honorTimestamps": bool, "params": dict, "relabelings": [dict],
            "metricRelabelings": [dict],
        }],
    },
}
RULE = {"record": str, "alert": str, "expr!": str, "for": DURATION, "keep_firing_for": DURATION,
        "labels": "map", "annotations": "map"}
PROMETHEUS_RULE = {
    "apiVersion!": str, "kind!": str, "metadata!": METADATA,
    "spec!": {"groups!": [{"name!": str, "interval": DURATION, "limit": int,
                           "partial_response_strategy": str, "rules!": [RULE]}]},
}
DURATION_RE = re.compile(r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
                         r"(([0-9]+)s)?(([0-9]+)ms)?)$")


# ---- helpers ----------------------------------------------------------------------------------------
def by_kind(objects, kind):
    return [o for o in objects if o["kind"] == kind]


def one(objects, kind, errors, where):
    found = by_kind(objects, kind)
    if len(found) != 1:
        errors.append(f"{where}: expected one {kind}, found {len(found)}")
        return None
    return found[0]


def flags(args):
    """--name=value and --name value arguments, as a dict."""
    result, i = {}, 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):
            if "=" in arg:
                name, value = arg[2:].split("=", 1)
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                name, value = arg[2:], args[i + 1]
                i += 1
            else:
                name, value = arg[2:], ""
            result[name] = value
        i += 1
    return result


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def prestop_sleep_seconds(container):
    prestop = container.get("lifecycle", {}).get("preStop", {})
    if "sleep" in prestop:
        return int(prestop["sleep"]["seconds"])
    command = prestop.get("exec", {}).get("command", [])
    if len(command) == 2 and os.path.basename(command[0]) == "sleep":
        return int(command[1])
    return None


# ---- checks -----------------------------------------------------------------------------------------
def check_overlay(name, objects, inputs, errors):
    w = f"overlay {name}"
    deployment = one(objects, "Deployment", errors, w)
    hpa = one(objects, "HorizontalPodAutoscaler", errors, w)
    pdb = one(objects, "PodDisruptionBudget", errors, w)
    monitor = one(objects, "ServiceMonitor", errors, w)
    rule = one(objects, "PrometheusRule", errors, w)
    services = by_kind(objects, "Service")
    if not (deployment and hpa and pdb and monitor and rule and services):
        return

    check_schema(monitor, SERVICE_MONITOR, f"{w}: ServiceMonitor", errors)
    check_schema(rule, PROMETHEUS_RULE, f"{w}: PrometheusRule", errors)
    for endpoint in monitor["spec"].get("endpoints", []):
        for field in ("interval", "scrapeTimeout"):
            if field in endpoint and not DURATION_RE.match(endpoint[field]):
                errors.append(f"{w}: ServiceMonitor {field} {endpoint[field]!r} is no duration")
    if rule.get("spec", {}).get("groups") != inputs["rules"]["groups"]:
        errors.append(f"{w}: the PrometheusRule's groups differ from lmserve-rules.yaml "
                      "(run deploy/gen_prometheusrule.py)")

    template = deployment["spec"]["template"]
    pod = template["spec"]
    pod_labels = template["metadata"].get("labels", {})
    if deployment["spec"]["selector"].get("matchLabels", {}).items() - pod_labels.items():
        errors.append(f"{w}: the Deployment's selector does not match its pods")
    if "replicas" in deployment["spec"]:
        errors.append(f"{w}: Deployment sets replicas, which the HorizontalPodAutoscaler owns")

    # Security.
    pod_security = pod.get("securityContext", {})
    if pod_security.get("runAsNonRoot") is not True or pod_security.get("runAsUser", 0) == 0:
        errors.append(f"{w}: the pod must run as a non-root user (runAsNonRoot, runAsUser)")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for container in pod.get("containers", []) + pod.get("initContainers", []):
        cw = f"{w}: container {container['name']}"
        security = container.get("securityContext", {})
        if security.get("readOnlyRootFilesystem") is not True:
            errors.append(f"{cw}: readOnlyRootFilesystem must be true")
        if security.get("allowPrivilegeEscalation") is not False:
            errors.append(f"{cw}: allowPrivilegeEscalation must be false")
        if "ALL" not in security.get("capabilities", {}).get("drop", []):
            errors.append(f"{cw}: capabilities must drop ALL")
        if security.get("runAsUser") == 0 or security.get("privileged"):
            errors.append(f"{cw}: runs as root or privileged")
        for mount in container.get("volumeMounts", []):
            if mount["name"] not in volumes:
                errors.append(f"{cw}: mounts undeclared volume {mount['name']}")
        for kind in ("requests", "limits"):
            if "memory" not in container.get("resources", {}).get(kind, {}):
                errors.append(f"{cw}: no memory {kind}")

    servers = [c for c in pod["containers"] if c["name"] == "lmserve"]
    if len(servers) != 1:
        errors.append(f"{w}: no container named lmserve")
        return
    server = servers[0]
    args = server.get("args", [])
    if args[:1] != ["serve"]:
        errors.append(f"{w}: lmserve's args must start with the serve command")
    f = flags(args)
    ports = {p["name"]: p["containerPort"] for p in server.get("ports", [])}
    if set(ports) != {"grpc", "http", "metrics"}:
        errors.append(f"{w}: lmserve's ports must be named grpc, http and metrics, not "
                      f"{sorted(ports)}")
        return
    if f.get("port") != str(ports["grpc"]):
        errors.append(f"{w}: --port={f.get('port')} but the grpc containerPort is {ports['grpc']}")
    if f.get("http-port") != str(ports["http"]):
        errors.append(f"{w}: --http-port={f.get('http-port')} but the http containerPort is "
                      f"{ports['http']}")
    if f.get("metrics-port") != str(ports["metrics"]):
        errors.append(f"{w}: --metrics-port={f.get('metrics-port')} but the metrics containerPort "
                      f"is {ports['metrics']}")
    if f.get("host") not in HOSTS_ALL_INTERFACES:
        errors.append(f"{w}: --host={f.get('host')}: probes and Services reach the pod IP, so "
                      "listen on 0.0.0.0 or [::]")
    annotations = template["metadata"].get("annotations", {})
    if annotations.get("prometheus.io/port") != str(ports["metrics"]):
        errors.append(f"{w}: the prometheus.io/port annotation is not the metrics port")

    mounts = {m["mountPath"]: m for m in server.get("volumeMounts", [])}
    model = f.get("model", "")
    model_mounts = [m for path, m in mounts.items() if model.startswith(path.rstrip("/") + "/")]
    if not model_mounts:
        errors.append(f"{w}: --model={model} is on no mounted volume")
    elif not model_mounts[0].get("readOnly"):
        errors.append(f"{w}: the model volume must be mounted readOnly in the server")
    if "/tmp" not in mounts:
        errors.append(f"{w}: /tmp (HOME, the CUDA cache) must be a mounted volume")

    # Probes: startup and liveness through gRPC health, readiness through the HTTP API's /health
    # (both front ends answer from one state: 503 / NOT_SERVING while starting or draining).
    for probe in ("startupProbe", "livenessProbe"):
        spec = server.get(probe)
        if not spec or "grpc" not in spec:
            errors.append(f"{w}: {probe} must use the gRPC health protocol (grpc:)")
        elif spec["grpc"].get("port") != ports["grpc"]:
            errors.append(f"{w}: {probe} probes port {spec['grpc'].get('port')}, not the gRPC port")
    readiness = server.get("readinessProbe")
    if not readiness or "httpGet" not in readiness:
        errors.append(f"{w}: readinessProbe must GET the HTTP API's /health (httpGet:)")
    elif readiness["httpGet"].get("port") not in (ports["http"], "http"):
        errors.append(f"{w}: readinessProbe probes port {readiness['httpGet'].get('port')}, not "
                      "the HTTP API's port")
    elif readiness["httpGet"].get("path") != "/health":
        errors.append(f"{w}: readinessProbe must GET /health, not {readiness['httpGet'].get('path')}")
    startup = server.get("startupProbe", {})
    budget = startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3)
    if budget < 300:
        errors.append(f"{w}: the startup probe allows {budget} s for loading and warm-up, < 300")

    # Shutdown.
    sleep = prestop_sleep_seconds(server)
    if sleep is None:
        errors.append(f"{w}: lmserve needs a preStop sleep")
        sleep = 0
    try:
        grace = float(f["grace-period-s"])
    except (KeyError, ValueError):
        errors.append(f"{w}: lmserve's args must set --grace-period-s")
        grace = 0
    termination = pod.get("terminationGracePeriodSeconds", 30)
    if termination < sleep + grace + 10:
        errors.append(f"{w}: terminationGracePeriodSeconds {termination} < preStop sleep {sleep} + "
                      f"--grace-period-s {grace:g} + 10")

    # Services, PDB, ServiceMonitor.
    service_ports = set()
    for service in services:
        sw = f"{w}: Service {service['metadata']['name']}"
        if not matches(service["spec"].get("selector"), pod_labels):
            errors.append(f"{sw}: selector does not match the pods")
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            if target not in ports and target not in ports.values():
                errors.append(f"{sw}: targetPort {target} is no container port")
            if service["spec"].get("clusterIP") != "None":
                service_ports.add(port["name"])
            if port["name"] == "grpc" and port.get("appProtocol") not in ("kubernetes.io/h2c",
                                                                          "grpc"):
                errors.append(f"{sw}: the grpc port should declare appProtocol kubernetes.io/h2c")
    if not matches(pdb["spec"]["selector"].get("matchLabels"), pod_labels):
        errors.append(f"{w}: the PodDisruptionBudget's selector does not match the pods")
    if "minAvailable" in pdb["spec"]:
        errors.append(f"{w}: PodDisruptionBudget with minAvailable blocks drains at 1 replica")
    selected = [s for s in services
                if matches(monitor["spec"]["selector"].get("matchLabels"), s["metadata"]["labels"])]
    if not selected:
        errors.append(f"{w}: the ServiceMonitor selects no Service")
    for endpoint in monitor["spec"]["endpoints"]:
        if endpoint.get("port") not in service_ports:
            errors.append(f"{w}: the ServiceMonitor scrapes port {endpoint.get('port')!r}, which "
                          "no Service names")

    # Autoscaling.
    target = hpa["spec"]["scaleTargetRef"]
    if (target["kind"], target["name"]) != ("Deployment", deployment["metadata"]["name"]):
        errors.append(f"{w}: the HorizontalPodAutoscaler does not target the Deployment")
    if hpa["spec"].get("minReplicas", 1) > hpa["spec"]["maxReplicas"]:
        errors.append(f"{w}: minReplicas > maxReplicas")
    served = {r["name"]["as"]: r for r in inputs["adapter"]["rules"]["custom"]}
    for metric in hpa["spec"].get("metrics", []):
        if metric["type"] != "Pods":
            continue
        metric_name = metric["pods"]["metric"]["name"]
        if metric_name not in served:
            errors.append(f"{w}: HPA metric {metric_name} is served by no Prometheus adapter rule")
        elif not served[metric_name]["seriesQuery"].lstrip("'\"").startswith(metric_name):
            errors.append(f"{w}: the adapter rule for {metric_name} reads another series")
        elif "pod" not in served[metric_name]["resources"]["overrides"]:
            errors.append(f"{w}: the adapter rule for {metric_name} does not map the pod label")

    # Variants.
    image = server["image"]
    gpus = server.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
    if name == "gpu":
        if not gpus or int(gpus) < 1:
            errors.append(f"{w}: asks for no nvidia.com/gpu")
        if f.get("backend") != "cuda":
            errors.append(f"{w}: must run --backend=cuda")
        if not image.endswith(":cuda"):
            errors.append(f"{w}: image {image} is not the cuda variant")
    else:
        if gpus:
            errors.append(f"{w}: the cpu overlay asks for GPUs")
        if f.get("backend", "cpu") != "cpu":
            errors.append(f"{w}: must run the cpu backend")
        if not image.endswith(":cpu"):
            errors.append(f"{w}: image {image} is not the cpu variant")


def check_dockerfile(text, overlays, errors):
    lines = re.sub(r"\\\n", " ", text).splitlines()
    instructions = [l.strip() for l in lines if l.strip() and not l.strip().startswith("#")]
    users = [i.split(None, 1)[1] for i in instructions if i.upper().startswith("USER ")]
    if not users or users[-1].split(":")[0] in ("0", "root"):
        errors.append("Dockerfile: the last USER must be a non-root user")
    health = [i for i in instructions if i.upper().startswith("HEALTHCHECK ")]
    if len(health) != 1 or '"lmserve-cli", "health"' not in health[0].replace("/usr/local/bin/", ""):
        errors.append("Dockerfile: needs one HEALTHCHECK running `lmserve-cli health`")
    runs = " ".join(i for i in instructions if i.upper().startswith("RUN "))
    for script in ("scripts/setup.sh", "scripts/build.sh"):
        if script not in runs:
            errors.append(f"Dockerfile: the build must run {script} (the steps CI runs)")
    cmds = [json.loads(i.split(None, 1)[1]) for i in instructions if i.upper().startswith("CMD ")]
    if not cmds:
        errors.append("Dockerfile: no CMD")
    deployment = by_kind(overlays["gpu"], "Deployment")[0]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: str(p["containerPort"]) for p in container["ports"]}
    for cmd in cmds:
        f = flags(cmd)
        if (f.get("port") != ports["grpc"] or f.get("metrics-port") != ports["metrics"] or
                f.get("http-port") != ports["http"]):
            errors.append(f"Dockerfile: CMD {cmd} ports differ from the manifests' {ports}")
        if f.get("host") not in HOSTS_ALL_INTERFACES:
            errors.append(f"Dockerfile: CMD {cmd} does not listen on every interface")
        if health and f"127.0.0.1:{f.get('port')}" not in health[0]:
            errors.append("Dockerfile: the HEALTHCHECK does not probe the CMD's gRPC port")
    exposed = " ".join(i for i in instructions if i.upper().startswith("EXPOSE "))
    for port in ports.values():
        if port not in exposed.split():
            errors.append(f"Dockerfile: port {port} is not EXPOSEd")


def check_rules(rules, rules_test, errors):
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    fires, quiet = set(), set()
    for test in rules_test["tests"]:
        for case in test.get("alert_rule_test", []):
            (fires if case.get("exp_alerts") else quiet).add(case["alertname"])
    for alert in alerts:
        name = alert["alert"]
        if name not in fires:
            errors.append(f"rules: no test where {name} fires")
        if name not in quiet:
            errors.append(f"rules: no test where {name} does not fire")
        if not {"summary", "description"} <= set(alert.get("annotations", {})):
            errors.append(f"rules: {name} lacks a summary or description")
        if "severity" not in alert.get("labels", {}):
            errors.append(f"rules: {name} has no severity label")


def check_dashboard(dashboard, errors):
    ids = []

    def walk(panels):
        for panel in panels:
            yield panel
            yield from walk(panel.get("panels", []))

    for panel in walk(dashboard["panels"]):
        ids.append(panel["id"])
        grid = panel["gridPos"]
        if grid["x"] < 0 or grid["x"] + grid["w"] > 24:
            errors.append(f"dashboard: panel {panel['id']} lies outside the 24 columns")
        if panel["type"] == "row":
            continue
        if not panel.get("targets"):
            errors.append(f"dashboard: panel {panel['id']} {panel['title']!r} has no query")
        for target in panel.get("targets", []):
            if target.get("datasource", {}).get("uid") != "${datasource}":
                errors.append(f"dashboard: panel {panel['id']} target {target['refId']} is not "
                              "on the ${datasource} variable")
    if len(ids) != len(set(ids)):
        errors.append("dashboard: panel ids repeat")


METRIC_RE = re.compile(r"(?<![:\w])lmserve_[a-z0-9_]+(?![:\w])")


def metric_family(name):
    return re.sub(r"_(bucket|sum|count)$", "", name)


def check_metrics_documented(queries, docs, errors):
    used = {metric_family(m) for q in queries for m in METRIC_RE.findall(q)}
    table = [l for l in docs.splitlines() if l.startswith("| `lmserve_")]
    documented = {re.match(r"\| `(lmserve_[a-z0-9_]+)", l).group(1) for l in table}
    for metric in sorted(used - documented):
        errors.append(f"docs/deploying.md: metric {metric} is queried but not described")
    for metric in sorted(documented - used):
        errors.append(f"docs/deploying.md: metric {metric} is described but no query uses it")


def run_checks(inputs):
    errors = []
    for name, objects in inputs["overlays"].items():
        check_overlay(name, objects, inputs, errors)
    check_dockerfile(inputs["dockerfile"], inputs["overlays"], errors)
    check_rules(inputs["rules"], inputs["rules_test"], errors)
    check_dashboard(inputs["dashboard"], errors)
    check_metrics_documented(inputs["queries"], inputs["docs"], errors)
    return errors


# ---- self-test: each break must be caught, by the check meant for it ---------------------------------
def _deployment(inputs, overlay="gpu"):
    return by_kind(inputs["overlays"][overlay], "Deployment")[0]


def _server(inputs, overlay="gpu"):
    return _deployment(inputs, overlay)["spec"]["template"]["spec"]["containers"][0]


def _set_arg(inputs, name, value, overlay="gpu"):
    args = _server(inputs, overlay)["args"]
    args[:] = [a for a in args if not a.startswith(f"--{name}=")] + [f"--{name}={value}"]


# name: (a part of the error the break must cause, the break)
BREAKS = {
    "short termination grace": ('terminationGracePeriodSeconds 30 <', lambda i: _deployment(i)["spec"]["template"]["spec"].update(
        terminationGracePeriodSeconds=30)),
    "writable root filesystem": ('lmserve: readOnlyRootFilesystem', lambda i: _server(i, "cpu")["securityContext"].update(
        readOnlyRootFilesystem=False)),
    "init container as root": ('fetch-model: runs as root', lambda i: _deployment(i, "cpu")["spec"]["template"]["spec"][
        "initContainers"][0]["securityContext"].update(runAsUser=0)),
    "liveness over HTTP": ('livenessProbe must use', lambda i: _server(i).update(
        livenessProbe={"httpGet": {"port": 9400, "path": "/metrics"}})),
    "probe on the metrics port": ('readinessProbe probes port 9400', lambda i: _server(i)["readinessProbe"]["httpGet"].update(port=9400)),
    "startup probe on the metrics port": ('startupProbe probes port 9400', lambda i: _server(i)["startupProbe"]["grpc"].update(port=9400)),
    "--http-port differs from the container port": ('--http-port=9000', lambda i: _set_arg(i, "http-port", "9000")),
    "--port differs from the container port": ('--port=8000', lambda i: _set_arg(i, "port", "8000")),
    "listening on loopback": ('--host=127.0.0.1', lambda i: _set_arg(i, "host", "127.0.0.1", "cpu")),
    "gpu overlay on the cpu backend": ('must run --backend=cuda', lambda i: _set_arg(i, "backend", "cpu")),
    "HPA metric typo": ('served by no Prometheus adapter rule', lambda i: by_kind(i["overlays"]["gpu"], "HorizontalPodAutoscaler")[0][
        "spec"]["metrics"][0]["pods"]["metric"].update(name="lmserve_requests_waiting")),
    "ServiceMonitor port typo": ("scrapes port 'metric'", lambda i: by_kind(i["overlays"]["cpu"], "ServiceMonitor")[0][
        "spec"]["endpoints"][0].update(port="metric")),
    "ServiceMonitor unknown field": ('unknown field intervall', lambda i: by_kind(i["overlays"]["cpu"], "ServiceMonitor")[0][
        "spec"]["endpoints"][0].update(intervall="15s")),
    "stale PrometheusRule": ('groups differ', lambda i: by_kind(i["overlays"]["gpu"], "PrometheusRule")[0]["spec"][
        "groups"][1]["rules"].pop()),
    "Service selector typo": ('selector does not match the pods', lambda i: by_kind(i["overlays"]["gpu"], "Service")[0]["spec"][
        "selector"].update({"app.kubernetes.io/name": "lmserver"})),
    "alert without a quiet test": ('no test where LmserveErrorRateHigh does not fire', lambda i: i["rules_test"]["tests"].__setitem__(
        slice(None), [t for t in i["rules_test"]["tests"]
                      if not any(c["alertname"] == "LmserveErrorRateHigh" and not c["exp_alerts"]
                                 for c in t.get("alert_rule_test", []))])),
    "Dockerfile as root": ('last USER', lambda i: i.update(dockerfile=i["dockerfile"] + "\nUSER root\n")),
    "undocumented metric": ('lmserve_new_thing_total is queried but not described', lambda i: i["queries"].append("rate(lmserve_new_thing_total[1m])")),
    "dashboard panel off the datasource variable": ('not on the ${datasource} variable', lambda i: i["dashboard"]["panels"][1][
        "targets"][0].update(datasource={"type": "prometheus", "uid": "prom"})),
}


def self_test(inputs):
    failures = 0
    for name, (expected, brk) in BREAKS.items():
        broken = copy.deepcopy(inputs)
        brk(broken)
        if any(expected in error for error in run_checks(broken)):
            print(f"check_deploy.py: self-test: caught: {name}")
        else:
            print(f"check_deploy.py: self-test: NOT caught: {name}", file=sys.stderr)
            failures += 1
    return failures


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    inputs = load_inputs(*args)
    errors = run_checks(inputs)
    for error in errors:
        print(f"check_deploy.py: {error}", file=sys.stderr)
    if errors:
        return 1
    print("check_deploy.py: manifests, Dockerfile, rules, dashboard and docs agree")
    if "--self-test" in sys.argv and self_test(inputs):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
