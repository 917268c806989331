"""Service classes: who is protected under contention (the token-pools paper, §3.2, Table 1).

    class        baseline        burst  shrink  weight  here
    dedicated    reserved        yes    never   1000    its unused baseline stays held even
                                                        when idle (nobody backfills it)
    guaranteed   reserved        no     never   1000    a hard cap at baseline; its idle
                                                        baseline may be backfilled, and its
                                                        requests within baseline are admitted
                                                        even into a full pool
    elastic      time-averaged   yes    yes     100     within baseline it competes on
                                                        priority (Eq. 1); accrues debt (Eq. 2)
    spot         none            yes    yes     1       surplus only: refused whenever the pool
                                                        has no idle room; no debt
    preemptible  none            yes    evict   0.1     as spot, and its in-flight requests are
                                                        evicted when a protected class needs room

"Reserved" means: a request within the entitlement's baseline is never refused for pool
contention (§3.2: "dedicated/guaranteed entitlements are never touched"). The one
difference the paper draws between dedicated and guaranteed besides burst — dedicated's
baseline "is never reclaimed, even when idle" — is kept by counting a dedicated
entitlement's unused slots and KV bytes as taken when deciding whether the pool has idle
room for a burst (the throughput dimension is a rate and is not held that way).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ServiceClass(StrEnum):
    DEDICATED = "dedicated"
    GUARANTEED = "guaranteed"
    ELASTIC = "elastic"
    SPOT = "spot"
    PREEMPTIBLE = "preemptible"


@dataclass(frozen=True, slots=True)
class ClassRules:
    reserved: bool  # within baseline: never refused for contention
    burst: bool  # may go above baseline into idle pool capacity
    has_baseline: bool  # spot and preemptible have none: every request is surplus
    holds_idle: bool  # its unused baseline is not backfilled by others
    accrues_debt: bool  # underservice raises its priority later (Eq. 2)
    evictable: bool  # its in-flight requests may be cancelled for a protected class


RULES: dict[ServiceClass, ClassRules] = {
    ServiceClass.DEDICATED: ClassRules(True, True, True, True, True, False),
    ServiceClass.GUARANTEED: ClassRules(True, False, True, False, True, False),
    ServiceClass.ELASTIC: ClassRules(False, True, True, False, True, False),
    ServiceClass.SPOT: ClassRules(False, True, False, False, False, False),
    ServiceClass.PREEMPTIBLE: ClassRules(False, True, False, False, False, True),
}

# Table 1's base weights w_κ: orders of magnitude apart so class dominates the other factors
CLASS_WEIGHTS: dict[ServiceClass, float] = {
    ServiceClass.DEDICATED: 1000.0,
    ServiceClass.GUARANTEED: 1000.0,
    ServiceClass.ELASTIC: 100.0,
    ServiceClass.SPOT: 1.0,
    ServiceClass.PREEMPTIBLE: 0.1,
}
