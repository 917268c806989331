"""The tenancy ledger (policies/tenancy/ledger.py, the in-memory store's heart and the Redis
scripts' specification): no sequence of reserve / settle / release / finish / heartbeat /
expire / clock steps leaves a negative balance, a bucket outside [0, depth], a count that
disagrees with the holds, or — once every hold is released or has expired — anything held."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.tenancy.capacity import PoolCapacity
from policies.tenancy.classes import ServiceClass as C
from policies.tenancy.entitlement import Entitlement
from policies.tenancy.ledger import Ledger, StoreConfig
from policies.tenancy.verdict import Claim, Granted

POOL = PoolCapacity(tokens_per_s=300.0, kv_bytes=300_000, slots=5, bytes_per_token=100)
ENTS = [
    Entitlement("g", "p", C.GUARANTEED, 100.0, 120_000, 2, window_s=4.0),
    Entitlement("d", "p", C.DEDICATED, 80.0, 80_000, 2, window_s=4.0),
    Entitlement("e", "p", C.ELASTIC, 60.0, 80_000, 2, window_s=4.0),
    Entitlement("s", "p", C.SPOT, 50.0, 80_000, 3, window_s=4.0),
    Entitlement("x", "p", C.PREEMPTIBLE, 50.0, 80_000, 3, window_s=4.0),
]
PRIORITY = {"g": 333.0, "d": 333.0, "e": 40.0, "s": 0.3, "x": 0.03}

op = st.one_of(
    st.tuples(
        st.just("reserve"),
        st.sampled_from("gdesx"),
        st.integers(1, 1500),
        st.sampled_from(["", "r1", "r2"]),
    ),
    st.tuples(
        st.sampled_from(["settle", "release", "finish"]),
        st.integers(0, 99),
        st.integers(0, 2000),
        st.just(""),
    ),
    st.tuples(st.just("heartbeat"), st.just(""), st.just(0), st.sampled_from(["r1", "r2"])),
    st.tuples(st.just("expire"), st.just(""), st.just(0), st.just("")),
    st.tuples(st.just("tick"), st.just(""), st.sampled_from([1, 50, 700, 2500, 9000]), st.just("")),
)


def check_invariants(ledger: Ledger) -> None:
    pool = ledger.pools["p"]
    holds = list(pool.holds.values())
    assert pool.in_flight == len(holds) >= 0
    assert pool.kv == sum(h.kv for h in holds) >= 0
    assert 0 <= pool.bucket.level <= pool.bucket.depth
    assert sum(pool.admitted.values()) == len(holds)
    assert set(pool.evictable) <= {h.id for h in holds if h.evictable}
    per = Counter(h.entitlement for h in holds)
    for name, led in pool.entitlements.items():
        assert led.in_flight == per[name] >= 0
        assert led.kv == sum(h.kv for h in holds if h.entitlement == name) >= 0
        assert 0 <= led.bucket.level <= led.bucket.depth
        assert led.charged >= 0 and led.refused >= 0
    assert pool.idle_slots == sum(led.idle_slots() for led in pool.entitlements.values()) >= 0
    assert pool.idle_kv == sum(led.idle_kv() for led in pool.entitlements.values()) >= 0
    for replica, ids in pool.by_replica.items():
        assert ids and all(pool.holds[i].replica == replica for i in ids)
    # a hold named for eviction is no longer evictable, and counts as coming back
    named = [h for h in holds if h.named]
    assert pool.named_slots == len(named) and pool.named_kv == sum(h.kv for h in named)
    assert not {h.id for h in named} & set(pool.evictable)


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=120))
def test_no_sequence_leaves_a_negative_balance_or_a_leaked_hold(ops):
    ledger = Ledger(StoreConfig(hold_ttl_s=30.0, heartbeat_ttl_s=5.0))
    now = 10.0
    ledger.define_pool("p", POOL, now)
    for e in ENTS:
        ledger.put_entitlement(e, PRIORITY[e.name], now)
    granted: list[str] = []
    for kind, a, b, c in ops:
        if kind == "reserve":
            v = ledger.reserve(Claim("p", a, f"q{len(granted)}", b, c), now)
            if isinstance(v, Granted):
                granted.append(v.reservation)
        elif kind in ("settle", "release", "finish") and granted:
            hid = granted[a % len(granted)]
            if kind != "release":
                ledger.settle("p", hid, b, 0.2, now)
            if kind != "settle":
                ledger.release("p", hid)
                ledger.release("p", hid)  # a second exit path: no effect
        elif kind == "heartbeat":
            ledger.heartbeat(c, now)
        elif kind == "expire":
            ledger.expire(now)
        elif kind == "tick":
            now += b / 1000
        check_invariants(ledger)
    # every hold ends: released by hand, or by its TTL; nothing is left held
    for hid in granted[::2]:
        ledger.release("p", hid)
    ledger.expire(now + 30.0)
    check_invariants(ledger)
    pool = ledger.pools["p"]
    assert pool.in_flight == pool.kv == 0 and not pool.holds and not pool.admitted
    assert not pool.evictable and not pool.by_replica
    assert pool.named_slots == pool.named_kv == 0
    assert all(led.in_flight == led.kv == 0 for led in pool.entitlements.values())
    # with nothing held, a dedicated entitlement's whole baseline is idle again
    assert pool.idle_slots == 2 and pool.idle_kv == 80_000
