"""The optional compiled greedy_swap (policies/assign/_greedy.c).

setup.py builds it with `optional=True`: a machine without a C compiler still installs
fleetgate and greedy_swap runs its numpy path, with the same decisions (the tests compare
the two decision for decision). `built` is the module when it was built (else None);
`fast` is what greedy_swap uses: `built`, unless FLEETGATE_PURE=1 asks for the numpy path,
as for the compressor (compressor/compiled.py).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def _load() -> ModuleType | None:
    # by name, not `from policies.assign import _greedy`: that reads as an import of the
    # package, whose __init__ registers bfio, which imports greedy_swap, which imports
    # this module (a circle to the import-graph checks, which cannot see a C extension)
    try:
        return importlib.import_module("policies.assign._greedy")
    except ImportError:
        return None


built = _load()
fast = None if os.environ.get("FLEETGATE_PURE", "") not in ("", "0") else built
