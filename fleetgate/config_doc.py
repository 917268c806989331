"""docs/CONFIG.md, generated from the configuration models: every key with its type, default
and meaning.

    python -m fleetgate.config_doc            # rewrite docs/CONFIG.md
    python -m fleetgate.config_doc --check    # exit 1 when docs/CONFIG.md is stale

Types, defaults and bounds come from the pydantic models of gateway/config.py and the
policy schema it shares with the simulator's scenarios, policies/spec.py (and the
dataclasses behind `admission.params` of `token_pools`, policies/tenancy/config.py); a
key's meaning is its `Field(description=...)` when it has one, else the comment written
beside it or just above it in the model's source. So a key added to a model appears here
the next time this runs, and tests/unit/test_config_doc.py fails until it does.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import inspect
import io
import json
import re
import sys
import textwrap
import tokenize
import types
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gateway import config as gc
from policies.spec import EntitlementStoreSettings

DOC = Path(__file__).resolve().parents[1] / "docs" / "CONFIG.md"


@dataclasses.dataclass(frozen=True)
class Key:
    path: str
    type: str
    default: str
    meaning: str


# Meanings of the keys whose model has neither a description nor a comment beside the field
# (a comment in the model wins: write one there when you add a key). test_config_doc checks
# that every key has a meaning and that every entry here still names a key.
MEANINGS: dict[str, str] = {
    "listen.host": "the address to listen on (0.0.0.0: every interface)",
    "listen.port": "the port to listen on",
    "listen.forwarded_allow_ips": "addresses whose X-Forwarded-* headers are trusted "
    "(with proxy_headers)",
    "listen.graceful_shutdown_s": "after the drain, how long requests in flight (streams "
    "included) get to finish",
    "listen.backlog": "the listening socket's accept queue",
    "listen.ssl_keyfile": "the private key of ssl_certfile (PEM)",
    "auth.admin_key": "the bearer key of the /admin routes (null: they are disabled)",
    "quartz.max_num_batched_tokens": "the engine's --max-num-batched-tokens (with prefill_token_s)",
    "pools.<name>.max_model_len": "the context every worker of the pool serves (the engines' "
    "--max-model-len)",
    "pools.<name>.models": "the model names the pool serves (the engines' --served-model-name)",
    "pools.<name>.workers.<i>.url": "the engine's base URL, http(s)://host:port",
    "pools.<name>.workers.<i>.engine": "which API dialect and /metrics names to read",
    "placement.short_pool": "the pool that takes requests up to B_short (and compressed ones)",
    "admission.policy": "step 5, may the request start now: `always`, `concurrency` (params: "
    "limit, retry_after_s) or `token_pools` (below)",
    "admission.params": "the policy's own parameters; token_pools: the tables below",
    "budget.bytes_per_token": "the prior of the learnt bytes per token per content category "
    "(the estimate is bytes / this, plus a chat-template allowance per message)",
    "budget.default_max_tokens": "the output budget of a request without max_tokens",
    "telemetry.scrape_interval_s": "how often each engine's /metrics is read",
    "telemetry.stale_after_s": "telemetry older than this counts the worker as saturated",
    "telemetry.timeout_s": "one scrape's deadline",
    "health.interval_s": "how often each worker's /health is checked",
    "health.timeout_s": "one health check's deadline",
    "upstream.connect_timeout_s": "connecting to an engine (a failure is retried once on "
    "another worker)",
    "upstream.first_byte_timeout_s": "an engine's first byte of an answer (504 past it)",
    "upstream.idle_timeout_s": "silence between two bytes of an engine's answer (504 or an "
    "error frame past it)",
    "cors.allow_origins": "origins allowed (empty: CORS off), e.g. https://app.example.com",
    "cors.allow_methods": "methods allowed in a preflight",
    "cors.allow_headers": "request headers allowed in a preflight",
    "cors.allow_credentials": "Access-Control-Allow-Credentials",
    "cors.max_age_s": "how long a browser keeps a preflight's answer",
    "request_log.max_bytes": "rotate the file at this size",
    "request_log.backups": "rotated files kept",
    "quartz.alpha": "the quantile routed and ordered by: 0.9 or 0.95",
    "quartz.delta": "δ: fall back to least-loaded + FIFO when under-coverage (α − coverage) "
    "exceeds it",
    "quartz.calibration": "online residual correction of the quantiles (false: the ablation)",
    "quartz.window": "residuals kept per regime",
    "quartz.min_samples": "a bucket's own correction (and the coverage check) needs this many "
    "residuals",
    "quartz.locality": "the prefix-locality feature (false: the ablation)",
    "quartz.index_ttl_s": "a prefix-index entry is forgotten this long after its block was "
    "last sent",
    "quartz.index_max_entries": "(block, worker) pairs the prefix index holds at most",
    "quartz.high_fraction": "matched prefix / prompt at or above this is `high` locality",
    "quartz.mean_output_tokens": "the analytic model's mean output length",
    "quartz.spread90": "the analytic model's q90 = mean × this",
    "quartz.spread95": "the analytic model's q95 = mean × this",
    "quartz.engine_h": "H: seconds per running sequence per step (the step model, with engine_w)",
    "quartz.prefill_chunk": "chunked-prefill tokens per step",
    "admission.params.store": "where the counters live: `memory` (one process, no Redis) or "
    "`redis` (shared by every replica)",
    "admission.params.redis_url": "the Redis server (store: redis)",
    "admission.params.default_entitlement": "where requests without an entitlement key go "
    "(counted, and named in x-fleetgate-entitlement, as that one); null: refused as "
    "unknown_entitlement",
    "admission.params.pools": "token pools: one model's serving capacity each (below)",
    "admission.params.entitlements": "entitlements by name (below)",
    "admission.params.default_max_tokens": "the output budget charged for a request without "
    "max_tokens",
    "admission.params.control_interval_s": "debt, burst and priority are stepped this often",
    "admission.params.alpha_slo": "priority's sensitivity to SLO tightness (Eq. 1)",
    "admission.params.alpha_burst": "priority's sensitivity to sustained bursting",
    "admission.params.alpha_debt": "priority's sensitivity to accumulated underservice",
    "admission.params.gamma_debt": "γ_d: the debt EWMA's memory, in [0, 1)",
    "admission.params.gamma_burst": "γ_b: the burst EWMA's memory, in [0, 1)",
    "admission.params.class_weights": "priority weight per service class (defaults: the "
    "classes' own)",
    "admission.params.hold_ttl_s": "a hold outlives no request longer than this",
    "admission.params.heartbeat_ttl_s": "a dead replica's holds come back after this",
    "admission.params.state_retry_s": "Retry-After for an entitlement that is not bound",
    "admission.params.pools.<name>.slots": "r_p: requests in flight at once",
    "admission.params.pools.<name>.tokens_per_s": "Λ_p: tokens per second the pool serves",
    "admission.params.pools.<name>.kv_bytes": "χ_p: the KV cache's bytes",
    "admission.params.pools.<name>.bytes_per_token": "c: KV bytes per token (or kv_geometry; "
    "exactly one of the two)",
    "admission.params.pools.<name>.kv_geometry": "{layers, kv_heads, head_dim, dtype_bytes}: "
    "c = 2·L·H_kv·d_h·b",
    "admission.params.pools.<name>.window_s": "the window of the pool's rate accounting",
    "admission.params.pools.<name>.typical_request_s": "a typical request's length: the "
    "Retry-After of a refusal for room",
    "admission.params.entitlements.<name>.pool": "the token pool it draws from",
    "admission.params.entitlements.<name>.class": "service class: dedicated | guaranteed | "
    "elastic | spot | preemptible (docs/TENANCY.md)",
    "admission.params.entitlements.<name>.tokens_per_s": "λ_e: baseline tokens per second",
    "admission.params.entitlements.<name>.kv_bytes": "χ_e: baseline KV bytes",
    "admission.params.entitlements.<name>.concurrency": "r_e: baseline requests in flight",
    "admission.params.entitlements.<name>.slo_target_ms": "the SLO target, which raises "
    "its priority as it tightens",
    "admission.params.entitlements.<name>.tenant": "the tenant it belongs to (a label)",
    "admission.params.entitlements.<name>.state": "bound (admitted) | pending | degraded | "
    "expired (403 entitlement_inactive)",
    "admission.params.entitlements.<name>.window_s": "the window of its rate accounting",
}


# --- comments beside the fields ----------------------------------------------------------


def field_comments(cls: type) -> dict[str, str]:
    """Field name → the comment above it (a block of comment lines right before it) and the
    comment on its own lines, joined; from the class's source."""
    try:
        lines, _ = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return {}
    source = textwrap.dedent("".join(lines))
    tree = ast.parse(source)
    body = tree.body[0]
    assert isinstance(body, ast.ClassDef)
    comments: dict[int, tuple[str, bool]] = {}  # line → (text, alone on its line)
    src_lines = source.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            line = tok.start[0]
            alone = not src_lines[line - 1][: tok.start[1]].strip()
            text = tok.string.lstrip("#").strip()
            if text not in ("fmt: skip", "fmt: off", "fmt: on") and not text.startswith(
                ("type:", "noqa")
            ):
                comments[line] = (text, alone)
    out: dict[str, str] = {}
    for stmt in body.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        above: list[str] = []
        line = stmt.lineno - 1
        while line in comments and comments[line][1]:
            above.insert(0, comments[line][0])
            line -= 1
        end = stmt.end_lineno or stmt.lineno
        beside = [comments[n][0] for n in range(stmt.lineno, end + 1) if n in comments]
        text = " ".join([*above, *beside]).strip()
        if text:
            out[stmt.target.id] = text
    return out


