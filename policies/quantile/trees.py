"""A trained QUARTZ predictor: three tree ensembles in a plain-JSON file, and a compact
evaluator that runs them on the routing hot path (§3.2 and §4.2 of the QUARTZ paper).

The model. Gradient-boosted regression trees over the feature vector of `features.py`:
one ensemble per output, fitted by `fleetgate train-predictor` (fleetgate/predictor.py),

    mean(x) = link(b_mean + Σ_t f_t(x), o(x))   squared error: the expected prefill time
    q90(x)  = link(b_q90  + Σ_t g_t(x), o(x))   pinball loss at α = 0.9
    q95(x)  = link(b_q95  + Σ_t h_t(x), o(x))   pinball loss at α = 0.95

where each tree sends x left at an internal node while x[feature] <= threshold and
returns its leaf's value (the learning rate already folded in). `link` is the identity,
s + o(x), or exp, o(x)·e^s — an ensemble fitted on log prefill time: quantiles commute
with monotone maps, so exp of the log-time quantile is the time quantile. o(x) is the
optional offset, the analytic engine model of analytic.py (its mean; 0, resp. 1, without
one): the trees then learn a correction to the engine model — additive for the mean, a
factor for the quantiles — and outside the loads they were trained on the prediction
follows the engine model instead of flattening at the last leaf (bench/quantile_predictor.py
`table6`: under overload, raw q95 coverage 0.29 without the offset, 0.97 with it).
`predict` then keeps the quantiles from crossing (q95 ≥ q90: two independent fits can
cross) and clamps every output at 0.

The file (`fleetgate.quantile_trees/v1`, plain JSON, never pickle):

    {"format": "fleetgate.quantile_trees/v1",
     "name": "...",                       # what the gateway reports it uses
     "features": ["prompt_tokens", ...],  # the vector it was trained on (FEATURES or a prefix)
     "offset": null | {"kind": "analytic", "w": s, "h": s, "prefill_chunk": int,
                       "max_num_seqs": int, "mean_output_tokens": float,
                       "prefill_token_s": s, "max_num_batched_tokens": int | null},
     "ensembles": {"mean": E, "q90": E, "q95": E},
     "meta": {...}}                       # provenance and quality, free-form, not evaluated
    E = {"link": "identity" | "exp", "base": float, "trees": [T, ...]}
    T = {"feature": [int], "threshold": [float], "left": [int], "right": [int], "value": [float]}

The offset's compute-bound prefill terms (`prefill_token_s`, `max_num_batched_tokens`:
analytic.py) are optional and written only when on, so a file for an engine without them
is the same bytes as before they existed and an older fleetgate still reads it; a file
with them is refused by an older reader (an unknown key) rather than evaluated without
them — which is why they need no new format version.

A tree is flat arrays indexed by node, node 0 the root; a leaf has left = right = feature
= -1. Loading validates every field and names the offending key path: the format and
version, the feature list against this build's FEATURES, each tree's shape (every node
reached exactly once from the root, no cycles, depth ≤ MAX_DEPTH), feature indices in
range, finite thresholds and values, size bounds, and the offset's parameters.

The evaluator. The three ensembles are compiled once, at load, into one Python function
that unpacks x into locals and returns each ensemble's sum as one expression of nested
conditionals, one per tree,

    base + (v1 if x0 <= t1 else (v2 if x9 <= t2 else v3)) + (...) + ...

built as an AST from the validated numbers (ast.Constant: no text from the file is ever
parsed or executed, and the function sees no builtins). `predict_tuple`, the hot path's,
is one such function that goes on to the offset's analytic mean (on the same locals, its
parameters as constants), the links and the rearrangement, so a prediction is one Python
call. At 3 × 20 trees of depth 4 a prediction costs ~2.5 µs in a tight loop (~4 µs on
the routing path, varied inputs) — several times less than walking the flat arrays node
by node or one numpy gather per tree level, and ~200× less than a library call per request
(bench/quantile_predictor.py has the table). Summation runs in tree order, as
scikit-learn's predict does, so the sums agree with the library's own to the last bit
(the trainer moves each threshold so that float64 x compares as the library's float32 x).
The vector must be floats (an int compares correctly, only slower); NaN goes right.
"""

from __future__ import annotations

import ast
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from policies.quantile.analytic import AnalyticModel
from policies.quantile.features import (
    BACKLOG,
    FEATURES,
    IDLE_WORKER,
    LOCALITY,
    PROMPT,
    RUNNING,
    WAITING,
    Quantiles,
    Vector,
)

