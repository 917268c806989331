"""BF-IO's ablations on the lockstep DP group simulator (docs/BFIO.md, "Ablations").

    nice -n 10 python bench/bfio_ablations.py --out out/bfio-ablations

The command line only: the harness is tests/experiments/bfio_ablations.py (tests import
nothing from bench/).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.experiments.bfio_ablations import main

if __name__ == "__main__":
    main()