# --- types and defaults ------------------------------------------------------------------

_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}


def type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return "any"
    if tp in _NAMES:
        return _NAMES[tp]
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(type_name(a) for a in args)
    if origin is list or origin is tuple:
        return f"list of {type_name(args[0])}" if args else "list"
    if origin in (dict, Mapping) or origin is getattr(typing, "Mapping", None):
        return f"map of {type_name(args[0])} → {type_name(args[1])}" if args else "map"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "section"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return " \\| ".join(f"`{m.value}`" for m in tp)
    return getattr(tp, "__name__", str(tp))


def bounds(metadata: list[Any]) -> str:
    out = []
    for m in metadata:
        for attr, sign in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤")):
            value = getattr(m, attr, None)
            if value is not None and not isinstance(m, annotated_types.Interval):
                out.append(f"{sign} {value:g}" if isinstance(value, float) else f"{sign} {value}")
        if isinstance(m, annotated_types.MinLen) and m.min_length:
            out.append(f"at least {m.min_length}")
        if isinstance(m, annotated_types.MaxLen):
            out.append(f"at most {m.max_length}")
    return ", ".join(out)


def shown(value: Any) -> str:
    if isinstance(value, BaseModel):
        return "(section)"
    if isinstance(value, enum.Enum):
        value = value.value
    return f"`{json.dumps(value, ensure_ascii=False)}`"


