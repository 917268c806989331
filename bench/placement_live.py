"""Placement on the served model's tokens, live (issue 24's must-show).

    python bench/placement_live.py [--per-shape 6] [--models llama3.1,qwen3] [--seed 24]
        [--out rows.json] [--offline-only]

The command line only: the harness is tests/experiments/placement_live.py (tests import
nothing from bench/).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.experiments.placement_live import main

if __name__ == "__main__":
    raise SystemExit(main())
