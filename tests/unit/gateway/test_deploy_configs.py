"""The deployment files agree with each other and with the gateway's config schema.

Docker cannot run here, so these checks stand in for `docker compose config`: the compose
gateway config validates, docker-compose.yml parses and mounts that config where the image's
default command reads it, every worker URL names a compose service listening on that port,
and Prometheus scrapes the gateway and every worker (labelled by its pool) and loads the
rules in deploy/prometheus/rules/.
"""

import json
import re
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from gateway.config import load_config

ROOT = Path(__file__).resolve().parents[3]
PROM_DIR = ROOT / "deploy" / "prometheus"


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _flags(args: list[str]) -> dict[str, str]:
    return dict(zip(args[::2], args[1::2], strict=True))


def _dockerfile_cmd() -> list[str]:
    lines = [ln for ln in (ROOT / "Dockerfile").read_text().splitlines() if ln.startswith("CMD ")]
    assert len(lines) == 1
    return json.loads(lines[0][len("CMD ") :])


def test_compose_gateway_config_validates():
    cfg = load_config(ROOT / "config" / "compose.yaml", environ={})
    assert cfg.listen.host == "0.0.0.0"
    assert {p: pool.max_model_len for p, pool in cfg.pools.items()} == {
        "short": 8192,
        "long": 65536,
    }
    assert len(cfg.pools["short"].workers) == 2
    assert len(cfg.pools["long"].workers) == 1


def test_gateway_service_mounts_the_config_the_image_serves():
    services = _compose()["services"]
    cmd = _dockerfile_cmd()
    assert cmd[:2] == ["fleetgate", "serve"]
    config_path = cmd[cmd.index("--config") + 1]
    gateway = services["gateway"]
    assert gateway["command"] == cmd
    assert f"./config/compose.yaml:{config_path}:ro" in gateway["volumes"]
    assert any(p.endswith(":8080") for p in gateway["ports"])


def test_the_image_is_built_by_one_service_and_never_pulled():
    # several services building one tag at once collide in BuildKit; the others must not pull it
    services = _compose()["services"]
    ours = {n: s for n, s in services.items() if s.get("image") == "fleetgate:local"}
    assert [n for n, s in ours.items() if "build" in s] == ["gateway"]
    assert all(s["pull_policy"] == "never" for n, s in ours.items() if n != "gateway")
    assert len(ours) == 4


def test_every_worker_is_an_emulator_service_with_the_pool_context():
    services = _compose()["services"]
    cfg = load_config(ROOT / "config" / "compose.yaml", environ={})
    for pool in cfg.pools.values():
        for worker in pool.workers:
            url = urlsplit(worker.url)
            cmd = services[url.hostname]["command"]
            assert cmd[:2] == ["fleetgate", "emulate"]
            flags = _flags(cmd[2:])
            assert flags["--host"] == "0.0.0.0"
            assert int(flags["--port"]) == url.port
            assert int(flags["--max-model-len"]) == pool.max_model_len
            assert flags["--model"] in pool.models
            assert flags["--personality"] == worker.engine
            health = services[url.hostname]["environment"]["FLEETGATE_HEALTHCHECK_URL"]
            assert urlsplit(health).port == url.port


def test_prometheus_scrapes_gateway_and_every_worker():
    prom = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    targets = {
        t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]
    }
    cfg = load_config(ROOT / "config" / "compose.yaml", environ={})
    workers = {urlsplit(w.url).netloc for p in cfg.pools.values() for w in p.workers}
    assert f"gateway:{cfg.listen.port}" in targets
    assert workers <= targets
    assert {t.split(":")[0] for t in targets} <= set(_compose()["services"])
    # the engine recording rules sum by the scrape job's `pool`: each worker under its own pool
    pool_of = {
        t: sc.get("labels", {}).get("pool")
        for job in prom["scrape_configs"]
        if job["job_name"] == "engines"
        for sc in job["static_configs"]
        for t in sc["targets"]
    }
    for name, pool in cfg.pools.items():
        for w in pool.workers:
            assert pool_of[urlsplit(w.url).netloc] == name


