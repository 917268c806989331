"""What each assignment policy does, on hand-made cases whose answer is known."""

from policies.assign import PooledRequest, Predictor, RankState, Resident, make_assigner


def rank(i, slots, *contexts):
    return RankState(
        f"g{i}", slots, tuple(Resident(f"g{i}.{j}", c) for j, c in enumerate(contexts))
    )


def pooled(*sizes):
    return [PooledRequest(f"p{i}", s, float(i)) for i, s in enumerate(sizes)]


def ids(result):
    return [(p.id, r.id) for p, r in result]


def test_fcfs_maxfree_is_the_papers_algorithm_2():
    ranks = [rank(0, 3, 10), rank(1, 3), rank(2, 3, 10, 10)]
    # oldest first; most free slots, lowest index on ties: g1 (3), then g0/g1 tie at 2 -> g0
    got = make_assigner("fcfs_maxfree").assign(pooled(1, 2, 3, 4), ranks, 0.0)
    assert ids(got) == [("p0", "g1"), ("p1", "g0"), ("p2", "g1"), ("p3", "g0")]


def test_least_token_load_goes_to_the_lightest_rank_by_tokens():
    ranks = [rank(0, 4, 100), rank(1, 4, 50, 10), rank(2, 4, 500)]
    got = make_assigner("least_token_load").assign(pooled(30, 20, 70), ranks, 0.0)
    # loads 100, 60, 500 -> p0 to g1 (90) -> p1 to g1 (110)? no: g1 = 90 < 100 -> g1 (110) -> p2 to g0
    assert ids(got) == [("p0", "g1"), ("p1", "g1"), ("p2", "g0")]


def test_jsq_counts_requests_not_tokens():
    ranks = [rank(0, 4, 9000), rank(1, 4, 1, 1)]
    got = make_assigner("jsq_count").assign(pooled(5), ranks, 0.0)
    assert ids(got) == [("p0", "g0")]  # one request beats two, whatever their tokens


def test_bfio_picks_the_set_that_levels_the_ranks():
    # g0 carries 1000, g1 carries 400 and has the only free slot: BF-IO (H = 0) admits the
    # 600 (levels exactly) even though 100 and 900 are older; FCFS would take the 100.
    ranks = [rank(0, 1, 1000), rank(1, 2, 400)]
    for solver in ("milp", "greedy_swap"):
        got = make_assigner("bfio", {"solver": solver}).assign(pooled(100, 900, 600), ranks, 0.0)
        assert ids(got) == [("p2", "g1")], solver


def test_bfio_lookahead_sees_a_rank_about_to_empty():
    # g0 holds one request ending after this step (oracle), g1 one that runs on. With H = 0
    # the big request goes to the lighter g1; with a lookahead it goes to g0, which is about
    # to lose its 900 tokens.
    ranks = [
        RankState("g0", 2, (Resident("a", 900, generated=9, output_tokens=10),)),
        RankState("g1", 2, (Resident("b", 800, generated=0, output_tokens=500),)),
    ]
    pool = pooled(700)
    h0 = make_assigner("bfio", {"solver": "milp"}).assign(pool, ranks, 0.0)
    h5 = make_assigner(
        "bfio", {"solver": "milp", "lookahead_steps": 5, "predictor": "oracle"}
    ).assign(pool, ranks, 0.0)
    assert ids(h0) == [("p0", "g1")] and ids(h5) == [("p0", "g0")]


def test_guard_rails():
    ranks = [rank(0, 1, 1000), rank(1, 2, 400)]  # one free slot, on g1
    pool = [PooledRequest("old", 5, 0.0), PooledRequest("fits", 600, 50.0)]
    # without guard rails the old small request keeps waiting
    assert [p.id for p, _ in make_assigner("bfio").assign(pool, ranks, 60.0)] == ["fits"]
    forced = make_assigner("bfio", {"max_pool_wait_s": 30.0}).assign(pool, ranks, 60.0)
    assert [p.id for p, _ in forced] == ["old"]
    # a window of ⌈1·U⌉ = 1 candidate: only the oldest is considered
    windowed = make_assigner("bfio", {"candidate_window": 1.0}).assign(pool, ranks, 1.0)
    assert [p.id for p, _ in windowed] == ["old"]


def test_predictors():
    r = Resident("x", 100, generated=40, max_tokens=300, output_tokens=50)
    assert Predictor("none").remaining(r) == float("inf")
    assert Predictor("oracle").remaining(r) == 10
    assert Predictor("max_tokens_bound").remaining(r) == 260
    noisy = [Predictor("noisy_oracle", 0.3, s).remaining(r) for s in range(20)]
    assert noisy == [Predictor("noisy_oracle", 0.3, s).remaining(r) for s in range(20)]
    assert len(set(noisy)) > 3 and min(noisy) >= 1
    assert Predictor("noisy_oracle", 0.0).remaining(r) == 10
