"""Gateway configuration: one YAML file, environment overrides, validated at start.

Every section rejects unknown keys, and a validation error names the full key path
(`pools.short.workers.0.url: ...`), so a typo fails the start instead of being ignored.
Environment variables override the file: `FLEETGATE_LISTEN__PORT=9000` sets
`listen.port` (double underscore between levels; values are read as YAML scalars).
"""

from __future__ import annotations

import copy
import importlib.util
import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from dataclasses import field as dc_field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from compressor.served import load_served, parse_spec
from gateway.apikeys import stored_form
from gateway.config_pd import PdSettings
from policies.registry import ParamError

ENV_PREFIX = "FLEETGATE_"


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, reading numbers in exponent notation as YAML 1.2 does.

    PyYAML follows YAML 1.1, whose float needs a dot and a signed exponent: `1.0e+12` is a
    float but `1e12` and `1.0e12` are strings, which a policy's parameters would then
    compare with numbers. A plain scalar that is a decimal with an exponent is a float here
    (integers, `.inf`, `.nan` and sexagesimal values resolve as before; a quoted value
    stays a string)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def yaml_load(text: str) -> Any:
    """One YAML document, with `_Loader` (exponent notation reads as a number)."""
    return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass: no arbitrary objects


class ConfigError(ValueError):
    """A configuration that cannot be served; the message names the bad key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Listen(_Section):
    """How `fleetgate serve` runs uvicorn (the same options uvicorn's CLI has)."""

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    # processes sharing the port; each keeps its own soft state (fleet view, breakers,
    # learnt bytes/token, traffic histogram): see README "Several processes"
    workers: int = Field(1, ge=1, le=256)
    root_path: str = ""  # the prefix a reverse proxy strips (ASGI root_path)
    proxy_headers: bool = False  # trust X-Forwarded-For/-Proto from forwarded_allow_ips
    forwarded_allow_ips: str = "127.0.0.1"
    ssl_certfile: str | None = None  # both set: serve HTTPS
    ssl_keyfile: str | None = None
    keep_alive_s: float = Field(75.0, gt=0)  # idle client connections are closed after this
    # on SIGTERM: readiness 503 and new requests refused for this long (load balancers
    # notice), then in-flight requests get graceful_shutdown_s to finish
    drain_delay_s: float = Field(5.0, ge=0)
    graceful_shutdown_s: float = Field(30.0, ge=0)
    limit_concurrency: int | None = Field(None, ge=1)  # connections + tasks before 503
    backlog: int = Field(2048, ge=1)
    access_log: bool = False  # uvicorn's access log (the request log is the detailed one)
    # with a config file: check its modification time this often and reload the fleet when
    # it changes (SIGHUP and POST /admin/reload reload at once); 0: no polling
    reload_poll_s: float = Field(5.0, ge=0)

    @model_validator(mode="after")
    def _tls_pair(self) -> Listen:
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("ssl_certfile and ssl_keyfile go together")
        return self


class Cors(_Section):
    """Browser access (off unless allow_origins is set); applies to every route."""

    allow_origins: list[str] = Field(default_factory=list)
    allow_methods: list[str] = Field(default_factory=lambda: ["GET", "POST"])
    allow_headers: list[str] = Field(
        default_factory=lambda: ["authorization", "content-type", "x-request-id"]
    )
    allow_credentials: bool = False
    max_age_s: int = Field(600, ge=0)


class Expose(_Section):
    """What answers reveal about the fleet, for deployments that must not show addresses."""

    worker_header: bool = True  # x-fleetgate-worker on every proxied answer
    upstream_detail: bool = True  # the engine's error text in 502/504 messages


class Auth(_Section):
    api_keys: list[str] = Field(default_factory=list)  # keys that name no entitlement
    admin_key: str | None = None
    # API keys → entitlements (admission.policy: token_pools): entitlement name → its keys,
    # each a key as given to the client or its keyed hash `hmac-sha256:<hex>` (fleetgate
    # hash-key prints it); kept only as HMAC-SHA256 keyed by `key_secret`
    keys: dict[str, list[str]] = Field(default_factory=dict)
    # the server secret the keys are hashed with; the same on every replica (set it with
    # FLEETGATE_AUTH__KEY_SECRET rather than in the file)
    key_secret: str | None = Field(None, min_length=16)
    # /admin/entitlements' own key (the other admin routes take admin_key); None: disabled
    entitlements_admin_key: str | None = None

    @model_validator(mode="after")
    def _secret_for_keys(self) -> Auth:
        if self.keys and not self.key_secret:
            raise ValueError("key_secret: required with auth.keys (keys are kept as HMACs)")
        return self

    @property
    def required(self) -> bool:
        """Requests must carry a known key."""
        return bool(self.api_keys or self.keys)


class Worker(_Section):
    """One engine. Checked here, whichever way it comes in (the file, a reload, POST
    /admin/workers): what passes goes into request lines and headers as it is."""

    url: str
    engine: Literal["vllm", "sglang"] = "vllm"
    name: str | None = None  # defaults to host:port[/path]
    max_model_len: int | None = Field(None, gt=0)  # defaults to the pool's
    max_num_seqs: int | None = Field(None, ge=1)  # defaults to the pool's
    api_key: str | None = None  # sent upstream as a bearer token
    # a `kind: pd` pool's worker: which side of its pairs it serves (gateway/config_pd.py)
    role: Literal["prefill", "decode"] | None = None
    # an SGLang prefill's bootstrap port (--disaggregation-bootstrap-port); None: its URL's
    bootstrap_port: int | None = Field(None, ge=1, le=65535)

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        return worker_url(v)

    @field_validator("name")
    @classmethod
    def _header_name(cls, v: str | None) -> str | None:
        if v is not None and not header_safe(v):
            raise ValueError("printable ASCII, no spaces (a header value)")
        return v

    @field_validator("api_key")
    @classmethod
    def _header_key(cls, v: str | None) -> str | None:
        # never echoed: the message says what is wrong, not what was given
        if v is not None and not _TOKEN.fullmatch(v):
            raise ValueError(
                "must be visible ASCII with no spaces or control characters"
                " (it is sent in the Authorization header)"
            )
        return v

    @property
    def id(self) -> str:
        return self.name or self.url.split("://", 1)[1]


_TOKEN = re.compile(r"[\x21-\x7e]+")
_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")
_URL_PATH = re.compile(r"(/[\x21-\x7e]*)?")


def worker_url(v: str) -> str:
    """A worker's URL, checked for everything the upstream client will do with it: an
    http(s) scheme, a host and port a connection can be made to, no credentials (they would
    show in x-fleetgate-worker, /metrics and the Host header: give the key as `api_key`),
    no query or fragment. Returned without a trailing slash."""
    if not v.startswith(("http://", "https://")):
        raise ValueError("must be an http:// or https:// URL")
    netloc = v.split("://", 1)[1].split("/", 1)[0]
    if "@" in netloc:  # never echoed: it holds credentials
        raise ValueError(
            "must not hold credentials (user:password@host): give the engine's key as api_key"
        )
    # before urlsplit, which drops tabs, CR and LF where it finds them
    if not _TOKEN.fullmatch(v):
        raise ValueError("must be visible ASCII: no spaces or control characters")
    if netloc.endswith(":"):
        raise ValueError(f"no port after ':' in {netloc!r}")
    if "?" in v or "#" in v:
        raise ValueError(f"must have no query or fragment, got {v!r}")
    try:
        parts = urlsplit(v)
        port = parts.port
    except ValueError:
        raise ValueError(f"bad host or port (1-65535) in {netloc!r}") from None
    if port == 0:
        raise ValueError(f"bad port 0 in {netloc!r} (1-65535)")
    host = parts.hostname or ""
    if not host:
        raise ValueError(f"no host in {v!r}")
    if netloc.startswith("["):
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"bad IPv6 address in {netloc!r}") from None
    elif len(host) > 253 or not all(
        _HOST_LABEL.fullmatch(p) for p in host.removesuffix(".").split(".")
    ):
        raise ValueError(f"bad host name {host!r}: letters, digits, '-', '_' between dots")
    if not _URL_PATH.fullmatch(parts.path):
        raise ValueError(f"bad path in {v!r}: visible ASCII, no spaces")
    return v.rstrip("/")


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_PORT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,13}[a-z0-9])?$")


