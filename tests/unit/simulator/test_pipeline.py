"""The simulated gateway and cluster, driving the real engine model."""

import math
from collections.abc import Sequence

import pytest

from policies.routing import eligible, make_router
from policies.types import Category, Outcome, RequestInfo, Status, WorkerView
from simulator.run import run
from simulator.workloads import RequestSpec

from .conftest import small


def _spec(i: int, at: float, prompt: int, out: int, **kw: object) -> RequestSpec:
    return RequestSpec(
        id=f"q{i}", arrival=at, prompt_tokens=prompt, output_tokens=out, max_tokens=out, **kw
    )  # type: ignore[arg-type]


def test_a_lone_request_meets_eq7_exactly() -> None:
    # TTFT = ⌈L_in/C⌉·t_iter + t_iter and S = (⌈L_in/C⌉ + L_out)·t_iter with t_iter = W + H·1.
    sc = small()
    cfg = sc.engine_config(sc.fleet.pools[0])
    prompt, out = 1500, 40
    res = run(sc, specs=[_spec(0, 0.25, prompt, out)])
    (rec,) = res.records
    t_iter = cfg.w + cfg.h
    chunks = math.ceil(prompt / cfg.prefill_chunk)
    assert rec.status == "ok"
    assert rec.first_token - rec.arrival == pytest.approx((chunks + 1) * t_iter)
    assert rec.finish - rec.arrival == pytest.approx((chunks + out) * t_iter)
    assert res.pools["short"].busy_slot_seconds == pytest.approx((chunks + out) * t_iter)
    assert res.pools["short"].steps == chunks + out


def test_every_request_completes_once_with_its_tokens() -> None:
    sc = small(
        rate=30,
        requests=400,
        workers=3,
        components=[{"family": "chat", "weight": 2}, {"family": "rag"}],
    )
    res = run(sc)
    assert len(res.records) == 400
    assert all(r.status == "ok" for r in res.records)
    for r in res.records:
        assert r.completion_tokens == r.output_tokens
        assert r.arrival <= r.dispatch <= r.scheduled < r.first_token <= r.finish
    assert {r.worker for r in res.records} == {"short-0", "short-1", "short-2"}
    busy = sum(p.busy_slot_seconds for p in res.pools.values())
    assert busy == pytest.approx(sum(r.finish - r.scheduled for r in res.records), rel=1e-9)


class Recording:
    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []
        self.outcomes: dict[str, Outcome] = {}

    def on_arrival(self, request: RequestInfo, now: float) -> None:
        self.log.append(("arrival", request.id))

    def on_dispatch(self, request: RequestInfo, worker: str, now: float) -> None:
        self.log.append(("dispatch", request.id))

    def on_first_token(self, request: RequestInfo, now: float) -> None:
        self.log.append(("first_token", request.id))

    def on_complete(self, request: RequestInfo, outcome: Outcome, now: float) -> None:
        self.log.append(("complete", request.id))
        self.outcomes[request.id] = outcome


def test_hooks_see_each_request_in_order_and_errors_too() -> None:
    # 200 KV blocks hold 3,200 tokens: a 4,000-token prompt fits the context but never the cache.
    sc = small(
        engine={"num_kv_blocks": 200},
        pools=[{"name": "short", "workers": 1, "max_model_len": 8192}],
    )
    hook = Recording()
    specs = [_spec(0, 0.1, 100, 5), _spec(1, 0.2, 4000, 5), _spec(2, 0.3, 50, 3)]
    res = run(sc, specs=specs, hooks=(hook,))
    status = {r.id: r.status for r in res.records}
    assert status == {"q0": "ok", "q1": "error", "q2": "ok"}  # 4000 tokens never fit 200 blocks
    for rid in ("q0", "q2"):
        events = [e for e, i in hook.log if i == rid]
        assert events == ["arrival", "dispatch", "first_token", "complete"]
        assert hook.outcomes[rid].status is Status.OK
        assert hook.outcomes[rid].completion_tokens == {"q0": 5, "q2": 3}[rid]
        assert hook.outcomes[rid].ttft is not None and hook.outcomes[rid].ttft > 0
    # sent, then refused by the engine: dispatched and completed, as the gateway's hooks
    # hear an engine's refusal
    assert [e for e, i in hook.log if i == "q1"] == ["arrival", "dispatch", "complete"]
    assert hook.outcomes["q1"].status is Status.ERROR


def test_placement_sends_long_requests_to_the_long_pool_and_rejects_what_fits_nowhere() -> None:
    sc = small(
        pools=[
            {"name": "short", "workers": 2, "max_model_len": 4096},
            {"name": "long", "workers": 1, "max_model_len": 16384},
        ],
        policy={"placement": {"short_pool": "short", "b_short": 4096}},
    )
    specs = [
        _spec(0, 0.1, 1000, 100),
        _spec(1, 0.2, 5000, 100),
        _spec(2, 0.3, 4000, 96),
        _spec(3, 0.4, 16000, 900),
    ]
    res = run(sc, specs=specs)
    got = {r.id: (r.status, r.pool) for r in res.records}
    assert got == {
        "q0": ("ok", "short"),
        "q1": ("ok", "long"),
        "q2": ("ok", "short"),
        "q3": ("rejected_413", None),
    }


