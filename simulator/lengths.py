"""Request lengths from the workload CDFs in ``simulator/data/`` (schema ``fleetgate.workload_cdf/v1``).

Sampling follows the reference simulator the FleetOpt tables were computed with
(inference-fleet-sim, see ``simulator/data/README.md``): draw u ~ U(0,1), take the first
breakpoint t_k with F(t_k) ≥ u, and return a uniform integer in [t_{k-1}+1, t_k] (the
first bin is [1, t_1]). That is the bin-uniform distribution whose mean the data files
quote (Azure 1,627, LMSYS 682, agent-heavy 6,512 tokens).

The CDFs give *total* tokens L = L_in + L_out per request. The input/output split is a
documented assumption, not data: by default the paper's 80/20 rule,
``L_in = max(1, ⌊0.8·L⌋)``, ``L_out = max(1, L − L_in)`` (FleetOpt §7.1; it reproduces the
paper's tables). The raw Azure trace is 90/10 (input 90.3 % of tokens), which a scenario
can ask for with ``input_fraction: 0.9``.

Where the files are: ``$FLEETGATE_DATA_DIR`` if set, else the copies the project ships in
``simulator/data/`` (with their provenance). A name that is an existing path is read as is.
Failure posture: a missing or malformed file raises at scenario load, naming the file.
"""

from __future__ import annotations

import bisect
import json
import os
import random
from dataclasses import dataclass
from functools import cache
from pathlib import Path

_DATA = Path(__file__).resolve().parent / "data"


def data_dir() -> Path:
    """Where the workload files live: ``$FLEETGATE_DATA_DIR``, else the copies shipped in
    ``simulator/data/`` (provenance in its README.md)."""
    env = os.environ.get("FLEETGATE_DATA_DIR")
    return Path(env) if env else _DATA


@dataclass(frozen=True, slots=True)
class LengthCDF:
    """A piecewise CDF over token counts: breakpoints t_k (increasing) and F(t_k)."""

    name: str
    tokens: tuple[int, ...]
    probs: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.tokens or len(self.tokens) != len(self.probs):
            raise ValueError(f"{self.name}: empty CDF or tokens/probs of different lengths")
        if any(b <= a for a, b in zip(self.tokens, self.tokens[1:], strict=False)):
            raise ValueError(f"{self.name}: breakpoints must be strictly increasing")
        if any(b < a for a, b in zip(self.probs, self.probs[1:], strict=False)):
            raise ValueError(f"{self.name}: F must be non-decreasing")
        if abs(self.probs[-1] - 1.0) > 1e-9 or self.tokens[0] < 1:
            raise ValueError(f"{self.name}: the last F must be 1 and tokens ≥ 1")

    def sample(self, rng: random.Random) -> int:
        """One draw, the reference simulator's way: a bin by u, then uniform inside it."""
        k = bisect.bisect_left(self.probs, rng.random())
        k = min(k, len(self.tokens) - 1)
        lo = self.tokens[k - 1] + 1 if k else 1
        return rng.randint(lo, self.tokens[k])

    def mean(self) -> float:
        """Mean of the bin-uniform distribution `sample` draws from."""
        total, prev_t, prev_f = 0.0, 0, 0.0
        for t, f in zip(self.tokens, self.probs, strict=True):
            total += (f - prev_f) * (prev_t + 1 + t) / 2
            prev_t, prev_f = t, f
        return total

    def cdf(self, x: float) -> float:
        """F(x), linear between breakpoints from the implicit origin (0, 0)."""
        if x <= 0:
            return 0.0
        k = bisect.bisect_left(self.tokens, x)
        if k >= len(self.tokens):
            return 1.0
        t0, f0 = (self.tokens[k - 1], self.probs[k - 1]) if k else (0, 0.0)
        return f0 + (self.probs[k] - f0) * (x - t0) / (self.tokens[k] - t0)

    def truncated(self, max_tokens: int) -> LengthCDF:
        """The CDF conditioned on L ≤ max_tokens (for a pool whose context is smaller)."""
        f_max = self.cdf(max_tokens)
        if f_max <= 0:
            raise ValueError(f"{self.name}: no mass at or below {max_tokens} tokens")
        pts = [
            (t, f / f_max) for t, f in zip(self.tokens, self.probs, strict=True) if t < max_tokens
        ]
        pts.append((max_tokens, 1.0))
        return LengthCDF(
            f"{self.name}≤{max_tokens}",
            tuple(t for t, _ in pts),
            tuple(min(1.0, f) for _, f in pts),
        )


def split(total: int, input_fraction: float) -> tuple[int, int]:
    """(L_in, L_out) from L_total: L_in = max(1, ⌊f·L⌋), L_out = max(1, L − L_in)."""
    l_in = max(1, int(input_fraction * total))
    return l_in, max(1, total - l_in)


@cache
def load_cdf(name: str, series: str | None = None) -> LengthCDF:
    """A CDF file by name (``azure_2023``) or path; `series` picks one of a file's series."""
    path = Path(name)
    if not path.is_file():
        path = data_dir() / (name if name.endswith(".json") else f"{name}.json")
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read workload CDF {path}: {exc}") from exc
    points = doc.get("points")
    label = doc.get("name", path.stem)
    if series is not None:
        found = [s for s in doc.get("series", []) if s.get("name") == series]
        if not found:
            known = ", ".join(s.get("name", "?") for s in doc.get("series", []))
            raise ValueError(f"{path}: no series {series!r}; known: {known or 'none'}")
        points, label = found[0]["points"], f"{label}:{series}"
    if not points:
        raise ValueError(f"{path}: no CDF points")
    # Bins of zero mass (F repeats) are kept: bisect_left never lands in them for u > 0.
    return LengthCDF(label, tuple(int(t) for t, _ in points), tuple(float(f) for _, f in points))