FORMAT = "fleetgate.quantile_trees/v1"
FORMAT_PREFIX = "fleetgate.quantile_trees/"
OUTPUTS: tuple[str, ...] = ("mean", "q90", "q95")
LINKS: tuple[str, ...] = ("identity", "exp")
MAX_DEPTH = 16  # deeper trees are not "compact", and bound the compiled expression's nesting
MAX_TREES = 2000  # per ensemble
MAX_NODES = 1 << 14  # per tree
MAX_TOTAL_NODES = (
    1 << 20
)  # per file: what is compiled stays small (a 3 × 20 × depth-4 model: ~1,800)
CHAIN = 64  # trees summed in one expression of the compiled evaluator


class ModelFormatError(ValueError):
    """A model file that is not a valid `fleetgate.quantile_trees/v1` document; the message
    starts with the key path of the first problem found."""


@dataclass(frozen=True, slots=True)
class Tree:
    feature: tuple[int, ...]
    threshold: tuple[float, ...]
    left: tuple[int, ...]
    right: tuple[int, ...]
    value: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Ensemble:
    base: float
    trees: tuple[Tree, ...]
    link: str = "identity"


@dataclass(frozen=True, slots=True)
class TreeDocument:
    """A validated model file's contents."""

    name: str
    features: tuple[str, ...]
    ensembles: Mapping[str, Ensemble]
    meta: Mapping[str, Any]
    offset: AnalyticModel | None = None


# -- validation ------------------------------------------------------------------------


def _fail(path: str, what: str) -> ModelFormatError:
    return ModelFormatError(f"{path}: {what}")


