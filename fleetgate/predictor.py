"""`fleetgate train-predictor`: fit QUARTZ's prefill-time predictor (the QUARTZ paper, §3.2).

    fleetgate train-predictor LOG [LOG ...] -o model.json [--trees N] [--depth D]
            [--learning-rate X] [--holdout F] [--seed N] [--name S] [--json]
            [--offset analytic|none] [--engine-w S] [--engine-h S] [--prefill-chunk N]
            [--max-num-seqs N] [--mean-output-tokens N] [--prefill-token-s S]
            [--max-num-batched-tokens N]
    fleetgate train-predictor --scenario quartz-mixed [--seeds 1,2,3] [--loads 0.5,1]
            [--requests N] -o model.json                 # simulator runs as the log
    fleetgate train-predictor --synthetic N -o model.json  # a generated log, for trying

LOG is the gateway's request log (JSONL) or a simulator record file (JSONL, or one JSON
document: a list of records or an object with a "records" list). Every entry with
`features` (the vector of policies/quantile/features.py at dispatch: a list in FEATURES
order, or an object keyed by feature name) and `prefill_s` (dispatch → first token,
seconds, ≥ 0) is an example; the others are skipped and counted by reason. --scenario
runs the simulator once per seed and load (a multiple of the scenario's arrival rate),
with the analytic model as the predictor that records the features.

Three gradient-boosted tree ensembles (scikit-learn's GradientBoostingRegressor; it
matched HistGradientBoosting and LightGBM on holdout loss at these sizes and its trees are
public attributes): pinball loss at α 0.9 and 0.95, and a squared-error mean twin (for
the expected backlog Ŵ and the PointPred baseline). By default (`--offset analytic`) they
fit what the analytic engine model leaves — y − o(x) for the mean, log y − log o(x) for
the quantiles — so the model is the engine model times a learned correction, and follows
it outside the loads in the log; its parameters are the scenario's engine or the flags
(defaults: the gateway's). Quantiles are fitted in log time — they commute with the
monotone log, and a tree's constant leaves then hold a relative error over the
milliseconds-to-seconds range — and the file says so per ensemble (`link: exp`). Defaults:
20 trees of depth ≤ 4 per ensemble at learning rate 0.3, leaves of ≥ max(20, n/1000)
examples: ~6 µs per prediction on the hot path (bench/quantile_predictor.py measures size
against loss and speed).

The last `--holdout` fraction of the examples, in file order (the later traffic), is held
out; the model is fitted on the rest and is the one written. The report (Table 6's
columns and more), for it and for the analytic engine model, raw and after the router's
online calibration replayed over the holdout in order: coverage at 0.9 and 0.95, the
under-coverage at 0.95 (%), pinball loss at both (ms), the mean shortfall min(q̂95 − y, 0)
(ms), and the MAE of the mean (ms). It is also stored in the file's `meta.holdout`.

The file is plain JSON (`fleetgate.quantile_trees/v1`, policies/quantile/trees.py) and is
loaded back through the gateway's loader before it is written. scikit-learn is needed
only here (`pip install 'fleetgate[train]'`); the gateway reads the file without it.

Exit status: 0 written, 2 usage or input error (no usable examples, unreadable file).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from policies.quantile.analytic import AnalyticModel
from policies.quantile.calibration import Calibration
from policies.quantile.features import CATEGORY_CODES, FEATURES, PrefillModel, Quantiles
from policies.quantile.trees import Ensemble, Tree, loads, to_document

DEFAULT_TREES = 20
DEFAULT_DEPTH = 4
DEFAULT_LEARNING_RATE = 0.3
MIN_EXAMPLES = 50
LOG_FLOOR_S = 1e-4  # log-time targets start here: a log rounds a sub-ms prefill to 0
_F32_MAX = float(np.finfo(np.float32).max)


# -- reading ---------------------------------------------------------------------------


def _vector(feats: object) -> list[float] | None:
    if isinstance(feats, Mapping):
        if not all(name in feats for name in FEATURES):
            return None
        feats = [feats[name] for name in FEATURES]
    if not isinstance(feats, list) or len(feats) != len(FEATURES):
        return None
    out = []
    for v in feats:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            return None
        out.append(float(v))
    return out


def _records(doc: object) -> list[object]:
    if isinstance(doc, dict) and isinstance(doc.get("records"), list):
        return list(doc["records"])
    return list(doc) if isinstance(doc, list) else [doc]


def _entries(path: Path) -> Iterator[object]:
    """A file's entries: JSON lines (streamed), or one JSON document — a list of records,
    an object with a "records" list, or one record — e.g. pretty-printed."""
    with path.open() as fh:
        skipped = 0
        for line in fh:
            if line.strip():
                break
            skipped += 1
        else:
            return
        try:
            first = json.loads(line)
        except ValueError:  # not a whole value on its first line: one multi-line document
            try:
                doc = json.loads(line + fh.read())
            except ValueError as exc:
                raise ValueError(f"{path}: neither JSON lines nor a JSON document: {exc}") from exc
            yield from _records(doc)
            return
        yield from _records(first)
        for lineno, line in enumerate(fh, skipped + 2):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{lineno}: not JSON: {exc}") from exc


def examples(
    entries: Iterable[object], skipped: Counter[str]
) -> Iterator[tuple[list[float], float]]:
    """(features, prefill_s) from log entries; the reason each other entry was skipped."""
    for e in entries:
        if not isinstance(e, Mapping) or e.get("features") is None or e.get("prefill_s") is None:
            skipped["no features or prefill_s"] += 1
            continue
        x = _vector(e["features"])
        if x is None:
            skipped[f"features not {len(FEATURES)} finite numbers"] += 1
            continue
        y = e["prefill_s"]
        if isinstance(y, bool) or not isinstance(y, int | float) or not 0.0 <= y < math.inf:
            skipped["prefill_s not a finite number >= 0"] += 1
            continue
        yield x, float(y)


def read_logs(paths: Sequence[Path]) -> tuple[np.ndarray, np.ndarray, Counter[str]]:
    skipped: Counter[str] = Counter()
    xs: list[list[float]] = []
    ys: list[float] = []
    for path in paths:
        for x, y in examples(_entries(path), skipped):
            xs.append(x)
            ys.append(y)
    X = np.asarray(xs, dtype=np.float64).reshape(-1, len(FEATURES))
    return X, np.asarray(ys, dtype=np.float64), skipped


# -- a generated log (tests, trying the command) ----------------------------------------


def synthetic_entries(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """`n` request-log entries whose prefill time follows a chunked-prefill engine (W + H·n
    per 512-token chunk, the backlog ahead of the request, the engine's own queue) with
    multiplicative noise that widens with KV pressure and cache-state drift, and rare
    preemption spikes. Seeded; every 20th entry has no features (skipped by the reader)."""
    rng = np.random.default_rng(seed)
    chat = CATEGORY_CODES.index("chat")
    rag = CATEGORY_CODES.index("rag")
    out: list[dict[str, Any]] = []
    for i in range(n):
        is_rag = rng.random() < 0.3
        if is_rag:
            p = int(np.clip(rng.lognormal(math.log(2500), 0.5), 256, 8000))
            max_tokens = int(rng.choice([256, 512]))
            bucket = int(rng.choice(3, p=[0.4, 0.3, 0.3]))
        else:
            p = int(np.clip(rng.lognormal(math.log(250), 0.9), 8, 8000))
            max_tokens = int(rng.choice([256, 512, 1024]))
            bucket = int(rng.choice(3, p=[0.5, 0.35, 0.15]))
        share = (0.0, rng.uniform(0.1, 0.6), rng.uniform(0.6, 0.95))[bucket]
        locality = int(p * share) // 16 * 16
        load = rng.random()
        running = int(rng.integers(0, 1 + int(64 * load)))
        waiting = int(rng.poisson(4 * load**3))
        backlog = int(rng.gamma(1 + 6 * load, 400)) if rng.random() < load else 0
        kv = float(np.clip(running / 64 * rng.uniform(0.5, 1.1), 0.0, 1.0))
        computed = p - locality + backlog
        chunks = math.ceil(max(computed, 1) / 512)
        step = 0.012 + 0.00025 * running  # W + H·n: one engine step with n sequences
        mu = chunks * step + 3.0e-5 * computed + 0.02 * waiting
        sigma = 0.08 + 0.35 * kv + (0.1 if bucket else 0.0)
        y = mu * math.exp(sigma * rng.standard_normal())
        if rng.random() < 0.03 * kv:  # a preemption: recomputed from scratch
            y *= 2.5
        entry: dict[str, Any] = {"request_id": f"syn-{i:06d}", "status": 200}
        if i % 20 != 19:
            entry["features"] = [
                float(p),
                float(max_tokens),
                float(rng.choice([0.0, 0.7, 1.0])),
                float(rng.choice([1.0, 0.95, 0.9])),
                float(rag if is_rag else chat),
                float(rng.random() < 0.8),
                float(locality),
                float(bucket),
                float(running),
                float(waiting),
                float(backlog),
                round(kv, 4),
            ]
            entry["prefill_s"] = round(y, 6)
        out.append(entry)
    return out


# -- fitting and export ----------------------------------------------------------------


def _f32_threshold(t: float) -> float:
    """The float64 threshold that sends x left exactly when scikit-learn's tree (which
    compares float32(x) <= t) does, so the evaluator needs no cast on the hot path.

    float32 rounding is monotone, so {x : float32(x) <= t} is a half-line ending just
    below (or at, when ties round down to it) the midpoint between the largest float32
    t32 <= t and the next float32."""
    t32 = np.float32(t)
    if float(t32) > t:
        t32 = np.nextafter(t32, np.float32(-np.inf))
    if float(t32) >= _F32_MAX:
        return _F32_MAX
    up = np.nextafter(t32, np.float32(np.inf))
    mid = (float(t32) + float(up)) / 2.0  # exact in float64
    even = int(np.array(t32, dtype=np.float32).view(np.uint32)) % 2 == 0
    return mid if even else float(np.nextafter(mid, -np.inf))


def _export_gbr(est: Any, link: str) -> Ensemble:
    # the initial estimate (a DummyRegressor: the mean, or the α-quantile of the targets)
    base = float(est.init_.predict(np.zeros((1, len(FEATURES))))[0])
    lr = est.learning_rate
    trees = []
    for stage in est.estimators_[:, 0]:
        t = stage.tree_
        leaf = t.children_left == -1
        trees.append(
            Tree(
                feature=tuple(
                    int(f) if not lf else -1 for f, lf in zip(t.feature, leaf, strict=True)
                ),
                threshold=tuple(
                    0.0 if lf else _f32_threshold(float(v))
                    for v, lf in zip(t.threshold, leaf, strict=True)
                ),
                left=tuple(int(c) for c in t.children_left),
                right=tuple(int(c) for c in t.children_right),
                value=tuple(
                    float(lr * v) if lf else 0.0
                    for v, lf in zip(t.value[:, 0, 0], leaf, strict=True)
                ),
            )
        )
    return Ensemble(base=base, trees=tuple(trees), link=link)


@dataclass
class Fitted:
    """The three fitted estimators (for the library-agreement test) and the document."""

    estimators: dict[str, Any]
    document: dict[str, Any]
    fit_s: float
    links: dict[str, str] = field(default_factory=dict)


_FitSpec = tuple[dict[str, str | float], np.ndarray, str]  # loss kwargs, target, link


def fit(
    X: np.ndarray,
    y: np.ndarray,
    *,
    trees: int = DEFAULT_TREES,
    depth: int = DEFAULT_DEPTH,
    learning_rate: float = DEFAULT_LEARNING_RATE,
    offset: AnalyticModel | None = None,
    log_quantiles: bool = True,
    seed: int = 0,
    min_leaf: int | None = None,
    name: str = "trees",
    meta: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> Fitted:
    """Fit mean, q90 and q95 ensembles and build the model document. With `offset`, the
    trees fit what the analytic model leaves: y − o(x) for the mean, log y − log o(x) for
    the quantiles (a correction factor), so the model extrapolates as the engine model
    does outside the load range it was trained on."""
    from sklearn.ensemble import GradientBoostingRegressor

    started = time.process_time()
    common = dict(
        n_estimators=trees, max_depth=depth, learning_rate=learning_rate, random_state=seed,
        min_samples_leaf=min_leaf if min_leaf is not None else max(20, len(y) // 1000),
    )  # fmt: skip
    o = np.array([offset.mean(row) for row in X.tolist()]) if offset is not None else None
    y_mean = y if o is None else y - o
    y_log = np.log(np.maximum(y, LOG_FLOOR_S))
    if o is not None:
        y_log = y_log - np.log(o)
    q_target, q_link = (y_log, "exp") if log_quantiles else (y_mean, "identity")
    specs: dict[str, _FitSpec] = {
        "mean": ({"loss": "squared_error"}, y_mean, "identity"),
        "q90": ({"loss": "quantile", "alpha": 0.9}, q_target, q_link),
        "q95": ({"loss": "quantile", "alpha": 0.95}, q_target, q_link),
    }
    estimators: dict[str, Any] = {}
    ensembles: dict[str, Ensemble] = {}
    links: dict[str, str] = {}
    from simulator.progress import bar as progress_bar

    with progress_bar(len(specs) * trees, "fit", "tree", on=progress) as stages:

        def advance(_i: int, _est: Any, _locals: Any) -> bool:  # sklearn's per-stage monitor
            stages.update(1)
            return False  # never stop early

        for key, (loss, target, link) in specs.items():
            stages.set_description_str(f"fit {key}")
            est = GradientBoostingRegressor(**common, **loss)
            est.fit(X, target, monitor=advance if progress else None)
            estimators[key] = est
            ensembles[key] = _export_gbr(est, link)
            links[key] = link
    fit_s = time.process_time() - started
    info = {"trainer": "sklearn.GradientBoostingRegressor", "trees": trees, "depth": depth,
            "learning_rate": learning_rate, "examples": len(y)} | dict(meta or {})  # fmt: skip
    document = to_document(name, FEATURES, ensembles, info, offset)
    return Fitted(estimators, document, fit_s, links)


# -- quality ---------------------------------------------------------------------------


def pinball(y: np.ndarray, q: np.ndarray, alpha: float) -> float:
    d = y - q
    return float(np.mean(np.maximum(alpha * d, (alpha - 1.0) * d)))


def _rows(preds: Sequence[Quantiles], y: np.ndarray) -> dict[str, float]:
    mean = np.array([p.mean for p in preds])
    q90 = np.array([p.q90 for p in preds])
    q95 = np.array([p.q95 for p in preds])
    cov95 = float(np.mean(y <= q95))
    return {
        "n": float(len(y)),
        "coverage_90": float(np.mean(y <= q90)),
        "coverage_95": cov95,
        "under_coverage_95_pct": 100.0 * (1.0 - cov95),  # the paper's: y above q95
        "pinball_90_ms": 1e3 * pinball(y, q90, 0.9),
        "pinball_95_ms": 1e3 * pinball(y, q95, 0.95),
        # the shortfall: mean of min(q95 − y, 0), the harmful underestimation (Table 6)
        "signed_residual_95_ms": 1e3 * float(np.mean(np.minimum(q95 - y, 0.0))),
        "mae_mean_ms": 1e3 * float(np.mean(np.abs(y - mean))),
    }


def quality(
    model: PrefillModel, X: np.ndarray, y: np.ndarray, name: str
) -> dict[str, dict[str, float]]:
    """Table-6-like numbers of a model on held-out examples, raw and calibrated: coverage
    and pinball loss at 0.9 and 0.95, under-coverage at 0.95 (%), the mean shortfall of
    q95 (ms), MAE of the mean (ms). "Calibrated" replays the examples in order through
    the router's online calibration (policies/quantile/calibration.py, defaults): each
    prediction is corrected with what was observed before it, then observed."""
    calib = Calibration()
    raw: list[Quantiles] = []
    calibrated: list[Quantiles] = []
    for row, target in zip(X.tolist(), y.tolist(), strict=True):
        q = model.predict(row)
        regime = calib.regime(row)
        c = calib.correct(q, regime)
        calib.observe(regime, q, c.at(calib.alpha), target)
        raw.append(q)
        calibrated.append(c)
    return {name: _rows(raw, y), f"{name} + calib.": _rows(calibrated, y)}


def report_table(rows: Mapping[str, Mapping[str, float]]) -> str:
    cols = [
        ("coverage_90", "cov@0.9", "{:.3f}"),
        ("coverage_95", "cov@0.95", "{:.3f}"),
        ("under_coverage_95_pct", "under-cov %", "{:.1f}"),
        ("pinball_90_ms", "pinball .9 ms", "{:.2f}"),
        ("pinball_95_ms", "pinball .95 ms", "{:.2f}"),
        ("signed_residual_95_ms", "shortfall ms", "{:.1f}"),
        ("mae_mean_ms", "MAE mean ms", "{:.1f}"),
    ]
    width = max(len(n) for n in rows) + 2
    lines = [f"{'model':<{width}}" + "".join(f"{c[1]:>15}" for c in cols)]
    for name, r in rows.items():
        lines.append(f"{name:<{width}}" + "".join(f"{c[2].format(r[c[0]]):>15}" for c in cols))
    return "\n".join(lines)


# -- simulator runs ----------------------------------------------------------------------


def simulated_entries(
    scenario: Any,
    seeds: Sequence[int],
    loads: Sequence[float],
    requests: int | None = None,
    progress: bool = False,
) -> tuple[list[dict[str, Any]], AnalyticModel]:
    """Records (features at dispatch, prefill_s) of a scenario (a name, a YAML path or a
    loaded Scenario) run once per seed and load (a multiple of its arrival rate), with the
    analytic model of its engine as the predictor that records the features; and that
    analytic model, the baseline."""
    from policies.quantile.config import EngineShape, QuartzSettings, analytic_model
    from simulator import scenario as scn
    from simulator.run import run

    base = scn.load(scenario) if isinstance(scenario, str) else scenario
    name = base.name
    e = base.engine_config(base.fleet.pools[0])
    quartz = base.policy.quartz
    settings = quartz.settings() if quartz is not None else QuartzSettings()
    shape = EngineShape(
        e.w, e.h, e.prefill_chunk, e.max_num_seqs, e.prefill_token_s, e.max_num_batched_tokens
    )
    analytic = analytic_model(settings, shape)
    from simulator.progress import bar as progress_bar

    out: list[dict[str, Any]] = []
    runs = progress_bar(len(loads) * len(seeds), f"simulate {name}", "run", on=progress)
    for load in loads:
        sc = base
        arrivals = base.workload.arrivals
        if load != 1.0:
            if arrivals is None:
                raise ValueError(f"{name}: --loads needs a workload with one `arrivals` rate")
            arrivals = arrivals.model_copy(update={"rate": arrivals.rate * load})
            sc = base.model_copy(
                update={"workload": base.workload.model_copy(update={"arrivals": arrivals})}
            )
        for seed in seeds:
            runs.set_postfix_str(f"load {load:g} seed {seed}")
            result = run(sc, seed=seed, requests=requests, prefill_model=analytic)
            out.extend(
                {"features": r.features, "prefill_s": r.prefill_s, "load": load, "seed": seed}
                for r in result.records
                if r.features is not None and r.prefill_s is not None
            )
            runs.update(1)
    runs.close()
    return out, analytic


# -- the command -----------------------------------------------------------------------


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fleetgate train-predictor",
        description="fit QUARTZ's prefill-time quantile predictor from request logs",
    )
    p.add_argument("logs", nargs="*", type=Path, help="request log JSONL / simulator record files")
    p.add_argument("-o", "--out", type=Path, required=True, help="the model file to write")
    p.add_argument(
        "--scenario", help="also train on simulator runs of this scenario (name or YAML)"
    )
    p.add_argument("--seeds", default="1", help="the scenario's seeds, comma-separated (1)")
    p.add_argument(
        "--loads", default="1", help="multiples of its arrival rate, comma-separated (1)"
    )
    p.add_argument("--requests", type=int, default=None, help="requests per scenario run")
    p.add_argument(
        "--synthetic", type=int, default=0, metavar="N", help="also train on N generated entries"
    )
    p.add_argument(
        "--trees", type=int, default=DEFAULT_TREES, help=f"trees per ensemble ({DEFAULT_TREES})"
    )
    p.add_argument("--depth", type=int, default=DEFAULT_DEPTH, help=f"tree depth ({DEFAULT_DEPTH})")
    p.add_argument(
        "--learning-rate",
        type=float,
        default=DEFAULT_LEARNING_RATE,
        help=f"shrinkage ({DEFAULT_LEARNING_RATE})",
    )
    p.add_argument(
        "--offset",
        choices=["analytic", "none"],
        default="analytic",
        help="trees correct the analytic engine model (default), or stand alone",
    )
    e = p.add_argument_group(
        "the analytic model (default: the scenario's engine, else the gateway's defaults)"
    )
    e.add_argument(
        "--engine-w", type=float, default=None, help="W, seconds per engine step (0.008)"
    )
    e.add_argument(
        "--engine-h", type=float, default=None, help="H, seconds per step per sequence (0.00065)"
    )
    e.add_argument("--prefill-chunk", type=int, default=None, help="chunked-prefill tokens (512)")
    e.add_argument("--max-num-seqs", type=int, default=None, help="the engine's max_num_seqs (256)")
    e.add_argument("--mean-output-tokens", type=float, default=None, help="(256)")
    e.add_argument(
        "--prefill-token-s",
        type=float,
        default=None,
        help="compute-bound prefill, seconds per prompt token computed (0: off)",
    )
    e.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="the engine's per-step token budget (default: none)",
    )
    p.add_argument("--holdout", type=float, default=0.2, help="the last fraction, held out (0.2)")
    p.add_argument("--seed", type=int, default=0, help="the fit's (and --synthetic's) seed")
    p.add_argument("--name", default=None, help="the model's name (default: the file's stem)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p  # fmt: skip


def _describe(m: AnalyticModel) -> str:
    compute = ""
    if m.prefill_token_s or m.max_num_batched_tokens:
        compute = (f", {m.prefill_token_s:g} s per prefill token, "
                   f"token budget {m.max_num_batched_tokens or 'none'}")  # fmt: skip
    return (f"W {m.w:g} s, H {m.h:g} s, chunk {m.prefill_chunk}, max_num_seqs {m.max_num_seqs}, "
            f"mean output {m.mean_output_tokens:g}{compute}")  # fmt: skip


def _gather(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, Counter[str], AnalyticModel]:
    from simulator.progress import enabled

    X, y, skipped = read_logs(args.logs)
    extra: list[dict[str, Any]] = []
    analytic = AnalyticModel()
    if args.scenario:
        sim, analytic = simulated_entries(
            args.scenario,
            [int(v) for v in _floats(args.seeds)],
            _floats(args.loads),
            args.requests,
            progress=enabled(args.json),
        )
        extra += sim
    if args.synthetic:
        extra += synthetic_entries(args.synthetic, args.seed)
    if extra:
        pairs = list(examples(extra, skipped))
        if pairs:
            X = np.vstack([X, np.array([p[0] for p in pairs])])
            y = np.concatenate([y, np.array([p[1] for p in pairs])])
    given = {
        "w": args.engine_w,
        "h": args.engine_h,
        "prefill_chunk": args.prefill_chunk,
        "max_num_seqs": args.max_num_seqs,
        "mean_output_tokens": args.mean_output_tokens,
        "prefill_token_s": args.prefill_token_s,
        "max_num_batched_tokens": args.max_num_batched_tokens,
    }
    analytic = replace(analytic, **{k: v for k, v in given.items() if v is not None})
    return X, y, skipped, analytic


def main(argv: list[str] | None = None) -> int:
    from simulator.progress import enabled

    args = _parser().parse_args(argv)
    err = "fleetgate train-predictor:"
    if not args.logs and not args.synthetic and not args.scenario:
        print(f"{err} give LOG files, --scenario NAME or --synthetic N", file=sys.stderr)
        return 2
    if not 0.0 < args.holdout < 0.9 or not 1 <= args.trees <= 500 or not 1 <= args.depth <= 8:
        print(
            f"{err} need --holdout in (0, 0.9), --trees in 1..500, --depth in 1..8", file=sys.stderr
        )
        return 2
    try:
        X, y, skipped, analytic = _gather(args)
    except (OSError, ValueError) as exc:
        print(f"{err} {exc}", file=sys.stderr)
        return 2
    n = len(y)
    n_test = int(n * args.holdout)
    if n - n_test < MIN_EXAMPLES or n_test < 1:
        print(f"{err} {n} usable examples (need {MIN_EXAMPLES} to train, and a holdout); "
              f"skipped: {dict(skipped) or 'none'}", file=sys.stderr)  # fmt: skip
        return 2
    cut = n - n_test
    name = args.name or args.out.stem
    offset = analytic if args.offset == "analytic" else None
    fitted = fit(X[:cut], y[:cut], trees=args.trees, depth=args.depth, offset=offset,
                 learning_rate=args.learning_rate, seed=args.seed, name=name,
                 progress=enabled(args.json))  # fmt: skip
    model = loads(json.dumps(fitted.document))  # it must load the way the gateway loads it
    report = quality(model, X[cut:], y[cut:], "trees")
    report |= quality(analytic, X[cut:], y[cut:], "analytic")
    fitted.document["meta"]["holdout"] = report
    text = json.dumps(fitted.document, separators=(",", ":"))
    args.out.write_text(text + "\n")
    summary = {"examples": n, "train": cut, "holdout": n_test, "skipped": dict(skipped),
               "fit_cpu_s": round(fitted.fit_s, 3), "bytes": len(text) + 1, "quality": report}  # fmt: skip
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    print(f"{n} examples: {cut} to train, the last {n_test} held out; skipped: "
          f"{dict(skipped) or 'none'}")  # fmt: skip
    on = "" if offset is None else f" correcting the analytic model ({_describe(offset)})"
    print(f"fitted 3 × {args.trees} trees of depth ≤ {args.depth}{on} in {fitted.fit_s:.1f} s CPU; "
          f"wrote {args.out} ({(len(text) + 1) / 1024:.0f} KiB)")  # fmt: skip
    print(report_table(report))
    return 0
