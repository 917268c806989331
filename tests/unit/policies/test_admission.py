"""Step 5's conformance suite: every registered admitter (policies/admission.py) passes it,
and the built-in ones' own behaviour."""

from __future__ import annotations

import pytest

from policies.admission import ADMITTERS, AdmissionRefused, make_admitter
from policies.types import Outcome, RequestInfo, Status

# parameters that make each registered admitter refuse within a few requests, where it can
TIGHT = {
    "concurrency": {"limit": 2},
    # one guaranteed entitlement of 2 slots in a 16-slot pool: the third request is refused
    "token_pools": {
        "pools": {
            "p": {"slots": 16, "tokens_per_s": 1e6, "kv_bytes": 10**12, "bytes_per_token": 1000}
        },
        "entitlements": {
            "team-a": {
                "pool": "p",
                "class": "guaranteed",
                "tokens_per_s": 1e5,
                "kv_bytes": 10**10,
                "concurrency": 2,
            }
        },
    },
}


def _request(i: int, entitlement: str = "team-a") -> RequestInfo:
    return RequestInfo(f"r{i}", "m", 0.0, 1000, 100, entitlement=entitlement)


@pytest.fixture(params=ADMITTERS.names())
def admitter(request):
    return make_admitter(request.param, TIGHT.get(request.param, {}))


def test_every_registered_admitter_gives_back_what_it_took(admitter):
    """Admit until refused, release everything, and the same requests are admitted again:
    a reservation's release returns the entitlement to where it was."""
    first = [admitter.admit(_request(i), float(i)) for i in range(8)]
    held = [r for r in first if r is not None and not isinstance(r, AdmissionRefused)]
    for r in held:
        r.settle(Outcome(Status.OK, prompt_tokens=1000, completion_tokens=100), 10.0)
        r.release()
        r.release()  # a second release changes nothing
    again = [admitter.admit(_request(i), 20.0 + i) for i in range(8)]
    assert [isinstance(r, AdmissionRefused) for r in again] == [
        isinstance(r, AdmissionRefused) for r in first
    ]
    for r in again:
        if r is not None and not isinstance(r, AdmissionRefused):
            r.release()


def test_every_refusal_says_why_and_when_to_retry(admitter):
    for i in range(8):
        verdict = admitter.admit(_request(i), 0.0)
        if isinstance(verdict, AdmissionRefused):
            assert verdict.reason and verdict.code
            assert verdict.retry_after > 0
            return


def test_every_admitter_releases_on_any_outcome(admitter):
    """Success, error and disconnect alike: settle then release leaves nothing held."""
    for status in Status:
        held = admitter.admit(_request(0), 0.0)
        assert not isinstance(held, AdmissionRefused)
        if held is not None:  # None: admitted, holding nothing
            held.settle(Outcome(status), 1.0)
            held.release()
    again = [admitter.admit(_request(i), 2.0) for i in range(2)]
    assert not any(isinstance(r, AdmissionRefused) for r in again)


@pytest.mark.parametrize("name", ADMITTERS.names())
def test_unknown_parameters_are_refused_at_start(name):
    with pytest.raises(ValueError, match="unknown parameter"):
        make_admitter(name, {"no_such_knob": 1})


def test_unknown_admitter_names_what_is_known():
    with pytest.raises(ValueError, match="always"):
        make_admitter("token_pool_typo")


def test_concurrency_is_per_entitlement():
    a = make_admitter("concurrency", {"limit": 1, "retry_after_s": 2.5})
    first = a.admit(_request(0, "a"), 0.0)
    assert not isinstance(first, AdmissionRefused)
    refused = a.admit(_request(1, "a"), 0.0)
    assert isinstance(refused, AdmissionRefused) and refused.retry_after == 2.5
    assert "'a'" in refused.reason and "limit" in refused.reason
    assert not isinstance(a.admit(_request(2, "b"), 0.0), AdmissionRefused)  # another tenant
    first.release()
    assert not isinstance(a.admit(_request(3, "a"), 0.0), AdmissionRefused)


@pytest.mark.parametrize("params", [{"limit": 0}, {"retry_after_s": 0}])
def test_concurrency_bad_values_are_refused(params):
    with pytest.raises(ValueError):
        make_admitter("concurrency", params)