class KubernetesDiscovery(_Section):
    """A pool's workers found in Kubernetes (gateway/discovery.py): the ready endpoints of
    the EndpointSlices that match a label selector, watched live. Needs the `kubernetes`
    extra (`pip install 'fleetgate[kubernetes]'`) and RBAC to get, list and watch
    EndpointSlices in the namespace (deploy/kubernetes/base/rbac.yaml)."""

    kind: Literal["kubernetes"] = Field(
        description="The discovery mechanism; `kubernetes` (EndpointSlices,"
        " discovery.k8s.io/v1) is the one there is."
    )
    namespace: str = Field(
        description="The namespace whose EndpointSlices are watched (a DNS label)."
    )
    selector: str = Field(
        min_length=1,
        description="A Kubernetes label selector on the EndpointSlices, as `kubectl -l` takes"
        " it: `kubernetes.io/service-name=vllm-llama` picks the slices of one Service.",
    )
    port: int | str = Field(
        description="The engine's port: a number, or the name of a port in the"
        " EndpointSlices' `ports` (a slice without that name contributes no workers).",
    )
    engine: Literal["vllm", "sglang"] = Field(
        "vllm", description="What the discovered workers run (as a static worker's `engine`)."
    )
    scheme: Literal["http", "https"] = Field("http", description="How to reach the workers.")
    api_key: str | None = Field(
        None, description="Sent to every discovered worker as a bearer token."
    )
    kubeconfig: str | None = Field(
        None,
        description="A kubeconfig file to reach the API server with; None: the in-cluster"
        " configuration (the pod's service account).",
    )
    watch_timeout_s: int = Field(
        300,
        ge=1,
        le=3600,
        description="Each watch request asks the API server to end after this long; the"
        " watch then resumes from the last resourceVersion seen (a 410 Gone re-lists).",
    )
    retry_s: float = Field(
        1.0,
        gt=0,
        description="After an API error, wait this long before the next list (doubling up"
        " to 30 s while errors go on); the workers found so far stay meanwhile.",
    )

    @model_validator(mode="after")
    def _client_installed(self) -> KubernetesDiscovery:
        # a check before the cost: refused at start (and by check-config), not in a task
        if importlib.util.find_spec("kubernetes_asyncio") is None:
            raise ValueError(
                "kind: kubernetes needs the kubernetes extra: pip install 'fleetgate[kubernetes]'"
            )
        return self

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str) -> str:
        if not _DNS_LABEL.match(v):
            raise ValueError(f"must be a DNS label (lower-case letters, digits, '-'), got {v!r}")
        return v

    @field_validator("port")
    @classmethod
    def _port(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 1 <= v <= 65535:
            raise ValueError(f"a port number is 1..65535, got {v}")
        if isinstance(v, str) and (v.isdigit() or not _PORT_NAME.match(v)):
            raise ValueError(f"a port name is lower-case letters, digits and '-', got {v!r}")
        return v


class Pool(_Section):
    # standard: independent replicas; pd: prefill and decode workers, a request on a pair
    kind: Literal["standard", "pd"] = "standard"
    pd: PdSettings | None = None  # kind: pd — its protocol and pair selector
    max_model_len: int = Field(gt=0)
    # requests a worker takes at once (the engine's --max-num-seqs); beyond it a request
    # waits in the gateway for room (`dispatch`); None: no limit, the engine queues
    max_num_seqs: int | None = Field(None, ge=1)
    models: list[str] = Field(min_length=1)
    # at least one, unless `discovery` finds them
    workers: list[Worker] = Field(default_factory=list)
    discovery: KubernetesDiscovery | None = Field(
        None,
        description="Find the pool's workers in Kubernetes (beside any listed in `workers`):"
        " ready endpoints join, endpoints that go away or turn not ready drain, as a"
        " configuration reload would do.",
    )
    # what the pool's model counts prompts with (compressor/served.py): auto (the engine's
    # /tokenize where it offers it, probed at start; else cl100k), cl100k (the emulator's),
    # hf:<tokenizer folder> (tokenizer.json + its chat template), or engine
    tokenizer: str = "auto"
    # tokenizer: engine — how long the gateway waits for a worker's /tokenize before it
    # counts locally (cl100k) instead (gateway/tokenize.py)
    tokenize_timeout_s: float = Field(0.5, gt=0)
    # this pool's own routing policy (as the simulator's scenario pools have); None: the
    # top-level `routing`
    routing: Routing | None = None

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer_spec(cls, v: str) -> str:
        parse_spec(v)
        return v

    @model_validator(mode="after")
    def _has_workers(self) -> Pool:
        if not self.workers and self.discovery is None:
            raise ValueError("workers: list at least one worker, or find them with `discovery`")
        check_pd_pool(self)
        return self


def check_pd_pool(pool: Pool) -> None:
    """A `kind: pd` pool names its protocol, lists a prefill and a decode worker (each
    worker with its role, engines of the protocol) and is not discovered (discovered
    workers have no role); any other pool has no roles."""
    roles = [w.role for w in pool.workers]
    if pool.kind != "pd":
        if pool.pd is not None or any(roles):
            raise ValueError("pd, role: only in a pool of kind: pd")
        return
    if pool.pd is None:
        raise ValueError("pd: a pool of kind: pd needs pd.protocol (vllm or sglang)")
    if pool.discovery is not None:
        raise ValueError("discovery: a pool of kind: pd lists its workers with their roles")
    for i, w in enumerate(pool.workers):
        if w.role is None:
            raise ValueError(f"workers.{i}.role: prefill or decode, in a pool of kind: pd")
        if w.engine != pool.pd.protocol:
            raise ValueError(
                f"workers.{i}.engine: {w.engine}, but pd.protocol is {pool.pd.protocol}"
            )
        if w.bootstrap_port is not None and (w.role != "prefill" or w.engine != "sglang"):
            raise ValueError(f"workers.{i}.bootstrap_port: only an sglang prefill worker's")
    for role in ("prefill", "decode"):
        if role not in roles:
            raise ValueError(f"workers: a pool of kind: pd needs a {role} worker")


class Placement(_Section):
    # a registered placement policy (policies/pools.py): compress_and_route, FleetOpt §5
    # (short, compress-then-short, long); short_long, §2.1
    policy: str = "compress_and_route"
    # the policy's own parameters (compress_and_route: min_target, compressible); the keys
    # below are offered to every policy, which takes the ones it uses
    params: dict[str, Any] = Field(default_factory=dict)
    short_pool: str = "short"
    # B_short: the short pool's boundary in tokens; defaults to its max_model_len
    b_short: int | None = Field(None, gt=0)
    # γ: compress when B_short < L_total ≤ γ·B_short (FleetOpt §5.1)
    gamma: float = Field(1.5, ge=1.0, le=4.0)
    # estimates this close below B_short are counted exactly before the short pool
    verify_margin: float = Field(0.05, ge=0.0, lt=1.0)
    # threads that count and compress borderline prompts off the event loop; 0: inline
    compress_workers: int = Field(1, ge=0, le=64)
    # never shorten the last user message (compressor.compress.CompressorConfig's
    # protect_last_user; false: it is shortened around its trailing question)
    protect_last_user: bool = False
    # compress_and_route with no larger pool serving a model: compress band requests onto
    # the one pool (true), or refuse them 400 context_length_exceeded naming this key
    # (false, the default: a single pool silently shortening prompts surprised users)
    compress_single_pool: bool = False

    @model_validator(mode="after")
    def _builds(self) -> Placement:
        from policies.pools import PLACERS, make_placement

        b_short = self.b_short or 8192  # the short pool's context when unset: checked later
        _check_builds(
            PLACERS.names(),
            self.policy,
            lambda: make_placement(
                self.policy,
                self.short_pool,
                b_short,
                self.gamma,
                self.verify_margin,
                {**self.params, "compress_single_pool": self.compress_single_pool},
            ),
        )
        return self


ServiceClassName = Literal["dedicated", "guaranteed", "elastic", "spot", "preemptible"]


class EntitlementStoreSettings(_Section):
    """Where `token_pools` keeps its counters (admission.params beside the policy's own):
    `memory` (one process, no Redis) or `redis` (shared by every replica)."""

    store: Literal["memory", "redis"] = "memory"
    redis_url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = "fg"  # Redis keys: <prefix>:{<pool>}:…
    timeout_s: float = Field(0.25, gt=0)  # every Redis call; never a hang
    breaker_failures: int = Field(3, ge=1)  # consecutive errors that open the breaker
    breaker_cooldown_s: float = Field(2.0, gt=0)  # open this long, then one probe
    # Redis unreachable: a class that fails open is admitted against local limits / live
    # replicas, one that fails closed gets 429 store_unavailable. Defaults: dedicated,
    # guaranteed, elastic open; spot, preemptible closed
    fail_open: dict[ServiceClassName, bool] = Field(default_factory=dict)
    # the replicas sharing the store: while Redis is unreachable a replica admits at most
    # its share of each limit, ⌊limit / n⌋ with n = the larger of this and the replica
    # count its heartbeat last saw (this alone when it never reached Redis). 1: a replica
    # that starts without Redis admits the whole limit by itself
    expected_replicas: int = Field(1, ge=1, le=10_000)
    # token pool → fleet pool: the token pool's capacity follows that pool's workers in
    # service (configured × active / configured workers, within 0.1 s), so a
    # worker drained or added through /admin/workers or a reload resizes it (§3.1).
    # In-memory store only (with Redis every replica would write the capacity)
    follow_workers: dict[str, str] = Field(default_factory=dict)

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, v: str) -> str:
        if not v.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"must be a redis://, rediss:// or unix:// URL, got {v!r}")
        return v


