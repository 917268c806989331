"""QUARTZ's configuration keys (gateway/config.py `quartz`, `dispatch.params`,
`dispatch.prefill_room`, the routing policies) and the predictor they build."""

from __future__ import annotations

import json

import pytest

from gateway import quartz
from gateway.config import ConfigError, load_config
from gateway.openai_request import parse

MINIMAL = {
    "pools": {
        "short": {
            "max_model_len": 8192,
            "max_num_seqs": 64,
            "models": ["m"],
            "workers": [{"url": "http://127.0.0.1:1"}],
        }
    }
}


def cfg(**extra):
    return load_config(data={**MINIMAL, **extra}, environ={})


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        ({"quartz": {"alpah": 0.9}}, r"quartz\.alpah: unknown key"),
        ({"quartz": {"alpha": 0.5}}, r"quartz\.alpha"),
        ({"quartz": {"delta": 0}}, r"quartz\.delta"),
        (
            {"dispatch": {"policy": "quartz", "params": {"lamda": 1}}},
            r"dispatch\.params: unknown parameter\(s\) lamda",
        ),
        ({"dispatch": {"prefill_room": 0}}, r"dispatch\.prefill_room"),
        (
            {"dispatch": {"policy": "quartz", "params": {"wait_bound_s": 0}}},
            r"dispatch\.params\.wait_bound_s: must be positive",
        ),
        (
            {
                "dispatch": {
                    "policy": "quartz",
                    "params": {"wait_bound_slo": 0.5, "slo_s": {"long": 0}},
                }
            },
            r"dispatch\.params\.slo_s\.long: must be positive",
        ),
        (
            {"routing": {"policy": "quartz", "params": {"k": 0}}},
            r"routing\.params: k: must be >= 1",
        ),
        ({"dispatch": {"policy": "lifo"}}, r"dispatch\.policy: unknown 'lifo'"),
    ],
)
def test_bad_keys_are_named(extra, where):
    with pytest.raises(ConfigError, match=where):
        cfg(**extra)


def test_the_default_builds_no_predictor():
    assert quartz.predictor_for(cfg()) is None


@pytest.mark.parametrize(
    "extra",
    [
        {"quartz": {}},
        {"routing": {"policy": "quartz"}},
        {"routing": {"policy": "locality"}},
        {"dispatch": {"policy": "quartz", "params": {"lam": 0.05, "beta": 0.2}}},
    ],
)
def test_quartz_or_a_policy_using_it_builds_the_analytic_predictor(extra):
    p = quartz.predictor_for(cfg(**extra))
    assert p is not None and p.name == "analytic"
    assert p.model.max_num_seqs == 64  # the pool's
    assert p.index.stride == 1 and p.index.block_tokens == quartz.PREFIX_BLOCK_BYTES // 4


def test_a_model_file_that_cannot_be_read_is_named(tmp_path):
    c = cfg(quartz={"model": str(tmp_path / "missing.json")})
    with pytest.raises(ValueError, match=r"quartz\.model"):
        quartz.predictor_for(c)


def test_prompt_hashes_share_a_prefix_and_read_decoding_parameters():
    long_history = [{"role": "user", "content": "x" * 3000}]
    a = parse(
        json.dumps(
            {
                "model": "m",
                "messages": [*long_history, {"role": "user", "content": "a"}],
                "temperature": 0.2,
                "top_p": 0.9,
            }
        ).encode(),
        "chat",
    )
    b = parse(
        json.dumps(
            {"model": "m", "messages": [*long_history, {"role": "user", "content": "b"}]}
        ).encode(),
        "chat",
    )
    ha, hb = quartz.prompt_hashes(a), quartz.prompt_hashes(b)
    assert len(ha) == 5 and ha[:5] == hb[:5]  # 3,000 bytes shared: five full 512-byte blocks
    from policies.types import RequestInfo

    info = RequestInfo("r", "m", 0.0, 10, 10)
    quartz.describe(info, a)
    assert info.temperature == 0.2 and info.top_p == 0.9 and info.prefix_hashes == ha
