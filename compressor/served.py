"""Which tokenizer and template the served model counts with: a pool's `tokenizer:` setting.

    auto            the default: the engine's own `/tokenize` where the engine offers it
                    (probed at start, gateway/tokenizer_probe.py), else cl100k — the
                    stated fallback, logged as an error for a model that is not OpenAI's
    cl100k          cl100k text in the Llama-3.0 layout (the emulated engines')
    hf:<path>       a tokenizer folder (tokenizer.json + tokenizer_config.json's chat template)
    engine          count locally with cl100k, and let the gateway ask the worker's
                    `/tokenize` for the exact count of borderline requests
                    (gateway/tokenize.py; cl100k is also its fallback) — `auto` without
                    the probe

`load_served` reads files once per spec (the caller does it at start, never per request);
everything it returns is pure.
"""

from __future__ import annotations

from functools import lru_cache

from compressor.template import ServedTemplate, default_template

AUTO = "auto"
ENGINE = "engine"
CL100K = "cl100k"
HF_PREFIX = "hf:"


def parse_spec(spec: str) -> tuple[str, str]:
    """(kind, path) of a `tokenizer:` value; ValueError for an unknown kind."""
    if spec in (CL100K, ENGINE, AUTO):
        return spec, ""
    if spec.startswith(HF_PREFIX) and spec[len(HF_PREFIX) :].strip():
        return "hf", spec[len(HF_PREFIX) :].strip()
    raise ValueError(f"tokenizer must be 'auto', 'cl100k', 'engine' or 'hf:<path>', got {spec!r}")


@lru_cache(maxsize=8)
def load_served(spec: str = AUTO) -> ServedTemplate:
    """The template a `tokenizer:` value names, loaded once (OSError/ValueError if unloadable)."""
    kind, path = parse_spec(spec)
    if kind != "hf":
        return default_template()
    from compressor.hf_template import HFTemplate

    return HFTemplate(path)