STORE_KEYS = frozenset(EntitlementStoreSettings.model_fields)


class Admission(_Section):
    """Step 5 (policies/admission.py): `always` admits everything; `concurrency` holds at
    most `params.limit` requests of one entitlement in flight (429 + Retry-After beyond);
    `token_pools` admits on token-pool entitlements (policies/tenancy/config.py's keys,
    plus the store's: `EntitlementStoreSettings`; an entitlement may list its API `keys`)."""

    policy: str = "always"
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _builds(self) -> Admission:
        from policies.admission import ADMITTERS

        if self.policy == "token_pools":
            try:
                self.store_settings()
            except ValidationError as exc:
                first = exc.errors()[0]
                loc = ".".join(str(p) for p in first["loc"] if p != "[key]")
                msg = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
                raise ValueError(f"params.{loc}: {msg.removeprefix('Value error, ')}") from None
        _check_builds(
            ADMITTERS.names(),
            self.policy,
            lambda: ADMITTERS.make(self.policy, self.policy_params()),
        )
        return self

    def policy_params(self) -> dict[str, Any]:
        """`params` as the policy takes them (the store's settings and keys left out)."""
        if self.policy != "token_pools":
            return self.params
        out = {k: v for k, v in self.params.items() if k not in STORE_KEYS}
        ents = out.get("entitlements")
        if isinstance(ents, Mapping):
            out["entitlements"] = {
                n: {k: v for k, v in e.items() if k != "keys"} if isinstance(e, Mapping) else e
                for n, e in ents.items()
            }
        return out

    def store_settings(self) -> EntitlementStoreSettings:
        return EntitlementStoreSettings.model_validate(
            {k: v for k, v in self.params.items() if k in STORE_KEYS}
        )

    def entitlement_keys(self) -> dict[str, list[str]]:
        """`params.entitlements.<name>.keys` (token_pools): entitlement → its API keys."""
        ents = self.params.get("entitlements") if self.policy == "token_pools" else None
        if not isinstance(ents, Mapping):
            return {}
        return {
            str(n): [str(k) for k in e.get("keys") or ()]
            for n, e in ents.items()
            if isinstance(e, Mapping) and e.get("keys")
        }


