"""A minimal kustomize, for the features deploy/kubernetes/ uses and no others.

No kustomize is packaged for Debian or PyPI (Debian's kubernetes-client is kubectl 1.20 with a
kustomize too old for `replicas:` and path-only `patches:`), so the tests render overlays with
this: `resources` (files and directories), `namespace`, `images` (newName/newTag), `replicas`
and `patches` given by `path` (strategic-merge patches, target named by the patch's kind and
name; lists of named items merge by `name`, other lists are replaced). Any other kustomization
key fails loudly, so a manifest change that needs more cannot pass unchecked. Where a
`kubectl` with kustomize is installed, test_kubernetes.py checks this agrees with it.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "namespace", "images", "replicas", "patches"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}

Resource = dict[str, Any]


def _key(r: Resource) -> tuple[str, str]:
    return r["kind"], r["metadata"]["name"]


def _load(path: Path) -> list[Resource]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _merge(base: Any, patch: Any) -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = _merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    if (
        isinstance(base, list)
        and isinstance(patch, list)
        and all(isinstance(i, dict) and "name" in i for i in [*base, *patch])
    ):
        by_name = {i["name"]: i for i in base}
        merged = [_merge(i, p) if (p := _find(patch, i["name"])) else i for i in base]
        return merged + [copy.deepcopy(p) for p in patch if p["name"] not in by_name]
    return copy.deepcopy(patch)


def _find(items: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    return next((i for i in items if i["name"] == name), None)


def _pod_spec(r: Resource) -> dict[str, Any] | None:
    if r["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return r["spec"]["template"]["spec"]
    return None


def _split_image(image: str) -> str:
    name = image.split("@", 1)[0]
    if ":" in name.rsplit("/", 1)[-1]:
        name = name.rsplit(":", 1)[0]
    return name


def build(directory: Path) -> list[Resource]:
    """The resources `kustomize build directory` would print (order: as listed)."""
    kust = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kust) - SUPPORTED
    assert not unknown, f"{directory}: this test renderer does not implement {sorted(unknown)}"
    resources: list[Resource] = []
    for entry in kust.get("resources", []):
        path = (directory / entry).resolve()
        resources += build(path) if path.is_dir() else _load(path)
    keys = [_key(r) for r in resources]
    assert len(set(keys)) == len(keys), f"{directory}: a resource appears twice"

    for patch_ref in kust.get("patches", []):
        assert set(patch_ref) == {"path"}, "only path-based strategic-merge patches"
        for patch in _load(directory / patch_ref["path"]):
            i = keys.index(_key(patch))  # ValueError: the patch names no resource
            resources[i] = _merge(resources[i], patch)

    for rep in kust.get("replicas", []):
        hits = [
            r
            for r in resources
            if r["metadata"]["name"] == rep["name"] and "replicas" in r.get("spec", {})
        ]
        assert hits, f"replicas: no workload {rep['name']}"
        for r in hits:
            r["spec"]["replicas"] = rep["count"]

    for img in kust.get("images", []):
        assert set(img) <= {"name", "newName", "newTag"} and "newTag" in img
        for r in resources:
            pod = _pod_spec(r)
            for c in (pod or {}).get("containers", []) + (pod or {}).get("initContainers", []):
                if _split_image(c["image"]) == img["name"]:
                    c["image"] = f"{img.get('newName', img['name'])}:{img['newTag']}"

    if ns := kust.get("namespace"):
        for r in resources:
            if r["kind"] not in CLUSTER_SCOPED:
                r["metadata"]["namespace"] = ns
    return resources
