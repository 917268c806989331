"""Worker entries are validated once, in the model (`config.Worker`), whatever way they come
in (the file, a reload, POST /admin/workers): nothing that passes can break a header, leak
credentials or crash the fleet later. And an API key names one entitlement, never two."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.apikeys import key_hash
from gateway.config import ConfigError, Worker, header_safe, load_config
from gateway.upstream import Endpoint
from tests.procs import ROOT, env


def _with_worker(**worker: object) -> dict[str, object]:
    return {
        "pools": {
            "short": {"max_model_len": 8192, "models": ["m"], "workers": [worker]},
        }
    }


@pytest.mark.parametrize(
    "api_key", ["sk-1\r\nx-evil: 1", "sk-1\nx", "sk-\x00", "sk-\x7f", "sk 1", "sk-\t1", "clé"]
)
def test_a_worker_key_that_would_break_a_header_is_refused(api_key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(data=_with_worker(url="http://127.0.0.1:1", api_key=api_key), environ={})
    msg = str(info.value)
    assert "pools.short.workers.0.api_key" in msg
    assert api_key not in msg and "x-evil" not in msg  # the key is never shown


@pytest.mark.parametrize(
    "url", ["http://user:s3cret-pw@127.0.0.1:8000", "https://s3cret-pw@engine:443/v1"]
)
def test_a_worker_url_with_credentials_is_refused_without_showing_them(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(data=_with_worker(url=url), environ={})
    msg = str(info.value)
    assert "pools.short.workers.0.url" in msg and "api_key" in msg
    assert "s3cret-pw" not in msg


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:99999",
        "http://127.0.0.1:0",
        "http://127.0.0.1:80x",
        "http://127.0.0.1:-1",
        "http://exa mple:80",
        "http://a..b:80",
        "http://-a:80",
        "http://[zz::1]:80",
        "http://:8000",
        "http://h:1/p?q=1",
        "http://h:1/p#f",
        "http://h:1/a b",
    ],
)
def test_a_worker_url_with_a_bad_host_or_port_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError, match=r"pools\.short\.workers\.0\.url: "):
        load_config(data=_with_worker(url=url), environ={})


@pytest.mark.parametrize(
    ("url", "wid"),
    [
        ("http://127.0.0.1:8000", "127.0.0.1:8000"),
        ("http://engine-0.engines.svc:8000/", "engine-0.engines.svc:8000"),
        ("https://[::1]:8443", "[::1]:8443"),
        ("http://my_engine", "my_engine"),
        ("http://127.0.0.1:8000/engine/a", "127.0.0.1:8000/engine/a"),
    ],
)
def test_good_worker_urls_still_validate(url: str, wid: str) -> None:
    cfg = load_config(data=_with_worker(url=url, api_key="sk-Ab0_-.~+/="), environ={})
    assert cfg.pools["short"].workers[0].id == wid


def test_a_bad_worker_name_is_refused_by_the_model() -> None:
    with pytest.raises(ValueError, match="name"):
        Worker.model_validate({"url": "http://127.0.0.1:1", "name": "a b"})


def test_a_bad_port_at_start_is_a_config_error_not_a_traceback(tmp_path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(_with_worker(url="http://127.0.0.1:99999")))
    out = subprocess.run(
        [sys.executable, "-m", "fleetgate", "serve", "--config", str(path), "--port", "1"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=env(),
    )  # fmt: skip
    assert out.returncode == 2, out.stderr[-2000:]
    assert "pools.short.workers.0.url" in out.stderr
    assert "Traceback" not in out.stderr


# --- one key, one entitlement ----------------------------------------------------------------
SECRET = "0123456789abcdef0123"


def _token_pools(
    entitlement_keys: dict[str, list[str]], auth_keys: dict[str, list[str]]
) -> dict[str, object]:
    ent = {"pool": "p", "class": "spot"}
    return {
        **_with_worker(url="http://127.0.0.1:1"),
        "auth": {"key_secret": SECRET, "keys": auth_keys},
        "admission": {
            "policy": "token_pools",
            "params": {
                "pools": {"p": {"slots": 8, "tokens_per_s": 1e6, "kv_bytes": 1 << 30,
                                "bytes_per_token": 1}},
                "entitlements": {
                    n: {**ent, "keys": entitlement_keys.get(n, [])} for n in ("a", "b", "c")
                },
            },
        },
    }  # fmt: skip


@pytest.mark.parametrize(
    ("ent_keys", "auth_keys", "first", "second"),
    [
        (
            {},
            {"a": ["sk-shared-1"], "b": ["sk-x", "sk-shared-1"]},
            "auth.keys.a.0",
            "auth.keys.b.1",
        ),
        (
            {"a": ["sk-shared-1"]},
            {"c": ["sk-shared-1"]},
            "auth.keys.c.0",
            "admission.params.entitlements.a.keys.0",
        ),
        (
            {"b": [key_hash(SECRET, "sk-shared-1")]},
            {"a": ["sk-shared-1"]},
            "auth.keys.a.0",
            "admission.params.entitlements.b.keys.0",
        ),
    ],
)
def test_a_key_under_two_entitlements_is_a_config_error_naming_both(
    ent_keys: dict[str, list[str]], auth_keys: dict[str, list[str]], first: str, second: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(data=_token_pools(ent_keys, auth_keys), environ={})
    msg = str(info.value)
    assert first in msg and second in msg, msg
    assert "sk-shared-1" not in msg and key_hash(SECRET, "sk-shared-1") not in msg


def test_a_key_listed_twice_for_one_entitlement_is_fine() -> None:
    cfg = load_config(data=_token_pools({"a": ["sk-a-1"]}, {"a": ["sk-a-1", "sk-a-2"]}), environ={})
    assert cfg.entitlement_keys()["a"].count("sk-a-1") == 2


# what the model lets through, the upstream client can use: an independent parser (the
# client's Endpoint) takes every accepted URL, and nothing it sends can carry credentials
_URL_PIECES = st.sampled_from(
    ["http://", "https://", "h", "127.0.0.1", "[::1]", "a.b", "-", "_", ".", ":", "8000", "0",
     "99999", "@", "u:p@", "/", "/v1", "?", "#", " ", "\r\n", "\t", "%40", "\\", "[", "]", "é"]
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(_URL_PIECES, min_size=1, max_size=8).map("".join))
def test_every_accepted_url_is_one_the_upstream_client_can_use(url: str) -> None:
    try:
        worker = Worker.model_validate({"url": url})
    except ValueError:
        return
    endpoint = Endpoint.from_url(worker.url)
    assert b"@" not in endpoint.authority and 1 <= endpoint.port <= 65535
    assert header_safe(worker.id)
    assert all(33 <= ord(c) < 127 for c in worker.url)


@pytest.mark.parametrize("url", ["http://http://\r\n", "http://h:1/a\tb", "http://h:/v1"])
def test_what_urlsplit_would_drop_or_guess_is_refused(url: str) -> None:
    """Found by the property above: urlsplit drops CR, LF and tabs wherever they are."""
    with pytest.raises(ValueError, match="url"):
        Worker.model_validate({"url": url})