def model_default(info: FieldInfo) -> str:
    if info.default is not PydanticUndefined:
        return shown(info.default)
    if info.default_factory is not None:
        return shown(info.get_default(call_default_factory=True))
    return "**required**"


def model_keys(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, type[BaseModel]]]:
    """Every section under `model` (itself first), with its key path."""
    yield prefix, model
    for name, info in model.model_fields.items():
        inner = _section_type(info.annotation)
        if inner is None:
            continue
        path = f"{prefix}.{name}" if prefix else name
        origin = typing.get_origin(info.annotation)
        if origin is dict:
            path += ".<name>"
        elif origin is list:
            path += ".<i>"
        yield from model_keys(inner, path)


def _section_type(tp: Any) -> type[BaseModel] | None:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    for arg in typing.get_args(tp):
        found = _section_type(arg)
        if found is not None:
            return found
    return None


def section_rows(model: type[BaseModel], prefix: str) -> list[Key]:
    comments = field_comments(model)
    rows = []
    for name, info in model.model_fields.items():
        tp = type_name(info.annotation)
        limit = bounds(info.metadata)
        path = f"{prefix}.{name}" if prefix else name
        meaning = info.description or comments.get(name) or MEANINGS.get(path, "")
        sub = _section_type(info.annotation)
        if sub is not None:
            origin = typing.get_origin(info.annotation)
            where = f"{prefix}.{name}" if prefix else name
            where += ".<name>" if origin is dict else ".<i>" if origin is list else ""
            meaning = (meaning + " " if meaning else "") + f"See [`{where}`](#{anchor(where)})."
        rows.append(
            Key(
                path,
                tp + (f" ({limit})" if limit else ""),
                model_default(info),
                meaning,
            )
        )
    return rows


