"""The composition root attaches the cache routers' hooks (policies/build.py): once each,
whoever else gives them, for routers built from configuration or handed in."""

from __future__ import annotations

from policies.build import Choice, CoreSpec, build_core, request_fields, router_hooks
from policies.clock import ManualClock
from policies.routing import make_router


def test_a_handed_in_routers_hooks_join_once_even_when_the_driver_gives_them_too():
    router = make_router("regime_adaptive")
    hooks = router_hooks(router)
    assert len(hooks) == 2  # the kv state and the TTFT sampler
    core, _ = build_core(CoreSpec(), ManualClock(), hooks=hooks, routers={"short": router})
    assert core.hooks == hooks


def test_a_configured_router_is_attached_when_its_pool_is_first_routed():
    spec = CoreSpec(pool_routing={"short": Choice("prefix_overlap")})
    core, _ = build_core(spec, ManualClock())
    assert core.hooks == ()
    router = core.router_for("short")
    assert core.hooks == router_hooks(router) == (router.state,)  # type: ignore[attr-defined]
    plain = core.router_for("long")  # least_loaded: nothing to attach
    assert router_hooks(plain) == () and len(core.hooks) == 1


def test_request_fields_name_what_the_configured_routers_read():
    assert request_fields(CoreSpec()) == frozenset()
    spec = CoreSpec(routing=Choice("kv_cost"), pool_routing={"long": Choice("session_affinity")})
    assert request_fields(spec) == {
        "prefix_hashes",
        "router_temperature",
        "overlap_weight",
        "session",
    }
