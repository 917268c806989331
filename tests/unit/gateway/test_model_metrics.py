"""Per-model series (gateway/metrics.py `count_model`): the `model` label is a model some
configured pool serves, else `other`, so clients cannot grow the label set; a reload that
adds a model gives it its own series from then on."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from gateway.config import load_config
from gateway.metrics import GatewayMetrics
from gateway.workers import Fleet


def _cfg(models: list[str]):
    pool = {"max_model_len": 8192, "models": models, "workers": [{"url": "http://127.0.0.1:9"}]}
    return load_config(data={"pools": {"short": pool}}, environ={})


def _samples(metrics: GatewayMetrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for fam in text_string_to_metric_families(metrics.render().decode()):
        for s in fam.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_model_label_is_bounded_by_the_configured_models():
    fleet = Fleet(_cfg(["llama"]))
    m = GatewayMetrics(fleet, time.monotonic)
    m.count_model("llama", 200, 0.05, 10, 5)
    for i in range(50):  # fifty made-up names: one label value
        m.count_model(f"made-up-{i}", 404, None, 0, 0)
    m.count_model("qwen", 200, 0.2, 7, 3)
    m.count_model("llama", 499, None, 0, 0)  # the client left: not an answer
    requests = _samples(m, "fleetgate_model_requests_total")
    assert requests == {
        (("model", "llama"), ("status", "200")): 1.0,
        (("model", "other"), ("status", "404")): 50.0,
        (("model", "other"), ("status", "200")): 1.0,
    }
    prompt = _samples(m, "fleetgate_model_prompt_tokens_total")
    assert prompt == {(("model", "llama"),): 10.0, (("model", "other"),): 7.0}
    ttft = _samples(m, "fleetgate_model_time_to_first_token_seconds_count")
    assert ttft == {(("model", "llama"),): 1.0, (("model", "other"),): 1.0}
    # a reload that adds qwen: it counts under its own name from then on
    fleet.apply(_cfg(["llama", "qwen"]))
    m.count_model("qwen", 200, 0.1, 1, 1)
    assert (
        _samples(m, "fleetgate_model_requests_total")[(("model", "qwen"), ("status", "200"))] == 1.0
    )
