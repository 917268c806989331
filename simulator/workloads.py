"""Workloads: arrival processes × request-shape families × clients, or a replayed trace.

Arrivals (the times requests reach the gateway):
- ``poisson`` — exponential gaps at rate λ (FleetOpt §7.3 drives its DES this way).
- ``gamma`` — Gamma-distributed gaps with mean 1/λ and coefficient of variation `cv`
  (cv > 1 is bursty; BurstGPT fits its arrivals with a Gamma renewal process).
- ``bursty`` — QUARTZ's "Mixed Bursty" (§5.2): a Poisson base at λ with short bursts
  injected on top. Calm periods last Exp(mean `burst_every`) seconds, each followed by a
  burst of `burst_duration` seconds at rate `burst_factor`·λ.

A workload is a weighted mixture of components (family + SLO class + content category);
each request picks its component, then its shape, then its client (uniform, or Zipf with
exponent `client_skew` so a few clients dominate). Or a workload is a list of tenants
(`Tenant`, `generate_tenants`), each with its own arrival process, shapes, and join and
leave times, its name the client of its requests (in the simulator: their entitlement). Every concern draws from its own
`random.Random` seeded from (seed, concern), so changing e.g. the client count leaves the
arrival times unchanged, and a seed fixes the workload exactly.

Traces (JSONL, one request per line) are the gateway's request log format
(gateway/requestlog.py), so a logged day can be replayed: ``ts`` (unix seconds at arrival;
``arrival``/``time`` also read), ``request_id`` (or ``id``), ``model``, ``status`` (HTTP
code; only 200 — or "ok" — lines are replayed), ``prompt_tokens`` and
``completion_tokens`` (the engine's counts; also read under ``usage``), ``max_tokens``
(defaults to completion_tokens), and the simulator's optional ``entitlement``/``client``,
``slo_class``, ``category``. Lines without token counts never reached an engine and are
skipped. `write_trace` writes the same fields, which is how the live-vs-simulated
comparison feeds both sides one trace.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from policies.types import Category
from simulator.families import Family


@dataclass(frozen=True, slots=True)
class Poisson:
    rate: float  # requests per second


@dataclass(frozen=True, slots=True)
class GammaArrivals:
    rate: float
    cv: float = 2.0  # coefficient of variation of the gaps; 1 = Poisson


@dataclass(frozen=True, slots=True)
class Bursty:
    rate: float  # base rate between bursts
    burst_factor: float = 4.0  # a burst multiplies the rate (QUARTZ injects "short arrival bursts")
    burst_every: float = 20.0  # mean calm period before a burst, seconds
    burst_duration: float = 2.0  # seconds


Arrivals = Poisson | GammaArrivals | Bursty


@dataclass(slots=True)
class RequestSpec:
    """One request of a workload, as the simulated gateway receives it."""

    id: str
    arrival: float
    prompt_tokens: int
    output_tokens: int
    max_tokens: int
    client: str = "c0"
    slo_class: str = "interactive"
    category: Category = Category.CHAT
    model: str = "model"
    prefix_hashes: tuple[int, ...] = ()
    session: str = ""  # a conversation's key (session_affinity reads it; "" none)
    attempt: int = 1  # a retry of a refused request is attempt 2, 3, …
    first_arrival: float | None = None  # a retry: when its first attempt arrived


@dataclass(frozen=True, slots=True)
class Retry:
    """A client that retries a refused request (429) after the refusal's Retry-After,
    capped at `max_wait_s`, up to `max_attempts` attempts in all (1: never retries)."""

    max_attempts: int = 1
    max_wait_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.max_wait_s <= 0:
            raise ValueError("retry: max_attempts >= 1 and max_wait_s > 0")


@dataclass(frozen=True, slots=True)
class Component:
    family: Family
    weight: float = 1.0
    slo_class: str = "interactive"
    category: Category = Category.CHAT


def iter_arrivals(process: Arrivals, rng: random.Random, start: float = 0.0) -> Iterator[float]:
    """Increasing arrival times drawn from `process`, starting after `start`, forever."""
    t = start
    if isinstance(process, Poisson):
        while True:
            t += rng.expovariate(process.rate)
            yield t
    elif isinstance(process, GammaArrivals):
        shape = 1.0 / (process.cv * process.cv)
        scale = 1.0 / (process.rate * shape)
        while True:
            t += rng.gammavariate(shape, scale)
            yield t
    else:
        calm_end = t + rng.expovariate(1.0 / process.burst_every)
        burst_end = calm_end + process.burst_duration
        while True:
            in_burst = calm_end <= t < burst_end
            rate = process.rate * (process.burst_factor if in_burst else 1.0)
            boundary = burst_end if in_burst else calm_end
            gap = rng.expovariate(rate)
            if t + gap < boundary:
                t += gap
                yield t
                continue
            # Memorylessness: restart the draw at the boundary with the new rate.
            t = boundary
            if t >= burst_end:
                calm_end = t + rng.expovariate(1.0 / process.burst_every)
                burst_end = calm_end + process.burst_duration


def arrival_times(process: Arrivals, n: int, rng: random.Random, start: float = 0.0) -> list[float]:
    """`n` increasing arrival times drawn from `process`."""
    return list(itertools.islice(iter_arrivals(process, rng, start), n))


def _zipf_weights(n: int, s: float) -> list[float]:
    return [1.0 / (k + 1) ** s for k in range(n)]


def generate(
    components: Sequence[Component],
    arrivals: Arrivals,
    n: int,
    seed: int,
    clients: int = 16,
    client_skew: float = 0.0,
    model: str = "model",
) -> list[RequestSpec]:
    """`n` requests: arrival times from `arrivals`, shapes from the weighted `components`."""
    if not components:
        raise ValueError("a workload needs at least one component")
    times = arrival_times(arrivals, n, random.Random(f"{seed}:arrivals"))
    pick = random.Random(f"{seed}:components")
    shape_rng = random.Random(f"{seed}:shapes")
    who = random.Random(f"{seed}:clients")
    weights = [c.weight for c in components]
    client_weights = _zipf_weights(clients, client_skew)
    client_ids = [f"c{k:03d}" for k in range(clients)]
    specs: list[RequestSpec] = []
    for i, t in enumerate(times):
        comp = (
            components[pick.choices(range(len(components)), weights)[0]]
            if len(components) > 1
            else components[0]
        )
        shape = comp.family.draw(shape_rng, i)
        client = who.choices(client_ids, client_weights)[0]
        specs.append(
            RequestSpec(
                id=f"r{i:07d}",
                arrival=t,
                prompt_tokens=shape.prompt,
                output_tokens=shape.output,
                max_tokens=shape.output,
                client=client,
                slo_class=comp.slo_class,
                category=comp.category,
                model=model,
                prefix_hashes=shape.hashes,
            )
        )
    return specs


@dataclass(frozen=True, slots=True)
class Tenant:
    """One tenant of a multi-tenant workload: its own arrival process between `join` and
    `leave`, its own request shapes, and its name as every request's client — which the
    simulator passes to admission as the request's entitlement."""

    name: str
    arrivals: Arrivals
    components: Sequence[Component]
    join: float = 0.0  # its first request comes after this time
    leave: float = math.inf  # ... and its last before this one
    requests: int | None = None  # at most this many (None: until it leaves)

    def __post_init__(self) -> None:
        if self.leave == math.inf and self.requests is None:
            raise ValueError(f"tenant {self.name!r} needs `leave` or `requests` (or both)")
        if self.leave <= self.join:
            raise ValueError(f"tenant {self.name!r}: leave must come after join")


