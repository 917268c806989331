"""The PoA diagnostics (policies/poa.py) on hand-computed cases."""

import math
import random

import pytest

from policies.poa import FittedLatency, PaperCost, fit_latency, poa_calibrated, poa_paper


def test_paper_cost_constants_and_the_brief_s_plateau_arithmetic():
    c = PaperCost()
    assert (c.a, c.b, c.d, c.beta, c.capacity, c.w_c) == (0.005, 0.020, 0.010, 2, 64, 0.015)
    # n_j = 32 (C = 64 over 2 workers) and 12.8 (over 5), a full prefix hit each
    two = 0.005 * 32 + 0.020 + 0.010 / 32**2 - 0.015
    five = 0.005 * 12.8 + 0.020 + 0.010 / 51.2**2 - 0.015
    assert c.latency(32) - c.w_c == pytest.approx(two) and two == pytest.approx(0.165, abs=1e-3)
    assert c.latency(12.8) - c.w_c == pytest.approx(five) and five == pytest.approx(0.069, abs=1e-3)
    assert two / five == pytest.approx(2.4, abs=0.02)


def test_poa_paper_2_workers_3_requests_by_hand():
    # n = 2 on w0, 1 on w1; request 0 has its whole prefix on w0
    f2 = 0.005 * 2 + 0.020 + 0.010 / 62**2  # 0.0300026…
    f1 = 0.005 * 1 + 0.020 + 0.010 / 63**2  # 0.0250025…
    # request 0: min(f2 − 0.015, f1) = f2 − 0.015; requests 1, 2: f1 each
    opt = (f2 - 0.015) + 2 * f1
    got = poa_paper([0.1, 0.2, 0.3], {"w0": 2, "w1": 1}, [{"w0": 1.0}, {}, {}])
    assert got.opt == pytest.approx(opt, rel=1e-12)
    assert got.actual == pytest.approx(0.6)
    assert got.ratio == pytest.approx(0.6 / opt, rel=1e-12)
    assert got.ratio == pytest.approx(9.2297, abs=1e-3)


def test_poa_paper_capacity_binds_through_the_hungarian_assignment():
    # one copy per worker: both requests prefer w0 (overlap), only one may have it
    c = PaperCost(capacity=2)
    f_w0 = 0.005 * 0 + 0.020 + 0.010 / 2**2  # 0.0225 (n clamped at C − 1 = 1 does not bind)
    f_w1 = 0.005 * 1 + 0.020 + 0.010 / 1**2  # 0.035
    got = poa_paper([1.0, 1.0], {"w0": 0, "w1": 1}, [{"w0": 1.0}, {"w0": 0.5}], c)
    # capacity 2 copies each: both on w0 is allowed: (f_w0 − 0.015) + (f_w0 − 0.0075)
    assert got.opt == pytest.approx(2 * f_w0 - 0.015 - 0.0075)
    assert got.opt < (f_w0 - 0.015) + f_w1  # cheaper than sending the second to w1
    one = PaperCost(capacity=1)  # one copy each (|W| = 2 = Σ C_j): one must go to w1
    g0 = 0.005 * 0 + 0.020 + 0.010 / 1**2  # 0.03 at n = 0
    g1 = 0.005 * 0 + 0.020 + 0.010 / 1**2  # n = 1 clamped to C − 1 = 0: 0.03
    got = poa_paper([1.0, 1.0], {"w0": 0, "w1": 1}, [{"w0": 1.0}, {"w0": 0.5}], one)
    assert got.opt == pytest.approx((g0 - 0.015) + g1)  # the bigger overlap keeps w0


def test_poa_paper_assigns_every_request_beyond_the_columns():
    got = poa_paper([0.5] * 5, {"w0": 0}, None, PaperCost(capacity=2))
    assert got.requests == 5
    assert got.opt == pytest.approx(5 * (0.020 + 0.010 / 4))


def test_fit_latency_recovers_a_known_model():
    truth = FittedLatency(a=0.004, b=0.03, d=0.5, capacity=64)
    samples = [(n, truth.latency(n)) for n in range(0, 60, 3)]
    got = fit_latency(samples, capacity=64)
    assert (got.a, got.b, got.d) == pytest.approx((0.004, 0.03, 0.5), rel=1e-6)
    with pytest.raises(ValueError):
        fit_latency([(70, 1.0)] * 3, capacity=64)


