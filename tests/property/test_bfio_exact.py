"""Property: BF-IO's MILP finds the optimum that brute-force enumeration finds.

The brute force is written here from the paper's definitions alone, over the plain state:
try every way of giving each pooled request to no rank or one rank, keep those that respect
the free slots and admit exactly U = min(|pool|, Σ free), and score each by J = Σ_h Imb(k+h)
with every load recomputed from the residents (context + h while the request still runs)
and from the admitted prompts (s + h). It shares no code with policies/assign."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.assign import PooledRequest, RankState, Resident, make_assigner


def brute_force_best(pool, ranks, lookahead, oracle):
    def alive(r, h):
        return not oracle or r.generated + h < r.output_tokens

    best = None
    free = [r.slots - len(r.residents) for r in ranks]
    fillable = min(len(pool), sum(max(0, f) for f in free))
    for choice in itertools.product([None, *range(len(ranks))], repeat=len(pool)):
        taken = [choice.count(g) for g in range(len(ranks))]
        if any(t > f for t, f in zip(taken, free, strict=True)):
            continue
        if sum(taken) != fillable:
            continue
        total = 0
        for h in range(lookahead + 1):
            loads = []
            for g, r in enumerate(ranks):
                load = sum(x.prompt_tokens + x.generated + h for x in r.residents if alive(x, h))
                load += sum(
                    p.prompt_tokens + h for p, c in zip(pool, choice, strict=True) if c == g
                )
                loads.append(load)
            total += len(ranks) * max(loads) - sum(loads)
        best = total if best is None else min(best, total)
    return best


def score(result, pool, ranks, lookahead, oracle):
    choice = [None] * len(pool)
    index = {r.id: g for g, r in enumerate(ranks)}
    position = {p.id: i for i, p in enumerate(pool)}
    for p, r in result:
        choice[position[p.id]] = index[r.id]
    # reuse the enumeration's scoring on exactly this one choice
    total = 0
    for h in range(lookahead + 1):
        loads = []
        for g, r in enumerate(ranks):
            load = sum(
                x.prompt_tokens + x.generated + h
                for x in r.residents
                if not oracle or x.generated + h < x.output_tokens
            )
            load += sum(p.prompt_tokens + h for p, c in zip(pool, choice, strict=True) if c == g)
            loads.append(load)
        total += len(ranks) * max(loads) - sum(loads)
    return total


resident = st.builds(
    lambda s, gen, extra: Resident("r", s, generated=gen, output_tokens=gen + extra),
    st.integers(1, 60),
    st.integers(0, 10),
    st.integers(1, 4),
)
rank_state = st.tuples(st.integers(0, 2), st.lists(resident, max_size=3)).map(
    lambda t: RankState("", t[0] + len(t[1]), tuple(t[1]))
)


@settings(max_examples=150, deadline=None)
@given(
    ranks=st.lists(rank_state, min_size=1, max_size=3),
    sizes=st.lists(st.integers(1, 60), max_size=6),
    lookahead=st.integers(0, 3),
    oracle=st.booleans(),
)
def test_milp_equals_brute_force(ranks, sizes, lookahead, oracle) -> None:  # type: ignore[no-untyped-def]
    ranks = [RankState(f"g{g}", r.slots, r.residents) for g, r in enumerate(ranks)]
    ranks = [
        RankState(
            r.id,
            r.slots,
            tuple(
                Resident(f"{r.id}.{j}", x.prompt_tokens, x.generated, None, x.output_tokens)
                for j, x in enumerate(r.residents)
            ),
        )
        for r in ranks
    ]
    pool = [PooledRequest(f"p{i}", s, float(i)) for i, s in enumerate(sizes)]
    params = {"solver": "milp", "lookahead_steps": lookahead}
    if oracle:
        params["predictor"] = "oracle"
    result = make_assigner("bfio", params).assign(pool, ranks, 0.0)
    assert len(result) == min(len(pool), sum(r.free for r in ranks))
    assert score(result, pool, ranks, lookahead, oracle) == brute_force_best(
        pool, ranks, lookahead, oracle
    )