def test_prometheus_service_mounts_the_config_directory_and_loads_the_rules():
    prom_service = _compose()["services"]["prometheus"]
    assert "./deploy/prometheus:/etc/prometheus:ro" in prom_service["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prom_service["command"]
    prom = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    # rule_files are relative to the config file, inside the mounted directory
    loaded = {p for pattern in prom["rule_files"] for p in PROM_DIR.glob(pattern)}
    assert loaded == set((PROM_DIR / "rules").glob("*.yml"))
    assert len(loaded) >= 3


def test_commented_vllm_profile_is_valid_yaml_once_uncommented():
    text = (ROOT / "docker-compose.yml").read_text()
    start = text.index("  # vllm-short-1: &vllm")
    block = re.sub(r"(?m)^  # ?", "  ", text[start:])
    services = yaml.safe_load("services:\n" + block)["services"]
    assert set(services) == {"vllm-short-1", "vllm-short-2", "vllm-long-1"}
    lens = {}
    for name, svc in services.items():
        assert svc["profiles"] == ["vllm"]
        assert svc["image"].startswith("vllm/vllm-openai")
        flags = _flags(svc["command"])
        assert flags["--served-model-name"] == "llama-3.1-8b"
        lens[name] = int(flags["--max-model-len"])
        devices = svc["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"]
    # each on its own GPU, and the same contexts as the emulated pools they replace
    assert (
        len(
            {
                svc["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"][0]
                for svc in services.values()
            }
        )
        == 3
    )
    assert lens == {"vllm-short-1": 8192, "vllm-short-2": 8192, "vllm-long-1": 65536}


# --- Grafana (deploy/grafana/) ----------------------------------------------------------------


def _mounts(service: dict) -> dict[str, str]:
    """container path -> host path (relative to the repository) of a service's bind mounts."""
    out = {}
    for volume in service["volumes"]:
        host, container, *_ = volume.split(":")
        out[container] = host
    return out


def test_grafana_service_mounts_provisioning_and_dashboards():
    grafana = _compose()["services"]["grafana"]
    assert grafana["image"].startswith("grafana/grafana:")
    assert all(v.endswith(":ro") for v in grafana["volumes"])
    mounts = _mounts(grafana)
    for host in mounts.values():
        assert (ROOT / host).exists(), f"{host} is mounted but missing"
    provisioning = ROOT / mounts["/etc/grafana/provisioning"]
    assert (provisioning / "datasources").is_dir() and (provisioning / "dashboards").is_dir()
    # the provider reads the folder the dashboards are mounted at
    providers = yaml.safe_load((provisioning / "dashboards" / "fleetgate.yml").read_text())
    (provider,) = providers["providers"]
    dash_dir = provider["options"]["path"]
    assert sorted(p.name for p in (ROOT / mounts[dash_dir]).glob("*.json")) == [
        "compress.json",
        "control.json",
        "fleet.json",
        "overview.json",
    ]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(dash_dir + "/") and (ROOT / mounts[dash_dir] / Path(home).name).exists()


def test_grafana_is_read_only_for_anonymous_visitors_and_local_only():
    grafana = _compose()["services"]["grafana"]
    env = grafana["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert env["GF_USERS_ALLOW_SIGN_UP"] == "false"
    assert grafana["ports"] == ["127.0.0.1:3000:3000"]


def test_every_published_port_is_bound_to_loopback():
    for name, service in _compose()["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"


def test_grafana_datasource_is_the_compose_prometheus():
    services = _compose()["services"]
    grafana = services["grafana"]
    provisioning = ROOT / _mounts(grafana)["/etc/grafana/provisioning"]
    (ds,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert ds["type"] == "prometheus" and ds["isDefault"] is True
    url = urlsplit(ds["url"])
    assert url.hostname in services and url.hostname in grafana["depends_on"]
    assert any(p.endswith(f":{url.port}") for p in services[url.hostname]["ports"])
