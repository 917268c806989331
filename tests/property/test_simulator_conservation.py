"""Property: whatever the workload and fleet, every admitted request finishes exactly once
with all of its tokens, its timestamps are ordered, TTFT is at least Eq. 7's unloaded
value, and the slot-time the workers account equals the time requests held slots."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.run import run
from simulator.scenario import parse
from simulator.workloads import RequestSpec

request = st.tuples(
    st.floats(0, 5, allow_nan=False),  # arrival
    st.integers(1, 3000),  # prompt tokens
    st.integers(1, 200),  # output tokens
    st.integers(0, 2),  # client
)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(request, min_size=1, max_size=60),
    st.integers(1, 4),
    st.integers(1, 8),
    st.sampled_from(["least_loaded", "round_robin", "power_of_two"]),
    st.sampled_from([0.0, 0.05]),
    st.integers(300, 3000),
)
def test_requests_are_conserved(reqs, workers, slots, routing, scrape, kv_blocks) -> None:  # type: ignore[no-untyped-def]
    sc = parse(
        {
            "name": "prop",
            "fleet": {
                "engine": {"max_num_seqs": slots, "num_kv_blocks": kv_blocks},
                "pools": [{"name": "short", "workers": workers, "max_model_len": 4096}],
            },
            "policy": {"routing": {"policy": routing}},
            "telemetry": {"scrape_interval": scrape},
            "workload": {"trace": {"path": "unused"}},
        }
    )
    reqs = sorted(reqs)
    specs = [
        RequestSpec(
            id=f"p{i}", arrival=t, prompt_tokens=p, output_tokens=o, max_tokens=o, client=f"c{c}"
        )
        for i, (t, p, o, c) in enumerate(reqs)
    ]
    res = run(sc, specs=specs)
    cfg = sc.engine_config(sc.fleet.pools[0])
    assert [r.id for r in res.records] == [s.id for s in specs]
    held = 0.0
    for r, s in zip(res.records, specs, strict=True):
        if s.prompt_tokens + s.max_tokens > 4096:
            assert r.status == "rejected_413"
            continue
        if math.ceil((s.prompt_tokens + s.max_tokens) / cfg.block_size) > kv_blocks:
            assert r.status in ("error", "ok")  # the engine decides what can never fit
            if r.status == "error":
                continue
        assert r.status == "ok"
        assert r.completion_tokens == s.output_tokens
        assert r.arrival <= r.dispatch <= r.scheduled < r.first_token <= r.finish
        floor = (math.ceil(s.prompt_tokens / cfg.prefill_chunk) + 1) * cfg.w
        assert r.first_token - r.arrival >= floor - 1e-9
        held += r.finish - r.scheduled
    if not any(r.preemptions for r in res.records):
        # With no preemption every slot-second belongs to one request's residence.
        assert abs(res.pools["short"].busy_slot_seconds - held) <= 1e-6 * max(1.0, held)
