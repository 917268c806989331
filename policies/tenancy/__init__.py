"""Token pools: multi-tenant admission in inference-native units (the token-pools paper).

    capacity.py     a pool's Λ_p tokens/s, χ_p KV bytes (c = 2·L·H_kv·d_h·b), r_p slots  §3.1
    classes.py      service classes and their rules (Table 1)                              §3.2
    entitlement.py  tenant, pool, class, baselines (λ_e, χ_e, r_e), SLO, state            §3.1, §4.2
    priority.py     Eq. 1 priority, Eq. 2 debt, Eq. 3 burst                                §3.3
    control.py      the control step: observed usage → debt, burst, priority              §3.3
    bucket.py       the token budget in exact integers
    verdict.py      a claim, and what answers it: granted (evictions) or denied (check)
    ledger.py       the counters and §4.3's check-and-reserve, settle, release, expiry     §4.3
    store.py        the `EntitlementStore` protocol and the in-memory store
    config.py       `admission.params` of the admitter
    admitter.py     the `token_pools` admitter (policies/admission.py's extension point)

Pure: no I/O, no wall clock. The Redis store is gateway/store_redis.py.
"""