def generate_tenants(
    tenants: Sequence[Tenant], seed: int, model: str = "model", limit: int | None = None
) -> list[RequestSpec]:
    """Every tenant's requests, merged in arrival order (ids in that order); at most `limit`.

    Each tenant draws from its own generators seeded from (seed, tenant, concern), so
    adding, removing or retiming one tenant leaves every other tenant's requests unchanged.
    """
    names = [t.name for t in tenants]
    if len(set(names)) != len(names):
        raise ValueError("tenant names must be unique")
    drawn: list[tuple[float, int, int, RequestSpec]] = []
    for k, tenant in enumerate(tenants):
        if not tenant.components:
            raise ValueError(f"tenant {tenant.name!r} needs at least one component")
        key = f"{seed}:tenant:{tenant.name}"
        times = iter_arrivals(tenant.arrivals, random.Random(f"{key}:arrivals"), tenant.join)
        pick = random.Random(f"{key}:components")
        shape_rng = random.Random(f"{key}:shapes")
        weights = [c.weight for c in tenant.components]
        for i, t in enumerate(times):
            if t >= tenant.leave or (tenant.requests is not None and i >= tenant.requests):
                break
            comp = tenant.components[pick.choices(range(len(weights)), weights)[0]]
            shape = comp.family.draw(shape_rng, i)
            spec = RequestSpec(
                id="",
                arrival=t,
                prompt_tokens=shape.prompt,
                output_tokens=shape.output,
                max_tokens=shape.output,
                client=tenant.name,
                slo_class=comp.slo_class,
                category=comp.category,
                model=model,
                prefix_hashes=shape.hashes,
            )
            drawn.append((t, k, i, spec))
    drawn.sort(key=lambda x: x[:3])
    specs = [d[3] for d in drawn[:limit]]
    for i, spec in enumerate(specs):
        spec.id = f"r{i:07d}"
    return specs


