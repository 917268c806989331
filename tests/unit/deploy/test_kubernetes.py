"""deploy/kubernetes/: the base and the example overlay, offline.

Built-in kinds are validated with kubernetes-validate (strict: unknown fields fail) against a
fixed Kubernetes version; the overlay is rendered by tests/unit/deploy/kustomize.py (and
compared with `kubectl kustomize` where one is installed). The Prometheus Operator's CRDs
(ServiceMonitor, PrometheusRule), which kubernetes-validate has no schema for, get structural
checks. The gateway YAML in every ConfigMap is loaded with the environment the Deployment
builds from the Secret, through the gateway's own config loader.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from deploy.kubernetes import render_rules
from gateway.config import load_config
from tests.unit.deploy.kustomize import build

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "kubernetes"
BASE = K8S / "base"
OVERLAYS = sorted(p.parent for p in (K8S / "overlays").glob("*/kustomization.yaml"))
KUBERNETES_VERSION = "1.33.0"
CRD_GROUP = "monitoring.coreos.com/"
GATEWAY = {"app.kubernetes.io/name": "fleetgate", "app.kubernetes.io/component": "gateway"}

Resource = dict[str, Any]


def _by_kind(resources: list[Resource], kind: str) -> list[Resource]:
    return [r for r in resources if r["kind"] == kind]


def _one(resources: list[Resource], kind: str, name: str | None = None) -> Resource:
    hits = [r for r in _by_kind(resources, kind) if name in (None, r["metadata"]["name"])]
    assert len(hits) == 1, f"{kind} {name or ''}: {len(hits)} found"
    return hits[0]


def _gateway(resources: list[Resource]) -> Resource:
    return _one(resources, "Deployment", "fleetgate-gateway")


def _dockerfile_cmd() -> list[str]:
    (line,) = [ln for ln in (ROOT / "Dockerfile").read_text().splitlines() if ln.startswith("CMD ")]
    return json.loads(line[len("CMD ") :])


@pytest.fixture(scope="module", params=["base", *(p.name for p in OVERLAYS)])
def rendered(request) -> list[Resource]:
    return build(BASE if request.param == "base" else K8S / "overlays" / request.param)


def test_there_is_an_example_overlay():
    assert [p.name for p in OVERLAYS] == ["example"]


def test_builtin_kinds_validate_against_kubernetes(rendered):
    checked = 0
    for r in rendered:
        if r["apiVersion"].startswith(CRD_GROUP):
            continue
        kubernetes_validate.validate(r, KUBERNETES_VERSION, strict=True)
        checked += 1
    assert checked >= 6


def test_the_validator_is_strict():
    deployment = copy.deepcopy(_gateway(build(BASE)))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_gateway_config_loads_with_the_secret_as_environment(rendered):
    deployment = _gateway(rendered)
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    secrets = {s["metadata"]["name"]: s["stringData"] for s in _by_kind(rendered, "Secret")}
    environ = {}
    for var in container["env"]:
        ref = var["valueFrom"]["secretKeyRef"]
        environ[var["name"]] = secrets[ref["name"]][ref["key"]]
    (volume,) = [v for v in pod["volumes"] if "configMap" in v]
    config_map = _one(rendered, "ConfigMap", volume["configMap"]["name"])
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    config_path = container["args"][container["args"].index("--config") + 1]
    assert Path(config_path).parent == Path(mount["mountPath"])
    text = config_map["data"][Path(config_path).name]
    cfg = load_config(data=yaml.safe_load(text), environ=environ)
    assert len(cfg.auth.api_keys) >= 1 and all(isinstance(k, str) for k in cfg.auth.api_keys)
    assert cfg.auth.admin_key
    assert cfg.listen.host == "0.0.0.0" and cfg.listen.workers == 1
    assert [p["containerPort"] for p in container["ports"]] == [cfg.listen.port]
    # uvicorn's graceful shutdown and the preStop pause fit in the pod's grace period
    pause = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert cfg.listen.graceful_shutdown_s + pause < pod["terminationGracePeriodSeconds"]
    assert container["args"] == _dockerfile_cmd()


def test_gateway_pod_probes_and_hardening(rendered):
    pod = _gateway(rendered)["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"]
    tmp = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert len(tmp) == 1
    assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == tmp[0]["name"])


def test_every_pod_meets_the_restricted_pod_security_standard(rendered):
    for r in rendered:
        if r["kind"] != "Deployment":
            continue
        pod = r["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, r["metadata"]["name"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]


def test_selectors_and_ports_line_up(rendered):
    deployment = _gateway(rendered)
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"] == GATEWAY
    assert GATEWAY.items() <= pod_labels.items()
    service = _one(rendered, "Service", "fleetgate")
    pdb = _one(rendered, "PodDisruptionBudget")
    monitor = _one(rendered, "ServiceMonitor")
    assert service["spec"]["selector"] == GATEWAY
    assert pdb["spec"]["selector"]["matchLabels"] == GATEWAY
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    container_ports = {
        p["name"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
    }
    service_ports = {p["name"] for p in service["spec"]["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= service_ports
    hpa = _one(rendered, "HorizontalPodAutoscaler")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "fleetgate-gateway")
    assert (
        hpa["spec"]["minReplicas"] >= 2 and hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"]
    )
    assert hpa["spec"]["minReplicas"] <= deployment["spec"]["replicas"]


def test_example_overlay_runs_replicas_sharing_one_redis():
    resources = build(K8S / "overlays" / "example")
    ns = _one(resources, "Namespace")["metadata"]["name"]
    assert all(r["metadata"].get("namespace") == ns for r in resources if r["kind"] != "Namespace")
    gateway = _gateway(resources)
    assert gateway["spec"]["replicas"] == 3
    assert _one(resources, "HorizontalPodAutoscaler")["spec"]["minReplicas"] == 3
    image = gateway["spec"]["template"]["spec"]["containers"][0]["image"]
    assert re.fullmatch(r"[\w.-]+(/[\w.-]+)+:[\w.-]+", image), image
    redis = _one(resources, "Deployment", "fleetgate-redis")
    assert redis["spec"]["replicas"] == 1
    assert (
        _one(resources, "Service", "fleetgate-redis")["spec"]["selector"]
        == (redis["spec"]["selector"]["matchLabels"])
    )
    # the overlay's fleet, not the base's placeholder
    text = _one(resources, "ConfigMap")["data"]["gateway.yaml"]
    assert set(load_config(data=yaml.safe_load(text), environ={}).pools) == {"short", "long"}


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="no kubectl on PATH")
def test_minimal_renderer_agrees_with_kubectl_kustomize():
    for overlay in OVERLAYS:
        try:
            out = subprocess.run(
                ["kubectl", "kustomize", str(overlay)],
                capture_output=True,
                text=True,
                timeout=15,
                check=True,
            ).stdout
        except (subprocess.SubprocessError, OSError) as exc:
            pytest.skip(f"kubectl kustomize does not run here: {exc}")
        theirs = {(r["kind"], r["metadata"]["name"]): r for r in yaml.safe_load_all(out) if r}
        ours = {(r["kind"], r["metadata"]["name"]): r for r in build(overlay)}
        assert ours == theirs


# --- the Prometheus Operator's custom resources --------------------------------------------


def test_service_monitor_structure():
    monitor = _one(build(BASE), "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["name"]
    assert monitor["spec"]["selector"]["matchLabels"]
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] and endpoint["path"] == "/metrics"
        assert re.fullmatch(r"\d+[smh]", endpoint["interval"])
    assert set(monitor["spec"]) <= {"selector", "endpoints", "namespaceSelector", "jobLabel"}


def test_prometheus_rule_structure():
    rule = _one(build(BASE), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["name"] and set(rule["spec"]) == {"groups"}
    assert isinstance(rule["spec"]["groups"], list)
    names = [g["name"] for g in rule["spec"]["groups"]]
    assert len(set(names)) == len(names)
    for group in rule["spec"]["groups"]:
        assert group["name"] and isinstance(group["rules"], list)
        for r in group["rules"]:
            assert isinstance(r["expr"], str | int | float) and str(r["expr"]).strip()
            assert ("alert" in r) != ("record" in r), r
            if "for" in r:
                assert re.fullmatch(r"(\d+(ms|s|m|h|d|w|y))+", r["for"])


def test_committed_prometheus_rule_is_rendered_from_the_rule_files():
    assert render_rules.OUT.read_text() == render_rules.render(), (
        "out of date: python -m deploy.kubernetes.render_rules"
    )


def test_render_rules_tolerates_no_rules_and_keeps_file_order(tmp_path):
    missing = tmp_path / "nowhere"
    assert render_rules.groups(missing) == []
    assert yaml.safe_load(render_rules.render(missing))["spec"]["groups"] == []
    rules = tmp_path / "rules"
    rules.mkdir()
    a = {"name": "a", "rules": [{"alert": "A", "expr": "up == 0", "for": "5m"}]}
    b = {"name": "b", "rules": [{"record": "job:up:sum", "expr": "sum by (job) (up)"}]}
    (rules / "20-b.yml").write_text(yaml.safe_dump({"groups": [b]}))
    (rules / "10-a.yml").write_text(yaml.safe_dump({"groups": [a]}))
    (rules / "notes.md").write_text("not a rule file")
    assert render_rules.groups(rules) == [a, b]
    (rules / "30-a-again.yaml").write_text(yaml.safe_dump({"groups": [a]}))
    with pytest.raises(ValueError, match="appears twice"):
        render_rules.groups(rules)


def test_gateway_may_watch_endpointslices_and_nothing_else(rendered):
    """`discovery: {kind: kubernetes}` pools: the pod's ServiceAccount is bound to a Role
    that gets, lists and watches EndpointSlices (gateway/discovery_k8s.py), nothing more."""
    pod = _gateway(rendered)["spec"]["template"]["spec"]
    account = pod["serviceAccountName"]
    assert pod["automountServiceAccountToken"] is True
    _one(rendered, "ServiceAccount", account)
    namespace = _gateway(rendered)["metadata"].get("namespace")
    bound = [
        b
        for b in _by_kind(rendered, "RoleBinding")
        if any(s["kind"] == "ServiceAccount" and s["name"] == account for s in b["subjects"])
    ]
    assert len(bound) == 1
    (binding,) = bound
    (subject,) = binding["subjects"]
    assert subject.get("namespace") == namespace  # an overlay names it (kustomize does not)
    assert binding["roleRef"]["kind"] == "Role"
    role = _one(rendered, "Role", binding["roleRef"]["name"])
    assert role["rules"] == [
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    assert not _by_kind(rendered, "ClusterRoleBinding")
