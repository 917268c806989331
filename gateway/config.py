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
from policies.build import Choice, CoreSpec, PdSpec, request_fields
from policies.dp_config import DpGroup
from policies.spec import PolicySpec, RoutingSpec, core_spec, describe_errors

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
    # learnt bytes/token, traffic histogram): see docs/OPERATIONS.md "Several processes"
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
    # where this engine publishes its KV-cache events (ZMQ), overriding the pool's
    # `kv_events.endpoint` (docs/CACHE_ROUTING.md)
    kv_events_endpoint: str | None = Field(None, pattern=r"^(tcp|ipc)://\S+$")

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


class KvEvents(_Section):
    """The engines' KV-cache event streams (vLLM's --kv-events-config; docs/WIRE_SPEC.md
    §8) keeping a cache-aware router's prefix index current (docs/CACHE_ROUTING.md)."""

    endpoint: str = Field(
        "tcp://{host}:5557",
        pattern=r"^(tcp|ipc)://\S+$",
        description="Each worker's ZMQ PUB endpoint; `{host}` is the worker URL's host"
        " (a worker's `kv_events_endpoint` overrides it).",
    )
    topic: str = Field("", max_length=256, description="The engines' `topic` (a prefix).")
    block_size: int = Field(16, ge=1, le=4096, description="The engines' KV block size.")
    max_message_bytes: int = Field(
        16 << 20, ge=1024, description="Larger event batches are refused (and resynchronise)."
    )


class Pool(_Section):
    # workers: independent replicas, per-request routing; dp_group: G data-parallel ranks
    # fed from a holding pool by an assignment policy (`dp_group`, policies/dp_config.py;
    # docs/BFIO.md); pd: prefill and decode workers, a request on a pair (`pd`, docs/PD.md)
    kind: Literal["workers", "dp_group", "pd"] = "workers"
    dp_group: DpGroup | None = None
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
    routing: RoutingSpec | None = None
    # the engines publish KV-cache events: a cache-aware router's index follows them
    # (optional, needs pyzmq: fleetgate[kv-events]); None: the index is the gateway's guess
    kv_events: KvEvents | None = None

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

    @model_validator(mode="after")
    def _dp_group(self) -> Pool:
        if self.kind != "dp_group":
            if self.dp_group is not None:
                raise ValueError("dp_group: only for kind: dp_group")
            return self
        g = self.dp_group
        if g is None:
            raise ValueError("dp_group: kind: dp_group needs its ranks, slots and assigner")
        if self.discovery is not None:
            raise ValueError("discovery: a dp_group lists its endpoints in `workers`")
        if len(self.workers) not in (1, g.ranks):
            raise ValueError(
                f"workers: a dp_group lists one endpoint (the engine's rank selector) or one"
                f" per rank ({g.ranks}, in rank order), not {len(self.workers)}"
            )
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


class Telemetry(_Section):
    scrape_interval_s: float = Field(0.5, gt=0)
    stale_after_s: float = Field(2.0, gt=0)
    timeout_s: float = Field(1.0, gt=0)
    poa_interval_s: float = Field(
        5.0,
        ge=0,
        description="With a cache-aware router: how often the price-of-anarchy diagnostics"
        " are estimated, off the event loop (docs/CACHE_ROUTING.md); 0: never.",
    )


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


class Traffic(_Section):
    window_s: float = Field(300.0, gt=0)  # the observed-traffic window the planner sees


class RequestLog(_Section):
    path: str | None = None  # None: off; "-": stdout; else a file (rotated at max_bytes)
    max_bytes: int = Field(100 * 1024 * 1024, gt=0)
    backups: int = Field(3, ge=0)
    # lines held in memory while the writer thread lags; beyond it entries are dropped
    queue_max: int = Field(65_536, ge=1)


_OTLP_HTTP = "opentelemetry.exporter.otlp.proto.http.trace_exporter"