class Spy:
    """A router that records what it was shown, then defers to least-loaded."""

    name = "spy"

    def __init__(self) -> None:
        self.inner = make_router("least_loaded")
        self.seen: list[list[tuple[int, int, int]]] = []

    def choose(self, request: RequestInfo, candidates: Sequence[WorkerView]) -> WorkerView | None:
        self.seen.append([(w.running, w.waiting, w.in_flight) for w in eligible(candidates)])
        return self.inner.choose(request, candidates)


def test_fresh_telemetry_agrees_with_the_gateways_counts() -> None:
    spy = Spy()
    run(small(rate=40, requests=300, workers=3), routers={"short": spy})
    assert len(spy.seen) == 300
    # The engine's figures are as of the step it is running, which already dropped the
    # requests finishing at that step's end; ours drop them when the step ends.
    diffs = [f - (r + q) for views in spy.seen for r, q, f in views]
    assert min(diffs) >= 0
    assert diffs.count(0) > 0.8 * len(diffs)
    assert max(f for views in spy.seen for _, _, f in views) > 1


def test_scraped_telemetry_lags_while_in_flight_counts_stay_exact() -> None:
    spy = Spy()
    sc = small(rate=40, requests=300, workers=3, telemetry={"scrape_interval": 1000.0})
    res = run(sc, routers={"short": spy})
    # One scrape at t=0 saw idle engines; every later decision saw that snapshot.
    assert all(r == 0 and q == 0 for views in spy.seen for r, q, _ in views)
    assert max(f for views in spy.seen for _, _, f in views) > 1
    assert all(r.status == "ok" for r in res.records)


def test_scrape_interval_refreshes_between_decisions() -> None:
    spy = Spy()
    run(
        small(rate=40, requests=300, workers=3, telemetry={"scrape_interval": 0.5}),
        routers={"short": spy},
    )
    lagging = sum(r + q != f for views in spy.seen for r, q, f in views)
    assert lagging > 0  # between scrapes the engine's figure trails ours
    assert any(r > 0 for views in spy.seen for r, _, _ in views)  # but scrapes do land


def test_compress_and_route_runs_in_the_simulator_with_the_gateways_intake() -> None:
    """The band B_short < L_total ≤ γ·B_short is compressed onto the short pool; code never
    compresses and goes long; beyond the band goes long."""
    pools = [
        {"name": "short", "workers": 2, "max_model_len": 4096},
        {"name": "long", "workers": 1, "max_model_len": 16384},
    ]
    placement = {"policy": "compress_and_route", "short_pool": "short", "b_short": 4096,
                 "gamma": 2.0}  # fmt: skip
    specs = [
        _spec(0, 0.1, 1000, 100),  # short
        _spec(1, 0.2, 6000, 100),  # band, compressible (chat)
        _spec(2, 0.3, 7000, 100),  # band, but code: long, uncompressed
        _spec(3, 0.4, 10000, 100),  # beyond the band: long
    ]
    sc = small(
        pools=pools,
        policy={
            "placement": placement,
            "compression": {"shortenable": {"chat": {"mean": 0.5, "sd": 0.0}}},
        },
    )
    lowered = [s if s.id != "q2" else _with(s, category=Category.CODE) for s in specs]
    res = run(sc, specs=lowered)
    got = {r.id: (r.status, r.pool, r.compressed_to is not None) for r in res.records}
    assert got == {
        "q0": ("ok", "short", False),
        "q1": ("ok", "short", True),
        "q2": ("ok", "long", False),  # code: never compressed
        "q3": ("ok", "long", False),
    }
    q1 = next(r for r in res.records if r.id == "q1")
    assert q1.compressed_to <= 4096 - 100  # T_c = B_short − max_tokens


def _with(spec: RequestSpec, **changes: object) -> RequestSpec:
    from dataclasses import replace

    return replace(spec, **changes)


def test_requests_wait_in_the_gateway_for_room_first_come_first_served() -> None:
    """With `dispatch.capacity: engine` a worker never holds more than its max_num_seqs;
    the rest wait (FIFO) and are dispatched as completions free slots; past the timeout a
    waiter gives up."""
    sc = small(
        workers=1,
        engine={"max_num_seqs": 2},
        policy={"dispatch": {"capacity": "engine", "timeout_s": 1000.0}},
    )
    specs = [_spec(i, 0.1 + 0.001 * i, 500, 50) for i in range(6)]
    res = run(sc, specs=specs)
    assert all(r.status == "ok" for r in res.records)
    spans = sorted((r.dispatch, r.finish) for r in res.records)
    for t, _ in spans:  # at every dispatch, at most 2 requests are on the worker
        assert sum(1 for a, b in spans if a <= t < b) <= 2
    order = [r.id for r in sorted(res.records, key=lambda r: r.dispatch)]
    assert order == [f"q{i}" for i in range(6)]  # dispatched in arrival order
    quick = small(
        workers=1,
        engine={"max_num_seqs": 1},
        policy={"dispatch": {"capacity": "engine", "timeout_s": 0.01}},
    )
    res = run(quick, specs=specs[:3])
    statuses = sorted(r.status for r in res.records)
    assert statuses == ["ok", "queue_timeout", "queue_timeout"]