def _obj(v: object, path: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise _fail(path, f"expected an object, got {type(v).__name__}")
    return v


def _keys(d: Mapping[str, Any], path: str, required: set[str], optional: set[str]) -> None:
    missing = sorted(required - d.keys())
    if missing:
        raise _fail(path, f"missing key(s) {', '.join(missing)}")
    extra = sorted(d.keys() - required - optional)
    if extra:
        raise _fail(path, f"unknown key(s) {', '.join(map(str, extra))}")


def _float(v: object, path: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise _fail(path, f"expected a number, got {type(v).__name__}")
    try:
        f = float(v)
    except OverflowError:  # an integer literal beyond float range
        f = math.inf
    if not math.isfinite(f):
        raise _fail(path, f"not finite ({v})")
    return f


def _int(v: object, path: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise _fail(path, f"expected an integer, got {type(v).__name__}")
    return v


def _list(v: object, path: str) -> list[Any]:
    if not isinstance(v, list):
        raise _fail(path, f"expected a list, got {type(v).__name__}")
    return v


def _tree(v: object, path: str, n_features: int) -> Tree:
    d = _obj(v, path)
    arrays = ("feature", "threshold", "left", "right", "value")
    _keys(d, path, set(arrays), set())
    lists = {k: _list(d[k], f"{path}.{k}") for k in arrays}
    n = len(lists["feature"])
    if not 1 <= n <= MAX_NODES:
        raise _fail(f"{path}.feature", f"{n} nodes, expected 1..{MAX_NODES}")
    for k in arrays:
        if len(lists[k]) != n:
            raise _fail(f"{path}.{k}", f"{len(lists[k])} entries, but feature has {n}")
    feature = tuple(_int(x, f"{path}.feature[{i}]") for i, x in enumerate(lists["feature"]))
    left = tuple(_int(x, f"{path}.left[{i}]") for i, x in enumerate(lists["left"]))
    right = tuple(_int(x, f"{path}.right[{i}]") for i, x in enumerate(lists["right"]))
    threshold = tuple(_float(x, f"{path}.threshold[{i}]") for i, x in enumerate(lists["threshold"]))
    value = tuple(_float(x, f"{path}.value[{i}]") for i, x in enumerate(lists["value"]))
    # Every node reached exactly once from the root: a tree, not a DAG or a cycle.
    seen = [False] * n
    seen[0] = True
    stack = [(0, 0)]
    while stack:
        i, depth = stack.pop()
        if left[i] == -1 and right[i] == -1:
            if feature[i] != -1:
                raise _fail(f"{path}.feature[{i}]", f"a leaf has feature -1, not {feature[i]}")
            continue
        if not 0 <= feature[i] < n_features:
            raise _fail(
                f"{path}.feature[{i}]", f"{feature[i]} is not a feature index (0..{n_features - 1})"
            )
        if depth + 1 > MAX_DEPTH:
            raise _fail(path, f"deeper than {MAX_DEPTH}")
        for side, child in (("left", left[i]), ("right", right[i])):
            if not 0 <= child < n:
                raise _fail(f"{path}.{side}[{i}]", f"{child} is not a node index (0..{n - 1})")
            if seen[child]:
                raise _fail(f"{path}.{side}[{i}]", f"node {child} is reached twice (not a tree)")
            seen[child] = True
            stack.append((child, depth + 1))
    if not all(seen):
        raise _fail(path, f"node {seen.index(False)} is not reachable from the root")
    return Tree(feature, threshold, left, right, value)


def _ensemble(v: object, path: str, n_features: int) -> Ensemble:
    d = _obj(v, path)
    _keys(d, path, {"base", "trees"}, {"link"})
    link = d.get("link", "identity")
    if link not in LINKS:
        raise _fail(f"{path}.link", f"{link!r} is not one of {', '.join(LINKS)}")
    trees = _list(d["trees"], f"{path}.trees")
    if len(trees) > MAX_TREES:
        raise _fail(f"{path}.trees", f"{len(trees)} trees, at most {MAX_TREES}")
    return Ensemble(
        base=_float(d["base"], f"{path}.base"),
        trees=tuple(_tree(t, f"{path}.trees[{i}]", n_features) for i, t in enumerate(trees)),
        link=link,
    )


def _features(v: object) -> tuple[str, ...]:
    names = _list(v, "features")
    for i, s in enumerate(names):
        if not isinstance(s, str):
            raise _fail(f"features[{i}]", f"expected a string, got {type(s).__name__}")
    ours = FEATURES
    # FEATURES only ever grows at its end, so a model trained on a prefix still reads the
    # vector the right way; any other difference would silently mean the wrong inputs.
    for i, s in enumerate(names):
        if i >= len(ours) or s != ours[i]:
            theirs = ours[i] if i < len(ours) else "(none)"
            raise _fail(
                "features",
                f"the model was trained on a different feature vector: position {i} is "
                f"{s!r} in the file but {theirs!r} in this fleetgate (FEATURES in "
                "policies/quantile/features.py); retrain it with `fleetgate train-predictor`",
            )
    if not names:
        raise _fail("features", "empty")
    return tuple(names)


def parse_document(doc: object) -> TreeDocument:
    """Validate a decoded model file; raises ModelFormatError naming the first bad key."""
    d = _obj(doc, "(top level)")
    fmt = d.get("format")
    if not isinstance(fmt, str) or not fmt.startswith(FORMAT_PREFIX):
        raise _fail("format", f"expected {FORMAT!r}, got {fmt!r}: not a fleetgate predictor")
    if fmt != FORMAT:
        raise _fail(
            "format", f"{fmt!r} is a version this fleetgate cannot read (it reads {FORMAT!r})"
        )
    _keys(d, "(top level)", {"format", "features", "ensembles"}, {"name", "meta", "offset"})
    name = d.get("name", "trees")
    if not isinstance(name, str) or not name:
        raise _fail("name", "expected a non-empty string")
    features = _features(d["features"])
    ens = _obj(d["ensembles"], "ensembles")
    _keys(ens, "ensembles", set(OUTPUTS), set())
    ensembles = {k: _ensemble(ens[k], f"ensembles.{k}", len(features)) for k in OUTPUTS}
    total = sum(len(t.feature) for e in ensembles.values() for t in e.trees)
    if total > MAX_TOTAL_NODES:
        raise _fail("ensembles", f"{total} nodes, at most {MAX_TOTAL_NODES}")
    meta = _obj(d.get("meta", {}), "meta")
    offset = _offset(d["offset"]) if d.get("offset") is not None else None
    return TreeDocument(name, features, ensembles, meta, offset)


_OFFSET_FLOATS = ("w", "h", "mean_output_tokens")
_OFFSET_INTS = ("prefill_chunk", "max_num_seqs")
# the compute-bound terms: optional, absent meaning off (AnalyticModel's defaults)
_OFFSET_OPTIONAL = ("prefill_token_s", "max_num_batched_tokens")


def _offset(v: object) -> AnalyticModel:
    d = _obj(v, "offset")
    _keys(d, "offset", {"kind", *_OFFSET_FLOATS, *_OFFSET_INTS}, set(_OFFSET_OPTIONAL))
    if d["kind"] != "analytic":
        raise _fail("offset.kind", f"{d['kind']!r} is not 'analytic'")
    floats = {k: _float(d[k], f"offset.{k}") for k in _OFFSET_FLOATS}
    ints = {k: _int(d[k], f"offset.{k}") for k in _OFFSET_INTS}
    token_s = _float(d.get("prefill_token_s", 0.0), "offset.prefill_token_s")
    if token_s < 0.0:
        raise _fail("offset.prefill_token_s", f"must be >= 0, got {token_s}")
    budget = d.get("max_num_batched_tokens")
    if budget is not None and _int(budget, "offset.max_num_batched_tokens") < 1:
        raise _fail("offset.max_num_batched_tokens", f"must be >= 1 or null, got {budget}")
    try:
        return AnalyticModel(
            **floats,  # type: ignore[arg-type]
            **ints,
            prefill_token_s=token_s,
            max_num_batched_tokens=budget,
        )
    except ValueError as exc:
        raise _fail("offset", str(exc)) from None


def offset_document(m: AnalyticModel) -> dict[str, Any]:
    """The `offset` entry of a model file for the analytic model `m` (the compute-bound
    terms only when on: see the module's docstring)."""
    doc: dict[str, Any] = {"kind": "analytic"}
    doc.update((k, getattr(m, k)) for k in (*_OFFSET_FLOATS, *_OFFSET_INTS))
    if m.prefill_token_s:
        doc["prefill_token_s"] = m.prefill_token_s
    if m.max_num_batched_tokens is not None:
        doc["max_num_batched_tokens"] = m.max_num_batched_tokens
    return doc


def _no_constants(token: str) -> float:
    raise ModelFormatError(f"not valid JSON: {token} (a model holds finite numbers only)")


def loads(text: str | bytes) -> TreeModel:
    """A TreeModel from a model file's text (the caller reads the file)."""
    try:
        doc = json.loads(text, parse_constant=_no_constants)
    except ModelFormatError:
        raise
    except ValueError as exc:
        raise ModelFormatError(f"not valid JSON: {exc}") from exc
    return TreeModel(parse_document(doc))


def to_document(
    name: str,
    features: Sequence[str],
    ensembles: Mapping[str, Ensemble],
    meta: Mapping[str, Any],
    offset: AnalyticModel | None = None,
) -> dict[str, Any]:
    """The JSON-ready dict of a model file (the inverse of parse_document)."""
    return {
        "format": FORMAT,
        "name": name,
        "features": list(features),
        "offset": None if offset is None else offset_document(offset),
        "ensembles": {
            k: {
                "link": e.link,
                "base": e.base,
                "trees": [
                    {
                        "feature": list(t.feature),
                        "threshold": list(t.threshold),
                        "left": list(t.left),
                        "right": list(t.right),
                        "value": list(t.value),
                    }
                    for t in e.trees
                ],
            }
            for k, e in ensembles.items()
        },
        "meta": dict(meta),
    }


# -- the compiled evaluator ---------------------------------------------------------------


def _var(i: int) -> str:
    return f"x{i}"


def _node_expr(t: Tree, i: int, fixed: Mapping[int, float]) -> ast.expr:
    """Node i of t as an expression; a node on a feature in `fixed` is decided now (the
    same comparison the evaluator would make) and only the side taken is compiled."""
    while t.feature[i] in fixed:
        i = t.left[i] if fixed[t.feature[i]] <= t.threshold[i] else t.right[i]
    if t.left[i] == -1:
        return ast.Constant(t.value[i])
    return ast.IfExp(
        test=ast.Compare(
            left=ast.Name(_var(t.feature[i]), ast.Load()),
            ops=[ast.LtE()],
            comparators=[ast.Constant(t.threshold[i])],
        ),
        body=_node_expr(t, t.left[i], fixed),
        orelse=_node_expr(t, t.right[i], fixed),
    )


def _sum_expr(start: ast.expr, trees: Sequence[Tree], fixed: Mapping[int, float]) -> ast.expr:
    expr = start
    for t in trees:  # left-nested: ((start + t1) + t2) + ..., summed in tree order
        expr = ast.BinOp(expr, ast.Add(), _node_expr(t, 0, fixed))
    return expr


def _sums_body(
    ensembles: Sequence[Ensemble], n_inputs: int, fixed: Mapping[int, float]
) -> tuple[list[ast.stmt], list[ast.expr]]:
    """The statements that unpack x into locals x0..x{n-1} (a vector of another length
    raises ValueError), and each ensemble's sum as one expression, base + tree₁ + tree₂ + …
    (in chunks of CHAIN trees, which keeps the expression's nesting shallow for the
    compiler and costs one store per chunk, not per tree)."""
    body: list[ast.stmt] = [
        ast.Assign(
            targets=[
                ast.Tuple([ast.Name(_var(i), ast.Store()) for i in range(n_inputs)], ast.Store())
            ],
            value=ast.Name("x", ast.Load()),
        )
    ]
    results: list[ast.expr] = []
    for k, e in enumerate(ensembles):
        s = f"s{k}"
        expr: ast.expr = ast.Constant(e.base)
        for i in range(0, len(e.trees), CHAIN):
            if i:
                body.append(ast.Assign(targets=[ast.Name(s, ast.Store())], value=expr))
                expr = ast.Name(s, ast.Load())
            expr = _sum_expr(expr, e.trees[i : i + CHAIN], fixed)
        results.append(expr)
    return body, results


def _function(name: str, body: list[ast.stmt], namespace: dict[str, Any]) -> Any:
    """Compile `def name(x): body` in `namespace` (no builtins) and return the function."""
    fn = ast.FunctionDef(
        name=name,
        args=ast.arguments(
            posonlyargs=[], args=[ast.arg("x")], kwonlyargs=[], kw_defaults=[], defaults=[]
        ),
        body=body,
        decorator_list=[],
    )
    if sys.version_info >= (3, 12):
        fn.type_params = []
    module = ast.fix_missing_locations(ast.Module(body=[fn], type_ignores=[]))
    namespace["__builtins__"] = {}
    exec(compile(module, "<fleetgate.quantile.trees>", "exec"), namespace)
    return namespace[name]


def compile_ensembles(
    ensembles: Sequence[Ensemble], n_inputs: int
) -> Callable[[Vector], tuple[float, ...]]:
    """One function x ↦ (raw sum of each ensemble, before its link), from validated trees."""
    body, results = _sums_body(ensembles, n_inputs, {})
    body.append(ast.Return(ast.Tuple(results, ast.Load())))
    compiled: Callable[[Vector], tuple[float, ...]] = _function("ensembles", body, {})
    return compiled


# The statements after the sums s0, s1, s2 of `compile_predict`: our own fixed text, parsed
# here (never anything from a model file). The UPPER-CASE names are replaced before
# compiling: a feature by its unpacked local (or by its value where `fixed`), a parameter
# of the offset by its value. They are `AnalyticModel.mean` (and `_compute`), the links
# and the rearrangement, operation for operation, so the fused function's result is the
# same to the last bit (tests/unit/predictor/test_trees.py checks it).
_OFFSET_MEAN = """
todo = PROMPT - LOCALITY
ahead = RUNNING + WAITING + 1.0
t_iter = W + H * (ahead if ahead < CAP else CAP)
steps = (-(-todo // CHUNK) if todo > 1.0 else 1.0) + 1.0
queue = ahead - CAP
o = steps * t_iter
if queue > 0:
    o += queue * t_iter * MEAN_OUTPUT_TOKENS / CAP
"""
_OFFSET_COMPUTE = """
extra = TOKEN_S * (BACKLOG + (todo if todo > 0.0 else 0.0))
"""
_OFFSET_BUDGET = """
extra += BACKLOG / BUDGET * t_iter
"""
# two independently fitted quantiles can cross: the larger α never predicts less
_REARRANGE = """
a = a if a > 0.0 else 0.0
b = b if b > a else a
return (m if m > 0.0 else 0.0), a, b
"""


class _Substitute(ast.NodeTransformer):
    """Replace the template's upper-case names: a feature by its unpacked local (x0, x6, …),
    a fixed feature or a parameter of the offset by its value (ast.Constant)."""

    def __init__(
        self, features: Mapping[str, int], constants: Mapping[str, float | int | None]
    ) -> None:
        self.features = features
        self.constants = constants

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if node.id in self.features:
            return ast.copy_location(ast.Name(_var(self.features[node.id]), node.ctx), node)
        if node.id in self.constants:
            return ast.copy_location(ast.Constant(self.constants[node.id]), node)
        return node


def compile_predict(
    ensembles: Sequence[Ensemble],
    n_inputs: int,
    offset: AnalyticModel | None,
    fixed: Mapping[int, float] | None = None,
) -> Callable[[Vector], tuple[float, float, float]]:
    """x ↦ (mean, q90, q95) as one compiled function: the three sums, the offset's analytic
    mean (from the unpacked locals), each link, the rearrangement (q95 ≥ q90, all ≥ 0).

    One function, not the sums' and a closure around them: the routing hot path evaluates
    a model three times per decision (ŝα at arrival, then K = 2 candidates), and the two
    Python calls per evaluation that saves (the closure, `AnalyticModel.mean`) and the
    sums' tuple were ~0.15 µs of its ~2.6 µs in a tight loop.

    `fixed` {feature index: value}: a function only for vectors holding those values there
    (the caller's promise; the vector still has every feature), specialised at compile
    time — nodes on them decided, the offset's arithmetic on them done by constants —
    with the same result to the last bit as the general function on such a vector."""
    fixed = {} if fixed is None else dict(fixed)
    body, results = _sums_body(ensembles, n_inputs, fixed)
    body += [
        ast.Assign(targets=[ast.Name(f"s{k}", ast.Store())], value=r) for k, r in enumerate(results)
    ]
    text = ""
    if offset is not None:
        text += _OFFSET_MEAN
        if offset.prefill_token_s or offset.max_num_batched_tokens:  # as `mean` tests it
            text += _OFFSET_COMPUTE
            if offset.max_num_batched_tokens:
                text += _OFFSET_BUDGET
            text += "o += extra\n"
    for out, k, e in zip("mab", range(3), ensembles, strict=True):
        if offset is None:
            text += f"{out} = exp(s{k})\n" if e.link == "exp" else f"{out} = s{k}\n"
        else:
            text += f"{out} = o * exp(s{k})\n" if e.link == "exp" else f"{out} = s{k} + o\n"
    text += _REARRANGE
    tail = ast.parse(text).body
    if offset is not None:
        features = {
            "PROMPT": PROMPT,
            "LOCALITY": LOCALITY,
            "RUNNING": RUNNING,
            "WAITING": WAITING,
            "BACKLOG": BACKLOG,
        }
        constants: dict[str, float | int | None] = {
            "W": offset.w,
            "H": offset.h,
            "CAP": offset.max_num_seqs,
            "CHUNK": offset.prefill_chunk,
            "MEAN_OUTPUT_TOKENS": offset.mean_output_tokens,
            "TOKEN_S": offset.prefill_token_s,
            "BUDGET": offset.max_num_batched_tokens,
        }
        for name, index in list(features.items()):
            if index in fixed:  # a constant in place of the local
                constants[name] = fixed[index]
                del features[name]
        substitute = _Substitute(features, constants)
        tail = [substitute.visit(st) for st in tail]
    compiled: Callable[[Vector], tuple[float, float, float]] = _function(
        "predict", body + tail, {"exp": math.exp}
    )
    return compiled


class TreeModel:
    """A PrefillModel from a validated model file: (mean, q90, q95) from three ensembles."""

    __slots__ = (
        "_exp",
        "_offset",
        "_sums",
        "document",
        "name",
        "predict_idle_tuple",
        "predict_tuple",
    )

    def __init__(self, document: TreeDocument) -> None:
        self.document = document
        self.name = document.name
        ensembles = [document.ensembles[k] for k in OUTPUTS]
        self._sums = compile_ensembles(ensembles, len(FEATURES))
        self._exp = tuple(e.link == "exp" for e in ensembles)
        self._offset = document.offset
        # `predict` as a plain (mean, q90, q95) (the predictor's hot path)
        self.predict_tuple = compile_predict(ensembles, len(FEATURES), self._offset)
        # the same for a vector whose worker state is idle (the queue key's ŝα, once per
        # arrival): most nodes split on the worker's state, so most are decided at load
        self.predict_idle_tuple = compile_predict(
            ensembles, len(FEATURES), self._offset, IDLE_WORKER
        )

    def sums(self, x: Vector) -> tuple[float, ...]:
        """Each ensemble's base + Σ trees (mean, q90, q95): what the library predicts."""
        return self._sums(x)

    def raw(self, x: Vector) -> tuple[float, ...]:
        """Each ensemble's output with its offset and link, before rearranging."""
        o = self._offset.mean(x) if self._offset is not None else None
        out = []
        for v, e in zip(self._sums(x), self._exp, strict=True):
            if e:
                v = math.exp(v) if o is None else o * math.exp(v)
            elif o is not None:
                v = v + o
            out.append(v)
        return tuple(out)

    def predict(self, x: Vector) -> Quantiles:
        return Quantiles(*self.predict_tuple(x))
