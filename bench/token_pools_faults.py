"""The shared ledger through Redis faults, live: two gateway replicas, one redis-server, the
engine's peak concurrency as the oracle (restarted empty, stalled, unreachable at start, a
replica killed).

    python bench/token_pools_faults.py            # the table of docs/TENANCY.md's Redis faults

The command line only: the harness is tests/experiments/token_pools_faults.py, where the test
that checks its promise imports it from (tests import nothing from bench/).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.experiments.token_pools_faults import main

if __name__ == "__main__":
    sys.exit(main())
