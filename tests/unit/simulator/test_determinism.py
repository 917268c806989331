import json

from simulator import report
from simulator.run import run

from .conftest import small


def _json(sc, seed=None) -> str:  # type: ignore[no-untyped-def]
    return json.dumps(report.build(run(sc, seed=seed)), sort_keys=True)


def test_same_scenario_and_seed_give_an_identical_report() -> None:
    sc = small(
        rate=25,
        requests=400,
        workers=3,
        components=[
            {"family": "chat", "weight": 0.6},
            {"family": "rag", "weight": 0.3},
            {"family": "structured", "weight": 0.1},
        ],
        routing="power_of_two",
        telemetry={"scrape_interval": 0.2},
    )
    a, b = _json(sc), _json(sc)
    assert a == b
    assert _json(sc, seed=2) != a


def test_a_run_in_a_fresh_interpreter_gives_the_same_report(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # String hashing is salted per process (PYTHONHASHSEED); nothing may depend on it.
    import os
    import subprocess
    import sys

    code = (
        "import json, sys; sys.path.insert(0, '.');"
        "from tests.unit.simulator.conftest import small;"
        "from simulator import report; from simulator.run import run;"
        "print(json.dumps(report.build(run(small(rate=25, requests=300, workers=3, "
        "components=[{'family': 'structured'}, {'family': 'chat'}]))), sort_keys=True))"
    )
    outs = set()
    for salt in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": salt}
        outs.add(
            subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
            ).stdout
        )
    assert len(outs) == 1