def test_poa_calibrated_by_hand_and_at_least_one_when_latencies_are_the_model():
    f = FittedLatency(a=1.0, b=1.0, d=0.0, capacity=100)  # f(n) = 1 + n
    models = {"w0": f, "w1": f}
    # 4 requests all on w0 (batch view, s = 1): each latency f(4) = 5, total 20;
    # OPT splits 2 + 2: 2·f(2) + 2·f(2) = 12 (marginals 2, 4 per worker)
    got = poa_calibrated([5.0] * 4, ["w0"] * 4, models)
    assert got.opt == pytest.approx(12.0) and got.ratio == pytest.approx(20 / 12)
    # at twice the window's concurrency (s = 2): OPT = 2·(2·f(4)) = 20; actual 4·f(8) = 36
    got = poa_calibrated([9.0] * 4, ["w0"] * 4, models, concurrency=8)
    assert got.opt == pytest.approx(20.0) and got.ratio == pytest.approx(36 / 20)
    # the optimal allocation observed: exactly 1
    got = poa_calibrated([3.0] * 4, ["w0", "w0", "w1", "w1"], models)
    assert got.ratio == pytest.approx(1.0)
    # heterogeneous workers, any observed allocation: ≥ 1
    slow = FittedLatency(a=0.5, b=2.0, d=1.0, capacity=10)
    fast = FittedLatency(a=0.1, b=0.5, d=0.2, capacity=20)
    models = {"s": slow, "f": fast}
    for on_slow in range(7):
        alloc = ["s"] * on_slow + ["f"] * (6 - on_slow)
        lat = [slow.latency(on_slow)] * on_slow + [fast.latency(6 - on_slow)] * (6 - on_slow)
        assert poa_calibrated(lat, alloc, models).ratio >= 1 - 1e-12
    with pytest.raises(ValueError, match="without a model"):
        poa_calibrated([1.0], ["x"], models)


def test_poa_calibrated_overlap_credit():
    f = FittedLatency(a=0.0, b=1.0, d=0.0, capacity=math.inf)  # flat: only the credit differs
    got = poa_calibrated([1.0, 1.0], ["a", "b"], {"a": f, "b": f}, None, [{"b": 1.0}, {}], 0.5)
    assert got.opt == pytest.approx(1.5)


@pytest.mark.parametrize("seed", range(5))
def test_poa_calibrated_without_credit_equals_the_hungarian_optimum(seed: int):
    """Without an overlap credit every row is the same, and the estimator sums the
    cheapest marginals instead of solving: the oracle is scipy's assignment of the full
    matrix of marginal costs, built here."""
    import numpy as np
    from scipy.optimize import linear_sum_assignment

    rng = random.Random(seed)
    workers = [f"w{j}" for j in range(rng.randint(1, 5))]
    models = {
        w: FittedLatency(rng.uniform(0, 0.01), rng.uniform(0.01, 0.5), rng.uniform(0, 2), 64.0)
        for w in workers
    }
    size = rng.randint(1, 120)
    latencies = [rng.uniform(0.05, 2.0) for _ in range(size)]
    concurrency = rng.uniform(1, 40)
    got = poa_calibrated(latencies, [workers[0]] * size, models, concurrency)
    s = concurrency / size
    columns = []
    for w in workers:
        f = models[w]
        prev = 0.0
        for k in range(1, size + 1):
            total = k * f.latency(k * s)
            if not math.isfinite(total):
                break
            columns.append(total - prev)
            prev = total
    matrix = np.tile(np.array(columns), (size, 1))
    rows, cols = linear_sum_assignment(matrix)
    assert got.opt == pytest.approx(float(matrix[rows, cols].sum()), rel=1e-12)


@pytest.mark.parametrize("seed", range(40))
def test_the_transportation_solver_equals_the_hungarian_on_the_copied_matrix(seed: int):
    """`_transport` (eq. 12's solver for a few workers) against scipy's assignment of the
    matrix with each column copied `capacity` times: ties, zero capacities and binding
    capacities included."""
    import numpy as np
    from scipy.optimize import linear_sum_assignment

    from policies.poa import _transport

    rng = random.Random(seed)
    m, n = rng.randint(1, 6), rng.randint(1, 40)
    capacity = [rng.randint(0, n) for _ in range(m)]
    while sum(capacity) < n:
        capacity[rng.randrange(m)] += 1
    values = [0.0, 0.5, 1.0, rng.random()]
    cost = [[rng.choice(values) + 0.1 * j * rng.randint(0, 1) for j in range(m)] for _ in range(n)]
    copied = np.array([[row[j] for j in range(m) for _ in range(capacity[j])] for row in cost])
    rows, cols = linear_sum_assignment(copied)
    assert _transport(cost, capacity) == pytest.approx(float(copied[rows, cols].sum()), abs=1e-9)


def test_poa_paper_beyond_the_transport_solver_uses_the_hungarian():
    from policies.poa import TRANSPORT_MAX_WORKERS

    m = TRANSPORT_MAX_WORKERS + 1
    load = {f"w{j}": float(j) for j in range(m)}
    overlap = [{"w3": 1.0}, {}, {"w0": 0.5}]
    got = poa_paper([0.1, 0.2, 0.3], load, overlap)
    model = PaperCost()
    # three requests, 64 copies each: nobody binds, each takes its cheapest worker
    best = [
        min(model.latency(n) - model.w_c * o.get(w, 0.0) for w, n in load.items()) for o in overlap
    ]
    assert got.opt == pytest.approx(math.fsum(best))