class Dispatch(_Section):
    """Requests that find every worker of their pools without room wait here, in the
    dispatch policy's order (fifo; quartz; token_fair)."""

    policy: str = "fifo"  # policies/dispatch.py's registry
    params: dict[str, Any] = Field(default_factory=dict)  # the policy's own (quartz: lam, beta…)
    max_waiting: int = Field(1024, ge=0)  # beyond this: 429 at once
    timeout_s: float = Field(30.0, gt=0)  # longer than this without room: 503 queue_timeout
    # a worker takes another request while this gateway's outstanding tokens on it
    # (Σ prompt + max_tokens) are below its KV cache tokens (from its /metrics) × this;
    # None: the KV cache's size is not used (engines preempt or queue past it themselves)
    kv_overcommit: float | None = Field(None, gt=0)
    # a worker takes another request while the prompt tokens this gateway sent it that
    # have no first token yet are below this (every dispatch policy alike; QUARTZ's room:
    # a long prompt waits here, where the order is ours); None: not considered
    prefill_room: int | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _builds(self) -> Dispatch:
        from policies.dispatch import DISPATCHERS

        params = {"max_waiting": self.max_waiting, "timeout_s": self.timeout_s, **self.params}
        _check_builds(
            DISPATCHERS.names(), self.policy, lambda: DISPATCHERS.make(self.policy, params)
        )
        return self