class Tracing(_Section):
    """OpenTelemetry traces of requests (gateway/tracing.py): off by default; on, it needs the
    `otel` extra (pip install 'fleetgate[otel]')."""

    enabled: bool = False  # a span per request, its steps as child spans, exported over OTLP
    # OTLP/HTTP traces URL; unset: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT,
    # else http://localhost:4318/v1/traces (the exporter's own defaults)
    endpoint: str | None = None
    service_name: str = "fleetgate"  # the traces' service.name
    sample_ratio: float = Field(1.0, ge=0, le=1)  # share of requests traced (by trace id)
    # continue a client's W3C trace context (traceparent, tracestate): its trace id, and its
    # sampled flag decides (false: every trace starts at the gateway, sampled by the ratio)
    client_context: bool = True

    @field_validator("enabled")
    @classmethod
    def _installed(cls, enabled: bool) -> bool:
        if enabled:
            try:
                for module in ("opentelemetry.sdk.trace", _OTLP_HTTP):
                    importlib.import_module(module)
            except ImportError as exc:
                raise ValueError(
                    f"needs the otel extra (pip install 'fleetgate[otel]'): {exc}"
                ) from None
        return enabled


class GatewayConfig(PolicySpec):
    """The gateway's configuration: the policy schema the simulator's scenarios share
    (policies/spec.py's `PolicySpec`: placement, admission, dispatch, budget, routing,
    retry, breaker, health, quartz) at its top level, and the gateway's own sections."""

    listen: Listen = Field(default_factory=Listen)
    auth: Auth = Field(default_factory=Auth)
    pools: dict[str, Pool] = Field(min_length=1)
    telemetry: Telemetry = Field(default_factory=Telemetry)
    upstream: Upstream = Field(default_factory=Upstream)
    limits: Limits = Field(default_factory=Limits)
    cors: Cors = Field(default_factory=Cors)
    expose: Expose = Field(default_factory=Expose)
    request_log: RequestLog = Field(default_factory=RequestLog)
    traffic: Traffic = Field(default_factory=Traffic)
    tracing: Tracing = Field(default_factory=Tracing)

    def kv_events_pools(self) -> dict[str, KvEvents]:
        """The pools whose engines publish KV-cache events (`kv_events`)."""
        return {n: p.kv_events for n, p in self.pools.items() if p.kv_events is not None}

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
        events = {n: p.kv_events for n, p in self.pools.items() if p.kv_events is not None}
        for pname in events:
            if self.pools[pname].kind != "workers":
                raise ValueError(f"pools.{pname}.kv_events: only for a pool of kind: workers")
        if events:
            spec = self.core_spec()
            for pname in events:
                choice = spec.pool_routing.get(pname, spec.routing)
                if "prefix_hashes" not in request_fields(CoreSpec(routing=choice)):
                    raise ValueError(
                        f"pools.{pname}.kv_events: the pool's router ({choice.policy}) reads"
                        " no prefix index: use kv_cost, prefix_overlap or regime_adaptive"
                    )
        if len({e.block_size for e in events.values()}) > 1:
            # a request's prefix hashes are one chain of token blocks of that size
            raise ValueError("pools.*.kv_events.block_size: every pool's must be the same")
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

    def core_spec(self) -> CoreSpec:
        """The policy sections in the composition root's terms (policies/build.py), by the
        same translation a scenario's `policy` takes (policies/spec.py)."""
        return core_spec(
            self,
            {n: p.max_model_len for n, p in self.pools.items()},
            {n: p.routing for n, p in self.pools.items()},
            {n: p.dp_group.spec() for n, p in self.pools.items() if p.dp_group is not None},
            {
                n: PdSpec(p.pd.protocol, Choice(p.pd.pair.policy, p.pd.pair.params))
                for n, p in self.pools.items()
                if p.pd is not None
            },
        )

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
    return f"{where} is invalid:\n" + "\n".join(describe_errors(exc))
