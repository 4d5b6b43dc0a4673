#!/usr/bin/env python3
"""Renders a kustomization (deploy/kubernetes/overlays/*) without kustomize or kubectl.

Debian 12 packages no kustomize (and its kubectl, 1.20, embeds a kustomize too old for `patches:`), so
CI renders the overlays with this script: a small subset of kustomize, exactly the features these
kustomizations use, and an error for anything else:

  resources   files (one or more YAML documents) and directories holding a kustomization.yaml
  images      name -> newName / newTag / digest, on containers and initContainers
  patches     `path:` or inline `patch:`; a strategic merge patch (a mapping, its target named by its
              own kind and metadata.name) or a JSON 6902 patch (a list of add / replace / remove
              operations, with `target:` kind and name)

The strategic merge follows Kubernetes' rules for the fields it knows (lists of containers, volumes,
env, ... merge by their key; args, command, tolerations are replaced; null deletes a field) and
refuses the others. Where kubectl is installed, `--compare-kubectl` checks that `kubectl kustomize`
renders the same objects (CI does so when it finds kubectl).

Usage: render.py DIR [--out FILE] [--compare-kubectl]
"""

import argparse
import copy
import os
import shutil
import subprocess
import sys

import yaml

# Lists that Kubernetes' strategic merge patch merges item by item, and the key it matches items by.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "env": "name",
    "imagePullSecrets": "name",
}
# Lists that a strategic merge patch replaces whole.
REPLACED_LISTS = {"args", "command", "tolerations", "add", "drop", "finalizers"}
KNOWN_FIELDS = {"apiVersion", "kind", "resources", "images", "patches"}


class RenderError(Exception):
    pass


def load_documents(path):
    with open(path, encoding="utf-8") as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def strategic_merge(base, patch, where):
    for key, value in patch.items():
        if key.startswith("$"):
            raise RenderError(f"{where}: directive {key} is not supported")
        if value is None:
            base.pop(key, None)
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            strategic_merge(base[key], value, f"{where}.{key}")
        elif isinstance(value, list) and key in base:
            if key in MERGE_KEYS:
                merge_key = MERGE_KEYS[key]
                for item in value:
                    match = [b for b in base[key] if b.get(merge_key) == item.get(merge_key)]
                    if match:
                        strategic_merge(match[0], item, f"{where}.{key}[{item.get(merge_key)}]")
                    else:
                        base[key].append(copy.deepcopy(item))
            elif key in REPLACED_LISTS:
                base[key] = copy.deepcopy(value)
            else:
                raise RenderError(f"{where}.{key}: render.py does not know how Kubernetes merges "
                                  "this list; add it to MERGE_KEYS or REPLACED_LISTS")
        else:
            base[key] = copy.deepcopy(value)


def json_pointer(doc, path, where):
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]
    parent = doc
    for part in parts[:-1]:
        parent = parent[int(part)] if isinstance(parent, list) else parent[part]
    if not parts:
        raise RenderError(f"{where}: empty path")
    return parent, parts[-1]


def json_patch(doc, operations, where):
    for op in operations:
        parent, last = json_pointer(doc, op["path"], where)
        kind = op["op"]
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if kind == "add":
                parent.insert(index, copy.deepcopy(op["value"]))
            elif kind == "replace":
                parent[index] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del parent[index]
            else:
                raise RenderError(f"{where}: op {kind} is not supported")
        else:
            if kind in ("add", "replace"):
                if kind == "replace" and last not in parent:
                    raise RenderError(f"{where}: replace of missing {op['path']}")
                parent[last] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del parent[last]
            else:
                raise RenderError(f"{where}: op {kind} is not supported")


def find(objects, kind, name, where):
    found = [o for o in objects if o.get("kind") == kind and o["metadata"]["name"] == name]
    if len(found) != 1:
        raise RenderError(f"{where}: patch target {kind}/{name} matches {len(found)} objects")
    return found[0]


