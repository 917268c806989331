"""The QUARTZ paper's evaluation (§5) in the simulator, beside its tables.

    python bench/quartz_experiments.py --out out/quartz            # the full protocol
    python bench/quartz_experiments.py --quick --out out/quartz-q  # a small, fast version

The command line only: the harness is tests/experiments/quartz_experiments.py, where the tests that
check its claims import it from (tests import nothing from bench/).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.experiments.quartz_experiments import main

if __name__ == "__main__":
    main()
