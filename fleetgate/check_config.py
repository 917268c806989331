"""`fleetgate check-config FILE...`: validate gateway configurations without starting.

For each file: the effective configuration (the file, then FLEETGATE_* environment
overrides, as `fleetgate serve --config FILE` would read it), every default filled in, or
every problem with its full key path. Secrets (API keys, the admin and HMAC keys, a Redis
URL's password) are printed as "***". A Kubernetes ConfigMap (deploy/kubernetes/) is
checked entry by entry: each `data` entry named *.yaml or *.yml is a gateway configuration.

Exit status: 0 every file is valid, 1 at least one is not, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from gateway.config import ENV_PREFIX, ConfigError, GatewayConfig, load_config, yaml_load

SECRET_KEYS = frozenset(
    {"api_keys", "admin_key", "key_secret", "entitlements_admin_key", "api_key"}
)
_URL_PASSWORD = re.compile(r"^(\w+://[^:/@]*:)[^@]*@")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fleetgate check-config",
        description="Validate gateway configuration files: print the effective configuration "
        "(defaults filled in) or every problem with its key path. Exit 0 all valid, 1 not.",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="a gateway YAML file or ConfigMap")
    p.add_argument("-q", "--quiet", action="store_true", help="only say which files are valid")
    p.add_argument("--json", action="store_true", help="the effective configurations as JSON")
    p.add_argument("--no-env", action="store_true", help="ignore FLEETGATE_* environment overrides")
    return p


def documents(path: str) -> Iterator[tuple[str, dict[str, Any] | None, str | None]]:
    """(name, raw configuration, error) for each configuration in the file: the file itself,
    or each YAML entry of a ConfigMap's `data`."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        yield path, None, f"cannot read {path}: {exc.strerror}"
        return
    try:
        loaded = yaml_load(text)
    except yaml.YAMLError as exc:
        yield path, None, f"not valid YAML: {exc}"
        return
    if isinstance(loaded, dict) and loaded.get("kind") == "ConfigMap":
        entries = {
            k: v
            for k, v in (loaded.get("data") or {}).items()
            if str(k).endswith((".yaml", ".yml"))
        }
        if not entries:
            yield path, None, "a ConfigMap without a *.yaml entry in data"
        for key, value in entries.items():
            name = f"{path} (data.{key})"
            try:
                inner = yaml_load(str(value))
            except yaml.YAMLError as exc:
                yield name, None, f"not valid YAML: {exc}"
                continue
            yield (name, inner, None) if isinstance(inner, dict) else (name, None, _not_mapping)
        return
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        yield path, None, _not_mapping
        return
    yield path, loaded, None


_not_mapping = "the top level must be a mapping"


def masked(value: Any, key: str = "") -> Any:
    """`value` with secrets replaced by "***"."""
    if isinstance(value, dict):
        if key == "keys":  # auth.keys: entitlement → its API keys
            return {
                k: ["***" for _ in v] if isinstance(v, list) else "***" for k, v in value.items()
            }
        return {k: masked(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        if key in SECRET_KEYS or key == "keys":
            return ["***" for _ in value]
        return [masked(v) for v in value]
    if key in SECRET_KEYS and value is not None:
        return "***"
    if isinstance(value, str) and key.endswith("url"):
        return _URL_PASSWORD.sub(r"\1***@", value)
    return value


def effective(config: GatewayConfig) -> dict[str, Any]:
    data: dict[str, Any] = masked(config.model_dump(mode="json"))
    return data


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    environ = {} if args.no_env else dict(os.environ)
    overrides = sorted(k for k in environ if k.startswith(ENV_PREFIX) and "__" in k)
    results: list[dict[str, Any]] = []
    for path in args.files:
        for name, raw, error in documents(path):
            if error is None:
                assert raw is not None
                try:
                    config = load_config(data=raw, environ=environ)
                except ConfigError as exc:
                    error = str(exc).removeprefix("config is invalid:\n")
                else:
                    results.append({"file": name, "valid": True, "config": effective(config)})
                    continue
            results.append({"file": name, "valid": False, "problems": _problems(error)})
    ok = all(r["valid"] for r in results)
    if args.json:
        print(json.dumps(results if len(results) > 1 else results[0], indent=2))
        return 0 if ok else 1
    if overrides and not args.quiet:
        print(f"# with environment overrides: {', '.join(overrides)}")
    for r in results:
        if r["valid"]:
            print(f"{r['file']}: valid")
            if not args.quiet:
                print(_indent(yaml.safe_dump(r["config"], sort_keys=False, allow_unicode=True)))
        else:
            print(f"{r['file']}: invalid")
            for problem in r["problems"]:
                print(f"  {problem}")
    return 0 if ok else 1


_NESTED = re.compile(r"^([\w.<>\[\]-]+): ([A-Za-z_][\w.]*): (.*)$")


def _problems(error: str) -> list[str]:
    """One line per problem: `key.path: what is wrong`. A section's own check reports
    `section: key: ...` (gateway/config.py's messages): joined into the full path here."""
    out = []
    for line in error.splitlines():
        line = line.strip()
        if line:
            m = _NESTED.match(line)
            out.append(f"{m[1]}.{m[2]}: {m[3]}" if m else line)
    return out


def _indent(text: str) -> str:
    return "\n".join("    " + line if line else line for line in text.splitlines()) + "\n"


if __name__ == "__main__":
    sys.exit(main())
