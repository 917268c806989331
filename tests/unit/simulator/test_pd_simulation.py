"""A `kind: pd` pool in the simulator (simulator/pd_topology.py, simulator/driver.py): the
core's pair flow on engine models — prefill on a prefill worker, the KV's transfer, decode
on a decode worker — with every lease back at zero and the paper's cascade in miniature:
past the prefill's capacity TTFT grows while the decode's inter-token time does not."""

from __future__ import annotations

import random
from typing import Any

import pytest

from policies.actions import ActionLog
from simulator.closed_loop import LoadShape, simulate
from simulator.scenario import ScenarioError, parse
from simulator.workloads import RequestSpec


def _scenario(protocol: str = "vllm", prefill: int = 1, decode: int = 2, **pd: Any) -> Any:
    return parse(
        {
            "name": "pd",
            "seed": 1,
            "fleet": {
                "engine": {"max_num_seqs": 128, "num_kv_blocks": 16384},
                "pools": [
                    {
                        "name": "short",
                        "workers": prefill + decode,
                        "kind": "pd",
                        "pd": {
                            "protocol": protocol,
                            "prefill": prefill,
                            "decode": decode,
                            "transfer_s_per_block": 0.001,
                            # compute-bound prefill: ~6,000 prompt tokens a second
                            "prefill_engine": {"prefill_token_s": 0.00017},
                            "decode_engine": {"h": 0.00005},
                            **pd,
                        },
                    }
                ],
            },
            "workload": {
                "requests": 10,
                "arrivals": {"kind": "poisson", "rate": 1},
                "components": [{"family": "chat"}],
            },
        }
    )


def _run(scenario: Any, clients: int, per_client: int = 4, out: int = 64) -> Any:
    seqs = [
        [RequestSpec(f"r{c}-{k}", 0.0, 128, out, out, client=f"c{c}") for k in range(per_client)]
        for c in range(clients)
    ]
    log = ActionLog()
    result, _ = simulate(scenario, LoadShape(clients), seqs, log=log)
    return result, log


@pytest.mark.parametrize("protocol", ["vllm", "sglang"])
def test_every_request_runs_on_a_pair_and_every_lease_comes_back(protocol: str):
    result, log = _run(_scenario(protocol), clients=8)
    assert len(result.records) == 32 and all(r.status == "ok" for r in result.records)
    assert all(r.completion_tokens == 64 for r in result.records)
    # the decode's first token comes after the hand-off and the KV's transfer (128 tokens:
    # 8 blocks × 1 ms)
    for r in result.records:
        assert r.worker in ("short-d0", "short-d1")
    what = {w for _, w, _ in log.entries}
    assert {"send_pair", "handoff", "done"} <= what
    views = [w.view for w in result.core.load_of.__self__.cluster.workers.values()]  # type: ignore[attr-defined]
    assert all(v.in_flight == 0 and v.outstanding_tokens == 0 for v in views)


def test_the_first_token_follows_the_transfer():
    result, _ = _run(_scenario(), clients=1, per_client=1)
    (r,) = result.records
    driver = result.core.load_of.__self__  # type: ignore[attr-defined]
    handoff, arrived = driver.handoffs[r.id]
    assert arrived - handoff == pytest.approx(8 * 0.001)
    assert r.first_token > arrived


def test_past_the_prefills_capacity_ttft_grows_and_inter_token_time_does_not():
    def p99(xs: list[float]) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(0.99 * len(xs)))]

    rows = {}
    for clients in (8, 256):
        result, _ = _run(_scenario(), clients=clients, per_client=3, out=128)
        ok = [r for r in result.records if r.status == "ok"]
        ttft = [r.first_token - r.arrival for r in ok]
        itl = [(r.finish - r.first_token) / (r.completion_tokens - 1) for r in ok]
        rows[clients] = (p99(ttft), p99(itl))
    (ttft_lo, itl_lo), (ttft_hi, itl_hi) = rows[8], rows[256]
    assert ttft_hi > 10 * ttft_lo  # the prefill worker is the bottleneck: a queue builds there
    assert itl_hi < 3 * itl_lo  # the decode workers are not


