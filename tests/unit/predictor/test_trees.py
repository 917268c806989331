"""The model file format (fleetgate.quantile_trees/v1) and its evaluator, without a
training library: hand-written files, the way a user or a bad disk could hand them over."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest

from policies.quantile.analytic import AnalyticModel
from policies.quantile.features import FEATURES, IDLE_WORKER, Quantiles
from policies.quantile.trees import (
    FORMAT,
    MAX_DEPTH,
    ModelFormatError,
    TreeModel,
    loads,
    to_document,
)

PROMPT = FEATURES.index("prompt_tokens")
KV = FEATURES.index("kv_usage")
LEAF = -1


def stump(feature: int, threshold: float, low: float, high: float) -> dict[str, Any]:
    """x[feature] <= threshold → low, else high."""
    return {
        "feature": [feature, LEAF, LEAF],
        "threshold": [threshold, 0.0, 0.0],
        "left": [1, -1, -1],
        "right": [2, -1, -1],
        "value": [0.0, low, high],
    }


def two_level() -> dict[str, Any]:
    """prompt <= 1000 ? (kv <= 0.5 ? 0.1 : 0.3) : 0.7"""
    return {
        "feature": [PROMPT, KV, LEAF, LEAF, LEAF],
        "threshold": [1000.0, 0.5, 0.0, 0.0, 0.0],
        "left": [1, 3, -1, -1, -1],
        "right": [2, 4, -1, -1, -1],
        "value": [0.0, 0.0, 0.7, 0.1, 0.3],
    }


def document() -> dict[str, Any]:
    return {
        "format": FORMAT,
        "name": "hand-made",
        "features": list(FEATURES),
        "ensembles": {
            "mean": {"link": "identity", "base": 0.05, "trees": [two_level()]},
            "q90": {"link": "identity", "base": 0.1, "trees": [two_level(), stump(KV, 0.9, 0.0, 1.0)]},
            "q95": {"link": "exp", "base": math.log(0.2), "trees": [stump(PROMPT, 1000.0, 0.0, 1.0)]},
        },
        "meta": {"trainer": "hand"},
    }  # fmt: skip


def x(prompt: float = 100.0, kv: float = 0.0) -> list[float]:
    v = [0.0] * len(FEATURES)
    v[PROMPT], v[KV] = prompt, kv
    return v


def test_predict_follows_the_trees() -> None:
    m = loads(json.dumps(document()))
    assert m.name == "hand-made"
    # x <= threshold goes left, on the threshold itself too
    assert m.raw(x(1000.0, 0.5)) == pytest.approx((0.15, 0.2, 0.2))
    assert m.raw(x(1000.0, 0.51)) == pytest.approx((0.35, 0.4, 0.2))
    assert m.raw(x(1000.5, 0.95)) == pytest.approx((0.75, 1.8, 0.2 * math.e))
    assert isinstance(m.predict(x()), Quantiles)


def test_predict_keeps_quantiles_ordered_and_times_non_negative() -> None:
    doc = document()
    # q95 (0.2) below q90 (0.1 + 0.3 + 1.0) for a short prompt: the larger α never predicts less
    p = loads(json.dumps(doc)).predict(x(100.0, 0.95))
    assert p.q90 == pytest.approx(1.4) and p.q95 == p.q90
    doc["ensembles"]["mean"]["base"] = -5.0
    assert loads(json.dumps(doc)).predict(x()).mean == 0.0


OFFSET = {"kind": "analytic", "w": 0.01, "h": 0.001, "mean_output_tokens": 100.0,
          "prefill_chunk": 512, "max_num_seqs": 8}  # fmt: skip


def test_an_analytic_offset_enters_each_ensemble_in_its_link_space() -> None:
    doc = document()
    doc["offset"] = OFFSET
    m = loads(json.dumps(doc))
    v = x(1000.0, 0.5)
    v[FEATURES.index("running")] = 10.0  # over max_num_seqs: the analytic queue term too
    o = AnalyticModel(0.01, 0.001, 512, 8, 100.0).mean(v)
    assert o > 0.1
    # identity: o + sums; exp: o · exp(sums)
    assert m.raw(v) == pytest.approx((o + 0.15, o + 0.2, o * 0.2))
    p = m.predict(v)
    assert (p.mean, p.q90, p.q95) == pytest.approx((o + 0.15, o + 0.2, o + 0.2))  # no crossing
    assert m.sums(v) == pytest.approx((0.15, 0.2, math.log(0.2)))


COMPUTE = {"prefill_token_s": 2e-5, "max_num_batched_tokens": 2048}


def test_an_offset_without_the_compute_terms_loads_with_them_off() -> None:
    """A file written before the compute-bound terms existed (no such keys) still loads."""
    doc = document()
    doc["offset"] = OFFSET
    offset = loads(json.dumps(doc)).document.offset
    assert offset == AnalyticModel(0.01, 0.001, 512, 8, 100.0)
    assert offset.prefill_token_s == 0.0 and offset.max_num_batched_tokens is None
    doc["offset"] = {**OFFSET, "max_num_batched_tokens": None}  # null: no budget
    assert loads(json.dumps(doc)).document.offset == offset


def test_the_offset_round_trips_with_and_without_the_compute_terms() -> None:
    base = {k: v for k, v in OFFSET.items() if k != "kind"}
    for compute in ({}, COMPUTE, {"prefill_token_s": 2e-5}, {"max_num_batched_tokens": 2048}):
        offset = AnalyticModel(**base, **compute)  # type: ignore[arg-type]
        m = loads(json.dumps(document()))
        written = to_document("m", FEATURES, m.document.ensembles, {}, offset)
        # off terms are not written: a file for an engine without them stays as it was
        assert written["offset"] == {**OFFSET, **compute}
        again = loads(json.dumps(written))
        assert again.document.offset == offset
        assert to_document("m", FEATURES, again.document.ensembles, {}, offset) == written


def test_the_compute_terms_enter_the_offset() -> None:
    doc = document()
    doc["offset"] = {**OFFSET, **COMPUTE}
    m = loads(json.dumps(doc))
    v = x(3000.0, 0.5)
    v[FEATURES.index("prefill_backlog_tokens")] = 4000.0
    o = AnalyticModel(0.01, 0.001, 512, 8, 100.0, **COMPUTE).mean(v)  # type: ignore[arg-type]
    assert o > AnalyticModel(0.01, 0.001, 512, 8, 100.0).mean(v) + 0.1
    assert m.raw(v)[0] == pytest.approx(o + 0.75)


def test_a_model_on_a_prefix_of_the_features_reads_the_full_vector() -> None:
    doc = document()
    doc["features"] = list(FEATURES[: KV + 1])
    m = loads(json.dumps(doc))
    assert m.raw(x(2000.0, 0.1)) == pytest.approx((0.75, 0.8, 0.2 * math.e))


def test_a_vector_of_another_length_is_refused() -> None:
    m = loads(json.dumps(document()))
    with pytest.raises(ValueError):
        m.predict([1.0, 2.0])
    with pytest.raises(ValueError):
        m.predict([*x(), 1.0])


def _set(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    *parents, last = path.split("/")
    node: Any = doc
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value is _DELETE:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return doc


_DELETE = object()
T0 = "ensembles/q90/trees/0"


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("format", _DELETE, "format: expected 'fleetgate.quantile_trees/v1'"),
        ("format", "sklearn-pickle", "not a fleetgate predictor"),
        ("format", "fleetgate.quantile_trees/v2", "a version this fleetgate cannot read"),
        ("features", list(reversed(FEATURES)), "features: the model was trained on a different"),
        ("features", [*FEATURES, "gpu_temperature"], "position 12 is 'gpu_temperature'"),
        ("features/3", "top_k", "position 3 is 'top_k' in the file but 'top_p'"),
        ("features", [], "features: empty"),
        ("ensembles/q95", _DELETE, "ensembles: missing key(s) q95"),
        ("ensembles/median", {}, "ensembles: unknown key(s) median"),
        ("surprise", 1, "(top level): unknown key(s) surprise"),
        ("name", "", "name: expected a non-empty string"),
        ("meta", [], "meta: expected an object"),
        ("offset", {**OFFSET, "kind": "table"}, "offset.kind: 'table' is not 'analytic'"),
        ("offset", {**OFFSET, "max_num_seqs": 8.0}, "offset.max_num_seqs: expected an integer"),
        ("offset", {**OFFSET, "w": -1.0}, "offset: analytic model: w and h must be >= 0"),
        ("offset", {"kind": "analytic"}, "offset: missing key(s) h, max_num_seqs, mean_output_tokens"),
        ("offset", "analytic", "offset: expected an object, got str"),
        ("offset", {**OFFSET, "prefill_token_s": "1e-5"}, "offset.prefill_token_s: expected a number"),
        ("offset", {**OFFSET, "prefill_token_s": -1e-5}, "offset.prefill_token_s: must be >= 0"),
        ("offset", {**OFFSET, "max_num_batched_tokens": 2048.0}, "offset.max_num_batched_tokens: expected an integer"),
        ("offset", {**OFFSET, "max_num_batched_tokens": 0}, "offset.max_num_batched_tokens: must be >= 1"),
        ("offset", {**OFFSET, "prefill_token": 1e-5}, "offset: unknown key(s) prefill_token"),
        ("ensembles/mean/base", "0.1", "ensembles.mean.base: expected a number, got str"),
        ("ensembles/mean/base", True, "ensembles.mean.base: expected a number, got bool"),
        ("ensembles/mean/link", "softplus", "ensembles.mean.link: 'softplus' is not one of"),
        ("ensembles/mean/trees", {}, "ensembles.mean.trees: expected a list"),
        (f"{T0}/feature/0", 12, "ensembles.q90.trees[0].feature[0]: 12 is not a feature index"),
        (f"{T0}/feature/0", -2, "trees[0].feature[0]: -2 is not a feature index"),
        (f"{T0}/feature/0", 1.0, "trees[0].feature[0]: expected an integer, got float"),
        (f"{T0}/feature/2", 3, "trees[0].feature[2]: a leaf has feature -1, not 3"),
        (f"{T0}/left/0", 5, "trees[0].left[0]: 5 is not a node index (0..4)"),
        (f"{T0}/left/1", 0, "trees[0].left[1]: node 0 is reached twice"),
        (f"{T0}/right/1", 3, "trees[0].right[1]: node 3 is reached twice"),
        (f"{T0}/value", [0.0, 0.0, 0.7, 0.1], "trees[0].value: 4 entries, but feature has 5"),
        (f"{T0}/threshold", _DELETE, "trees[0]: missing key(s) threshold"),
        (f"{T0}/feature", [], "trees[0].feature: 0 nodes"),
        (f"{T0}/threshold/0", None, "trees[0].threshold[0]: expected a number, got NoneType"),
    ],
)  # fmt: skip
def test_malformed_files_name_the_bad_key(path: str, value: Any, message: str) -> None:
    with pytest.raises(ModelFormatError) as err:
        loads(json.dumps(_set(document(), path, value)))
    assert message in str(err.value)


def test_non_finite_numbers_are_refused() -> None:
    text = json.dumps(document())
    # 1e999 is valid JSON that parses to infinity
    bad = text.replace('"threshold": [1000.0, 0.5,', '"threshold": [1e999, 0.5,', 1)
    with pytest.raises(ModelFormatError, match=r"trees\[0\]\.threshold\[0\]: not finite"):
        loads(bad)
    huge = text.replace('"base": 0.05', '"base": 1' + "0" * 400, 1)  # an int past float range
    with pytest.raises(ModelFormatError, match=r"ensembles\.mean\.base: not finite"):
        loads(huge)
    with pytest.raises(ModelFormatError, match="NaN"):
        loads(text.replace('"base": 0.05', '"base": NaN'))
    with pytest.raises(ModelFormatError, match="not valid JSON"):
        loads(text[:-3])
    with pytest.raises(ModelFormatError, match=r"\(top level\): expected an object, got list"):
        loads("[]")


def test_an_unreachable_node_and_a_cycle_are_refused() -> None:
    doc = _set(document(), f"{T0}/right/0", 1)  # root → 1 twice
    with pytest.raises(ModelFormatError, match="reached twice"):
        loads(json.dumps(doc))
    orphan = {
        "feature": [PROMPT, LEAF, LEAF, LEAF],
        "threshold": [1.0, 0.0, 0.0, 0.0],
        "left": [1, -1, -1, -1],
        "right": [2, -1, -1, -1],
        "value": [0.0, 1.0, 2.0, 3.0],
    }
    doc = _set(document(), T0, orphan)
    with pytest.raises(ModelFormatError, match=r"trees\[0\]: node 3 is not reachable"):
        loads(json.dumps(doc))


def test_too_many_nodes_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from policies.quantile import trees

    monkeypatch.setattr(trees, "MAX_TOTAL_NODES", 15)  # the hand-made model has 16
    with pytest.raises(ModelFormatError, match="ensembles: 16 nodes, at most 15"):
        loads(json.dumps(document()))


def test_too_deep_a_tree_is_refused() -> None:
    n = MAX_DEPTH + 1  # a chain of n splits, each with a leaf on its left
    tree: dict[str, list[Any]] = {k: [] for k in ("feature", "threshold", "left", "right", "value")}
    for d in range(n):
        i = 2 * d
        tree["feature"] += [PROMPT, LEAF]
        tree["threshold"] += [float(d), 0.0]
        tree["left"] += [i + 1, -1]
        tree["right"] += [i + 2, -1]
        tree["value"] += [0.0, 1.0]
    tree["feature"].append(LEAF)
    tree["threshold"].append(0.0)
    tree["left"].append(-1)
    tree["right"].append(-1)
    tree["value"].append(2.0)
    doc = _set(document(), T0, tree)
    with pytest.raises(ModelFormatError, match=f"deeper than {MAX_DEPTH}"):
        loads(json.dumps(doc))
    # a depth-MAX_DEPTH tree (drop the first split) loads once its indices are renumbered
    doc = _set(document(), T0, {k: v[2:] for k, v in tree.items()})
    for k in ("left", "right"):
        doc["ensembles"]["q90"]["trees"][0][k] = [c - 2 if c != -1 else -1 for c in tree[k][2:]]
    assert isinstance(loads(json.dumps(doc)), TreeModel)


def test_the_compiled_evaluator_holds_only_numbers_from_the_file() -> None:
    doc = document()
    doc["name"] = "__import__('os').system('false')"
    m = loads(json.dumps(doc))
    code = m._sums.__code__
    assert all(c is None or type(c) in (float, int) for c in code.co_consts)
    assert set(code.co_names) == set()  # no globals, no attributes: locals only
    assert m.name == doc["name"]
    doc["offset"] = {**OFFSET, **COMPUTE}
    fused = loads(json.dumps(doc)).predict_tuple.__code__  # type: ignore[attr-defined]
    assert all(c is None or type(c) in (float, int) for c in fused.co_consts)
    assert set(fused.co_names) == {"exp"}  # math.exp, given by the loader; nothing else
    idle = loads(json.dumps(doc)).predict_idle_tuple.__code__  # type: ignore[attr-defined]
    assert all(c is None or type(c) in (float, int) for c in idle.co_consts)
    assert set(idle.co_names) == {"exp"}


@pytest.mark.parametrize(
    "links", ["identity/exp/exp", "exp/identity/identity", "identity/identity/identity"]
)
@pytest.mark.parametrize(
    "offset",
    [
        None,
        OFFSET,
        {**OFFSET, **COMPUTE},
        {**OFFSET, "prefill_token_s": 1e-5},
        {**OFFSET, "max_num_batched_tokens": 64},
    ],
)
def test_the_fused_evaluator_is_the_sums_offset_and_link_to_the_last_bit(
    links: str, offset: dict[str, Any] | None
) -> None:
    """`predict_tuple` (one compiled function) against the same steps taken one by one:
    `sums`, `AnalyticModel.mean`, each link, the rearrangement — equal as floats, not
    approximately (the routing decisions must not change by a bit)."""
    import random

    doc = document()
    for out, link in zip(("mean", "q90", "q95"), links.split("/"), strict=True):
        doc["ensembles"][out]["link"] = link
    doc["offset"] = offset
    m = loads(json.dumps(doc))
    rng = random.Random(5)
    for _ in range(500):
        v = [rng.choice((0.0, 1.0, rng.uniform(0, 8000.0))) for _ in FEATURES]
        v[KV] = rng.random()
        raw = m.raw(v)
        a = raw[1] if raw[1] > 0.0 else 0.0
        b = raw[2] if raw[2] > a else a
        expected = (raw[0] if raw[0] > 0.0 else 0.0, a, b)
        got = m.predict_tuple(v)
        assert [x.hex() for x in got] == [x.hex() for x in expected]
        # the function specialised to an idle worker's state, on such a vector
        for i, value in IDLE_WORKER.items():
            v[i] = value
        idle = m.predict_idle_tuple(v)
        assert [x.hex() for x in idle] == [x.hex() for x in m.predict_tuple(v)]


def test_the_idle_worker_function_decides_the_worker_state_nodes_at_load() -> None:
    doc = document()
    doc["offset"] = OFFSET
    m = loads(json.dumps(doc))
    general = m.predict_tuple.__code__  # type: ignore[attr-defined]
    idle = m.predict_idle_tuple.__code__  # type: ignore[attr-defined]
    # the q90 stump on kv_usage is decided (0.0 <= 0.9) and the offset's worker terms folded
    assert 0.9 in general.co_consts and 0.9 not in idle.co_consts
    assert len(idle.co_code) < len(general.co_code)


def test_the_gateway_loads_a_model_file_and_names_a_bad_one(tmp_path: Any) -> None:
    from gateway.quartz import load_model

    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(document()))
    assert load_model(str(good)).name == "hand-made"
    bad.write_text(json.dumps(_set(document(), f"{T0}/feature/0", 40)))
    with pytest.raises(ValueError, match=rf"quartz.model: {bad}: ensembles.q90.trees\[0\]"):
        load_model(str(bad))
