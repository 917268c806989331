"""bench/quartz_live.py --clients end to end, very small: closed-loop clients through a real
gateway and emulators. Every request is answered, and each client sent the requests the
simulator's closed loop gives it (simulator/closed_loop.py `deal` over the same trace), in
the same order — the one definition in both modes. Nothing about who wins."""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from pathlib import Path

import pytest

from simulator.closed_loop import deal
from simulator.workloads import RequestSpec
from tests.experiments.quartz_live import METHODS, Setup, run_one, trace

pytestmark = pytest.mark.e2e

SMALL = Setup(workers=2, max_num_seqs=4, scale=0.5, output_scale=0.1, requests=40,
              drain=120.0, clients=6)  # fmt: skip


def test_closed_loop_clients_send_their_own_sequences(tmp_path: Path) -> None:
    records = tmp_path / "records.jsonl"
    run = run_one(SMALL, METHODS["FIFO-LL"], seed=1, records=records)
    assert run["answered"] == run["requests"] == SMALL.requests, run
    rows = [json.loads(x) for x in records.read_text().splitlines()]
    sent: dict[str, list[int]] = defaultdict(list)
    for r in sorted(rows, key=lambda r: r["arrival"]):
        sent[r["client"]].append(r["i"])
    # the clients start over a 2 s ramp; fast chat clients may use up the 40-request cap
    # before the last ones start, so some may not have sent at all
    assert 2 <= len(sent) <= SMALL.clients

    # the simulator's sequences for the same draw (ids and classes do not depend on the
    # engine's template overhead, which only shortens prompt text)
    drawn = trace(dataclasses.replace(SMALL, requests=3 * SMALL.requests), 1, 0)
    specs = [RequestSpec(str(r.i), 0.0, 10, 1, 1, slo_class=r.slo_class) for r in drawn]
    seqs = deal(specs, SMALL.clients, names={"interactive": "chat", "long": "rag"})
    expected = {seq[0].client: [int(s.id) for s in seq] for seq in seqs}
    for client, ids in sent.items():
        assert ids == expected[client][: len(ids)], client