def test_a_pool_whose_circuits_are_all_open_is_down_for_placement_as_in_the_gateway() -> None:
    """The short pool's one worker drops every connection: the first failure opens its
    circuit (`breaker.failures: 1`) and the request is retried on the long pool; from then
    on the short pool is down for placement (the gateway's `Fleet.live_pools`), so a
    borderline request goes long uncompressed instead of being compressed for a pool
    that cannot take it. Once the open period is over the pool is up again."""
    from policies.actions import ActionLog

    log = ActionLog()
    sc = small(
        pools=[
            {"name": "short", "workers": 1, "max_model_len": 4096},
            {"name": "long", "workers": 1, "max_model_len": 65536},
        ],
        policy={
            "placement": {"policy": "compress_and_route", "short_pool": "short", "b_short": 4096},
            "breaker": {"failures": 1, "open_s": 10.0},
        },
        sim={"compression": {"shortenable": {"chat": {"mean": 0.5, "sd": 0.0}}}},
        events=[{"kind": "fault", "at": 0.0, "pool": "short", "worker": 0, "for_s": 15.0}],
    )
    specs = [
        RequestSpec(id=rid, arrival=at, prompt_tokens=p, output_tokens=4, max_tokens=4,
                    client="c", model="model", category=Category.CHAT)
        for rid, at, p in (("small", 0.0, 100), ("band", 1.0, 5000), ("later", 20.0, 5000))
    ]  # fmt: skip
    res = run(sc, specs=specs, log=log)
    assert log.of("small") == [
        "send short/short-0", "open short-0", "retry reset exclude=short-0", "send long/long-0",
        "done ok",
    ]  # fmt: skip
    assert log.of("band") == ["send long/long-0", "done ok"]  # not compressed: short is down
    # the open period and the fault are over: compressed onto the short pool again
    assert log.of("later")[:2] == ["fit 4092", "send short/short-0"]
    assert {r.id: r.status for r in res.records} == {"small": "ok", "band": "ok", "later": "ok"}


def test_health_checks_take_a_failing_worker_out_and_bring_it_back_with_hysteresis() -> None:
    """A worker in a fault that fails its health checks (`health: fails`) is out of routing
    after `unhealthy_after` failed checks and back after `healthy_after` good ones once the
    fault is over (policies/health.py's hysteresis, as the gateway's health loop applies
    it); the breaker alone (a high `failures`) would have kept sending to it."""
    from policies.actions import ActionLog

    log = ActionLog()
    sc = small(
        pools=[{"name": "short", "workers": 2, "max_model_len": 8192}],
        routing="round_robin",
        policy={
            "routing": {"policy": "round_robin"},
            "breaker": {"failures": 100},
            "health": {"interval_s": 1.0, "unhealthy_after": 2, "healthy_after": 3},
        },
        events=[
            {"kind": "fault", "at": 0.0, "pool": "short", "worker": 0, "for_s": 10.0,
             "health": "fails"},
        ],
    )  # fmt: skip
    arrivals = [0.5, 1.5, 2.5, 3.5, 4.5, 11.5, 12.5, 13.5, 14.5, 15.5]
    specs = [
        RequestSpec(id=f"q{i}", arrival=at, prompt_tokens=100, output_tokens=4, max_tokens=4,
                    client="c", model="model", category=Category.CHAT)
        for i, at in enumerate(arrivals)
    ]  # fmt: skip
    seen: list[tuple[float, bool]] = []  # (time, short-0 routable) at each sample

    def probe(core, now):  # type: ignore[no-untyped-def]
        seen.append((now, core.views("short")[0].healthy))

    run(sc, specs=specs, log=log, probe=probe)
    out = [t for t, healthy in seen if not healthy]
    # checks every second: the second failed one (t = 2) takes it out; the fault ends at 10,
    # and the third good check after it (t = 12, or 13 if the check at 10 came first) brings
    # it back: hysteresis, not the first good answer
    assert out and 2.0 <= min(out) < 2.5 and 11.5 < max(out) < 13.0, out
    assert all(2.0 <= t <= max(out) for t in out)  # one period out, none before or after
    reached = [arrivals[i] for i in range(len(arrivals)) if "send short/short-0" in log.of(f"q{i}")]
    assert reached and not any(min(out) <= at <= max(out) for at in reached), reached
    assert all(log.of(f"q{i}")[-1] == "done ok" for i in range(len(arrivals)))
