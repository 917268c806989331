from gateway.config import load_config
from gateway.workers import Fleet


def _fleet() -> Fleet:
    cfg = load_config(
        data={
            "pools": {
                "short": {
                    "max_model_len": 8192,
                    "models": ["m"],
                    "workers": [{"url": "http://127.0.0.1:9"}, {"url": "http://127.0.0.1:10"}],
                }
            }
        },
        environ={},
    )
    return Fleet(cfg)


def test_ready_needs_a_worker_heard_from_since_start():
    """Before: readiness was `any_routable`, true for a fleet nobody had heard from (every
    worker starts healthy, and one failed check is below unhealthy_after)."""
    fleet = _fleet()
    a, b = fleet.workers.values()
    assert fleet.any_routable(0.0) and not fleet.any_ready(0.0)
    a.health_result(False, unhealthy_after=2, healthy_after=1)
    assert a.healthy and not fleet.any_ready(0.0)  # benefit of the doubt, not readiness
    b.health_result(True, unhealthy_after=2, healthy_after=1)
    assert fleet.any_ready(0.0)
    # a proven worker that has since gone unhealthy does not keep the gateway ready
    for _ in range(2):
        b.health_result(False, unhealthy_after=2, healthy_after=1)
    assert not fleet.any_ready(0.0)
    # nor does one whose circuit is open
    b.health_result(True, unhealthy_after=2, healthy_after=1)
    b.open_until = 5.0
    assert not fleet.any_ready(1.0) and fleet.any_ready(6.0)