class Budget(_Section):
    bytes_per_token: float = Field(4.0, gt=0)
    default_max_tokens: int = Field(256, gt=0)


class Routing(_Section):
    policy: str = "least_loaded"
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _builds(self) -> Routing:
        from policies.routing import ROUTERS

        _check_builds(ROUTERS.names(), self.policy, lambda: ROUTERS.make(self.policy, self.params))
        return self


def _check_builds(names: list[str], policy: str, build: Any) -> None:
    """A policy named in configuration must build: unknown names and parameters are
    refused at start (the error names what is known)."""
    if policy not in names:
        raise ValueError(f"policy: unknown {policy!r}; known: {', '.join(names)}")
    try:
        build()
    except ParamError as exc:  # names its key: the error reads <section>.params.<path>
        raise ValueError(f"params.{exc.path}: {exc.detail}") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"params: {exc}") from None


class Telemetry(_Section):
    scrape_interval_s: float = Field(0.5, gt=0)
    stale_after_s: float = Field(2.0, gt=0)
    timeout_s: float = Field(1.0, gt=0)


class Health(_Section):
    interval_s: float = Field(2.0, gt=0)
    timeout_s: float = Field(1.0, gt=0)
    unhealthy_after: int = Field(2, ge=1)  # consecutive failed checks
    healthy_after: int = Field(1, ge=1)  # consecutive good checks to come back


class Breaker(_Section):
    failures: int = Field(3, ge=1)  # consecutive request failures that open the circuit
    open_s: float = Field(10.0, gt=0)  # how long it stays open before a trial request


