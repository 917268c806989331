"""The token-pools paper's two experiments (§5.2–5.3), in the simulator, beside the paper's figures.

    python bench/token_pools_experiments.py --out out/token-pools     # PNGs and figures.json

The command line only: the harness is tests/experiments/token_pools_experiments.py, where the tests that
check its claims import it from (tests import nothing from bench/).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.experiments.token_pools_experiments import main

if __name__ == "__main__":
    main()
