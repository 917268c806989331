"""QUARTZ against its baselines LIVE: gateway + emulators, time-scaled, the predictor trained
from the gateway's own request log of a warm-up run.

    python bench/quartz_live.py --out out/quartz-live                 # ~9 min wall
    python bench/quartz_live.py --reps 1 --methods FIFO-LL,QUARTZ     # a quick look

The command line only: the harness is tests/experiments/quartz_live.py, where the tests
that check its claims import it from (tests import nothing from bench/).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.experiments.quartz_live import main

if __name__ == "__main__":
    main()
