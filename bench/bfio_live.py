"""Data-parallel balancing LIVE: the gateway in front of an emulated DP group, FCFS against
BF-IO (docs/BFIO.md, "Live").

    python bench/bfio_live.py --out out/bfio-live
    python bench/bfio_live.py --policies fcfs_maxfree,bfio --seconds 20

The command line only: the harness is tests/experiments/bfio_live.py (tests import nothing
from bench/).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.experiments.bfio_live import main

if __name__ == "__main__":
    main()
