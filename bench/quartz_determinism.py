"""Does a change to QUARTZ's hot path change any decision? A digest of simulator records.

    python bench/quartz_determinism.py [--model m.json] [--requests 3000] [--save F | --check F]

Runs simulator/scenarios/quartz-mixed.yaml with routing `quartz` and dispatch `quartz`
(capacity from the engine), at its arrival rate and at twice it (`-2x`: there most
requests wait in the QUARTZ queue, so ŝα and k_fair order them; at its own rate almost
none wait), each with the analytic model and, with `--model`, with that trained tree model (`fleetgate train-predictor --synthetic 5000 -o m.json`), and
prints a SHA-256 of every record's fields (floats by `repr`, so to the last bit: the
worker chosen, dispatch and first-token times, the feature vector, the predicted
quantiles). Run it before and after a change to policies/quantile, policies/queue or
policies/routing/quartz.py: equal digests mean the change made no decision differently.
`--save` writes the digests, `--check` compares with a saved file (exit 1 when any differ).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml

from policies.quantile.trees import loads
from simulator.records import RequestRecord
from simulator.run import run
from simulator.scenario import parse, resolve


def scenario(requests: int, load: float = 1.0) -> Any:
    doc = yaml.safe_load(resolve("quartz-mixed").read_text())
    doc["policy"]["routing"] = {"policy": "quartz"}
    doc["policy"]["dispatch"] = {"policy": "quartz", "capacity": "engine"}
    doc["policy"]["quartz"] = {}
    doc["workload"]["requests"] = requests
    doc["workload"]["arrivals"]["rate"] *= load
    return parse(doc)


def field(v: object) -> object:
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, list | tuple):
        return [field(x) for x in v]
    if v is not None and hasattr(v, "q95"):  # Quantiles
        return [field(v.mean), field(v.q90), field(v.q95)]  # type: ignore[attr-defined]
    return v


def digest(records: list[RequestRecord]) -> tuple[str, int]:
    h = hashlib.sha256()
    for r in sorted(records, key=lambda r: (r.id, r.attempt)):
        row = {k: field(getattr(r, k)) for k in RequestRecord.__slots__}
        h.update(json.dumps(row, sort_keys=True).encode())
        h.update(b"\n")
    return h.hexdigest(), len(records)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", help="a trained tree model file (also digest a run with it)")
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--save")
    ap.add_argument("--check")
    args = ap.parse_args()
    out: dict[str, Any] = {}
    model = loads(Path(args.model).read_text()) if args.model else None
    for suffix, load in (("", 1.0), ("-2x", 2.0)):
        sc = scenario(args.requests, load)
        out["analytic" + suffix] = digest(run(sc).records)
        if model is not None:
            out["trees" + suffix] = digest(run(sc, prefill_model=model).records)
    for k, (d, n) in out.items():
        print(f"{k:<9} {n} records  sha256 {d}")
    if args.save:
        Path(args.save).write_text(json.dumps(out, indent=1))
    if args.check:
        saved = json.loads(Path(args.check).read_text())
        missing = sorted(out.keys() - saved.keys())
        if missing:  # a file saved by an older version of this script, or without --model
            print(f"{args.check} has no digest for {', '.join(missing)}: save it again")
            return 1
        same = all(saved[k] == list(v) for k, v in out.items())
        print(("identical to " if same else "DIFFERENT from ") + args.check)
        return 0 if same else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
