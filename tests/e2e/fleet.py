"""A real fleet on loopback for end-to-end tests: emulator processes and a gateway process."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx
import yaml

from tests.procs import Proc, Procs

MODEL = "llama-test"
TIME_SCALE = "0.02"  # 50x faster than real time: an 8.65 ms step takes ~0.2 ms


@dataclass
class Fleet:
    procs: Procs
    short: list[Proc]
    long: list[Proc]
    gateway: Proc
    config: dict[str, object] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.gateway.url

    def metrics(self) -> str:
        return httpx.get(self.gateway.url + "/metrics", timeout=5).text


def emulator(procs: Procs, name: str, max_model_len: int, *extra: str) -> Proc:
    return procs.emulator(
        name,
        "--model",
        MODEL,
        "--max-model-len",
        str(max_model_len),
        "--time-scale",
        TIME_SCALE,
        *extra,
    )


def gateway_config(
    short: Sequence[str], long: Sequence[str], **overrides: object
) -> dict[str, object]:
    pools: dict[str, object] = {}
    if short:
        pools["short"] = {
            "max_model_len": 8192,
            "models": [MODEL],
            "workers": [{"url": u} for u in short],
        }
    if long:
        pools["long"] = {
            "max_model_len": 65536,
            "models": [MODEL],
            "workers": [{"url": u} for u in long],
        }
    cfg: dict[str, object] = {
        "pools": pools,
        "telemetry": {"scrape_interval_s": 0.1, "stale_after_s": 1.0},
        "health": {"interval_s": 0.2, "timeout_s": 0.5, "unhealthy_after": 1},
        "upstream": {"connect_timeout_s": 1.0, "first_byte_timeout_s": 30.0, "idle_timeout_s": 5.0},
    }
    listen = overrides.pop("listen", {})
    cfg.update(overrides)
    # no drain delay unless a test asks for one: the delay exists for a load balancer's
    # endpoints to catch up, and would hold every test's teardown for seconds
    cfg["listen"] = {"drain_delay_s": 0, **(listen if isinstance(listen, dict) else {})}
    return cfg


def start_gateway(procs: Procs, cfg: dict[str, object], name: str = "gateway") -> Proc:
    path = procs.dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return procs.fleetgate(name, "serve", "--config", str(path), "--port", "{port}").wait_ready(
        "/healthz"
    )


def start_fleet(
    procs: Procs, n_short: int = 2, n_long: int = 1, *emulator_args: str, **overrides: object
) -> Fleet:
    short = [emulator(procs, f"short{i}", 8192, *emulator_args) for i in range(n_short)]
    long = [emulator(procs, f"long{i}", 65536, *emulator_args) for i in range(n_long)]
    for p in short + long:
        p.wait_ready("/health")
    cfg = gateway_config([p.url for p in short], [p.url for p in long], **overrides)
    return Fleet(procs, short, long, start_gateway(procs, cfg), cfg)


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        base = head.split("{", 1)[0]
        if base != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
