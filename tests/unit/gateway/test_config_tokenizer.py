"""pools.<name>.tokenizer: validated (and loaded once) at start, errors name the key."""

import copy

import pytest

from gateway.config import ConfigError, load_config
from tests.served_models import qwen3_dir
from tests.unit.gateway.test_config import MINIMAL


def _with(tokenizer: str) -> dict:
    data = copy.deepcopy(MINIMAL)
    next(iter(data["pools"].values()))["tokenizer"] = tokenizer
    return data


def test_default_is_auto():
    cfg = load_config(data=MINIMAL, environ={})
    assert all(p.tokenizer == "auto" for p in cfg.pools.values())


@pytest.mark.parametrize("spec", ["auto", "cl100k", "engine", f"hf:{qwen3_dir()}"])
def test_valid_specs(spec):
    cfg = load_config(data=_with(spec), environ={})
    assert next(iter(cfg.pools.values())).tokenizer == spec


@pytest.mark.parametrize("spec", ["hf:/nonexistent/folder", "gpt2", "hf:"])
def test_unloadable_tokenizer_names_the_key(spec):
    name = next(iter(MINIMAL["pools"]))
    with pytest.raises(ConfigError, match=rf"pools\.{name}\.tokenizer"):
        load_config(data=_with(spec), environ={})