class Upstream(_Section):
    connect_timeout_s: float = Field(5.0, gt=0)
    first_byte_timeout_s: float = Field(600.0, gt=0)
    idle_timeout_s: float = Field(60.0, gt=0)
    max_connections_per_worker: int = Field(512, ge=1)  # idle ones included
    pool_wait_timeout_s: float = Field(30.0, gt=0)  # waiting for one when all are in use
    max_response_bytes: int = Field(64 * 1024 * 1024, gt=0)  # a non-streamed answer


class Limits(_Section):
    max_body_bytes: int = Field(32 * 1024 * 1024, gt=0)  # larger request bodies: 413
    max_header_bytes: int = Field(64 * 1024, ge=1024)  # larger request heads: 431
    head_timeout_s: float = Field(10.0, gt=0)  # a request head must arrive within this: 408
    body_timeout_s: float = Field(60.0, gt=0)  # the rest of a request body, likewise
    # a client that reads none of a stream for this long is cut (never the worker's fault)
    client_write_timeout_s: float = Field(60.0, gt=0)


class Quartz(_Section):
    """QUARTZ's predictor (policies/quantile/config.py; gateway/quartz.py). Present, or a
    routing/dispatch policy that uses it: the predictor is built at start."""

    model: str | None = None  # a trained tree model file; None: the analytic model
    alpha: float = 0.95
    delta: float = Field(0.05, gt=0, lt=1)
    calibration: bool = True
    window: int = Field(256, ge=2)
    min_samples: int = Field(32, ge=1)
    locality: bool = True
    index_ttl_s: float = Field(300.0, gt=0)
    index_max_entries: int = Field(200_000, ge=1)
    high_fraction: float = Field(0.5, gt=0, le=1)
    mean_output_tokens: float = Field(256.0, ge=0)
    spread90: float = Field(1.3, ge=1)
    spread95: float = Field(1.5, ge=1)
    # the engine's step model for the analytic estimate (emulator defaults)
    engine_w: float = Field(0.008, ge=0)
    engine_h: float = Field(0.00065, ge=0)
    prefill_chunk: int = Field(512, ge=1)
    # compute-bound prefill, when the engines are modelled with it (emulator flags of the
    # same names; a real engine: seconds per prompt token at full batch, and its
    # --max-num-batched-tokens)
    prefill_token_s: float = Field(0.0, ge=0)
    max_num_batched_tokens: int | None = Field(None, ge=1)

    @field_validator("alpha")
    @classmethod
    def _alpha(cls, v: float) -> float:
        if v not in (0.9, 0.95):
            raise ValueError("must be 0.9 or 0.95")
        return v

    @model_validator(mode="after")
    def _builds(self) -> Quartz:
        self.settings()
        return self

    def settings(self) -> Any:
        from policies.quantile.config import QuartzSettings

        names = set(QuartzSettings.__dataclass_fields__)
        return QuartzSettings(**{k: v for k, v in self.model_dump().items() if k in names})


class Traffic(_Section):
    window_s: float = Field(300.0, gt=0)  # the observed-traffic window the planner sees


class RequestLog(_Section):
    path: str | None = None  # None: off; "-": stdout; else a file (rotated at max_bytes)
    max_bytes: int = Field(100 * 1024 * 1024, gt=0)
    backups: int = Field(3, ge=0)
    # lines held in memory while the writer thread lags; beyond it entries are dropped
    queue_max: int = Field(65_536, ge=1)


