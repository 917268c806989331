"""QUARTZ predictor: evaluator speed and the training choice. Prints tables, asserts nothing.

1. `speed`: µs (thread CPU) per predict — (mean, q90, q95) for one feature vector — for
   each way of evaluating the same three ensembles, at several model sizes:
   - walk: plain Python over each tree's flat arrays (node = left/right[node]);
   - compiled: the shipped evaluator (policies/quantile/trees.py), each tree compiled into
     a nested conditional expression;
   - numpy: every tree padded to a complete tree of depth d, one gather per level over all
     trees at once (per vector, and per vector in a batch of K = 2);
   - sklearn: the library's own predict on a 1-row array (what a library call per
     request would cost).
2. `fit`: on a generated log (fleetgate.predictor.synthetic_entries, or --log FILE...):
   scikit-learn GradientBoostingRegressor / HistGradientBoostingRegressor, and LightGBM
   when installed, at a few sizes: CPU seconds to fit the three ensembles, JSON size,
   holdout pinball loss and coverage.

3. `table6`: like the paper's Table 6 — trained on simulator runs of quartz-mixed, raw
   and calibrated coverage on unseen runs of it and of three shifts, beside the analytic
   model.

    PYTHONPATH=. python bench/quantile_predictor.py [speed|fit|table6] [--n 20000] [--log FILE ...]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from fleetgate.predictor import (
    DEFAULT_DEPTH,
    DEFAULT_LEARNING_RATE,
    DEFAULT_TREES,
    examples,
    fit,
    pinball,
    quality,
    read_logs,
    simulated_entries,
    synthetic_entries,
)
from policies.quantile.analytic import AnalyticModel
from policies.quantile.features import FEATURES
from policies.quantile.trees import Ensemble, Tree, loads


def _data(n: int, seed: int, logs: Sequence[Path]) -> tuple[np.ndarray, np.ndarray]:
    if logs:
        X, y, _ = read_logs(logs)
        return X, y
    pairs = list(examples(synthetic_entries(n, seed), Counter()))
    return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])


def _cpu_us(fn: Callable[[], object], reps: int) -> float:
    best = math.inf
    for _ in range(5):  # best of 5 rounds: the least-disturbed one on a shared machine
        t0 = time.thread_time()
        for _ in range(reps):
            fn()
        best = min(best, time.thread_time() - t0)
    return 1e6 * best / reps


# -- the alternative evaluators ---------------------------------------------------------


def walk_evaluator(ensembles: Sequence[Ensemble]) -> Callable[[Sequence[float]], tuple[float, ...]]:
    flat = [
        (e.base, [(t.feature, t.threshold, t.left, t.right, t.value) for t in e.trees])
        for e in ensembles
    ]

    def predict(x: Sequence[float]) -> tuple[float, ...]:
        out = []
        for base, trees in flat:
            s = base
            for feature, threshold, left, right, value in trees:
                i = 0
                while left[i] != -1:
                    i = left[i] if x[feature[i]] <= threshold[i] else right[i]
                s += value[i]
            out.append(s)
        return tuple(out)

    return predict


def numpy_evaluator(
    ensembles: Sequence[Ensemble],
) -> tuple[Callable[..., object], Callable[..., object]]:
    """Trees padded to complete depth-d trees (a leaf above depth d repeats downwards)."""
    trees = [t for e in ensembles for t in e.trees]
    owner = np.array([k for k, e in enumerate(ensembles) for _ in e.trees])
    d = max(_depth(t, 0) for t in trees)
    n_int, n_leaf = (1 << d) - 1, 1 << d
    feat = np.zeros((len(trees), n_int), dtype=np.intp)
    thr = np.full((len(trees), n_int), np.inf)
    leaf = np.zeros((len(trees), n_leaf))
    for r, t in enumerate(trees):
        _pad(t, 0, 0, 0, d, feat[r], thr[r], leaf[r])
    rows = np.arange(len(trees))
    base = np.array([e.base for e in ensembles])

    def one(x: Sequence[float]) -> np.ndarray:
        xv = np.asarray(x)
        node = np.zeros(len(trees), dtype=np.intp)
        for _ in range(d):
            node = 2 * node + 1 + (xv[feat[rows, node]] > thr[rows, node])
        vals = leaf[rows, node - n_int]
        return base + np.bincount(owner, vals, minlength=len(ensembles))

    def batch(xs: np.ndarray) -> np.ndarray:
        node = np.zeros((len(xs), len(trees)), dtype=np.intp)
        cols = np.arange(len(xs))[:, None]
        for _ in range(d):
            f = feat[rows, node]
            node = 2 * node + 1 + (xs[cols, f] > thr[rows, node])
        vals = leaf[rows, node - n_int]
        return base + np.stack([vals[:, owner == k].sum(axis=1) for k in range(len(ensembles))], 1)

    return one, batch


def _depth(t: Tree, i: int) -> int:
    if t.left[i] == -1:
        return 0
    return 1 + max(_depth(t, t.left[i]), _depth(t, t.right[i]))


def _pad(
    t: Tree,
    i: int,
    pos: int,
    level: int,
    d: int,
    feat: np.ndarray,
    thr: np.ndarray,
    leaf: np.ndarray,
) -> None:
    if level == d:
        leaf[pos - ((1 << d) - 1)] = t.value[i]
        return
    if t.left[i] == -1:  # a shallow leaf: always go left, keep the value
        feat[pos], thr[pos] = 0, np.inf
        _pad(t, i, 2 * pos + 1, level + 1, d, feat, thr, leaf)
        _pad(t, i, 2 * pos + 2, level + 1, d, feat, thr, leaf)
        return
    feat[pos], thr[pos] = t.feature[i], t.threshold[i]
    _pad(t, t.left[i], 2 * pos + 1, level + 1, d, feat, thr, leaf)
    _pad(t, t.right[i], 2 * pos + 2, level + 1, d, feat, thr, leaf)


# -- 1. speed ---------------------------------------------------------------------------


def speed(X: np.ndarray, y: np.ndarray, sizes: Sequence[tuple[int, int]]) -> None:
    rows = X[:200].tolist()
    print(
        "| trees × depth (×3 ensembles) | walk µs | compiled µs | compiled + analytic offset µs | numpy µs | numpy K=2 batch µs/vector | sklearn µs | compiled max |Δ| vs sklearn |"
    )
    print("|---|---|---|---|---|---|---|---|")  # fmt: skip
    for trees, depth in sizes:
        fitted = fit(X, y, trees=trees, depth=depth)
        model = loads(json.dumps(fitted.document))
        ens = [model.document.ensembles[k] for k in ("mean", "q90", "q95")]
        walk = walk_evaluator(ens)
        one, batch = numpy_evaluator(ens)
        it = iter(range(1 << 62))

        def call(
            f: Callable[[Sequence[float]], object], it: Iterator[int] = it
        ) -> Callable[[], object]:
            return lambda: f(rows[next(it) % 200])

        pair = X[:2].copy()
        est = fitted.estimators["q95"]
        one_row = X[:1].astype(np.float32)
        reps = 2000
        t_walk = _cpu_us(call(walk), reps // 4)
        t_comp = _cpu_us(call(model.predict), reps)
        with_offset = loads(
            json.dumps(fit(X, y, trees=trees, depth=depth, offset=AnalyticModel()).document)
        )
        t_off = _cpu_us(call(with_offset.predict), reps)
        t_np = _cpu_us(call(one), reps // 4)
        t_np2 = _cpu_us(lambda b=batch, p=pair: b(p), reps // 4) / 2
        t_sk = 3 * _cpu_us(lambda e=est, r=one_row: e.predict(r), 100)
        # agreement: the raw ensemble sums against the library's own predict
        worst = 0.0
        for k, e in fitted.estimators.items():
            ours = np.array([model.sums(r)[("mean", "q90", "q95").index(k)] for r in rows])
            worst = max(worst, float(np.max(np.abs(ours - e.predict(X[:200])))))
        print(
            f"| {trees} × {depth} | {t_walk:.1f} | {t_comp:.1f} | {t_off:.1f} | {t_np:.1f} | {t_np2:.1f} | {t_sk:.0f} | {worst:.1e} |"
        )
        sys.stdout.flush()


# -- 2. fit -----------------------------------------------------------------------------


def _quality(pred: dict[str, np.ndarray], y: np.ndarray) -> str:
    return (
        f"{np.mean(y <= pred['q90']):.3f} | {np.mean(y <= pred['q95']):.3f} | "
        f"{1e3 * pinball(y, pred['q90'], 0.9):.2f} | {1e3 * pinball(y, pred['q95'], 0.95):.2f} | "
        f"{1e3 * np.mean(np.abs(y - pred['mean'])):.1f}"
    )


def fits(X: np.ndarray, y: np.ndarray, sizes: Sequence[tuple[int, int, float]]) -> None:
    n_test = len(y) // 5
    Xtr, ytr, Xte, yte = X[:-n_test], y[:-n_test], X[-n_test:], y[-n_test:]
    print(f"{len(ytr)} train, {n_test} holdout examples")
    print(
        "| trainer | trees × depth | target | fit CPU s (3 ensembles) | JSON KiB | cov@0.9 | cov@0.95 | pinball0.9 ms | pinball0.95 ms | MAE mean ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    for trees, depth, lr in sizes:
        for log_q in (False, True):
            fitted = fit(Xtr, ytr, trees=trees, depth=depth, learning_rate=lr, log_quantiles=log_q)
            text = json.dumps(fitted.document, separators=(",", ":"))
            model = loads(text)
            preds = [model.predict(r) for r in Xte.tolist()]
            pred = {k: np.array([getattr(p, k) for p in preds]) for k in ("mean", "q90", "q95")}
            print(f"| sklearn GBR | {trees} × {depth} @ {lr} | {'log' if log_q else 'raw'} | {fitted.fit_s:.2f} | "
                  f"{len(text) / 1024:.0f} | {_quality(pred, yte)} |")  # fmt: skip
            sys.stdout.flush()
        for name, make in _others(trees, depth, lr):
            t0 = time.process_time()
            pred = {}
            for k, (loss, alpha) in {
                "mean": ("l2", None),
                "q90": ("quantile", 0.9),
                "q95": ("quantile", 0.95),
            }.items():
                est = make(loss, alpha)
                target = ytr if k == "mean" else np.log(ytr)
                est.fit(Xtr, target)
                p = est.predict(Xte)
                pred[k] = p if k == "mean" else np.exp(p)
            pred["q95"] = np.maximum(pred["q95"], pred["q90"])
            print(
                f"| {name} | {trees} × {depth} @ {lr} | log | {time.process_time() - t0:.2f} | – | {_quality(pred, yte)} |"
            )
            sys.stdout.flush()


def _others(
    trees: int, depth: int, lr: float
) -> list[tuple[str, Callable[[str, float | None], object]]]:
    from sklearn.ensemble import HistGradientBoostingRegressor

    def hgb(loss: str, alpha: float | None) -> object:
        kw = {"loss": "squared_error"} if loss == "l2" else {"loss": "quantile", "quantile": alpha}
        return HistGradientBoostingRegressor(max_iter=trees, max_depth=depth,
                                             max_leaf_nodes=1 << depth, early_stopping=False, learning_rate=lr, **kw)  # fmt: skip

    out: list[tuple[str, Callable[[str, float | None], object]]] = [("sklearn HGB", hgb)]
    try:
        import lightgbm

        def lgb(loss: str, alpha: float | None) -> object:
            kw = (
                {"objective": "regression"}
                if loss == "l2"
                else {"objective": "quantile", "alpha": alpha}
            )
            return lightgbm.LGBMRegressor(n_estimators=trees, max_depth=depth, num_leaves=1 << depth,
                                          learning_rate=lr, verbose=-1, n_jobs=1, **kw)  # fmt: skip

        out.append(("LightGBM", lgb))
    except ImportError:
        pass
    return out


# -- 3. table6 ---------------------------------------------------------------------------


def table6(trees: int, depth: int, lr: float) -> None:
    """Like the paper's Table 6: a model trained on simulator runs of quartz-mixed (seeds
    1, 2 at 0.5, 0.75 and 1× its arrival rate), evaluated raw and with the router's online
    calibration on unseen runs (seed 3): the nominal workload and four shifts. "trees"
    correct the analytic model (the default), "trees, no offset" stand alone."""
    from simulator import scenario as scn

    t0 = time.process_time()
    train, analytic = simulated_entries("quartz-mixed", [1, 2], [0.5, 0.75, 1.0])
    X, y = _xy(train)
    model = loads(
        json.dumps(fit(X, y, trees=trees, depth=depth, learning_rate=lr, offset=analytic).document)
    )
    plain = loads(json.dumps(fit(X, y, trees=trees, depth=depth, learning_rate=lr).document))
    print(
        f"trained on {len(y)} requests ({trees} × {depth} @ {lr}), {time.process_time() - t0:.1f} s CPU"
    )
    mixed = scn.load("quartz-mixed")
    assert mixed.workload.components is not None
    more_rag = mixed.model_copy(update={"workload": mixed.workload.model_copy(update={
        "components": [c.model_copy(update={"weight": 0.5}) for c in mixed.workload.components]})})  # fmt: skip
    shifts = [
        ("Nominal Mixed", mixed, 1.0),
        ("More RAG (50 %)", more_rag, 0.85),
        ("Bursty arrivals", scn.load("quartz-mixed-bursty"), 1.0),
        ("Overload (1.25×)", mixed, 1.25),
        ("Light load (0.3×)", mixed, 0.3),
    ]
    print(
        "| scenario | model | raw cov@0.95 | calib. cov@0.95 | raw under-cov % | calib. under-cov % | shortfall ms raw → calib. | raw cov@0.9 | pinball .95 ms raw → calib. | MAE mean ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    for label, sc, load in shifts:
        test, _ = simulated_entries(sc, [3], [load])
        Xt, yt = _xy(test)
        for name, m in (("trees", model), ("trees, no offset", plain), ("analytic", analytic)):
            q = quality(m, Xt, yt, name)
            r, c = q[name], q[f"{name} + calib."]
            print(f"| {label} | {name} | {r['coverage_95']:.3f} | {c['coverage_95']:.3f} | "
                  f"{r['under_coverage_95_pct']:.1f} | {c['under_coverage_95_pct']:.1f} | "
                  f"{r['signed_residual_95_ms']:.1f} → {c['signed_residual_95_ms']:.1f} | "
                  f"{r['coverage_90']:.3f} | {r['pinball_95_ms']:.2f} → {c['pinball_95_ms']:.2f} | "
                  f"{r['mae_mean_ms']:.1f} |")  # fmt: skip
            sys.stdout.flush()


def _xy(entries: Sequence[dict[str, object]]) -> tuple[np.ndarray, np.ndarray]:
    pairs = list(examples(entries, Counter()))
    return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", nargs="?", choices=["speed", "fit", "table6", "all"], default="all")
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--log", type=Path, nargs="*", default=[])
    args = ap.parse_args()
    if args.what in ("table6", "all"):
        table6(DEFAULT_TREES, DEFAULT_DEPTH, DEFAULT_LEARNING_RATE)
    if args.what == "table6":
        return
    X, y = _data(args.n, args.seed, args.log)
    assert X.shape[1] == len(FEATURES)
    if args.what in ("speed", "all"):
        speed(X[:5000], y[:5000], [(20, 3), (20, 4), (40, 4), (100, 3), (100, 4)])
    if args.what in ("fit", "all"):
        fits(X, y, [(20, 4, 0.3), (40, 4, 0.2), (60, 3, 0.1), (100, 3, 0.1), (100, 4, 0.1)])


if __name__ == "__main__":
    main()
