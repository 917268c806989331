"""Request lengths for the data-parallel balancing experiments: (prompt, output) pairs.

- `load_burstgpt_csv`: the public BurstGPT trace ("BurstGPT: A Real-world Workload Dataset
  to Optimize LLM Serving Systems"), whose CSV columns are `Timestamp, Model, Request
  tokens, Response tokens, Total tokens, Log Type`. Failed requests (0 response tokens) and
  empty prompts are dropped, as the balancing paper uses only served requests.
- `synthetic_burstgpt`: the documented fallback used when the CSV is not at hand (it is not
  reachable from here): prompts lognormal with median 500 tokens and σ = 1.0 (mean ≈ 820,
  a heavy right tail, clipped to [1, 16384]); outputs geometric with mean 280 (clipped to
  [1, 4096]). Assumptions fitted to the published shape rather than to the file: BurstGPT
  reports Zipf-like request lengths with means of a few hundred to ~1k tokens and response
  means of a few hundred; the balancing paper's Fig. 5 shows decode lengths close to
  geometric; and its Fig. 6 loads (≈ 80k tokens on a rank of 72 slots, ≈ 1.1k a slot) are
  what these parameters give (≈ 820 prompt + ≈ 280 generated on average per slot).
Both return a `Lengths` sampler drawing pairs independently with a seeded generator (trace
timestamps are not used: the experiment keeps the system permanently backlogged).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

PROMPT_MEDIAN, PROMPT_SIGMA, PROMPT_MAX = 500.0, 1.0, 16384
OUTPUT_MEAN, OUTPUT_MAX = 280.0, 4096


@dataclass(frozen=True)
class Lengths:
    """Draws (prompt, output) pairs: from a table of observed pairs, or synthetically."""

    prompts: npt.NDArray[np.int64] | None = None
    outputs: npt.NDArray[np.int64] | None = None

    def draw(
        self, rng: np.random.Generator, n: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        if self.prompts is not None and self.outputs is not None:
            pick = rng.integers(0, len(self.prompts), n)
            return self.prompts[pick], self.outputs[pick]
        prompts = np.clip(
            np.round(rng.lognormal(np.log(PROMPT_MEDIAN), PROMPT_SIGMA, n)), 1, PROMPT_MAX
        ).astype(np.int64)
        outputs = np.clip(rng.geometric(1.0 / OUTPUT_MEAN, n), 1, OUTPUT_MAX).astype(np.int64)
        return prompts, outputs


def synthetic_burstgpt() -> Lengths:
    return Lengths()


def load_burstgpt_csv(path: str | Path, model: str | None = None) -> Lengths:
    """Pairs from a BurstGPT CSV (optionally one `Model`, e.g. "ChatGPT")."""
    prompts: list[int] = []
    outputs: list[int] = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = {"Request tokens", "Response tokens"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: not a BurstGPT CSV, missing column(s) {sorted(missing)}")
        for row in reader:
            if model is not None and row.get("Model") != model:
                continue
            s, o = int(row["Request tokens"]), int(row["Response tokens"])
            if s > 0 and o > 0:  # failures have 0 response tokens
                prompts.append(s)
                outputs.append(o)
    if not prompts:
        raise ValueError(f"{path}: no served requests (all rows failed or filtered out)")
    return Lengths(np.array(prompts, dtype=np.int64), np.array(outputs, dtype=np.int64))
