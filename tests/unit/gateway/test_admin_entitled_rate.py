"""/admin/plan?source=promised|demand: the baselines as defined now, not as last measured
(the measured demand is recomputed at most every 100 ms, so a baseline changed through
/admin/entitlements just before a plan was missed: test_admin_plan's flake)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gateway.admin import entitled_rate
from policies.tenancy.classes import ServiceClass
from policies.tenancy.entitlement import Entitlement, EntitlementState


def test_the_baselines_are_read_from_the_definitions_and_the_measured_excess_added() -> None:
    g = ServiceClass.SPOT
    defs = [
        Entitlement("a", "p", g, tokens_per_s=400_000.0),  # just raised from 2,000
        Entitlement("b", "p", g, tokens_per_s=50.0, state=EntitlementState.PENDING),
    ]
    # the last measurement still holds the old baseline, and 300 tokens/s above it
    stale = [SimpleNamespace(promised={"tokens_per_s": 2000.0}, demand={"tokens_per_s": 2300.0})]
    assert entitled_rate(defs, stale, "promised") == 400_000.0
    assert entitled_rate(defs, stale, "demand") == pytest.approx(400_300.0)
