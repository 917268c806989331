"""The `token_pools` admitter on the synchronous path (the in-memory ledger): the control
step moves debt and priority from observed usage, refusals carry the check, evictions are
surfaced on the reservation, configuration errors fail at start."""

from __future__ import annotations

import pytest

from policies.admission import AdmissionRefused, make_admitter
from policies.types import Outcome, RequestInfo, Status

POOL = {"slots": 8, "tokens_per_s": 1e6, "kv_bytes": 10**12, "bytes_per_token": 10}


def _req(i, ent, max_tokens=100):
    return RequestInfo(f"{ent}{i}", "m", 0.0, 100, max_tokens, entitlement=ent)


def _params(**ents):
    return {"pools": {"p": POOL}, "entitlements": ents, "control_interval_s": 1.0}


def test_an_underserved_elastic_entitlement_gains_debt_and_priority():
    base = {"pool": "p", "class": "elastic", "tokens_per_s": 400.0, "kv_bytes": 10**10}
    a = make_admitter(
        "token_pools",
        _params(
            copilot=base | {"concurrency": 5, "slo_target_ms": 500},
            synth=base | {"concurrency": 5, "slo_target_ms": 30000},
        ),
    )
    held = [a.admit(_req(i, "copilot"), 0.0) for i in range(8)]  # fills the pool (bursting)
    assert not any(isinstance(h, AdmissionRefused) for h in held)
    refused = [a.admit(_req(i, "synth"), 0.5) for i in range(20)]
    assert all(isinstance(r, AdmissionRefused) and r.code == "pool_contention" for r in refused)
    before = {u.definition.name: u for u in a.ledger.view("p", 0.5).entitlements}
    a.admit(_req(99, "synth"), 1.0)  # the next interval: a control step runs first
    after = {u.definition.name: u for u in a.ledger.view("p", 1.0).entitlements}
    assert after["synth"].debt > 0 and after["synth"].priority > before["synth"].priority
    assert after["copilot"].debt < 0  # overserved: credit, priority down
    assert round(before["copilot"].priority, 1) == 93.8  # Eq. 1 with ℓ̄* = 15.25 s
    for h in held:
        h.settle(Outcome(Status.OK, prompt_tokens=100, completion_tokens=10), 2.0)
        h.release()
    assert a.ledger.pools["p"].in_flight == 0


def test_a_guaranteed_request_names_preemptible_victims():
    a = make_admitter(
        "token_pools",
        {
            "pools": {"p": POOL | {"slots": 2}},
            "entitlements": {
                "g": {"pool": "p", "class": "guaranteed", "tokens_per_s": 1e5}
                | {"kv_bytes": 10**10, "concurrency": 2},
                "batch": {"pool": "p", "class": "preemptible", "concurrency": 4},
            },
        },
    )
    victims = [a.admit(_req(i, "batch"), 0.0) for i in range(2)]
    g = a.admit(_req(0, "g"), 0.0)
    assert g.evict == (victims[0].hold,)  # one slot short: the lowest-priority, oldest hold
    assert victims[0].evictable and not g.evictable
    for r in [*victims, g]:
        r.release()


def test_unknown_entitlements_go_to_the_default_or_are_refused():
    ent = {"pool": "p", "class": "spot", "concurrency": 1}
    strict = make_admitter("token_pools", _params(anyone=ent))
    refused = strict.admit(_req(0, "nobody"), 0.0)
    assert isinstance(refused, AdmissionRefused) and refused.code == "unknown_entitlement"
    lenient = make_admitter("token_pools", _params(anyone=ent) | {"default_entitlement": "anyone"})
    assert not isinstance(lenient.admit(_req(0, "nobody"), 0.0), AdmissionRefused)
    assert lenient.entitlement_of("nobody").name == "anyone"
    assert strict.entitlement_of("nobody") is None
    assert strict.entitlement_of("anyone").name == "anyone"


@pytest.mark.parametrize(
    "params",
    [
        {"pools": {"p": POOL}, "entitlements": {"x": {"pool": "q", "class": "spot"}}},
        {"pools": {"p": POOL}, "entitlements": {"x": {"pool": "p", "class": "gold"}}},
        {"pools": {"p": POOL}, "entitlements": {"x": {"pool": "p", "class": "guaranteed"}}},
        {"pools": {"p": POOL | {"kv_geometry": {"layers": 1, "kv_heads": 1, "head_dim": 1}}}},
        {"pools": {"p": POOL}, "default_entitlement": "nobody"},
    ],
)
def test_bad_configuration_fails_at_start(params):
    with pytest.raises(ValueError):
        make_admitter("token_pools", params)


def test_n_best_of_and_batched_prompts_are_charged_as_the_engine_runs_them():
    """n=64 makes the engine run 64 sequences: the claim takes 64 slots and 64 answers'
    worth of tokens (the prompt once per prompt); a batch of prompts, each prompt's."""
    guaranteed = {"pool": "p", "class": "guaranteed", "tokens_per_s": 1e6,
                  "kv_bytes": 10**11, "concurrency": 8}  # fmt: skip
    a = make_admitter("token_pools", _params(team=guaranteed))

    def req(i, **kw):
        return RequestInfo(f"r{i}", "m", 0.0, 11, 30, entitlement="team", **kw)

    claim = a.claim(req(0, choices=64))
    assert (claim.tokens, claim.slots) == (11 + 64 * 30, 64)
    claim = a.claim(req(1, prompts=3, choices=2))  # 3 prompts, best_of 2 each
    assert (claim.tokens, claim.slots) == (3 * 11 + 6 * 30, 6)
    assert a.claim(req(2)).slots == 1
    refused = a.admit(req(3, choices=64), 0.0)
    assert isinstance(refused, AdmissionRefused) and refused.code == "concurrency"
    held = a.admit(req(4, choices=6), 0.0)
    assert not isinstance(held, AdmissionRefused)
    assert a.ledger.pools["p"].in_flight == 6
    assert isinstance(a.admit(req(5, choices=3), 0.0), AdmissionRefused)  # 6 + 3 > 8
    assert not isinstance(a.admit(req(6, choices=2), 0.0), AdmissionRefused)  # 6 + 2 = 8
    held.release()
    assert a.ledger.pools["p"].in_flight == 2
