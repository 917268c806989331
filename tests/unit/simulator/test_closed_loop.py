"""Closed-loop load (simulator/closed_loop.py): the promises of a closed loop checked on the
simulator's own records (arrival, finish, status) — not on the load generator's log — and
the same per-client sequences from the live driver (`drive`, asyncio)."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections import defaultdict

import pytest

from simulator.closed_loop import Bursts, ClosedLoop, LoadShape, deal, drive, simulate
from simulator.records import RequestRecord
from simulator.scenario import parse
from simulator.workloads import RequestSpec

SCENARIO = {
    "name": "closed-loop",
    "fleet": {
        "engine": {"max_num_seqs": 4, "num_kv_blocks": 4096},
        "pools": [{"name": "short", "workers": 2, "max_model_len": 4096}],
    },
    "workload": {
        "requests": 1,
        "arrivals": {"kind": "poisson", "rate": 1.0},
        "components": [{"family": "chat", "weight": 1.0}],
    },
    "policy": {"routing": {"policy": "least_loaded"}, "dispatch": {"capacity": "engine"}},
    "report": {"plots": False, "sample_interval": 1.0},
}


def specs(n: int, seed: int = 7, too_long_every: int = 0) -> list[RequestSpec]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        rag = rng.random() < 0.3
        prompt = rng.randint(1000, 3000) if rag else rng.randint(20, 400)
        if too_long_every and i % too_long_every == 0:
            prompt = 9000  # no pool holds it: refused before placement (413)
        out.append(
            RequestSpec(
                f"r{i}",
                0.0,
                prompt,
                rng.randint(5, 80),
                100,
                slo_class="long" if rag else "interactive",
            )
        )
    return out


def run(shape: LoadShape, pool: list[RequestSpec]) -> list[RequestRecord]:
    result, _ = simulate(parse(SCENARIO, "closed-loop"), shape, deal(pool, shape.clients), seed=1)
    return result.records


def end(r: RequestRecord) -> float:
    # a request refused at the gateway ends at its arrival
    return r.finish if r.finish is not None else r.arrival


def test_at_most_n_outstanding_and_the_bound_is_reached() -> None:
    recs = run(LoadShape(12, requests=200), specs(400))
    assert len(recs) == 200
    assert all(r.status == "ok" for r in recs)
    events = sorted([(r.arrival, 1) for r in recs] + [(end(r), -1) for r in recs])
    level = peak = 0
    for _, d in events:  # an answer at t is counted before a send at t (closed loop)
        level += d
        peak = max(peak, level)
    assert peak == 12  # 12 clients, 8 engine slots: the gateway queue holds the rest


@pytest.mark.parametrize("think", [0.0, 0.5])
def test_each_client_sends_only_after_its_previous_answer(think: float) -> None:
    recs = run(LoadShape(6, think_s=think, requests=150, seed=3), specs(300, too_long_every=9))
    assert any(r.status == "rejected_413" for r in recs)  # refusals before placement too
    assert len(recs) == 150  # and their clients went on: no client stalls on a refusal
    by: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in recs:
        by[r.client].append(r)
    assert len(by) == 6
    gaps = []
    for rs in by.values():
        rs.sort(key=lambda r: r.arrival)
        for prev, nxt in itertools.pairwise(rs):
            assert nxt.arrival >= end(prev)
            gaps.append(nxt.arrival - end(prev))
    if think == 0:
        assert max(gaps) == 0.0
    else:
        assert min(gaps) > 0 and sum(gaps) / len(gaps) == pytest.approx(think, rel=0.35)


def test_ramp_and_hold() -> None:
    recs = run(LoadShape(5, ramp_s=10.0, hold_s=20.0), specs(2000))
    firsts = sorted(min(r.arrival for r in recs if r.client == c) for c in {r.client for r in recs})
    assert firsts == pytest.approx([0.0, 2.0, 4.0, 6.0, 8.0])
    assert max(r.arrival for r in recs) < 30.0


def test_deterministic_under_a_seed() -> None:
    shape = LoadShape(8, think_s=0.2, ramp_s=2.0, requests=120, bursts=Bursts(5.0, 1.0), seed=5)
    a, b = run(shape, specs(300)), run(shape, specs(300))
    key = [(r.id, r.client, r.arrival, r.finish, r.worker) for r in a]
    assert key == [(r.id, r.client, r.arrival, r.finish, r.worker) for r in b]


def test_deal_gives_clients_by_application_in_proportion() -> None:
    pool = specs(1000)
    seqs = deal(pool, 10, names={"interactive": "chat", "long": "rag"})
    clients = [{s.client for s in seq} for seq in seqs]
    assert all(len(c) == 1 for c in clients)
    names = sorted(next(iter(c)) for c in clients)
    assert sum(n.startswith("rag") for n in names) == 3  # 30 % RAG of 10 clients
    assert all(s.slo_class == "long" for seq in seqs for s in seq if s.client.startswith("rag"))
    assert sorted(s.id for seq in seqs for s in seq) == sorted(s.id for s in pool)


def test_the_live_driver_sends_each_client_the_same_sequence() -> None:
    shape = LoadShape(6, requests=90, seed=2)
    pool = specs(300, too_long_every=9)
    sim, _ = simulate(parse(SCENARIO, "closed-loop"), shape, deal(pool, 6), seed=1)

    now = [0.0]
    rng = random.Random(1)

    async def send(spec: RequestSpec) -> str:
        # a service time unrelated to the simulator's: the interleaving differs
        for _ in range(rng.randrange(1, 20)):
            await asyncio.sleep(0)
        now[0] += 0.001
        return "ok"

    loop = ClosedLoop(shape, deal(pool, 6))
    answers = asyncio.run(drive(loop, send, lambda: now[0]))
    assert len(answers) == 90 and loop.max_outstanding <= 6

    def per_client(ids: list[tuple[str, str, float]]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = defaultdict(list)
        for client, rid, _ in sorted(ids, key=lambda x: x[2]):
            out[client].append(rid)
        return out

    live = per_client([(s.client, s.id, s.arrival) for s, _ in answers])
    simulated = per_client([(r.client, r.id, r.arrival) for r in sim.records])
    for c in set(live) | set(simulated):  # the same requests in the same order; one run
        a, b = live.get(c, []), simulated.get(c, [])  # may stop a client earlier (the cap)
        n = min(len(a), len(b))
        assert a[:n] == b[:n] and n > 0


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError):
        LoadShape(0)
    with pytest.raises(ValueError):
        Bursts(10.0, 20.0)
    with pytest.raises(ValueError):
        ClosedLoop(LoadShape(2), [[]])


def test_a_spike_adds_its_clients_only_between_its_bounds():
    """C = 2 → 6 → 2: the spike's four clients send only in [at_s, until_s); the base two
    throughout; at most 6 requests in flight, at most 2 outside the spike (the records)."""
    from simulator.closed_loop import Spike

    shape = LoadShape(6, think_s=0.2, hold_s=12.0, spike=Spike(4, at_s=4.0, until_s=8.0))
    records = run(shape, specs(600, seed=3))
    by_client: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in records:
        by_client[r.client].append(r)
    clients = sorted(by_client)
    assert len(clients) == 6
    base, extra = clients[:2], clients[2:]
    assert all(min(r.arrival for r in by_client[c]) < 1.0 for c in base)
    for c in extra:
        arrivals = [r.arrival for r in by_client[c]]
        assert min(arrivals) >= 4.0 and max(arrivals) < 8.0, (c, arrivals)
    events = sorted(
        [(r.arrival, 1) for r in records] + [(r.finish or r.arrival, -1) for r in records]
    )
    level = 0
    for t, step in events:
        level += step
        assert level <= 6
        if t < 4.0 or t >= 8.0 + 5.0:  # the spike's last requests finish within 5 s
            assert level <= 2 or step < 0, t
    with pytest.raises(ValueError, match="spike"):
        LoadShape(4, spike=Spike(4, 1.0, 2.0))