def test_a_pd_pool_is_refused_without_its_topology():
    doc = {
        "name": "x",
        "fleet": {"pools": [{"name": "short", "workers": 3, "kind": "pd"}]},
        "workload": {
            "arrivals": {"kind": "poisson", "rate": 1},
            "components": [{"family": "chat"}],
        },
    }
    with pytest.raises(ScenarioError, match="kind: pd"):
        parse(doc)
    with pytest.raises(ScenarioError, match="prefill \\+ decode"):
        parse({**doc, "fleet": {"pools": [{"name": "short", "workers": 3, "kind": "pd",
                                            "pd": {"prefill": 1, "decode": 1}}]}})  # fmt: skip


def test_the_decode_engine_caches_what_arrived_by_prefix():
    """As the emulator's decode role: the decode request carries the prompt's block hashes,
    so requests of one prompt share their prefix blocks on the decode worker (found as hits
    in its prefix cache; before, the simulator's decode cached nothing)."""
    chain = tuple(range(100, 108))  # 128 tokens: 8 full blocks
    seqs = [
        [RequestSpec(f"r{k}", 0.0, 128, 16, 16, client="c0", prefix_hashes=chain) for k in range(3)]
    ]
    result, _ = simulate(_scenario(decode=1), LoadShape(1), seqs)
    assert [r.status for r in result.records] == ["ok"] * 3
    cluster = result.core.load_of.__self__.cluster  # type: ignore[attr-defined]
    stats = cluster.workers["short-d0"].engine.stats
    # the first request's 7 cacheable blocks (the last one is always computed) are found
    # by the second and third: 2 × 7 × 16 tokens
    assert stats.prefix_hits_tokens == 2 * 7 * 16


def _decode_bound(output_blocks: bool, seed: int) -> Any:
    """docs/PD.md's decode-bound 2P/2D pool: decode steps 10× costlier per sequence, 64
    sequences a decode worker; the decode worker by Dynamo's cost at its defaults."""
    return parse(
        {
            "name": "pd-lock-in",
            "seed": seed,
            "fleet": {
                "engine": {"max_num_seqs": 256, "num_kv_blocks": 65536},
                "pools": [
                    {
                        "name": "short",
                        "workers": 4,
                        "kind": "pd",
                        "pd": {
                            "protocol": "vllm",
                            "prefill": 2,
                            "decode": 2,
                            "transfer_s_per_block": 0.0002,
                            "prefill_engine": {
                                "prefill_token_s": 0.00017,
                                "max_num_batched_tokens": 2048,
                                "max_num_seqs": 32,
                                "enable_prefix_caching": False,
                            },
                            "decode_engine": {"h": 0.0001, "max_num_seqs": 64},
                            "pair": {
                                "policy": "kv_cost_decode",
                                "params": {"seed": seed, "output_blocks": output_blocks},
                            },
                        },
                    }
                ],
            },
            "workload": {
                "arrivals": {"kind": "poisson", "rate": 1},
                "components": [{"family": "chat"}],
            },
            "policy": {"dispatch": {"max_waiting": 100000, "timeout_s": 3600}},
        }
    )


def test_counting_output_blocks_keeps_template_requests_from_locking_onto_one_decode():
    """docs/PD.md "the τ = 0 lock-in": 128 clients ramped over 30 s, prompts from 5
    templates (8 hashed blocks each). Counting prompt blocks alone (a shared block once),
    both decode workers look equally loaded however many requests of a template each
    holds, and the overlap term keeps sending a template where it went before: the
    workers' shares of the hold's requests split about 60 : 40. With each request's
    output blocks counted they split evenly."""
    seed, clients, ramp, hold = 2, 128, 30.0, 60.0
    seqs = []
    for c in range(clients):
        rng = random.Random(seed * 1_000_003 + c)
        seqs.append(
            [
                RequestSpec(
                    f"c{c}-{k}",
                    0.0,
                    128,
                    rng.randint(192, 256),
                    256,
                    client=f"c{c}",
                    prefix_hashes=tuple(1000 * (rng.randrange(5) + 1) + i for i in range(8)),
                )
                for k in range(50)
            ]
        )
    shares: dict[bool, float] = {}
    for output_blocks in (False, True):
        shape = LoadShape(clients, ramp_s=ramp, hold_s=hold, seed=seed)
        result, _ = simulate(_decode_bound(output_blocks, seed), shape, seqs)
        held = [r.worker for r in result.records if r.arrival >= ramp]
        n0, n1 = held.count("short-d0"), held.count("short-d1")
        assert n0 + n1 == len(held) > 2000
        shares[output_blocks] = max(n0, n1) / (n0 + n1)
    assert shares[False] > 0.55  # locked in: this workload's oracle that the test can fail
    assert shares[True] < 0.51  # an even split
