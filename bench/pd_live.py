"""A live 1P/2D pd pool through the openai SDK, both personalities.

    python bench/pd_live.py
    python bench/pd_live.py --requests 200

The command line only: the harness is tests/experiments/pd_live.py (tests import
nothing from bench/).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.experiments.pd_live import main

if __name__ == "__main__":
    main()