class GatewayConfig(_Section):
    listen: Listen = Field(default_factory=Listen)
    auth: Auth = Field(default_factory=Auth)
    pools: dict[str, Pool] = Field(min_length=1)
    placement: Placement = Field(default_factory=Placement)
    admission: Admission = Field(default_factory=Admission)
    dispatch: Dispatch = Field(default_factory=Dispatch)
    budget: Budget = Field(default_factory=Budget)
    routing: Routing = Field(default_factory=Routing)
    telemetry: Telemetry = Field(default_factory=Telemetry)
    health: Health = Field(default_factory=Health)
    breaker: Breaker = Field(default_factory=Breaker)
    upstream: Upstream = Field(default_factory=Upstream)
    limits: Limits = Field(default_factory=Limits)
    cors: Cors = Field(default_factory=Cors)
    expose: Expose = Field(default_factory=Expose)
    request_log: RequestLog = Field(default_factory=RequestLog)
    traffic: Traffic = Field(default_factory=Traffic)
    quartz: Quartz | None = None

    @model_validator(mode="after")
    def _consistent(self) -> GatewayConfig:
        self._keys_name_entitlements()
        ids: set[str] = set()
        for pname, pool in self.pools.items():
            if not header_safe(pname):
                raise ValueError(f"pools.{pname}: a pool name is printable ASCII, no spaces")
            for i, w in enumerate(pool.workers):
                if w.id in ids:
                    raise ValueError(f"pools.{pname}.workers.{i}: worker {w.id!r} appears twice")
                ids.add(w.id)
        # placement names the short pool: a typo would silently turn Compress-and-Route off
        # (no pool matches, so every request goes to the long pool, uncompressed)
        pl = self.placement
        short = self.pools.get(pl.short_pool)
        if short is None:
            raise ValueError(
                f"placement.short_pool: no pool named {pl.short_pool!r}"
                f" (the pools are {', '.join(map(repr, self.pools))})"
            )
        for pname, pool in self.pools.items():
            try:
                load_served(pool.tokenizer)  # once per spec (cached): the gateway uses it
            except (OSError, ValueError, ImportError) as exc:
                raise ValueError(
                    f"pools.{pname}.tokenizer: cannot load {pool.tokenizer!r}: {exc}"
                ) from None
        if pl.b_short is not None and pl.b_short > short.max_model_len:
            raise ValueError(
                f"placement.b_short: {pl.b_short} is larger than the context of the short pool"
                f" {pl.short_pool!r} (max_model_len {short.max_model_len})"
            )
        return self

    def _keys_name_entitlements(self) -> None:
        adm = self.admission
        in_params = adm.entitlement_keys()
        if in_params and not self.auth.key_secret:
            raise ValueError("auth.key_secret: required with admission.params.entitlements.*.keys")
        if adm.policy != "token_pools":
            if self.auth.keys:
                raise ValueError(
                    "auth.keys: API keys name entitlements of admission.policy token_pools"
                )
            return
        store = adm.store_settings()
        for token_pool, fleet_pool in store.follow_workers.items():
            where = f"admission.params.follow_workers.{token_pool}"
            if token_pool not in (adm.params.get("pools") or {}):
                raise ValueError(f"{where}: no such pool in admission.params.pools")
            if fleet_pool not in self.pools:
                raise ValueError(f"{where}: no fleet pool {fleet_pool!r} in pools")
            if store.store != "memory":
                raise ValueError(f"{where}: needs the in-memory store (store: memory)")
        known = adm.params.get("entitlements") or {}
        for name in self.auth.keys:
            if name not in known:
                raise ValueError(
                    f"auth.keys.{name}: no such entitlement in admission.params.entitlements"
                )
        self._one_entitlement_per_key()

    def _one_entitlement_per_key(self) -> None:
        """A key (or its hash) listed under two entitlements would map to whichever came
        last: refused, naming both places and never the key."""
        secret = self.auth.key_secret or ""
        places = [
            (name, f"auth.keys.{name}.{i}", key)
            for name, keys in self.auth.keys.items()
            for i, key in enumerate(keys)
        ] + [
            (name, f"admission.params.entitlements.{name}.keys.{i}", key)
            for name, keys in self.admission.entitlement_keys().items()
            for i, key in enumerate(keys)
        ]
        seen: dict[str, tuple[str, str]] = {}  # stored form → (entitlement, key path)
        for name, where, key in places:
            try:
                stored = stored_form(secret, key)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
            first = seen.setdefault(stored, (name, where))
            if first[0] != name:
                raise ValueError(
                    f"{where}: the same key is {first[1]}: a key names one entitlement, not"
                    f" two ({first[0]!r} and {name!r})"
                )

    def entitlement_keys(self) -> dict[str, list[str]]:
        """Every configured API key of an entitlement (auth.keys and the entitlements' own)."""
        out = {n: list(keys) for n, keys in self.auth.keys.items()}
        for n, keys in self.admission.entitlement_keys().items():
            out.setdefault(n, []).extend(keys)
        return out

    @property
    def auth_required(self) -> bool:
        return self.auth.required or bool(self.admission.entitlement_keys())

    @property
    def b_short(self) -> int:
        short = self.pools.get(self.placement.short_pool)
        if self.placement.b_short is not None:
            return self.placement.b_short
        return short.max_model_len if short else 0


def header_safe(name: str) -> bool:
    """Pool and worker names go into x-fleetgate-pool / x-fleetgate-worker as they are."""
    return bool(name) and name.isascii() and name.isprintable() and " " not in name


