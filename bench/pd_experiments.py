"""Disaggregated P/D pools in the simulator: the paper's knee on 1P/2D and 1P/5D.

    python bench/pd_experiments.py --out out/pd            # C swept 1…512, both topologies
    python bench/pd_experiments.py --quick --out out/pd-q  # fewer points, shorter holds
    python bench/pd_experiments.py --spike --out out/pd-spike  # 32 → 128 → 32, static vs adaptive
    python bench/pd_experiments.py --grid --topology 1P/5D --clients 64 128 --out out/g5

The command line only: the harness is tests/experiments/pd_experiments.py (tests import
nothing from bench/).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.experiments.pd_experiments import main

if __name__ == "__main__":
    main()