def _first(d: dict[str, object], *keys: str) -> object:
    for k in keys:
        if k in d and d[k] is not None:
            return d[k]
    usage = d.get("usage")
    if isinstance(usage, dict):
        for k in keys:
            if usage.get(k) is not None:
                return usage[k]
    return None


def _number(value: object) -> str | int | float:
    """A trace field given to int() or float(); anything else is the TypeError they raise."""
    if isinstance(value, str | int | float):
        return value
    raise TypeError(f"not a number: {value!r}")


def read_trace(
    path: str | Path, speedup: float = 1.0, limit: int | None = None
) -> list[RequestSpec]:
    """Requests from a JSONL trace, arrivals shifted to start at 0 and divided by `speedup`."""
    rows: list[RequestSpec] = []
    with Path(path).open() as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{lineno}: not JSON: {exc}") from exc
            status = d.get("status", 200)
            prompt, completion = _first(d, "prompt_tokens"), _first(d, "completion_tokens")
            arrival = _first(d, "ts", "arrival", "time")
            if (
                status not in (200, "200", "ok")
                or prompt is None
                or completion is None
                or arrival is None
            ):
                continue
            out = max(1, int(_number(completion)))
            cap = _first(d, "max_tokens")
            rows.append(
                RequestSpec(
                    id=str(_first(d, "request_id", "id") or f"t{lineno:07d}"),
                    arrival=float(_number(arrival)),
                    prompt_tokens=max(1, int(_number(prompt))),
                    output_tokens=out,
                    max_tokens=max(out, int(_number(cap))) if cap is not None else out,
                    client=str(_first(d, "entitlement", "client") or "c0"),
                    slo_class=str(d.get("slo_class") or "interactive"),
                    category=Category(d.get("category") or "chat"),
                    model=str(d.get("model") or "model"),
                )
            )
            if limit is not None and len(rows) >= limit:
                break
    if not rows:
        raise ValueError(f"{path}: no replayable requests")
    rows.sort(key=lambda r: r.arrival)
    t0 = rows[0].arrival
    for r in rows:
        r.arrival = (r.arrival - t0) / speedup
    return rows


def write_trace(specs: Iterable[RequestSpec], path: str | Path) -> None:
    """Write requests as a JSONL trace that `read_trace` (and the gateway's log reader) read."""
    with Path(path).open("w") as fh:
        for s in specs:
            row = {
                "ts": round(s.arrival, 6),
                "request_id": s.id,
                "model": s.model,
                "status": 200,
                "max_tokens": s.max_tokens,
                "prompt_tokens": s.prompt_tokens,
                "completion_tokens": s.output_tokens,
                "entitlement": s.client,
                "slo_class": s.slo_class,
                "category": s.category.value,
            }
            fh.write(json.dumps(row) + "\n")
