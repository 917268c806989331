"""`fleetgate train-predictor` and the trained model: agreement with scikit-learn's own
predict, the file round trip, coverage on held-out data, and the command as a user runs it
(a real process on a generated request log)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from fleetgate.predictor import examples, fit, main, synthetic_entries
from policies.quantile.analytic import AnalyticModel
from policies.quantile.features import FEATURES
from policies.quantile.trees import OUTPUTS, TreeModel, loads
from tests.procs import ROOT, env

pytest.importorskip("sklearn")  # fit() imports it; the module itself needs only numpy


def data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    pairs = list(examples(synthetic_entries(n, seed), Counter()))
    return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])


@pytest.fixture(scope="module")
def trained() -> tuple[object, TreeModel, np.ndarray, np.ndarray]:
    X, y = data(3000, 1)
    fitted = fit(X, y, seed=1)
    return fitted, loads(json.dumps(fitted.document)), X, y


def test_the_evaluator_agrees_with_sklearn_predict(trained: tuple) -> None:
    fitted, model, _, _ = trained
    Xt, _ = data(1000, 7)
    # and vectors sitting on, and one float32 step either side of, every split threshold:
    # sklearn compares float32(x) with its threshold, the evaluator float64 x with its own
    edges = []
    for est in fitted.estimators.values():
        for stage in est.estimators_[:, 0]:
            t = stage.tree_
            for f, thr in zip(t.feature, t.threshold, strict=True):
                if f < 0:
                    continue
                t32 = np.float32(thr)
                for v in (thr, float(t32), float(np.nextafter(t32, np.float32(np.inf))),
                          float(np.nextafter(t32, np.float32(-np.inf))), float(np.nextafter(thr, np.inf))):  # fmt: skip
                    row = Xt[len(edges) % len(Xt)].copy()
                    row[f] = v
                    edges.append(row)
    Xall = np.vstack([Xt, np.array(edges)])
    ours = np.array([model.sums(row) for row in Xall.tolist()])
    for k, key in enumerate(OUTPUTS):  # to the last bit
        np.testing.assert_array_equal(ours[:, k], fitted.estimators[key].predict(Xall), key)
    raw = np.array([model.raw(row) for row in Xall.tolist()])
    for k, key in enumerate(OUTPUTS):
        theirs = fitted.estimators[key].predict(Xall)
        theirs = np.exp(theirs) if fitted.links[key] == "exp" else theirs
        np.testing.assert_allclose(raw[:, k], theirs, rtol=1e-13, atol=0, err_msg=key)


def test_trees_fitted_on_the_analytic_offset_agree_with_sklearn() -> None:
    X, y = data(1500, 5)
    analytic = AnalyticModel(max_num_seqs=64)
    fitted = fit(X, y, trees=8, offset=analytic)
    model = loads(json.dumps(fitted.document))
    assert model.document.offset == analytic
    o = np.array([analytic.mean(row) for row in X.tolist()])
    mean, q90, q95 = (fitted.estimators[k].predict(X) for k in OUTPUTS)
    ours = np.array([model.raw(row) for row in X.tolist()])
    np.testing.assert_allclose(ours[:, 0], o + mean, rtol=1e-13)
    np.testing.assert_allclose(ours[:, 1], o * np.exp(q90), rtol=1e-13)
    np.testing.assert_allclose(ours[:, 2], o * np.exp(q95), rtol=1e-13)


def test_train_save_load_predict_round_trip(trained: tuple, tmp_path: Path) -> None:
    fitted, model, X, _ = trained
    path = tmp_path / "model.json"
    path.write_text(json.dumps(fitted.document))
    again = loads(path.read_bytes())
    assert again.document.features == FEATURES
    assert again.document.meta["trees"] == 20 and again.document.meta["depth"] == 4
    for row in X[:200].tolist():
        p = again.predict(row)
        assert p == model.predict(row)
        assert 0.0 <= p.q90 <= p.q95


def test_coverage_on_a_held_out_set_is_near_nominal() -> None:
    X, y = data(6000, 2)
    Xt, yt = data(4000, 102)  # another seed: unseen requests from the same engine
    model = loads(json.dumps(fit(X, y, seed=2).document))
    preds = [model.predict(row) for row in Xt.tolist()]
    cov90 = np.mean(yt <= np.array([p.q90 for p in preds]))
    cov95 = np.mean(yt <= np.array([p.q95 for p in preds]))
    assert abs(cov90 - 0.90) < 0.03 and abs(cov95 - 0.95) < 0.02, (cov90, cov95)


def _write_log(path: Path, n: int) -> None:
    with path.open("w") as fh:
        for e in synthetic_entries(n, 3):
            fh.write(json.dumps(e) + "\n")
        fh.write("\n")  # a blank line, and entries a gateway log also holds
        fh.write(json.dumps({"request_id": "x", "status": 429}) + "\n")
        fh.write(json.dumps({"request_id": "y", "features": None, "prefill_s": None}) + "\n")
        fh.write(json.dumps({"features": [1.0, 2.0], "prefill_s": 0.1}) + "\n")
        fh.write(json.dumps({"features": dict.fromkeys(FEATURES, 1.0), "prefill_s": 0.2}) + "\n")


def test_cli_trains_from_a_request_log(tmp_path: Path) -> None:
    log, out = tmp_path / "requests.jsonl", tmp_path / "model.json"
    _write_log(log, 800)
    proc = subprocess.run(
        [sys.executable, "-m", "fleetgate", "train-predictor", str(log), "-o", str(out), "--json"],
        cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["examples"] == 800 - 40 + 1  # every 20th has no features; + the keyed one
    assert report["skipped"] == {
        "no features or prefill_s": 42,
        "features not 12 finite numbers": 1,
    }
    assert set(report["quality"]) == {"trees", "trees + calib.", "analytic", "analytic + calib."}
    assert 0.8 < report["quality"]["trees"]["coverage_95"] <= 1.0
    model = loads(out.read_text())
    assert model.name == "model" and model.document.meta["holdout"] == report["quality"]
    assert model.document.offset == AnalyticModel()  # the gateway's defaults, for a log
    assert out.stat().st_size < 200_000


def test_cli_prints_the_quality_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--synthetic", "600", "-o", str(tmp_path / "m.json"), "--trees", "5"]) == 0
    out = capsys.readouterr().out
    assert "fitted 3 × 5 trees of depth ≤ 4" in out
    assert out.splitlines()[2].split()[:2] == ["model", "cov@0.9"]
    assert [line.split()[0] for line in out.splitlines()[3:]] == [
        "trees",
        "trees",
        "analytic",
        "analytic",
    ]


def test_cli_trains_on_a_simulator_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m.json"
    args = ["--scenario", "quartz-mixed", "--requests", "400", "--seeds", "1,2", "--json"]
    assert main([*args, "-o", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["examples"] == 800 and report["holdout"] == 160
    model = loads(out.read_text())
    assert model.document.offset == AnalyticModel(max_num_seqs=64)  # the scenario's engine
    assert main([*args, "-o", str(out), "--offset", "none", "--max-num-seqs", "32"]) == 0
    assert loads(out.read_text()).document.offset is None
    assert json.loads(capsys.readouterr().out)["quality"]["analytic"]["n"] == 160


def test_cli_writes_the_compute_bound_prefill_terms(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A compute-bound engine's terms go into the file's offset, so the trees correct the
    engine model they were fitted against (not learn those terms as residual)."""
    out = tmp_path / "m.json"
    compute = ["--prefill-token-s", "2e-5", "--max-num-batched-tokens", "2048"]
    assert main(["--synthetic", "600", "-o", str(out), "--trees", "3", *compute]) == 0
    offset = json.loads(out.read_text())["offset"]
    assert offset["prefill_token_s"] == 2e-5 and offset["max_num_batched_tokens"] == 2048
    assert loads(out.read_text()).document.offset == AnalyticModel(
        prefill_token_s=2e-5, max_num_batched_tokens=2048
    )
    assert "token budget 2048" in capsys.readouterr().out
    assert main(["--synthetic", "600", "-o", str(out), "--prefill-token-s", "-1"]) == 2
    assert "prefill_token_s must be >= 0" in capsys.readouterr().err


def test_cli_refuses_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"request_id": "a"}) + "\n")
    assert main([str(empty), "-o", str(tmp_path / "m.json")]) == 2
    assert "0 usable examples" in capsys.readouterr().err
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"features": [1]}\n{not json\n')
    assert main([str(broken), "-o", str(tmp_path / "m.json")]) == 2
    assert f"{broken}:2: not JSON" in capsys.readouterr().err
    assert main([str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "m.json")]) == 2
    assert not (tmp_path / "m.json").exists()


def test_the_runtime_does_not_import_the_training_library(tmp_path: Path) -> None:
    fitted = fit(*data(400, 4), trees=3)
    path = tmp_path / "m.json"
    path.write_text(json.dumps(fitted.document))
    code = (
        "import sys, pathlib, fleetgate.cli, policies.quantile.trees as t\n"
        f"m = t.loads(pathlib.Path({str(path)!r}).read_bytes())\n"
        f"m.predict([0.0] * {len(FEATURES)})\n"
        "bad = [n for n in ('sklearn', 'scipy', 'numpy') if n in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env(), check=True, timeout=60)
