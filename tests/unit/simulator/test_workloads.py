import random
import statistics
from pathlib import Path

import pytest

from policies.types import Category
from simulator.families import CdfFamily, ChatFamily, RagFamily, StructuredFamily, chain_hashes
from simulator.lengths import load_cdf
from simulator.workloads import (
    Bursty,
    Component,
    GammaArrivals,
    Poisson,
    arrival_times,
    generate,
    read_trace,
    write_trace,
)


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip([0.0, *times], times, strict=False)]


def test_poisson_arrivals_have_the_rate_and_exponential_gaps() -> None:
    t = arrival_times(Poisson(20.0), 20000, random.Random(1))
    assert t == sorted(t)
    gaps = _gaps(t)
    assert statistics.fmean(gaps) == pytest.approx(1 / 20, rel=0.03)
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, abs=0.05)


def test_gamma_arrivals_have_the_asked_burstiness() -> None:
    gaps = _gaps(arrival_times(GammaArrivals(10.0, cv=3.0), 20000, random.Random(2)))
    assert statistics.fmean(gaps) == pytest.approx(0.1, rel=0.1)
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(3.0, rel=0.15)


def test_bursty_arrivals_come_faster_inside_bursts() -> None:
    process = Bursty(rate=5.0, burst_factor=6.0, burst_every=10.0, burst_duration=2.0)
    t = arrival_times(process, 6000, random.Random(3))
    # Count arrivals per 1 s bin: bursts make the busiest bins far above the base rate.
    bins: dict[int, int] = {}
    for x in t:
        bins[int(x)] = bins.get(int(x), 0) + 1
    counts = sorted(bins.get(i, 0) for i in range(int(t[-1])))
    assert statistics.median(counts) == pytest.approx(5, abs=2)
    assert counts[int(0.98 * len(counts))] >= 20
    mean_rate = len(t) / t[-1]
    assert mean_rate == pytest.approx(5.0 * (1 + 5.0 * 2.0 / 12.0), rel=0.15)


def test_generate_is_reproducible_and_mixes_components_by_weight() -> None:
    comps = [
        Component(ChatFamily(), 0.7, "interactive", Category.CHAT),
        Component(RagFamily(), 0.3, "long", Category.RAG),
    ]
    a = generate(comps, Poisson(10), 3000, seed=4, clients=8)
    b = generate(comps, Poisson(10), 3000, seed=4, clients=8)
    assert a == b
    assert generate(comps, Poisson(10), 3000, seed=5, clients=8) != a
    long = [s for s in a if s.slo_class == "long"]
    assert len(long) / len(a) == pytest.approx(0.3, abs=0.03)
    assert statistics.median(s.prompt_tokens for s in long) > 4 * statistics.median(
        s.prompt_tokens for s in a if s.slo_class == "interactive"
    )
    assert {s.client for s in a} == {f"c{i:03d}" for i in range(8)}
    assert all(s.max_tokens == s.output_tokens for s in a)


def test_client_skew_concentrates_traffic() -> None:
    comps = [Component(ChatFamily())]
    specs = generate(comps, Poisson(10), 4000, seed=1, clients=10, client_skew=1.5)
    top = sum(s.client == "c000" for s in specs) / len(specs)
    assert top > 0.4  # 1/ζ-normalised weight of rank 1 at s = 1.5 over 10 clients is ~0.47


def test_cdf_family_splits_totals_80_20() -> None:
    fam = CdfFamily(load_cdf("lmsys_chat_1m"))
    rng = random.Random(1)
    shapes = [fam.draw(rng, i) for i in range(2000)]
    assert all(s.prompt == max(1, int(0.8 * (s.prompt + s.output))) for s in shapes if s.output > 1)


def test_structured_prefixes_share_block_hashes_per_template() -> None:
    fam = StructuredFamily(templates=3, prefix_min=256, prefix_max=256, block_size=16)
    rng = random.Random(1)
    shapes = [fam.draw(rng, i) for i in range(200)]
    firsts = {s.hashes[0] for s in shapes}
    assert len(firsts) == 3  # one chain start per template
    by_first: dict[int, list[tuple[int, ...]]] = {}
    for s in shapes:
        assert len(s.hashes) == s.prompt // 16
        by_first.setdefault(s.hashes[0], []).append(s.hashes)
    for chains in by_first.values():
        assert len({c[:16] for c in chains}) == 1  # 256 shared tokens = 16 shared blocks
        assert len({c[16:17] for c in chains if len(c) > 16}) == sum(len(c) > 16 for c in chains)


def test_chain_hashes_are_stable_and_chained() -> None:
    a = chain_hashes(64, 16, (1, 2), unique=9)
    assert a == chain_hashes(64, 16, (1, 2), unique=9)
    assert a[:2] == chain_hashes(64, 16, (1, 2), unique=10)[:2]
    assert a[2:] != chain_hashes(64, 16, (1, 2), unique=10)[2:]


def test_trace_round_trip_and_replay(tmp_path: Path) -> None:
    specs = generate([Component(ChatFamily())], Poisson(5), 50, seed=2, clients=3)
    path = tmp_path / "trace.jsonl"
    write_trace(specs, path)
    with path.open("a") as fh:
        fh.write('{"ts": 1e9, "status": 502, "prompt_tokens": 5, "completion_tokens": 1}\n')
        fh.write('{"ts": 1e9, "usage": {"prompt_tokens": 3}}\n')
    back = read_trace(path)
    assert len(back) == 50
    t0 = specs[0].arrival
    for s, b in zip(specs, back, strict=True):
        assert (b.id, b.prompt_tokens, b.output_tokens, b.client) == (
            s.id,
            s.prompt_tokens,
            s.output_tokens,
            s.client,
        )
        assert b.arrival == pytest.approx(s.arrival - t0, abs=1e-5)
    fast = read_trace(path, speedup=2.0, limit=10)
    assert len(fast) == 10
    assert fast[-1].arrival == pytest.approx(back[9].arrival / 2, abs=1e-6)


def test_a_trace_with_nothing_to_replay_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text('{"ts": 1, "status": 429}\n')
    with pytest.raises(ValueError, match="no replayable"):
        read_trace(path)


def test_tenants_have_their_own_arrivals_and_windows() -> None:
    from simulator.families import UniformFamily
    from simulator.workloads import Tenant, generate_tenants

    shape = [Component(UniformFamily(64, 64, 32, 32))]
    a = Tenant("a", Poisson(10.0), shape, leave=20.0)
    c = Tenant("c", Poisson(10.0), shape, join=5.0, leave=10.0)
    specs = generate_tenants([a, c], seed=3)
    assert [s.arrival for s in specs] == sorted(s.arrival for s in specs)
    assert [s.id for s in specs] == [f"r{i:07d}" for i in range(len(specs))]
    mine = [s for s in specs if s.client == "c"]
    assert all(5.0 < s.arrival < 10.0 for s in mine) and len(mine) == pytest.approx(50, rel=0.4)
    assert all(s.prompt_tokens == 64 and s.output_tokens == 32 for s in specs)
    # a tenant's requests do not depend on the others
    alone = generate_tenants([a], seed=3)
    assert [s.arrival for s in alone] == [s.arrival for s in specs if s.client == "a"]
    assert len(generate_tenants([a, c], seed=3, limit=7)) == 7
    with pytest.raises(ValueError, match="leave"):
        Tenant("x", Poisson(1.0), shape)