def dataclass_rows(cls: type, prefix: str) -> list[Key]:
    comments = field_comments(cls)
    hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
    rows = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            default = shown(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = shown(f.default_factory())
        else:
            default = "**required**"
        path = f"{prefix}.{f.metadata.get('alias', f.name)}"
        meaning = comments.get(f.name) or MEANINGS.get(path, "")
        rows.append(Key(path, type_name(hints[f.name]), default, meaning))
    return rows


def anchor(path: str) -> str:
    return "".join(c for c in path.lower() if c.isalnum() or c in "-_ ").replace(" ", "-")


def _escape(text: str) -> str:
    """Markdown table text: `|` escaped, and `<...>` outside code spans kept from reading as
    HTML."""
    text = re.sub(r"\bNone\b", "null", text)  # the models' comments speak Python; YAML says null
    parts = text.replace("|", "\\|").split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def table(rows: list[Key]) -> list[str]:
    out = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for r in rows:
        meaning = _escape(r.meaning)
        out.append(f"| `{r.path}` | {r.type} | {r.default} | {meaning} |")
    return out


def _doc(obj: Any) -> str:
    """The class's own docstring (not one it inherits: a section's base class's)."""
    own = vars(obj).get("__doc__") if isinstance(obj, type) else inspect.getdoc(obj)
    doc = inspect.cleandoc(own) if own else ""
    base = inspect.getdoc(BaseModel) or ""
    return "" if doc == base else " ".join(doc.split())


def render() -> str:
    from policies.admission import ADMITTERS
    from policies.dispatch import DISPATCHERS
    from policies.routing import ROUTERS
    from policies.tenancy import config as tenancy

    lines = [
        "# Configuration reference",
        "",
        "<!-- generated by `python -m fleetgate.config_doc` from gateway/config.py, policies/spec.py",
        "     and policies/tenancy/config.py: edit those, then run it; a test fails when stale -->",
        "",
        "One YAML file, validated at start (`fleetgate serve --config FILE`); check one without",
        "starting with `fleetgate check-config FILE...`, which prints the effective configuration",
        "with every default filled in, or every problem with its full key path. Unknown keys are",
        "errors. Environment variables override the file: `FLEETGATE_<SECTION>__<KEY>=value`",
        "(double underscore between levels, values read as YAML scalars, list items by index:",
        "`FLEETGATE_POOLS__SHORT__WORKERS__0__URL`). Only `pools` is applied by a live reload;",
        "every other section needs a restart. `<name>` stands for a name you choose (a pool's),",
        "`<i>` for a list item.",
        "",
        "The policy sections (placement, admission, dispatch, budget, routing, retry, breaker,",
        "quartz, and a pool's own `routing`) are the policy schema the simulator's scenarios",
        "share (policies/spec.py): a scenario's `policy:` takes exactly these keys.",
        "",
        "Policies chosen by name (unknown names and parameters are refused at start):",
        "",
        f"- `routing.policy`: {', '.join(f'`{n}`' for n in ROUTERS.names())}",
        f"- `dispatch.policy`: {', '.join(f'`{n}`' for n in DISPATCHERS.names())}",
        f"- `admission.policy`: {', '.join(f'`{n}`' for n in ADMITTERS.names())}",
        "",
    ]
    for path, model in model_keys(gc.GatewayConfig, ""):
        rows = section_rows(model, path)
        if not rows:
            continue
        lines += [f"## `{path or '(top level)'}`", ""]
        doc = _doc(model)
        if doc:
            lines += [doc, ""]
        lines += [*table(rows), ""]
    store = "admission.params"
    lines += [
        "## `admission.params` with `policy: token_pools`",
        "",
        _doc(tenancy).split(" admission: ")[0] + " Where the counters live "
        "(`EntitlementStoreSettings`):",
        "",
        *table(section_rows(EntitlementStoreSettings, store)),
        "",
        "The token pools and entitlements (`TokenPoolsConfig`):",
        "",
        *table(dataclass_rows(tenancy.TokenPoolsConfig, store)),
        "",
        "### `admission.params.pools.<name>`",
        "",
        *table(dataclass_rows(tenancy._PoolParams, f"{store}.pools.<name>")),
        "",
        "### `admission.params.entitlements.<name>`",
        "",
        "An entitlement may also list its API `keys` here (as `auth.keys` does).",
        "",
        *table(dataclass_rows(tenancy._EntitlementParams, f"{store}.entitlements.<name>")),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fleetgate.config_doc", description=__doc__)
    p.add_argument("--check", action="store_true", help="exit 1 when the file is stale")
    p.add_argument("--out", type=Path, default=DOC)
    args = p.parse_args(argv)
    text = render()
    if args.check:
        current = args.out.read_text() if args.out.is_file() else ""
        if current != text:
            print(f"{args.out} is stale: run `python -m fleetgate.config_doc`", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
