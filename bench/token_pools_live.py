"""The token-pools paper's two experiments (§5.2–5.3) LIVE, beside the simulator's and the paper's.

    python bench/token_pools_live.py --out out/token-pools-live          # both, ~3 min wall
    python bench/token_pools_live.py --scale 0.1 --only exp1             # a quick look

The command line only: the harness is tests/experiments/token_pools_live.py, where the tests that
check its claims import it from (tests import nothing from bench/).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.experiments.token_pools_live import main

if __name__ == "__main__":
    main()