def load_config(
    path: str | Path | None = None,
    *,
    data: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> GatewayConfig:
    """Read YAML (or take `data`), apply FLEETGATE_* overrides, validate."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
        try:
            loaded = yaml_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"config {path} is not valid YAML: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config {path}: the top level must be a mapping")
        raw = loaded or {}
    elif data is not None:
        raw = _deepcopy(data)
    _apply_env(raw, os.environ if environ is None else environ)
    try:
        return GatewayConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path)) from None


# the sections a reload applies live; every other change needs a restart
LIVE_SECTIONS = frozenset({"pools"})


@dataclass(frozen=True)
class ConfigSource:
    """Where the running configuration came from, so that a reload reads it the same way:
    the file (with FLEETGATE_* environment overrides) and the command line's `listen.*`
    flags on top."""

    path: str
    listen_overrides: Mapping[str, Any] = dc_field(default_factory=dict)
    # the file's (mtime, size) just before the running configuration was read from it: a
    # change after that point is a change the file poll must notice
    stamp: tuple[int, int] | None = None

    def stamped(self) -> ConfigSource:
        """This source with the file's stamp as of now (take it before `load`)."""
        return replace(self, stamp=file_stamp(self.path))

    def load(self) -> GatewayConfig:
        config = load_config(self.path)
        if self.listen_overrides:
            listen = config.listen.model_dump() | dict(self.listen_overrides)
            try:
                config = GatewayConfig.model_validate(config.model_dump() | {"listen": listen})
            except ValidationError as exc:
                raise ConfigError(_describe(exc, "command line")) from None
        return config


def file_stamp(path: str) -> tuple[int, int] | None:
    """(mtime in ns, size) of a file, None when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def live_merge(running: GatewayConfig, new: GatewayConfig) -> tuple[GatewayConfig, list[str]]:
    """The running configuration with `new`'s live sections (the fleet), and the key paths
    of everything else that differs (not applied: those need a restart). Raises ConfigError
    when the merged configuration does not hold together (say the pools no longer include
    `placement.short_pool`)."""
    merged_data = running.model_dump() | {k: new.model_dump()[k] for k in LIVE_SECTIONS}
    try:
        merged = GatewayConfig.model_validate(merged_data)
    except ValidationError as exc:
        raise ConfigError(
            _describe(exc, None).replace(
                "config is invalid",
                "the new fleet does not fit the"
                " running configuration (whose other sections need a restart to change)",
            )
        ) from None
    if merged.b_short != running.b_short:
        short = running.placement.short_pool
        raise ConfigError(
            f"pools.{short}.max_model_len: {merged.b_short} would change B_short (the"
            f" placement boundary, {running.b_short}), which needs a restart; or set"
            " placement.b_short"
        )
    return merged, _differences(running.model_dump(), new.model_dump(), "", LIVE_SECTIONS)


def _differences(old: Any, new: Any, prefix: str, skip: frozenset[str]) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in sorted(set(old) | set(new), key=str):
            if not prefix and k in skip:
                continue
            path = f"{prefix}.{k}" if prefix else str(k)
            if k not in old or k not in new:
                out.append(path)
            else:
                out.extend(_differences(old[k], new[k], path, skip))
        return out
    return [] if old == new else [prefix]


def _deepcopy(data: Mapping[str, Any]) -> dict[str, Any]:
    """A copy that environment overrides can change without touching the caller's data:
    mappings become dicts and lists new lists, all the way down (a worker's dict inside a
    pool's `workers` list included)."""
    return {k: _copy(v) for k, v in data.items()}


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return _deepcopy(value)
    if isinstance(value, list | tuple):
        return [_copy(v) for v in value]
    return copy.deepcopy(value)


def _apply_env(raw: dict[str, Any], environ: Mapping[str, str]) -> None:
    """FLEETGATE_SECTION__KEY[__KEY...]=value; list items are addressed by index."""
    for name, value in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        keys = [k.lower() for k in name[len(ENV_PREFIX) :].split("__")]
        if not all(keys):
            continue
        node: Any = raw
        for k in keys[:-1]:
            if isinstance(node, list):
                if not (k.isdigit() and int(k) < len(node)):
                    raise ConfigError(f"{name}: no list item {k} at that path")
                node = node[int(k)]
            elif isinstance(node, dict):
                node = node.setdefault(k, {})
            else:
                raise ConfigError(f"{name}: {k} is not a section")
        if not isinstance(node, dict):
            raise ConfigError(f"{name}: the parent of {keys[-1]} is not a section")
        node[keys[-1]] = yaml_load(value) if value else value


def _describe(exc: ValidationError, path: str | Path | None) -> str:
    where = f"config {path}" if path else "config"
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif err["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
            head, sep, rest = msg.partition(": ")
            if loc == "(top level)" and sep and " " not in head:  # a check across sections
                loc, msg = head, rest  # names its own key path
            elif sep and head.startswith("params.") and " " not in head:  # a policy's key
                loc, msg = f"{loc}.{head}", rest
        lines.append(f"  {loc}: {msg}")
    return f"{where} is invalid:\n" + "\n".join(lines)