def set_images(objects, images):
    for obj in objects:
        pod = obj.get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []) + pod.get("initContainers", []):
            image = container["image"]
            name = image.split("@")[0]
            if ":" in name.rsplit("/", 1)[-1]:
                name = name.rsplit(":", 1)[0]
            for rule in images:
                if rule["name"] != name:
                    continue
                unknown = set(rule) - {"name", "newName", "newTag", "digest"}
                if unknown:
                    raise RenderError(f"images: {sorted(unknown)} not supported")
                new = rule.get("newName", name)
                if "digest" in rule:
                    new += "@" + rule["digest"]
                elif "newTag" in rule:
                    new += ":" + str(rule["newTag"])
                else:
                    tag = image[len(name):]
                    new += tag
                container["image"] = new


def render(directory):
    kustomization_path = os.path.join(directory, "kustomization.yaml")
    with open(kustomization_path, encoding="utf-8") as f:
        kustomization = yaml.safe_load(f)
    unknown = set(kustomization) - KNOWN_FIELDS
    if unknown:
        raise RenderError(f"{kustomization_path}: fields {sorted(unknown)} are not supported")
    objects = []
    for resource in kustomization.get("resources", []):
        path = os.path.join(directory, resource)
        objects += render(path) if os.path.isdir(path) else load_documents(path)
    for i, entry in enumerate(kustomization.get("patches", [])):
        where = f"{kustomization_path}: patches[{i}]"
        if "path" in entry:
            documents = load_documents(os.path.join(directory, entry["path"]))
        else:
            documents = [yaml.safe_load(entry["patch"])]
        target = entry.get("target")
        for patch in documents:
            if isinstance(patch, list):
                if not target:
                    raise RenderError(f"{where}: a JSON 6902 patch needs a target")
                json_patch(find(objects, target["kind"], target["name"], where), patch, where)
            else:
                kind = target["kind"] if target else patch["kind"]
                name = target["name"] if target else patch["metadata"]["name"]
                strategic_merge(find(objects, kind, name, where), patch, where)
    set_images(objects, kustomization.get("images", []))
    return objects


def key(obj):
    return (obj["apiVersion"], obj["kind"], obj["metadata"]["name"])


def compare_with_kubectl(directory, objects):
    kubectl = shutil.which("kubectl")
    if not kubectl:
        print("render.py: no kubectl here; the rendering is not compared with kustomize's")
        return True
    result = subprocess.run([kubectl, "kustomize", directory], capture_output=True, text=True)
    if result.returncode != 0:
        print(f"render.py: kubectl kustomize {directory} failed:\n{result.stderr}", file=sys.stderr)
        return False
    theirs = {key(o): o for o in yaml.safe_load_all(result.stdout) if o}
    ours = {key(o): o for o in objects}
    if theirs == ours:
        print(f"render.py: {directory}: same {len(ours)} objects as `kubectl kustomize`")
        return True
    for k in sorted(set(theirs) | set(ours)):
        if theirs.get(k) != ours.get(k):
            print(f"render.py: {directory}: {k} differs from `kubectl kustomize`:\n"
                  f"--- ours\n{yaml.safe_dump(ours.get(k))}\n--- kubectl\n"
                  f"{yaml.safe_dump(theirs.get(k))}", file=sys.stderr)
    return False


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--out", help="write the YAML here (default: stdout)")
    parser.add_argument("--compare-kubectl", action="store_true",
                        help="check that `kubectl kustomize` renders the same, where kubectl exists")
    args = parser.parse_args()
    try:
        objects = render(args.directory)
    except (RenderError, KeyError, ValueError, IndexError, OSError) as e:
        print(f"render.py: {e}", file=sys.stderr)
        return 1
    text = yaml.safe_dump_all(objects, sort_keys=False, width=100)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    if args.compare_kubectl and not compare_with_kubectl(args.directory, objects):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
