"""The gateway CPU per request of count-when-uncertain placement, on vs off (issue 24).

    python bench/placement_cpu.py [--reps 7] [--requests 3000] [--base COMMIT] [--out rows.json]

The command line only: the harness is tests/experiments/placement_cpu.py (tests import
nothing from bench/).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.experiments.placement_cpu import main

if __name__ == "__main__":
    raise SystemExit(main())
